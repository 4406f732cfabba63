"""Atomic checkpoints: save a run's full state, find the newest one, load it back.

A checkpoint is written to a temporary file in the same directory, flushed and
fsynced, then renamed over its final name, so a crash mid-write never leaves a
truncated checkpoint and never touches the ones already there.
"""

from __future__ import annotations

import os
import random
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read or does not fit the run."""


def rng_state() -> dict[str, Any]:
    """The random-number generator states that make a resumed run continue the same streams."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore the states returned by :func:`rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save(
    state: dict[str, Any], directory: str | os.PathLike, step: int, keep: int = 2
) -> Path:
    """Atomically write ``directory/checkpoint-<step>.pt``; keep the newest ``keep`` of them."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"checkpoint-{step:012d}.pt"
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".checkpoint-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    # Prune by step among the others, never the file just written: a run resumed from an
    # older checkpoint writes lower steps than the newest ones already there.
    others = [p for p in list_checkpoints(directory) if p != final]
    for old in others[: max(len(others) - (keep - 1), 0)]:
        old.unlink(missing_ok=True)
    return final


def list_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """Checkpoints in ``directory``, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if CHECKPOINT_PATTERN.match(p.name)]
    return sorted(found, key=lambda p: int(CHECKPOINT_PATTERN.match(p.name).group(1)))


def resolve(path: str | os.PathLike) -> Path:
    """A checkpoint file, or the newest checkpoint of a run directory (or its checkpoints/)."""
    path = Path(path)
    if path.is_dir():
        for directory in (path / "checkpoints", path):
            found = list_checkpoints(directory)
            if found:
                return found[-1]
        raise CheckpointError(f"resume: no checkpoint-*.pt found in directory '{path}'")
    if not path.exists():
        raise CheckpointError(f"resume: checkpoint '{path}' does not exist")
    return path


def load(path: str | os.PathLike) -> dict[str, Any]:
    """Read a checkpoint; a missing, truncated or foreign file raises CheckpointError."""
    path = resolve(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:
        raise CheckpointError(
            f"resume: cannot read checkpoint '{path}' ({type(error).__name__}: {error})"
        ) from None
    if not isinstance(state, dict) or "format" not in state:
        raise CheckpointError(f"resume: '{path}' is not a distrl checkpoint")
    return state
