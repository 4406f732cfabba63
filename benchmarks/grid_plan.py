"""What a reproduce.py grid holds: its runs, each run's settings and command, whether it is
finished, to resume or fresh, and ``grid.json``, the record of everything asked for so far.
Nothing here starts a process (``reproduce.py`` does)."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suite import (
    AGENTS,
    GRID,
    SUMMARY,
    games_by_agent,
    has_checkpoint,
    preset_fingerprint,
    read_json,
    run_name,
)


@dataclass
class Run:
    agent: str
    game: str
    seed: int
    run_dir: Path

    @property
    def name(self) -> str:
        return self.run_dir.name


def plan(out: Path, agents: list[str], games: list[str], seeds: list[int]) -> list[Run]:
    return [Run(a, g, s, out / run_name(a, g, s)) for a in agents for g in games for s in seeds]


def run_overrides(run: Run, frames: int, extra: list[str]) -> list[str]:
    """The run's settings: its agent's preset and game, seed, budget and where it logs."""
    preset, _ = AGENTS[run.agent]
    return [f"+experiment={preset}", f"env=MinAtar-{run.game}", f"seed={run.seed}",
            f"total_frames={frames}", f"log.dir={run.run_dir.parent}", f"log.name={run.name}",
            *extra]


def finished_summary(run: Run, archive: Path | None) -> Path | None:
    """The ``summary.json`` that says ``run`` finished: its run directory's, else the
    archive's copy; None when neither does."""
    for path in (run.run_dir / SUMMARY, *([archive / run.name / SUMMARY] if archive else [])):
        summary = read_json(path)
        if isinstance(summary, dict) and summary.get("status") == "finished":
            return path
    return None


def state_of(run: Run, archive: Path | None = None) -> str:
    """finished (skip), resume (checkpoints, not finished) or fresh."""
    if finished_summary(run, archive) is not None:
        return "finished"
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
    preset, now = AGENTS[run.agent][0], preset_fingerprint(run.agent)
    if done.get("preset_sha") is not None and done["preset_sha"] != now:
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


def update_grid(out: Path, args: argparse.Namespace) -> None:
    """``<out>/grid.json``: every agent, game and seed asked for so far, and which games
    each agent was asked for, so the report can show runs that never started and no runs
    that were never asked for (also in the archive, when there is one)."""
    grid = read_json(out / GRID) or {}
    planned = games_by_agent(grid)
    for agent in args.agents:
        planned[agent] = list(dict.fromkeys([*planned.get(agent, []), *args.games]))
    for key in ("agents", "games", "seeds"):
        grid[key] = list(dict.fromkeys([*grid.get(key, []), *getattr(args, key)]))
    grid["games_by_agent"] = planned
    grid.update(frames=args.frames, overrides=args.set)
    write_atomic(out / GRID, json.dumps(grid, indent=1) + "\n")
    if args.archive is not None and out != args.archive:
        args.archive.mkdir(parents=True, exist_ok=True)
        update_grid(args.archive, argparse.Namespace(**{**vars(args), "archive": None}))
