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
CHECKPOINT_PREFIX = "checkpoint"


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


def shard_prefix(rank: int) -> str:
    """The file prefix of learner rank ``rank``'s replay shard (torchrun runs)."""
    return f"replay-rank{rank}"


def checkpoint_path(directory: str | os.PathLike, step: int,
                    prefix: str = CHECKPOINT_PREFIX) -> Path:
    """``directory/<prefix>-<step>.pt``, the name :func:`save` writes."""
    return Path(directory) / f"{prefix}-{step:012d}.pt"


def save(
    state: dict[str, Any], directory: str | os.PathLike, step: int, keep: int = 2,
    prefix: str = CHECKPOINT_PREFIX,
) -> Path:
    """Atomically write ``directory/<prefix>-<step>.pt``; keep the newest ``keep`` of them
    (of the same prefix: a replay shard has its own, :func:`shard_prefix`)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(directory, step, prefix)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{prefix}-", suffix=".tmp")
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
    others = [p for p in list_checkpoints(directory, prefix) if p != final]
    for old in others[: max(len(others) - (keep - 1), 0)]:
        old.unlink(missing_ok=True)
    return final


def list_checkpoints(directory: str | os.PathLike, prefix: str = CHECKPOINT_PREFIX
                     ) -> list[Path]:
    """Checkpoints (or files of another ``prefix``) in ``directory``, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    pattern = (CHECKPOINT_PATTERN if prefix == CHECKPOINT_PREFIX
               else re.compile(rf"^{re.escape(prefix)}-(\d+)\.pt$"))
    found = [p for p in directory.iterdir() if pattern.match(p.name)]
    return sorted(found, key=lambda p: int(pattern.match(p.name).group(1)))


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


def load_shard(resume: str | os.PathLike, step: int, rank: int) -> dict[str, Any]:
    """Learner rank ``rank``'s replay shard written with the checkpoint of ``step`` that
    ``resume`` resolves to; a missing or unreadable shard raises CheckpointError."""
    path = checkpoint_path(resolve(resume).parent, step, shard_prefix(rank))
    if not path.exists():
        raise CheckpointError(
            f"resume: learner rank {rank}'s replay shard '{path}' is missing (every rank "
            "writes its own shard beside rank 0's checkpoint; across hosts the run directory "
            "must be on a shared filesystem, or the shards copied there)")
    return load(path)
