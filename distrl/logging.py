"""Tensorboard scalars and a one-line console report.

Scalars are averaged over each report interval and written against the number of
env frames, so curves from runs with different topologies line up, and a resumed
run continues the same curves (events past the resume step are purged).
"""

from __future__ import annotations

import math
import sys
import time
from collections import defaultdict
from typing import TextIO

import numpy as np


class MetricLogger:
    """Accumulates scalars between reports; writes means to tensorboard and one console line.

    Args:
        log_dir: tensorboard directory, or None to log to the console only.
        interval_s: seconds between reports.
        purge_step: on resume, the frame count to continue from (later events are dropped).
        stream: where the console line goes; None means whatever ``sys.stdout`` is then.
    """

    def __init__(
        self,
        log_dir: str | None,
        interval_s: float = 5.0,
        purge_step: int | None = None,
        stream: TextIO | None = None,
    ):
        self.interval_s = interval_s
        self.stream = stream
        self._sums: dict[str, float] = defaultdict(float)
        self._counts: dict[str, int] = defaultdict(int)
        self._histograms: dict[str, list[float]] = defaultdict(list)
        self._last_report = time.monotonic()
        self._writer = None
        if log_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir, purge_step=purge_step)
        self.recent_returns: list[float] = []

    def add(self, name: str, value: float) -> None:
        """Accumulate one sample of a scalar; its mean is written at the next report."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return
        self._sums[name] += float(value)
        self._counts[name] += 1

    def add_many(self, metrics: dict[str, float], prefix: str = "") -> None:
        for name, value in metrics.items():
            self.add(prefix + name, value)

    def add_histogram(self, name: str, values: list[float]) -> None:
        """Accumulate samples of a distribution; its histogram is written at the next report."""
        self._histograms[name].extend(values)

    def episode(self, episode_return: float, length: int, frames: int) -> None:
        """Write one finished episode's raw return and length at ``frames``."""
        self.recent_returns.append(float(episode_return))
        del self.recent_returns[:-100]
        if self._writer is not None:
            self._writer.add_scalar("episode/return", episode_return, frames)
            self._writer.add_scalar("episode/length", length, frames)

    def mean_recent_return(self, last: int = 20) -> float:
        """Mean raw return of the last ``last`` episodes (NaN before any)."""
        window = self.recent_returns[-last:]
        return sum(window) / len(window) if window else float("nan")

    def due(self) -> bool:
        return time.monotonic() - self._last_report >= self.interval_s

    def report(self, frames: int, headline: dict[str, float]) -> dict[str, float]:
        """Write accumulated means at ``frames``, print one line, reset. Returns the means."""
        means = {name: self._sums[name] / self._counts[name] for name in self._sums}
        means.update(headline)
        if self._writer is not None:
            for name, value in means.items():
                self._writer.add_scalar(name, value, frames)
            for name, values in self._histograms.items():
                if values:
                    self._writer.add_histogram(name, np.asarray(values), frames)
            self._writer.flush()
        shown = " ".join(f"{name.split('/')[-1]}={_fmt(value)}" for name, value in headline.items())
        print(f"[distrl] frames={frames} {shown}", file=self.stream or sys.stdout, flush=True)
        self._sums.clear()
        self._counts.clear()
        self._histograms.clear()
        self._last_report = time.monotonic()
        return means

    def text(self, tag: str, text: str) -> None:
        if self._writer is not None:
            self._writer.add_text(tag, text)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def _fmt(value: float) -> str:
    whole = isinstance(value, float) and value.is_integer() and abs(value) < 1e9
    if isinstance(value, int) or whole:
        return str(int(value))
    return f"{value:.4g}"
