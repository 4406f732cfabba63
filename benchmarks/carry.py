"""Carry a stopped run to another machine through the archive: its newest checkpoint and its
event files, xz-compressed into ``<archive>/<run>/carry/``, and back into an empty run
directory there.

A long Atari run outlives the machine it started on (a session, an allocation), and its run
directory is too large to commit. What a resume needs is much smaller: the newest
checkpoint (weights, optimizer state, counters, random streams; no replay, which
``checkpoint.replay`` keeps out of the checkpoint file), the event files that hold its curve
so far, and its attempt records. ``reproduce.py --archive`` writes them here each time a run
stops and, on a machine whose run directory has no checkpoint, puts them back before it
resumes the run, so the run continues from where it stopped, as on the machine that ran it.
A finished run's carry is deleted; the archive keeps its ``summary.json`` and, in a suite
that keeps episodes (Atari's, runs of hours), its ``episodes.csv`` and its event files,
xz-compressed in ``<archive>/<run>/events/`` (``keep_events``), so its tensorboard record
(learner figures, throughput: ``rates.py`` reads them there) outlives the machine;
``xz -dk`` unpacks them for tensorboard. Until then the carry's own ``episodes.csv``
is the run's curve so far, which ``report.py`` shows as an unfinished run's.

``carry.json`` names each file with the sha256 and size of its uncompressed bytes; a restore
that does not match them is refused, and the run directory is left as it was. A checkpoint
is stored in byte planes (``byte_planes`` in its entry): in each MiB, the first bytes of
every 4-byte word, then the second ones, and so on, so that float32 exponents sit beside
each other; xz packs that ~8% smaller than the words in place (Ape-X's Pong checkpoint:
52.8 MB to 44.2 MB, against 47.9 MB), which matters because a push holds a replaced carry's
old bytes and its new ones. ``python benchmarks/carry.py repack <archive>/<run>`` rewrites a
carry saved before that in byte planes, with the same bytes once restored. A checkpoint
over ``LIMIT_BYTES`` (a replay buffer saved with ``checkpoint.replay=true`` makes GBs) is not
carried: that run resumes only where its run directory is.
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from attempt_record import write_episodes
from curve import Episodes
from suite import (
    ATTEMPTS,
    CARRY,
    EPISODES,
    KEPT_EVENTS,
    event_files,
    newest_checkpoint,
    read_attempts,
)
from suite import CARRY_MANIFEST as MANIFEST

LIMIT_BYTES = 256 << 20
_PRESET = 6  # xz's default level: 8 MB of IMPALA checkpoint in ~3 s, to ~60% of its size
_CHUNK = 1 << 20


_WORD = 4  # float32, the bulk of every checkpoint


def _to_planes(chunk: bytes) -> bytes:
    """``chunk``'s whole 4-byte words as byte planes (every word's byte 0, then byte 1, ...),
    any tail shorter than a word after them as it is."""
    whole = len(chunk) - len(chunk) % _WORD
    words = np.frombuffer(chunk, np.uint8, whole).reshape(-1, _WORD)
    return words.T.tobytes() + chunk[whole:]


def _from_planes(chunk: bytes) -> bytes:
    """The inverse of ``_to_planes`` for a chunk of the same length."""
    whole = len(chunk) - len(chunk) % _WORD
    planes = np.frombuffer(chunk, np.uint8, whole).reshape(_WORD, -1)
    return planes.T.tobytes() + chunk[whole:]


def _compress(source: Path, target: Path, byte_planes: bool = False) -> dict[str, Any]:
    digest, size = hashlib.sha256(), 0
    with open(source, "rb") as raw, lzma.open(target, "wb", preset=_PRESET) as packed:
        while chunk := raw.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
            packed.write(_to_planes(chunk) if byte_planes else chunk)
    entry = {"sha256": digest.hexdigest(), "bytes": size, "stored_bytes": target.stat().st_size}
    if byte_planes:  # the chunk length is part of the layout: a restore reads the same
        entry["byte_planes"] = _CHUNK
    return entry


def _decompress(source: Path, target: Path, expected: dict[str, Any]) -> None:
    digest, size = hashlib.sha256(), 0
    planes_chunk = expected.get("byte_planes")
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        with lzma.open(source, "rb") as packed, open(tmp, "wb") as raw:
            while chunk := packed.read(planes_chunk or _CHUNK):
                if planes_chunk:
                    chunk = _from_planes(chunk)
                digest.update(chunk)
                size += len(chunk)
                raw.write(chunk)
    except (lzma.LZMAError, EOFError) as error:
        tmp.unlink(missing_ok=True)
        raise CarryError(f"{source}: not a whole xz file ({error})") from error
    if (digest.hexdigest(), size) != (expected["sha256"], expected["bytes"]):
        tmp.unlink()
        raise CarryError(f"{source}: {size} bytes with sha256 {digest.hexdigest()[:12]}..., "
                         f"where {MANIFEST} says {expected['bytes']} bytes, "
                         f"{expected['sha256'][:12]}...")
    os.replace(tmp, target)


class CarryError(RuntimeError):
    """A carry that cannot be restored (damaged or incomplete)."""


def save(run_dir: Path, archive_run: Path, frames: int | None,
         episodes: Episodes | None = None, epsilons: np.ndarray | None = None) -> str:
    """Write ``run_dir``'s newest checkpoint, event files and attempt records to
    ``archive_run/carry/`` (replacing the carry there only once the new one is whole), and
    ``episodes`` as ``episodes.csv`` with their ``epsilons`` where given (read without
    decompressing: the report's curve of a run in progress); returns a line saying what
    was carried, or why nothing was."""
    checkpoint = newest_checkpoint(run_dir)
    if checkpoint is None:
        return "nothing to carry: no checkpoint"
    if checkpoint.stat().st_size > LIMIT_BYTES:
        return (f"not carried: {checkpoint.name} is {checkpoint.stat().st_size / 2**20:.0f} "
                f"MiB (over {LIMIT_BYTES >> 20} MiB, a replay inside?); it resumes only "
                f"from {run_dir}")
    archive_run.mkdir(parents=True, exist_ok=True)
    tmp = archive_run / f".{CARRY}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    files = {f"checkpoints/{checkpoint.name}":
             _compress(checkpoint, tmp / f"{checkpoint.name}.xz", byte_planes=True)}
    for events in event_files(run_dir):
        files[events.name] = _compress(events, tmp / f"{events.name}.xz")
    if (run_dir / ATTEMPTS).exists():
        shutil.copyfile(run_dir / ATTEMPTS, tmp / ATTEMPTS)
    if episodes is not None:
        write_episodes(tmp / EPISODES, episodes, epsilons)
    manifest = {"checkpoint": f"checkpoints/{checkpoint.name}", "frames": frames,
                "saved": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "files": files}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    final = _put_in_place(tmp, archive_run)
    stored = sum(f["stored_bytes"] for f in files.values())
    return f"carried to {final} ({len(files)} files, {stored / 2**20:.1f} MiB)"


def _put_in_place(whole: Path, archive_run: Path) -> Path:
    """Make the finished carry ``whole`` the run's carry, the one before it kept until then."""
    final = archive_run / CARRY
    old = archive_run / f".{CARRY}.old"
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    whole.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def repack(archive_run: Path) -> str:
    """Rewrite the carry in ``archive_run`` with its checkpoint in byte planes, checked
    against the manifest's sha256 on the way; the carry in place stays until the new one is
    whole. Returns a line saying what changed."""
    carry = archive_run / CARRY
    try:
        manifest = json.loads((carry / MANIFEST).read_text())
    except (OSError, ValueError) as error:
        raise CarryError(f"{carry}: no readable {MANIFEST} ({error})") from error
    name = manifest["checkpoint"]
    entry = manifest["files"][name]
    if entry.get("byte_planes"):
        return f"{carry}: {Path(name).name} is in byte planes already"
    packed = f"{Path(name).name}.xz"
    tmp = archive_run / f".{CARRY}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(carry, tmp)
    try:
        with tempfile.TemporaryDirectory(dir=archive_run) as scratch:
            raw = Path(scratch) / Path(name).name
            _decompress(carry / packed, raw, entry)
            manifest["files"][name] = _compress(raw, tmp / packed, byte_planes=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    _put_in_place(tmp, archive_run)
    return (f"{carry}: {Path(name).name} repacked in byte planes, "
            f"{entry['stored_bytes'] / 2**20:.1f} -> "
            f"{manifest['files'][name]['stored_bytes'] / 2**20:.1f} MiB")


def restore(archive_run: Path, run_dir: Path) -> str | None:
    """Put ``archive_run``'s carry into ``run_dir``, which must hold no checkpoint; returns a
    line saying what was restored, None when there is no carry. Raises CarryError (run_dir
    unchanged but for temporary files removed) when a file does not match the manifest."""
    carry = archive_run / CARRY
    try:
        manifest = json.loads((carry / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if newest_checkpoint(run_dir) is not None:
        raise CarryError(f"{run_dir} already holds checkpoints; its carry is not restored")
    staging = run_dir / f".{CARRY}.restore"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        for name, expected in manifest["files"].items():
            source = carry / f"{Path(name).name}.xz"
            if not source.exists():
                raise CarryError(f"{source} is missing (named in {carry / MANIFEST})")
            _decompress(source, staging / Path(name).name, expected)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    (run_dir / "checkpoints").mkdir(exist_ok=True)
    for name in manifest["files"]:
        os.replace(staging / Path(name).name, run_dir / name)
    staging.rmdir()
    if (carry / ATTEMPTS).exists():  # the carried attempts first, then any made here
        here = (run_dir / ATTEMPTS).read_text() if (run_dir / ATTEMPTS).exists() else ""
        (run_dir / ATTEMPTS).write_text((carry / ATTEMPTS).read_text() + here)
    return (f"restored {manifest['checkpoint']} ({manifest.get('frames') or '?'} frames, "
            f"carried {manifest.get('saved')}) and {len(manifest['files']) - 1} event "
            f"file(s) from {carry}")


def carried_attempts(archive_run: Path) -> int | None:
    """How many attempts the carry in ``archive_run`` records; None when it has no carry."""
    carry = archive_run / CARRY
    if not (carry / MANIFEST).exists():
        return None
    return len(read_attempts(carry))


def discard(archive_run: Path) -> bool:
    """Delete a finished run's carry; whether there was one."""
    carry = archive_run / CARRY
    if not carry.exists():
        return False
    shutil.rmtree(carry)
    return True


def keep_events(run_dir: Path, archive_run: Path) -> str:
    """For a finished run: its event files, xz-compressed, into ``archive_run/events/``
    (replacing those there only once the new ones are whole: a run's directory holds every
    attempt's, restored ones too), then its carry deleted. Returns a line saying so."""
    events = event_files(run_dir)
    kept = archive_run / KEPT_EVENTS
    if events:
        tmp = archive_run / f".{KEPT_EVENTS}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for path in events:
            _compress(path, tmp / f"{path.name}.xz")
        shutil.rmtree(kept, ignore_errors=True)
        tmp.rename(kept)
    stored = sum(path.stat().st_size for path in kept.glob("*.xz")) if kept.exists() else 0
    carried = discard(archive_run)
    line = (f"{len(events)} event file(s) kept in {kept} ({stored / 2**20:.1f} MiB)" if events
            else "no event files to keep")
    return line + (", its carry deleted" if carried else "")


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Repack carries saved before byte planes.")
    parser.add_argument("command", choices=["repack"])
    parser.add_argument("runs", nargs="+", type=Path, help="<archive>/<run> directories")
    args = parser.parse_args(argv)
    for archive_run in args.runs:
        try:
            print(repack(archive_run), flush=True)
        except CarryError as error:
            print(f"carry: {error}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
