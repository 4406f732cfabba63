"""Atomic, self-verifying checkpoints: save a run's full state, find the newest intact
one, load it back.

A checkpoint is written to a temporary file in the same directory, flushed and fsynced,
then renamed over its final name, so a crash mid-write never leaves a truncated
checkpoint and never touches the ones already there. Its last bytes are a checksum
record, the sha256 and length of the torch payload before it, hashed while ``torch.save``
streams into the file (no second copy of a multi-GB replay in memory). The record lives
in the file rather than in a sidecar so that a checkpoint stays one file: a copy, a
``resume=<file>`` of a moved checkpoint, pruning and directory listings need no partner
file kept in step. ``torch.load`` ignores bytes after the zip archive's end record, so a
checkpoint is still a plain torch file.

:func:`load` checks the record before unpickling and refuses non-finite learner weights;
given a run directory it falls back from a damaged newest checkpoint to the newest
intact one. Verifying only reads: it never renames, rewrites or deletes a file.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import tempfile
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)\.pt$")
CHECKPOINT_PREFIX = "checkpoint"

# "\ndistrl-sha256 <64 hex> bytes <20 digits>\n": fixed length, so it is read from the tail.
_RECORD = re.compile(rb"\ndistrl-sha256 ([0-9a-f]{64}) bytes ([0-9]{20})\n")
RECORD_BYTES = len(b"\ndistrl-sha256 " + b"0" * 64 + b" bytes " + b"0" * 20 + b"\n")
_ZIP_END = b"PK\x05\x06"  # a zip's end-of-central-directory record: 22 bytes, last in the file
_CHUNK = 16 << 20


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read or does not fit the run. ``why`` is the reason alone
    (e.g. "checksum mismatch: the file is damaged"), without the file's name."""

    def __init__(self, message: str, why: str | None = None):
        super().__init__(message)
        self.why = why if why is not None else message


class Checkpoint(dict):
    """A loaded checkpoint's state, and ``path``, the file it was read from."""

    def __init__(self, state: dict[str, Any], path: Path):
        super().__init__(state)
        self.path = path


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


class _HashingWriter:
    """The file torch.save streams into, hashing and counting every byte on the way."""

    def __init__(self, file: BinaryIO):
        self.file = file
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        self.size += memoryview(data).nbytes
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()

    def record(self) -> bytes:
        """The checksum record that ends the file."""
        return b"\ndistrl-sha256 %s bytes %020d\n" % (self.sha256.hexdigest().encode(), self.size)


def save(
    state: dict[str, Any], directory: str | os.PathLike, step: int, keep: int = 2,
    prefix: str = CHECKPOINT_PREFIX,
) -> Path:
    """Atomically write ``directory/<prefix>-<step>.pt`` with its checksum record; keep the
    newest ``keep`` of them (of the same prefix: a replay shard has its own,
    :func:`shard_prefix`)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    final = checkpoint_path(directory, step, prefix)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{prefix}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            writer = _HashingWriter(f)
            torch.save(state, writer)
            f.write(writer.record())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _prune(directory, prefix, final, step, keep)
    return final


def _prune(directory: Path, prefix: str, final: Path, step: int, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints, never ``final`` (just written).

    Checkpoints of a higher step than ``final`` belong to a history this run left: it
    resumed from an older checkpoint, because the newer ones were damaged or because the
    user named the older one. They go first, so that a damaged newest checkpoint is not
    kept while the intact one the run resumed from is deleted (and a later ``resume=<run
    dir>`` does not jump onto the abandoned history); then the oldest."""
    others = [p for p in list_checkpoints(directory, prefix) if p != final]
    ahead = [p for p in others if _step(p) > step]
    behind = [p for p in others if _step(p) <= step]
    for old in (ahead[::-1] + behind)[: max(len(others) - (keep - 1), 0)]:
        old.unlink(missing_ok=True)


def _step(path: Path) -> int:
    return int(path.stem.rsplit("-", 1)[1])


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


def _candidates(path: Path) -> list[Path]:
    """A run directory's checkpoints (in its checkpoints/, else in itself), oldest first."""
    for directory in (path / "checkpoints", path):
        found = list_checkpoints(directory)
        if found:
            return found
    raise CheckpointError(f"resume: no checkpoint-*.pt found in directory '{path}'")


def resolve(path: str | os.PathLike) -> Path:
    """A checkpoint file, or the newest checkpoint of a run directory (or its checkpoints/)
    by name, unverified: :func:`load` is what skips a damaged one."""
    path = Path(path)
    if path.is_dir():
        return _candidates(path)[-1]
    if not path.exists():
        raise CheckpointError(f"resume: checkpoint '{path}' does not exist")
    return path


def verify(path: str | os.PathLike) -> bool:
    """Check a checkpoint file's checksum record against its bytes, without unpickling.

    Returns True when it matches and False for a complete checkpoint written before
    checkpoints carried one; raises CheckpointError (``why``: "checksum mismatch: the file
    is damaged", "truncated or damaged: ...") otherwise."""
    path = Path(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(max(size - RECORD_BYTES, 0))
        tail = f.read()
        match = _RECORD.fullmatch(tail)
        if match is None:
            if len(tail) >= 22 and tail[-22:-18] == _ZIP_END and tail[-2:] == b"\0\0":
                return False
            raise _damaged(path, f"truncated or damaged: {size} bytes and no checksum "
                                 "record at its end")
        expected, payload = match.group(1).decode(), int(match.group(2))
        if size - RECORD_BYTES != payload:
            raise _damaged(path, f"damaged: {size - RECORD_BYTES} bytes before its checksum "
                                 f"record, which says {payload}")
        f.seek(0)
        if _sha256(f, payload) != expected:
            raise _damaged(path, "checksum mismatch: the file is damaged")
    return True


def _sha256(f: BinaryIO, size: int) -> str:
    digest = hashlib.sha256()
    buffer = memoryview(bytearray(min(_CHUNK, max(size, 1))))
    left = size
    while left:
        n = f.readinto(buffer[: min(left, len(buffer))])
        if not n:
            break
        digest.update(buffer[:n])
        left -= n
    return digest.hexdigest()


def _damaged(path: Path, why: str) -> CheckpointError:
    return CheckpointError(f"resume: cannot read checkpoint '{path}': {why}", why)


def first_non_finite(tree: Any, name: str) -> str | None:
    """The dotted name of the first floating tensor in ``tree`` (nested dicts, lists and
    tuples, e.g. a learner's state dict) holding a NaN or an infinity, else None."""
    if isinstance(tree, torch.Tensor):
        floating = tree.is_floating_point() or tree.is_complex()
        return name if floating and not bool(torch.isfinite(tree).all()) else None
    items = (tree.items() if isinstance(tree, dict)
             else enumerate(tree) if isinstance(tree, (list, tuple)) else ())
    for key, value in items:
        found = first_non_finite(value, f"{name}.{key}")
        if found is not None:
            return found
    return None


def _read(path: Path) -> Checkpoint:
    """One checkpoint file: verified, unpickled, a distrl checkpoint, finite weights."""
    try:
        if not verify(path):
            print(f"[distrl] resume: {path} has no checksum (written before distrl wrote "
                  "them); loading it unverified", flush=True)
        state = torch.load(path, map_location="cpu", weights_only=False)
    except CheckpointError:
        raise
    except Exception as error:
        first_line = next(iter(str(error).strip().splitlines()), "")
        raise _damaged(path, f"{type(error).__name__}: {first_line}") from None
    if not isinstance(state, dict) or "format" not in state:
        raise CheckpointError(f"resume: '{path}' is not a distrl checkpoint",
                              "not a distrl checkpoint")
    for key in ("learner", "loss"):  # the model, optimizer and target network
        bad = first_non_finite(state.get(key), key)
        if bad is not None:
            raise CheckpointError(
                f"resume: checkpoint '{path}' holds non-finite weights: {bad} has NaN or inf "
                "(its run had diverged; resume from an earlier checkpoint)",
                f"non-finite weights in {bad}")
    return Checkpoint(state, path)


def load(path: str | os.PathLike) -> Checkpoint:
    """Read the checkpoint ``path`` names, raising CheckpointError on one line if it is
    missing, damaged, truncated, foreign or holds non-finite learner weights.

    A run directory (or its checkpoints/) gives its newest intact checkpoint: each newer
    one that is refused is skipped with a ``[distrl] resume: skipped <file>: <why>`` line,
    then the one resumed from is named; none intact is an error listing every refusal."""
    path = Path(path)
    if not path.is_dir():
        return _read(resolve(path))
    candidates = _candidates(path)
    refused = []
    for candidate in reversed(candidates):
        try:
            state = _read(candidate)
        except CheckpointError as error:
            print(f"[distrl] resume: skipped {candidate}: {error.why}", flush=True)
            refused.append(f"{candidate.name}: {error.why}")
            continue
        if refused:
            print(f"[distrl] resume: resuming from {candidate}, the newest intact checkpoint",
                  flush=True)
        return state
    raise CheckpointError(f"resume: no intact checkpoint in '{candidates[0].parent}': "
                          + "; ".join(refused))


def load_shard(resume: str | os.PathLike, step: int, rank: int) -> Checkpoint:
    """Learner rank ``rank``'s replay shard written with the checkpoint of ``step`` in the
    directory ``resume`` names; a missing, damaged or unreadable shard raises
    CheckpointError naming it."""
    path = checkpoint_path(resolve(resume).parent, step, shard_prefix(rank))
    if not path.exists():
        raise CheckpointError(
            f"resume: learner rank {rank}'s replay shard '{path}' is missing (every rank "
            "writes its own shard beside rank 0's checkpoint; across hosts the run directory "
            "must be on a shared filesystem, or the shards copied there)")
    try:
        return _read(path)
    except CheckpointError as error:
        raise CheckpointError(
            f"resume: learner rank {rank}'s replay shard '{path}' cannot be read: {error.why}",
            error.why) from None
