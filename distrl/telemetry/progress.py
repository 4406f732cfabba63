"""The console progress of a training run: frames done of the budget, frames/s, time to
go, CPU and memory, where the time goes (env / forward / learn / copy) and which side
bounds the run.

``log.progress=lines`` prints one plain line per report, starting ``[distrl] frames=``
(what log files, CI and ``benchmarks/reproduce.py`` see); ``bar`` keeps a live panel with a
progress bar at the bottom of a terminal (``rich``), other output scrolling above it;
``auto`` (the default) draws the bar only where the output is an interactive terminal.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

from distrl.telemetry.logging import format_value

SPLIT = ("env", "forward", "learn", "copy")  # where the busy seconds of both sides go


def choose_mode(setting: str, stream: TextIO | None) -> str:
    """``bar`` or ``lines`` for ``log.progress`` (auto | bar | lines) on ``stream``:
    auto draws the bar only on an interactive terminal that is not ``TERM=dumb``."""
    if setting in ("bar", "lines"):
        return setting
    if setting != "auto":
        raise ValueError(f"log.progress must be one of auto, bar, lines; got {setting!r}")
    stream = stream or sys.stdout
    try:
        interactive = stream.isatty()
    except (AttributeError, ValueError):  # closed, or not a file
        interactive = False
    return "bar" if interactive and os.environ.get("TERM") != "dumb" else "lines"


@dataclass
class ProgressReport:
    """What one report shows."""

    frames: int
    total_frames: int
    fps: float  # frames/s over the last reports (distrl.training.loop.FPS_WINDOW_S), all ranks
    cpu_busy: float = math.nan  # cores busy (learner process and children)
    cores: float = math.nan
    memory_bytes: float = math.nan  # resident bytes of the learner process and children
    split: dict[str, float] = field(default_factory=dict)  # seconds per SPLIT entry
    bound: str = "?"  # the diagnosis, e.g. "learner x2.3"
    extra: dict[str, float] = field(default_factory=dict)  # more figures, name -> value
    average_fps: float = math.nan  # frames/s since this process started: the ETA's speed

    @property
    def done(self) -> float:
        return min(self.frames / self.total_frames, 1.0) if self.total_frames > 0 else math.nan

    @property
    def eta_s(self) -> float:
        """Seconds to the end of the budget at the frames/s since this process started, or
        the report's own where that is unknown (NaN if neither is known)."""
        left = max(self.total_frames - self.frames, 0)
        if left == 0:
            return 0.0
        speed = self.average_fps if self.average_fps > 0 else self.fps
        return left / speed if speed > 0 else math.nan


def duration_text(seconds: float) -> str:
    """``45s``, ``12m05s``, ``3h07m``, ``?`` when unknown."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def split_text(split: dict[str, float]) -> str:
    """``env 41% fwd 22% learn 30% copy 7%``: shares of the busy seconds."""
    total = sum(split.get(k, 0.0) for k in SPLIT)
    if total <= 0:
        return "?"
    names = {"forward": "fwd"}
    return " ".join(f"{names.get(k, k)} {100 * split.get(k, 0.0) / total:.0f}%" for k in SPLIT)


def memory_text(nbytes: float) -> str:
    if not math.isfinite(nbytes):
        return "?"
    return f"{nbytes / 2**30:.1f}GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.0f}MiB"


def format_line(report: ProgressReport) -> str:
    """The plain progress line, e.g. ``[distrl] frames=120000/5000000 (2.4%) fps=28900
    eta=2m49s cpu=1.9/2 mem=1.1GiB time=env 41% fwd 22% learn 30% copy 7%
    bound=learner x2.3 updates=183 updates_per_s=46.2 mean_return_20=3.1``."""
    cpu = ("?" if not math.isfinite(report.cpu_busy)
           else f"{report.cpu_busy:.1f}/{report.cores:g}")
    parts = [
        f"[distrl] frames={report.frames}/{report.total_frames} ({100 * report.done:.1f}%)",
        f"fps={report.fps:.0f}", f"eta={duration_text(report.eta_s)}", f"cpu={cpu}",
        f"mem={memory_text(report.memory_bytes)}", f"time={split_text(report.split)}",
        f"bound={report.bound}",
    ]
    parts += [f"{name.split('/')[-1]}={format_value(value)}"
              for name, value in report.extra.items()]
    return " ".join(parts)


class ProgressDisplay:
    """Shows each report: a plain line (``lines``) or a live panel (``bar``).

    Args:
        mode: ``bar`` or ``lines`` (see :func:`choose_mode`).
        stream: where to write; None: whatever ``sys.stdout`` is then.
        total_frames: the run's frame budget.
    """

    REFRESH_S = 0.25  # the bar moves between reports at most this often

    def __init__(self, mode: str, stream: TextIO | None, total_frames: int):
        self.mode, self.stream, self.total_frames = mode, stream, total_frames
        self._live: Any = None
        self._last: ProgressReport | None = None
        self._refreshed = 0.0
        if mode == "bar":
            from rich.console import Console
            from rich.live import Live

            console = Console(file=stream or sys.stdout)
            self._live = Live(console=console, auto_refresh=False, transient=False,
                              redirect_stdout=True, redirect_stderr=True)
            self._live.start()

    def show(self, report: ProgressReport) -> None:
        """One report: a line, or the panel redrawn."""
        self._last = report
        if self._live is None:
            print(format_line(report), file=self.stream or sys.stdout, flush=True)
            return
        self._draw(report)

    def tick(self, frames: int) -> None:
        """Between reports: move the bar to ``frames`` (lines mode prints nothing)."""
        if self._live is None or time.monotonic() - self._refreshed < self.REFRESH_S:
            return
        last = self._last or ProgressReport(frames, self.total_frames, math.nan)
        self._draw(replace(last, frames=frames))

    def _draw(self, report: ProgressReport) -> None:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        cpu = ("?" if not math.isfinite(report.cpu_busy)
               else f"{report.cpu_busy:.1f} of {report.cores:g} cores")
        head = Text(f"frames {report.frames:,} / {report.total_frames:,} "
                    f"({100 * report.done:.1f}%)   {report.fps:,.0f} frames/s   "
                    f"eta {duration_text(report.eta_s)}", style="bold")
        bar = Table.grid()  # a bare ProgressBar in a Group runs into the next line
        bar.add_row(ProgressBar(total=max(report.total_frames, 1),
                                completed=min(report.frames, report.total_frames), width=50))
        lines = [head, bar,
                 Text(f"bound {report.bound}   cpu {cpu}   "
                      f"mem {memory_text(report.memory_bytes)}"),
                 Text(f"time {split_text(report.split)}")]
        if report.extra:
            lines.append(Text("  ".join(f"{name.split('/')[-1]}={format_value(value)}"
                                        for name, value in report.extra.items()), style="dim"))
        self._live.update(Group(*lines), refresh=True)
        self._refreshed = time.monotonic()

    def close(self) -> None:
        """Stop the panel (its last state stays on the screen)."""
        if self._live is not None:
            self._live.stop()
            self._live = None
