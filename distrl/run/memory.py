"""Memory a run's sizes ask for: the machine's available memory, a check that a
preallocated structure fits in it when full, and allocation failures turned into one
error that names the setting which sized the allocation.

Available memory is ``MemAvailable`` from ``/proc/meminfo`` (what can be used without
swapping), not what the kernel lets a process reserve: torch reserves large tensors
lazily, so a replay larger than the free memory starts and is killed as it fills.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from distrl.validation import ConfigError

MEMINFO = Path("/proc/meminfo")
# What torch's and the OS's allocators say when memory (or /dev/shm, for shared slots)
# runs out; any other RuntimeError is not an allocation failure and passes through.
ALLOCATION_FAILURES = ("can't allocate memory", "cannot allocate memory", "out of memory",
                       "no space left on device")


def available_bytes(meminfo: Path = MEMINFO) -> int | None:
    """``MemAvailable`` in bytes, or None where the file or the line does not exist."""
    try:
        lines = meminfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("MemAvailable:"):
            value, unit = line.split()[1:3]
            if unit != "kB":
                raise ValueError(f"{meminfo}: MemAvailable in {unit!r}, expected kB")
            return int(value) * 1024
    return None


def format_bytes(nbytes: float) -> str:
    """``28.3 GiB``, ``512.0 MiB``: one decimal, binary units."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{int(nbytes)} B"


def round_down(value: int, digits: int = 3) -> int:
    """``value`` rounded down to ``digits`` significant digits (1_537_412 -> 1_530_000)."""
    if value < 10**digits:
        return value
    scale = 10 ** (len(str(value)) - digits)
    return value // scale * scale


def largest_that_fits(nbytes_for: Callable[[int], int], limit: int, budget: int) -> int:
    """The largest ``n <= limit`` with ``nbytes_for(n) <= budget`` (0 if not even 1 fits);
    ``nbytes_for`` must not decrease as ``n`` grows."""
    low, high = 0, limit
    while low < high:
        middle = (low + high + 1) // 2
        if nbytes_for(middle) <= budget:
            low = middle
        else:
            high = middle - 1
    return low


def check_fits(setting: str, value: int, nbytes_for: Callable[[int], int],
               available: int | None, what: str = "capacity") -> None:
    """Raise ConfigError when ``nbytes_for(value)`` (the bytes the structure ``setting``
    sizes holds when full) exceed ``available``, naming the largest value that fits
    (rounded down to 3 significant digits). ``available`` None: nothing to check against."""
    if available is None:
        return
    needed = nbytes_for(value)
    if needed <= available:
        return
    fits = round_down(largest_that_fits(nbytes_for, value, available))
    advice = (f"the largest {what} that fits is {fits}" if fits >= 1
              else f"not even a {what} of 1 fits")
    raise ConfigError(f"{setting}={value} needs {format_bytes(needed)} when full but this "
                      f"machine has {format_bytes(available)} available; {advice}")


def is_allocation_failure(error: BaseException) -> bool:
    """A MemoryError, or a RuntimeError in which an allocator says memory ran out."""
    if isinstance(error, MemoryError):
        return True
    return isinstance(error, RuntimeError) and any(
        phrase in str(error).lower() for phrase in ALLOCATION_FAILURES)


@contextlib.contextmanager
def allocating(what: str, sizing: str, nbytes: int, remedy: str) -> Iterator[None]:
    """Refuse, before allocating, ``nbytes`` that exceed the available memory, and turn an
    allocation failure inside into the same ConfigError:
    ``out of memory allocating {what} ({sizing} = {nbytes}...); {remedy}``."""
    available = available_bytes()
    if available is not None and nbytes > available:
        raise ConfigError(f"out of memory allocating {what} ({sizing} = {format_bytes(nbytes)}"
                          f", but this machine has {format_bytes(available)} available); "
                          f"{remedy}")
    try:
        yield
    except (MemoryError, RuntimeError) as error:
        if not is_allocation_failure(error):
            raise
        raise ConfigError(f"out of memory allocating {what} ({sizing} = "
                          f"{format_bytes(nbytes)}); {remedy}") from error


def slots_nbytes(specs: Mapping[str, Any], num_slots: int) -> int:
    """Bytes of a slot pool: ``num_slots`` times each field's ``spec.shape`` of
    ``spec.dtype`` (:class:`distrl.transport.queues.FieldSpec`)."""
    return num_slots * sum(math.prod(spec.shape) * spec.dtype.itemsize
                           for spec in specs.values())
