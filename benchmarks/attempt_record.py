"""One attempt's record, as ``reproduce.py`` writes it to ``summary.jsonl``,
``attempts.jsonl`` and ``summary.json``: identity, how it ended, frames, speed, returns,
learning curve, evaluation, throughput diagnosis and (with ``--reach``) the frames and run
time to each level of the 20-episode mean, read from the run's events; and the episodes
file (``episodes.csv``) an Atari run keeps beside its summary.json."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from curve import (
    GAP_S,
    WINDOW,
    Episodes,
    episode_columns,
    episode_table,
    reach_record,
    run_clock,
    write_csv,
)
from grid_plan import Run, run_overrides
from suite import (
    attempt_spans,
    event_files,
    final_return,
    finite_or_none,
    interval_returns,
    preset_fingerprint,
    read_events,
    trailing_curve,
)

ROOT = Path(__file__).resolve().parents[1]
EVAL_LINE = re.compile(r"\[distrl\] eval: (\d+) episodes .*?: return mean (-?[\d.]+)")
CURVE_INTERVALS = 20  # the summary's training returns per 1/20 of the frame budget


def read_episodes(run_dir: Path) -> Episodes | None:
    """Every training episode's (frames, raw return, wall time), as ``curve.py`` reads
    them; None where the run logged none."""
    return episode_table(run_dir) if event_files(run_dir) else None


def read_episodes_and_epsilons(run_dir: Path
                               ) -> tuple[Episodes | None, np.ndarray | None]:
    """:func:`read_episodes`' arrays and each episode's epsilon where the run logged it
    (``curve.episode_columns``), from one read of the events."""
    columns = episode_columns(run_dir) if event_files(run_dir) else None
    return (None, None) if columns is None else (columns[:3], columns[3])


def write_episodes(path: Path, episodes: Episodes, epsilons: np.ndarray | None = None
                   ) -> None:
    """``curve.py --csv``'s file, whole or not at all (``curve.py`` and ``report.py`` read
    it in place of the run's events), with each episode's epsilon where given."""
    tmp = path.with_name(f".{path.name}.tmp")
    write_csv(tmp, *episodes, epsilons)
    os.replace(tmp, path)


def reach(episodes: Episodes | None, levels: list[float],
          spans: list[tuple[float, float]] | None = None) -> dict[str, Any] | None:
    """For each level, the frames and run time at the first episode where the mean of the
    last 20 reached it (``curve.py --reach``'s figures: the run time inside the attempts
    ``spans``, (start, seconds) each, where they hold every episode, else the gap rule's,
    as ``clock`` says); None when no level is asked."""
    if not levels:
        return None
    frames, returns, wall = episodes if episodes is not None else (
        np.zeros(0, np.int64), np.zeros(0), np.zeros(0))
    clock, recorded = run_clock(wall, spans or [])
    return {"window": WINDOW, "gap_s": GAP_S, "clock": "attempts" if recorded else "gaps",
            "levels": reach_record(frames, returns, wall, levels, clock)}


def summarise(run: Run, command: list[str], attempt: int, resumed: bool, code: int,
              status: str, wall: float, wall_total: float, text: str,
              args: argparse.Namespace, episodes: Episodes | None = None,
              earlier: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One attempt's record: identity, how it ended, frames, speed and returns. ``text`` is
    what the attempt printed (its evaluation line where there are no event files);
    ``wall_total`` counts the run's earlier attempts too; ``episodes`` (:func:`read_episodes`)
    gives the reach figures of ``args.reach``, timed inside the attempts (``earlier``: the
    run's earlier attempt lines, then this one)."""
    events = read_events(run.run_dir)
    returns = events.returns if events is not None else []
    frames = events.last_frame if events is not None else None
    evaluation = dict(events.evaluation) if events is not None else {}
    match = EVAL_LINE.findall(text)
    if not evaluation and match:  # no tensorboard (log.tensorboard=false): the console line
        count, mean = match[-1]
        evaluation = {"return_mean": float(mean), "episodes": int(count), "source": "stdout"}
    final = final_return(events.returns) if events is not None else None
    width = max(args.frames // CURVE_INTERVALS, 1)
    wall_total_s = round(wall_total, 3)
    started = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - wall))
    spans = [*([a.get("started"), a.get("wall_s")] for a in earlier or []),
             [started, round(wall, 3)]]
    return {
        "run": run.name, "agent": run.agent, "game": run.game, "seed": run.seed,
        "suite": run.suite.name, "env": run.suite.env_name(run.game),
        "overrides": run_overrides(run, args.frames, args.set),
        "preset_sha": preset_fingerprint(run.agent, run.suite),
        "command": command, "run_dir": str(run.run_dir),
        "status": status, "exit_code": code, "attempt": attempt, "resumed": resumed,
        "started": started, "wall_s": round(wall, 3), "wall_s_total": wall_total_s,
        "spans": spans,
        "jobs": args.jobs,  # this invocation's --jobs; report.py counts the runs that
        # were going at once from the spans, which another invocation's runs may join
        "frames_target": args.frames, "frames": frames,
        # from the wall time as recorded (to the ms), so that the record agrees with itself
        "fps": round(frames / wall_total_s, 1) if frames and wall_total_s > 0 else None,
        "fps_logged_mean": events.fps_mean if events is not None else None,
        "episodes": len(returns),
        "final_return_100": finite_or_none(final),
        "final_return_episodes": min(len(returns), 100),
        "curve_interval_frames": width,
        "curve": interval_returns(events.frames, events.returns, width)
        if events is not None else [],
        "trailing_curve": trailing_curve(events.frames, events.returns, events.last_frame)
        if events is not None else None,
        "eval": evaluation or None,
        "reach": reach(episodes, args.reach, attempt_spans({"spans": spans}, [])[0]),
        "throughput": (run_throughput(run.run_dir)
                       if events is not None and events.has_throughput else None),
    }


def run_throughput(run_dir: Path) -> dict[str, Any] | None:
    """The run's throughput diagnosis over all its reports, by ``python -m distrl.diagnose
    --json`` in its own process (this one stays free of torch), or None where the events
    hold none (log.tensorboard=false, no report yet) or it failed."""
    try:
        proc = subprocess.run([sys.executable, "-m", "distrl.diagnose", "--json", str(run_dir)],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)
        return json.loads(proc.stdout) if proc.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
        return None
