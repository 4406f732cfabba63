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
        self.episodes_here = 0  # episodes this logger wrote (a resume's carried ones aside)

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

    def episode(self, episode_return: float, length: int, frames: int,
                epsilon: float | None = None) -> None:
        """Write one finished episode's raw return and length at ``frames``, and the
        exploration rate of the env that played it (``episode/epsilon``, NaN where not
        known) where the run has one per env (Ape-X's and R2D2's ladder): a run writes it
        with every episode or with none, so the n-th epsilon is the n-th return's."""
        self.episodes_here += 1
        self.recent_returns.append(float(episode_return))
        del self.recent_returns[:-100]
        if self._writer is not None:
            self._writer.add_scalar("episode/return", episode_return, frames)
            self._writer.add_scalar("episode/length", length, frames)
            if epsilon is not None:
                self._writer.add_scalar("episode/epsilon", epsilon, frames)

    def mean_recent_return(self, last: int = 20) -> float:
        """Mean raw return of the last ``last`` episodes (NaN before any)."""
        window = self.recent_returns[-last:]
        return sum(window) / len(window) if window else float("nan")

    def due(self) -> bool:
        return time.monotonic() - self._last_report >= self.interval_s

    def interval_sum(self, name: str) -> float:
        """The sum of ``name``'s samples since the last report (0 if none): e.g. the
        seconds every actor report of the interval spent stepping envs."""
        return self._sums.get(name, 0.0)

    def write(self, frames: int, headline: dict[str, float]) -> dict[str, float]:
        """Write accumulated means and ``headline`` at ``frames`` and reset, printing
        nothing (the training loop prints its own progress). Returns the means."""
        means = {name: self._sums[name] / self._counts[name] for name in self._sums}
        means.update(headline)
        if self._writer is not None:
            for name, value in means.items():
                self._writer.add_scalar(name, value, frames)
            for name, values in self._histograms.items():
                if values:
                    self._writer.add_histogram(name, np.asarray(values), frames)
            self._writer.flush()
        self._sums.clear()
        self._counts.clear()
        self._histograms.clear()
        self._last_report = time.monotonic()
        return means

    def report(self, frames: int, headline: dict[str, float]) -> dict[str, float]:
        """:meth:`write`, then print ``headline`` on one line. Returns the means."""
        means = self.write(frames, headline)
        shown = " ".join(f"{name.split('/')[-1]}={format_value(value)}"
                         for name, value in headline.items())
        print(f"[distrl] frames={frames} {shown}", file=self.stream or sys.stdout, flush=True)
        return means

    def text(self, tag: str, text: str) -> None:
        if self._writer is not None:
            self._writer.add_text(tag, text)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def format_value(value: float) -> str:
    """A console figure: integers whole, anything else to 4 significant digits."""
    whole = isinstance(value, float) and value.is_integer() and abs(value) < 1e9
    if isinstance(value, int) or whole:
        return str(int(value))
    return f"{value:.4g}"
