"""Shared-memory slot pool: preallocated experience buffers and a state flag per slot.

Actors fill a slot in place and flip its flag; the learner reads a batch of slots and
flips them back (the TorchBeast/Sample Factory pattern, with flags instead of index
queues). Only flags, commit stamps and semaphores cross processes, never a
``multiprocessing.Queue``: a producer SIGKILLed while it held a queue's lock would
block every other producer for good. Producers claim a free slot under a file lock
(``flock``), which the kernel releases when its holder dies, and record themselves as
the slot's writer, so once a producer is dead the supervisor hands its half-written
slots back (:meth:`SlotPool.reclaim`); the unrolls it had committed stay valid. Every
wait is timed so a run can tell whether it is sampling-bound or learning-bound.
"""

from __future__ import annotations

import fcntl
import os
import queue
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

import torch

FREE, WRITING, FULL, TAKEN = 0, 1, 2, 3  # a slot's state: who may touch it now
POLL_S = 0.1  # a waiter re-reads the flags at least this often (a wakeup may go to another)


@dataclass(frozen=True)
class FieldSpec:
    """Shape (without the slot dimension) and dtype of one per-slot buffer.

    ``time_major`` buffers are ``[T, E, ...]`` per slot; the others are ``[E, ...]``
    (one value per column, e.g. the recurrent state an unroll starts from).
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    time_major: bool = True


def sentinel_for(dtype: torch.dtype) -> float | int | bool:
    """The value fresh slots are filled with, so a half-written slot shows."""
    if dtype.is_floating_point:
        return float("nan")
    if dtype == torch.bool:
        return False
    if dtype == torch.uint8:
        return 255
    return -1


class SlotPool:
    """``num_slots`` preallocated buffers per field, and the flags that hand them over.

    A slot goes FREE -> WRITING (a producer acquired it) -> FULL (committed, stamped with
    the commit time) -> TAKEN (the learner took it, oldest first) -> FREE (released).
    Producers claim slots under a lock; every other transition is made by one side only,
    and a flag is written after the data it announces. Semaphores only wake the waiting
    side; a waiter always re-reads the flags.

    Args:
        specs: field name -> FieldSpec; each buffer is ``[num_slots, *spec.shape]``.
        num_slots: how many slots exist; all start free.
        mp_context: a ``torch.multiprocessing`` context to share the slots with child
            processes, or None for one process.
    """

    def __init__(self, specs: dict[str, FieldSpec], num_slots: int, mp_context: Any = None):
        if num_slots <= 0:
            raise ValueError(f"num_slots must be positive, got {num_slots}")
        self.specs = dict(specs)
        self.num_slots = num_slots
        self.mp_context = mp_context
        self.buffers = {
            name: torch.full((num_slots, *spec.shape), sentinel_for(spec.dtype), dtype=spec.dtype)
            for name, spec in self.specs.items()
        }
        self.state = torch.full((num_slots,), FREE, dtype=torch.int32)
        self.writer = torch.full((num_slots,), -1, dtype=torch.int32)  # who holds it WRITING
        self.stamp = torch.zeros(num_slots, dtype=torch.int64)  # commit time, ns
        self.lock_path: str | None = None
        if mp_context is not None:
            for tensor in (*self.buffers.values(), self.state, self.writer, self.stamp):
                tensor.share_memory_()
            self.filled: Any = mp_context.Semaphore(0)
            self.freed: Any = mp_context.Semaphore(0)
            fd, self.lock_path = tempfile.mkstemp(prefix="distrl-slots-", suffix=".lock")
            os.close(fd)
            weakref.finalize(self, _remove, self.lock_path)
        else:
            self.filled = threading.Semaphore(0)
            self.freed = threading.Semaphore(0)
        self._open_lock()

    def _open_lock(self) -> None:
        self._lock = threading.Lock()  # threads of this process
        self._lock_fd = os.open(self.lock_path, os.O_RDWR) if self.lock_path else None
        if self._lock_fd is not None:
            weakref.finalize(self, os.close, self._lock_fd)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_lock"], state["_lock_fd"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._open_lock()

    def _claim(self, producer: int) -> int | None:
        """Under both locks: mark the first free slot as ``producer``'s, or None."""
        with self._lock:
            if self._lock_fd is not None:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                free = torch.nonzero(self.state == FREE).flatten()
                if not free.numel():
                    return None
                index = int(free[0])
                self.writer[index] = producer
                self.state[index] = WRITING
                return index
            finally:
                if self._lock_fd is not None:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def acquire(self, timeout: float | None = None, producer: int = -1) -> tuple[int, float]:
        """Producer side: take a free slot. ``producer`` (an actor process's id; -1 for a
        thread of the learner's process) is recorded so :meth:`reclaim` can find the slot.
        Returns (index, seconds waited); raises ``queue.Empty`` after ``timeout`` s."""
        start = time.perf_counter()
        deadline = None if timeout is None else start + timeout
        woken = 0  # wakeups this call consumed while waiting
        while True:
            index = self._claim(producer)
            if index is not None:
                if not woken:  # consume the slot's wakeup, so the count stays bounded
                    self.freed.acquire(False)
                return index, time.perf_counter() - start
            left = None if deadline is None else deadline - time.perf_counter()
            if left is not None and left <= 0:
                raise queue.Empty
            woken += self.freed.acquire(True, POLL_S if left is None else min(left, POLL_S))

    def commit(self, index: int) -> None:
        """Producer side: the slot is completely written; hand it to the learner."""
        self.stamp[index] = time.monotonic_ns()
        self.state[index] = FULL  # last: the learner reads nothing before this flag
        self.filled.release()

    def full_count(self) -> int:
        """Committed slots the learner has not taken yet."""
        return int((self.state == FULL).sum())

    def free_count(self) -> int:
        """Slots that no producer and not the learner hold."""
        return int((self.state == FREE).sum())

    def take(self, count: int, timeout: float | None = None) -> tuple[list[int], float]:
        """Learner side: the ``count`` oldest committed slots, in commit order. Returns
        (indices, seconds waited); raises ``queue.Empty`` after ``timeout`` seconds (then
        nothing is taken)."""
        start = time.perf_counter()
        deadline = None if timeout is None else start + timeout
        woken = 0  # commits' wakeups this call consumed while waiting
        while True:
            full = torch.nonzero(self.state == FULL).flatten()
            if full.numel() >= count:
                oldest = full[torch.argsort(self.stamp[full], stable=True)[:count]]
                self.state[oldest] = TAKEN
                for _ in range(count - woken):  # one wakeup per slot taken, no more
                    self.filled.acquire(False)
                return oldest.tolist(), time.perf_counter() - start
            left = None if deadline is None else deadline - time.perf_counter()
            if left is not None and left <= 0:
                raise queue.Empty
            woken += self.filled.acquire(True, POLL_S if left is None else min(left, POLL_S))

    def release(self, indices: list[int]) -> None:
        """Learner side (or a producer dropping a half-written unroll): the slots may be
        written again."""
        for index in indices:
            self.writer[index] = -1
            self.state[index] = FREE
            self.freed.release()

    def reclaim(self, producer: int) -> int:
        """Hand back the slots a dead producer was writing (never committed), so nothing
        leaks and the learner never sees them; its committed slots stay for the learner.
        Call only once that producer's process has exited. Returns how many it dropped."""
        writing = torch.nonzero((self.state == WRITING) & (self.writer == producer)).flatten()
        self.release(writing.tolist())
        return int(writing.numel())

    def gather(self, indices: list[int]) -> dict[str, torch.Tensor]:
        """Copy the given slots out, concatenated along the batch dimension.

        Time-major buffers are ``[T, E, ...]`` per slot (E columns each) and come back as
        ``[T, K * E, ...]`` for K slots; per-column buffers ``[E, ...]`` as ``[K * E, ...]``.
        The result is a copy, so the slots may be released right after.
        """
        index = torch.tensor(indices, dtype=torch.long)
        out = {}
        for name, buffer in self.buffers.items():
            picked = buffer.index_select(0, index)
            if self.specs[name].time_major:
                k, t, e = picked.shape[:3]
                picked = picked.transpose(0, 1).reshape(t, k * e, *picked.shape[3:])
            else:
                picked = picked.flatten(0, 1)
            out[name] = picked
        return out


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
