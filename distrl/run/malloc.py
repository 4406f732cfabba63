"""Keep freed memory in the learner process for reuse (glibc's malloc settings).

A CPU learner allocates the same large temporaries in every update: on Pong, IMPALA's
batch of 32 x 21 frames becomes a 77 MB float tensor, and each 17 MB activation has a
gradient of the same size. glibc hands out blocks above its mmap threshold (32 MiB at most)
as fresh mappings and gives freed memory at the top of its heap back to the system, so
every update touches new pages and takes a page fault for each 4 KiB of them. On one core
that was about a fifth of a Pong IMPALA update (docs/notes/2026-11-26.md).

:func:`keep_freed_memory` turns both off (``M_MMAP_MAX`` 0: every block comes from the heap;
``M_TRIM_THRESHOLD`` 2 GiB: freed memory stays there), so an update reuses the previous
one's pages. The cost is memory: what the process freed is not returned to the system,
so its resident size stays at its high-water mark. ``distributed.keep_freed_memory``
(default true) applies it (:func:`apply`) in each learner process before auto sizing
measures the learner's cost, so the measurement sees the update the run will make. It
lasts for the life of the process: a later run in the same process (a test session,
``benchmarks/fps.py --vs``) with the setting false does not undo it, so compare the two in
separate processes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

# mallopt parameters (glibc malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
TRIM_THRESHOLD = 2**31 - 1  # bytes of free heap top kept before trimming: an int's maximum


def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (it has ``gnu_get_libc_version``), else None."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt") else None


@functools.cache
def keep_freed_memory() -> str:
    """Set glibc's malloc to serve every block from its heap and keep what is freed there;
    returns what it did, for the run's start-up line. Elsewhere (macOS, musl) nothing is
    changed and the line says so. Done once per process: the runners call it before
    sizing and the learner rank again for the line, which then only reads the result."""
    libc = _glibc()
    if libc is None:
        return "malloc=system (not glibc: keep_freed_memory does not apply)"
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    if not (libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return "malloc=system (glibc refused mallopt)"
    return "malloc=keep_freed"


def apply(keep: bool) -> str:
    """``distributed.keep_freed_memory``: :func:`keep_freed_memory` where true; returns the
    start-up line's word on it."""
    return keep_freed_memory() if keep else "malloc=system"
