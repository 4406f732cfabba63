"""Shared-memory slot pool: preallocated experience buffers plus free/full index queues.

Actors fill a slot in place and pass only its index through ``full``; the learner
reads a batch of slots and hands their indices back through ``free`` (the
TorchBeast/Sample Factory pattern). Every wait is timed so a run can tell whether
it is sampling-bound or learning-bound.
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass
from typing import Any

import torch


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
    """``num_slots`` preallocated buffers per field, and the queues that pass their indices.

    Args:
        specs: field name -> FieldSpec; each buffer is ``[num_slots, *spec.shape]``.
        num_slots: how many slots exist; all start free.
        mp_context: a ``torch.multiprocessing`` context to share the slots with child
            processes, or None for one process (serial mode, plain queues).
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
        if mp_context is not None:
            for buffer in self.buffers.values():
                buffer.share_memory_()
            self.free: Any = mp_context.Queue()
            self.full: Any = mp_context.Queue()
        else:
            self.free = queue.Queue()
            self.full = queue.Queue()
        for index in range(num_slots):
            self.free.put(index)

    def acquire(self, timeout: float | None = None) -> tuple[int, float]:
        """Actor side: take a free slot index. Returns (index, seconds waited)."""
        start = time.perf_counter()
        index = self.free.get(timeout=timeout)
        return index, time.perf_counter() - start

    def commit(self, index: int) -> None:
        """Actor side: the slot is completely written; hand it to the learner."""
        self.full.put(index)

    def take(self, count: int, timeout: float | None = None) -> tuple[list[int], float]:
        """Learner side: take ``count`` full slot indices. Returns (indices, seconds waited)."""
        start = time.perf_counter()
        indices = [self.full.get(timeout=timeout) for _ in range(count)]
        return indices, time.perf_counter() - start

    def release(self, indices: list[int]) -> None:
        """Learner side: the slots' contents were copied out; actors may reuse them."""
        for index in indices:
            self.free.put(index)

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
