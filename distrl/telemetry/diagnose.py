"""``python -m distrl.diagnose <run dir> [--last N] [--json]``: which side of a run bounds
its throughput, by how much, and what to change, for a finished run or one still running.

It reads the run directory's tensorboard events: the figures each report logged under
``throughput/raw/`` (:class:`distrl.telemetry.throughput.Figures`) and the run's config (the
``config`` text tag), recombines the last ``N`` reports (by default all but the first,
which spans the run's start, as the run's summary does) and diagnoses
them with the same function the live run uses (:func:`distrl.telemetry.throughput.diagnose`), so
the advice names the run's own settings. A run started with ``log.tensorboard=false``
leaves nothing to read; its console lines and summary carry the diagnosis instead.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distrl.telemetry.throughput import Diagnosis, Figures, RunContext, combine, diagnose, steady
from distrl.telemetry.throughput_meter import run_context

RAW = "throughput/raw/"
CONFIG_TAG = "config/text_summary"  # what SummaryWriter.add_text("config", ...) writes


class DiagnoseError(Exception):
    """The run directory holds nothing to diagnose."""


@dataclass
class RunFigures:
    """What a run directory's events hold for the diagnosis."""

    reports: list[Figures]  # one per report, oldest first
    frames: list[int]  # the frame count (tensorboard step) of each report
    wall_times: list[float]  # when each was written (seconds since the epoch)
    config_text: str  # the resolved config ("" if it was not logged)


def _event_files(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("events.out.tfevents.*"))


def read_run(run_dir: Path) -> RunFigures:
    """The throughput figures of every report in ``run_dir``'s events, in order (a resumed
    run's events past its checkpoint are dropped, as tensorboard shows them)."""
    if not run_dir.is_dir():
        raise DiagnoseError(f"{run_dir} is not a directory")
    if not _event_files(run_dir):
        raise DiagnoseError(f"{run_dir} has no tensorboard event files (was the run started "
                            "with log.tensorboard=false?)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    logging.getLogger("tensorboard").setLevel(logging.ERROR)  # a resume's purge warns
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    tags = events.Tags()
    raw = [tag for tag in tags.get("scalars", []) if tag.startswith(RAW)]
    if not raw:
        raise DiagnoseError(f"{run_dir} has no {RAW}* scalars yet (the first report comes "
                            "after log.interval_s; runs of distrl before the diagnosis have "
                            "none)")
    # Every report writes its fields at one step; a NaN field (no replay) is not written.
    # Reports at the same step (no frames between them) are told apart by their order.
    values: dict[tuple[int, int], dict[str, float]] = defaultdict(dict)
    wall: dict[tuple[int, int], float] = {}
    for tag in raw:
        seen: dict[int, int] = defaultdict(int)
        for event in events.Scalars(tag):
            key = (event.step, seen[event.step])
            seen[event.step] += 1
            values[key][tag] = event.value
            wall[key] = max(wall.get(key, 0.0), event.wall_time)
    keys = sorted(values, key=lambda k: (wall[k], k))
    config_text = ""
    if CONFIG_TAG in tags.get("tensors", []):
        tensor = events.Tensors(CONFIG_TAG)[-1].tensor_proto
        text = tensor_util.make_ndarray(tensor).flat[0]
        config_text = text.decode() if isinstance(text, bytes) else str(text)
    return RunFigures([Figures.from_scalars(values[k]) for k in keys], [k[0] for k in keys],
                      [wall[k] for k in keys], config_text)


def diagnose_run(run_dir: Path, last: int | None = None) -> tuple[Diagnosis, RunFigures, int]:
    """The diagnosis of ``run_dir``'s last ``last`` reports (None: the whole run but its
    start, :func:`~distrl.telemetry.throughput.steady`, as the run's summary has it), the figures
    read, and how many reports it covers."""
    run = read_run(run_dir)
    chosen = run.reports[-last:] if last else steady(run.reports)
    return diagnose(combine(chosen), context_of(run)), run, len(chosen)


def context_of(run: RunFigures) -> RunContext:
    return run_context(run.config_text)


def topology_text(ctx: RunContext, fig: Figures) -> str:
    """``impala: 2 actor processes x 16 envs in 1 group; learner on cpu, 1 thread``."""
    if ctx.actors == 0:
        topology = f"one process, {ctx.envs_per_actor} envs"
    else:
        who = "env worker" if ctx.seed else "actor process"
        topology = (f"{ctx.actors} {who}{'es' if who.endswith('s') else ''}"
                    f"{'s' if ctx.actors != 1 and not who.endswith('s') else ''} x "
                    f"{ctx.envs_per_actor} envs in {ctx.env_groups} "
                    f"group{'s' if ctx.env_groups != 1 else ''}")
    device = "a GPU" if fig.learner_gpu >= 0.5 else "cpu"
    threads = int(fig.learner_threads)
    return (f"{ctx.agent}: {topology}; learner on {device}, {threads} "
            f"thread{'s' if threads != 1 else ''}")


def render(run_dir: Path, diagnosis: Diagnosis, run: RunFigures, used: int,
           last: int | None = None, now: float | None = None) -> list[str]:
    """The CLI's text: a header, the figures, the verdict and the advice."""
    now = time.time() if now is None else now
    total = len(run.reports)
    first, newest = run.frames[total - used], run.frames[-1]
    span = sum(f.span_s for f in run.reports[total - used:])
    ctx = context_of(run)
    which = ("all" if used == total else f"the last {used} of" if last
             else f"the last {used} (the first, the run's start, left out) of")
    lines = [
        f"distrl diagnose: {run_dir} ({topology_text(ctx, run.reports[-1])})",
        f"{which} {total} reports: frames {first:,} to {newest:,} over {span:.0f} s "
        f"(the newest written {max(now - run.wall_times[-1], 0):.0f} s ago)",
        f"bound: {diagnosis.short}",
        *(f"  {line}" for line in diagnosis.lines),
    ]
    if diagnosis.advice:
        lines.append("advice:")
        lines += [f"  - {advice}" for advice in diagnosis.advice]
    else:
        lines.append("advice: none")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m distrl.diagnose",
        description="Which side (actors or learner) bounds a run's throughput, by how much, "
                    "and what to change; read from the run directory's tensorboard events.")
    parser.add_argument("run_dir", type=Path, help="the run directory (log.dir/log.name)")
    parser.add_argument("--last", type=int, default=None, metavar="N",
                        help="only the last N reports (default: the whole run but its first "
                             "report, the start)")
    parser.add_argument("--json", action="store_true",
                        help="print the diagnosis as JSON (bound, margin, lines, advice, ...)")
    args = parser.parse_args(argv)
    if args.last is not None and args.last < 1:
        parser.error(f"--last must be at least 1, got {args.last}")
    try:
        diagnosis, run, used = diagnose_run(args.run_dir, args.last)
    except DiagnoseError as error:
        print(f"distrl diagnose: error: {error}", file=sys.stderr)
        return 2
    if args.json:
        record: dict[str, Any] = {"run_dir": str(args.run_dir), "reports": used,
                                  "frames": run.frames[-1], **diagnosis.to_dict()}
        print(json.dumps(record, indent=1, allow_nan=False,
                         default=lambda v: None if isinstance(v, float) and math.isnan(v)
                         else str(v)))
    else:
        print("\n".join(render(args.run_dir, diagnosis, run, used, args.last)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
