"""What a reproduce.py grid holds: its runs, each run's settings and command, whether it is
finished, to resume or fresh, and ``grid.json``, the record of everything asked for so far
(one suite's runs: MinAtar's or Atari's). Nothing here starts a process (``reproduce.py``
does)."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suite import (
    GRID,
    LOST,
    MINATAR,
    RULED_OUT,
    SUMMARY,
    SuiteSpec,
    games_by_agent,
    has_checkpoint,
    preset_fingerprint,
    read_attempts,
    read_json,
    run_name,
    same_settings,
    suite_of_grid,
)

RUN_LOCK = "distrl.lock"  # distrl.run.run_lock.LOCK_NAME: flocked by the run.py that owns it
_HYDRA_ATTEMPT = re.compile(r"^attempt-(\d+)$")


@dataclass
class Run:
    agent: str
    game: str
    seed: int
    run_dir: Path
    suite: SuiteSpec = field(default=MINATAR)

    @property
    def name(self) -> str:
        return self.run_dir.name


def plan(out: Path, agents: list[str], games: list[str], seeds: list[int],
         suite: SuiteSpec = MINATAR) -> list[Run]:
    return [Run(a, g, s, out / run_name(a, g, s), suite)
            for a in agents for g in games for s in seeds]


def run_overrides(run: Run, frames: int, extra: list[str]) -> list[str]:
    """The run's settings: its agent's preset and game, seed, budget and where it logs."""
    return [f"+experiment={run.suite.preset(run.agent)}", run.suite.game_override(run.game),
            f"seed={run.seed}", f"total_frames={frames}", f"log.dir={run.run_dir.parent}",
            f"log.name={run.name}", *extra]


def missing_presets(agents: list[str], suite: SuiteSpec) -> dict[str, Path]:
    """Each of ``agents`` whose preset file in ``suite`` does not exist, with that file."""
    return {agent: suite.preset_path(agent) for agent in agents
            if not suite.preset_path(agent).is_file()}


def next_attempt(run_dir: Path) -> int:
    """The number of the run's next attempt: one past its recorded attempts, and past every
    ``hydra/attempt-N`` an attempt left (one started by hand, with reproduce.py's
    ``hydra.run.dir``, records none), so no attempt's Hydra files are overwritten."""
    started = [int(match[1]) for path in (run_dir / "hydra").glob("attempt-*")
               if (match := _HYDRA_ATTEMPT.match(path.name))]
    return max([len(read_attempts(run_dir)), *started]) + 1


def run_lock_holder(run_dir: Path) -> str | None:
    """Who holds the run's ``distrl.lock`` (a run.py going on in it, started by hand or by
    another tool), as the lock file names it; None when no process does. The test takes a
    shared lock and drops it at once: it never blocks the owner, and only a run.py that
    starts in that instant could find the lock taken."""
    try:
        fd = os.open(run_dir / RUN_LOCK, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            owner = json.loads(os.pread(fd, 1 << 16, 0))
        except ValueError:
            owner = {}
        owner = owner if isinstance(owner, dict) else {}
        return f"pid {owner.get('pid', '?')}, since {owner.get('since', '?')}"
    finally:
        os.close(fd)
    return None


def finished_summary(run: Run, archive: Path | None) -> Path | None:
    """The ``summary.json`` that says ``run`` finished: its run directory's, else the
    archive's copy; None when neither does."""
    for path in (run.run_dir / SUMMARY, *([archive / run.name / SUMMARY] if archive else [])):
        summary = read_json(path)
        if isinstance(summary, dict) and summary.get("status") == "finished":
            return path
    return None


def closed_summary(run: Run, archive: Path | None) -> dict[str, Any] | None:
    """The ``summary.json`` of ``run`` (the archive's, else its run directory's) where it
    says the run is closed for good: lost (``suite.LOST``: its ``lost`` field says how) or
    ruled out by its tuning rule (``suite.RULED_OUT``: ``ruled_out`` holds the reading);
    else None."""
    for path in ([archive / run.name / SUMMARY] if archive else []) + [run.run_dir / SUMMARY]:
        summary = read_json(path)
        if isinstance(summary, dict) and summary.get("status") in (LOST, RULED_OUT):
            return summary
    return None


def state_of(run: Run, archive: Path | None = None) -> str:
    """finished (skip), lost or ruled_out (skip: never run again), resume (checkpoints,
    not finished) or fresh."""
    if finished_summary(run, archive) is not None:
        return "finished"
    closed = closed_summary(run, archive)
    if closed is not None:
        return str(closed["status"])
    return "resume" if has_checkpoint(run.run_dir) else "fresh"


def command_for(run: Run, run_cmd: list[str], frames: int, extra: list[str], resume: bool,
                attempt: int) -> list[str]:
    hydra = [f"hydra.run.dir={run.run_dir / 'hydra' / f'attempt-{attempt}'}"]
    return [*run_cmd, *run_overrides(run, frames, extra), *hydra,
            *([f"resume={run.run_dir}"] if resume else [])]


def differences(done: dict[str, Any], run: Run, args: argparse.Namespace) -> str:
    """What sets a finished run apart from the grid asked for now (its budget, its preset's
    settings), as a note to its skip line; empty where nothing does. Such a run is still
    skipped, never overwritten: moving it away reruns it."""
    notes = []
    if done.get("frames_target") != args.frames:
        notes.append(f"its budget was {done.get('frames_target')} frames, not {args.frames}")
    preset, now = run.suite.preset(run.agent), preset_fingerprint(run.agent, run.suite)
    if done.get("preset_sha") is not None and not same_settings(preset, done["preset_sha"], now):
        notes.append(f"it ran with other settings of {preset} (fingerprint "
                     f"{done['preset_sha']}, today {now})")
    return "".join(f"; {note}" for note in notes) + (": move it away to rerun it"
                                                     if notes else "")


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def append_line(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def suite_conflict(directory: Path, suite: str) -> str | None:
    """Why ``directory``'s grid.json cannot take ``suite``'s runs (it holds another suite's),
    None when it can (or there is none)."""
    grid = read_json(directory / GRID)
    if not isinstance(grid, dict) or suite_of_grid(grid) == suite:
        return None
    return (f"{directory / GRID} holds the {suite_of_grid(grid)} suite's grid: it cannot "
            f"take --suite {suite} runs; give this suite its own --out and --archive")


def update_grid(out: Path, args: argparse.Namespace) -> None:
    """``<out>/grid.json``: the suite, every agent, game and seed asked for so far, and
    which games each agent was asked for, so the report can show runs that never started
    and no runs that were never asked for (also in the archive, when there is one). A
    grid.json of another suite is refused (ValueError) before either file is written."""
    suite = getattr(args, "suite", MINATAR.name)
    for directory in (out, *([args.archive] if args.archive is not None else [])):
        conflict = suite_conflict(directory, suite)
        if conflict is not None:
            raise ValueError(conflict)
    grid = read_json(out / GRID) or {}
    planned = games_by_agent(grid)
    for agent in args.agents:
        planned[agent] = list(dict.fromkeys([*planned.get(agent, []), *args.games]))
    for key in ("agents", "games", "seeds"):
        grid[key] = list(dict.fromkeys([*grid.get(key, []), *getattr(args, key)]))
    grid["games_by_agent"] = planned
    grid.update(suite=suite, frames=args.frames, overrides=args.set)
    write_atomic(out / GRID, json.dumps(grid, indent=1) + "\n")
    if args.archive is not None and out != args.archive:
        args.archive.mkdir(parents=True, exist_ok=True)
        update_grid(args.archive, argparse.Namespace(**{**vars(args), "archive": None}))
