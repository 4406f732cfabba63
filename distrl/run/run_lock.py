"""One owner per run directory: an exclusive ``flock`` on ``<run dir>/distrl.lock``.

The lock is held on an open file descriptor, so the kernel drops it when its process
dies, even by SIGKILL: a lock file left behind by a dead run does not block the next
one, which takes it over. The file holds the owner's pid, host, start time and command
line, for the message that refuses a second run. Releasing deletes the file (and the
directories taking it created, when they are still empty).
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path
from types import TracebackType

from distrl.validation import ConfigError

LOCK_NAME = "distrl.lock"
_OWNER_WRITE_WAIT_S = 1.0  # an owner writes its details right after taking the lock


class RunLock:
    """Exclusive ownership of a run directory, from :func:`take` until :meth:`release`
    (also a context manager)."""

    def __init__(self, path: Path, fd: int, created: list[Path]):
        self.path = path
        self._fd: int | None = fd
        self._created = created  # directories made for the lock, deepest first

    @property
    def held(self) -> bool:
        """Whether this object still holds the lock (:meth:`release` not yet called)."""
        return self._fd is not None

    def release(self) -> None:
        """Delete the lock file, then drop the lock; a second call does nothing."""
        if self._fd is None:
            return
        # Unlinked while still held: a run that opened this file meanwhile sees, once it
        # gets the lock, that the name points elsewhere and opens it again (see take).
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None
        _remove_empty(self._created)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.release()


def owner_details() -> dict[str, object]:
    """This process as the lock file records it."""
    return {
        "pid": os.getpid(), "host": socket.gethostname(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
    }


def take(run_dir: str | os.PathLike, field: str = "log.name") -> RunLock:
    """Lock ``run_dir`` (made if missing) for this process, or raise ConfigError naming
    ``field`` and the pid, host, start time and command line of the run that holds it."""
    run_dir = Path(run_dir)
    path = run_dir / LOCK_NAME
    while True:
        created = [p for p in (run_dir, *run_dir.parents) if not p.exists()]
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as error:
            raise ConfigError(f"{field}: cannot create the lock file '{path}' "
                              f"({type(error).__name__}: {error.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_owner(fd)
            os.close(fd)
            _remove_empty(created)
            advice = " or choose another log.name" if field == "log.name" else ""
            raise ConfigError(
                f"{field}: run directory '{run_dir}' is in use by pid {owner['pid']} on "
                f"{owner['host']} since {owner['since']} ({owner['command']}); wait for it to "
                f"end{advice}") from None
        if _names(path, fd):
            break
        # The owner released (and deleted) the file between our open and our lock: the
        # lock we hold is on a file no other run will open. Start again.
        os.close(fd)
    lock = RunLock(path, fd, created)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(owner_details()).encode() + b"\n", 0)
    except BaseException:
        lock.release()
        raise
    return lock


def _remove_empty(directories: list[Path]) -> None:
    """Remove ``directories`` (deepest first) up to the first that is not empty."""
    for directory in directories:
        try:
            directory.rmdir()
        except OSError:  # the run wrote into it, or another run made it its own
            return


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        here = path.stat()
    except FileNotFoundError:
        return False
    there = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _read_owner(fd: int) -> dict[str, str]:
    """The owner's details from the lock file (``?`` for what it has not written yet)."""
    deadline = time.monotonic() + _OWNER_WRITE_WAIT_S
    while True:
        try:
            owner = json.loads(os.pread(fd, 1 << 16, 0))
            if isinstance(owner, dict):
                return {key: str(owner.get(key, "?")).replace("\n", "\\n")
                        for key in ("pid", "host", "since", "command")}
        except ValueError:
            pass
        if time.monotonic() > deadline:
            return {key: "?" for key in ("pid", "host", "since", "command")}
        time.sleep(0.05)
