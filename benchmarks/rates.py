"""Frames/s and updates/s of runs between two clock times, from their own tensorboard
events: the throughput to quote for real runs (side by side or alone), where a benchmark
window is not a run.

    python benchmarks/rates.py runs/pong/apex-Pong-s0 runs/pong_x/r2d2-Pong-s100 \
        [--from 15:05] [--to 16:59]

Each run's ``learner/updates`` reports carry the wall time, the env frames (the step) and
the update count (the value); the rates are the differences between the first report at
or after ``--from`` and the last at or before ``--to``. Times are UTC, as ISO dates
(``2026-12-03T15:05``) or as ``HH:MM[:SS]`` on the day of the run's last report; without
them the window is the run's newest attempt (its newest event file). A run may also be given
by its archive directory (``results/atari/pong_apex/apex-Pong-s0``): the event files kept
there, xz-compressed, for a finished run, or its carry's for a run still going. A replay agent's
actors insert in bursts (Ape-X's every 100 s or so on 2 cores), so a window should span
many reports: the table gives how many there were and how many distinct frame counts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from suite import read_scalars, run_event_files  # noqa: E402

UPDATES_TAG = "learner/updates"  # distrl.training.loop's report: step = frames, value = updates


@dataclass
class Report:
    wall: float
    frames: int
    updates: float


@dataclass
class Rates:
    """A run's throughput between two of its reports."""

    start: Report
    end: Report
    reports: int  # reports in the window, both ends included
    frame_counts: int  # distinct frame counts among them

    @property
    def seconds(self) -> float:
        return self.end.wall - self.start.wall

    @property
    def frames_per_s(self) -> float:
        return (self.end.frames - self.start.frames) / self.seconds

    @property
    def updates_per_s(self) -> float:
        return (self.end.updates - self.start.updates) / self.seconds


def read_reports(paths: list[Path]) -> list[Report]:
    """Every ``learner/updates`` report in the event files, by wall time."""
    events = read_scalars(paths, as_one_run=False).get(UPDATES_TAG, [])
    return sorted((Report(e.wall_time, e.step, e.value) for e in events),
                  key=lambda report: report.wall)


def clock_time(text: str, day: dt.date) -> float:
    """Seconds since the epoch of ``text`` (UTC): an ISO date and time, or ``HH:MM[:SS]``
    on ``day``."""
    try:
        if "T" in text or " " in text or text.count("-") == 2:
            moment = dt.datetime.fromisoformat(text)
        else:
            moment = dt.datetime.combine(day, dt.time.fromisoformat(text))
    except ValueError:
        raise SystemExit(f"rates: {text!r} is not a time (HH:MM, HH:MM:SS or "
                         "2026-12-03T15:05)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return moment.timestamp()


def window_rates(reports: list[Report], start: float, end: float) -> Rates | None:
    """The rates between the first report at or after ``start`` and the last at or before
    ``end``; None where the window holds fewer than two reports or no time passes."""
    inside = [report for report in reports if start <= report.wall <= end]
    if len(inside) < 2 or inside[-1].wall <= inside[0].wall:
        return None
    return Rates(inside[0], inside[-1], len(inside), len({r.frames for r in inside}))


def utc(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def run_rates(run_dir: Path, start: str | None, end: str | None) -> Rates:
    files = run_event_files(run_dir, "rates")
    # Without a window, the newest attempt: its own event file.
    reports = read_reports(files if start or end else files[-1:])
    if not reports:
        raise SystemExit(f"rates: {run_dir} has no {UPDATES_TAG} report")
    day = dt.datetime.fromtimestamp(reports[-1].wall, dt.timezone.utc).date()
    low = clock_time(start, day) if start else reports[0].wall
    high = clock_time(end, day) if end else reports[-1].wall
    rates = window_rates(reports, low, high)
    if rates is None:
        raise SystemExit(f"rates: {run_dir} has fewer than two reports between {utc(low)} "
                         f"and {utc(high)} UTC (its reports: {utc(reports[0].wall)} to "
                         f"{utc(reports[-1].wall)})")
    return rates


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="run directories")
    parser.add_argument("--from", dest="start", help="UTC start: HH:MM[:SS] or ISO date")
    parser.add_argument("--to", dest="end", help="UTC end: HH:MM[:SS] or ISO date")
    args = parser.parse_args(argv)
    print("| run | from (UTC) | to (UTC) | seconds | frames/s | updates/s | reports "
          "(frame counts) |")
    print("|---|---|---|---:|---:|---:|---|")
    for run_dir in args.runs:
        r = run_rates(run_dir, args.start, args.end)
        print(f"| {run_dir.name} | {utc(r.start.wall)} | {utc(r.end.wall)} | "
              f"{r.seconds:,.0f} | {r.frames_per_s:,.0f} | {r.updates_per_s:#.3g} | "
              f"{r.reports} ({r.frame_counts}) |")


if __name__ == "__main__":
    main()
