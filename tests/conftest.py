"""Fixtures shared by several test files."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from types import FrameType

import psutil
import pytest
import torch

from distrl import ops


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Stop before any test when distrl._C did not load, unless that was asked for.

    Without this, every compiled-path test would skip and the suite would pass on a build
    whose extension is broken (a bad dlopen, an ABI mismatch) or missing. A SIGTERM (a CI
    runner cancelling the job) interrupts the session as Ctrl-C does, so the tests'
    cleanup and the session's child-process check below still run.
    """
    signal.signal(signal.SIGTERM, _interrupt)
    if not ops.has_extension() and not ops.extension_opted_out():
        pytest.exit(
            f"distrl._C did not load: {ops.extension_error()}. Build it with "
            f"`pip install --no-build-isolation -e .`, or set {ops.OPT_OUT}=1 to test "
            f"without the compiled ops (their tests are then skipped).",
            returncode=1,
        )


@pytest.fixture
def intra_op_threads() -> Iterator[Callable[[int], None]]:
    """``torch.set_num_threads`` for one test; the count before it is restored after."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.fixture(autouse=True, scope="session")
def no_orphans_after_the_session() -> Iterator[None]:
    """End any child process a failed or interrupted test left running, naming it.

    Each test that starts processes ends them itself; this only keeps one that did not
    from outliving the session (multiprocessing's own helper processes are left to it).
    """
    yield
    helpers = ("resource_tracker", "forkserver")
    left = [child for child in psutil.Process().children(recursive=True)
            if not any(helper in " ".join(_cmdline(child)) for helper in helpers)]
    for child in left:
        print(f"\nconftest: ending child process {child.pid} left running: "
              f"{' '.join(_cmdline(child))[:200]}")
        child.kill()
    psutil.wait_procs(left, timeout=10)


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:
        return []
