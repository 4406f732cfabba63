"""Preallocated FIFO storage of n-step transitions, each observation frame stored once.

An Atari transition stored naively is two 4x84x84 stacks (s_t and s_{t+n}): 56 KB.
Here frames live in one ring and transitions hold the ids of their frames, so a stored
transition costs about one 84x84 frame plus a few ids (Horgan et al. 2018 keep 2M
transitions per replay; at 56 KB each that would be 112 GB).

Two rings, both filled in arrival order:

- frames ``[frame_capacity, *frame_shape]``: frame id ``f`` (counted from 0 over the whole
  run) sits in row ``f % frame_capacity``;
- transitions ``[capacity]``: transition id ``k`` sits in slot ``k % capacity`` and holds
  the ids of the frames of its two observations.

Ids only grow, so "was this overwritten?" is a comparison with the number written. A
transition leaves (FIFO) when its slot is reused or when any frame of the batch it came
in is overwritten; whole batches leave at once (a batch is a few hundred transitions of
the two million). :meth:`add` returns the ids that left, so a sampler can stop drawing
them before it could ever hand out a transition whose frames are gone.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, Optional

import torch

from distrl.types import SampleBatch, TransitionBatch
from distrl.validation import check_count


def gather_rows(frames: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``frames[ids]`` for any shape of ``ids`` (rows of the frame ring), as whole-row copies
    (``index_select`` on the rows seen flat). Advanced indexing copies uint8 frames element
    by element: with it, R2D2's learner on the H200 machine spent 145 ms a batch of 32
    sequences x 125 steps x 4 stacked 84x84 frames (113 MB) in ``SequenceStorage.gather``,
    more than its update on the GPU; ``python benchmarks/kernels.py`` times the two side
    by side."""
    rows = frames.reshape(frames.shape[0], -1)
    gathered = torch.index_select(rows, 0, ids.reshape(-1))
    return gathered.view(*ids.shape, *frames.shape[1:])


def allocate_frames(frame_capacity: int, frame_shape: tuple[int, ...],
                    frame_dtype: torch.dtype) -> torch.Tensor:
    """The uninitialised frame ring: a row is read only after it is written, and the pages
    of a large ring are committed as they fill rather than all at start. Raises one clear
    error when the machine cannot reserve it."""
    try:
        return torch.empty((frame_capacity, *frame_shape), dtype=frame_dtype)
    except RuntimeError as error:
        size = frame_capacity * math.prod(frame_shape) * frame_dtype.itemsize
        raise MemoryError(f"the replay's frame ring ({frame_capacity:,} frames of "
                          f"{list(frame_shape)} {frame_dtype}, {size / 2**30:.1f} GiB) cannot "
                          f"be allocated on this machine: lower agent.replay_capacity") from error


class TransitionStorage:
    """Ring storage of transitions whose observations are rebuilt from shared frames.

    Args:
      capacity: transitions kept.
      frame_shape: shape of one frame (``(84, 84)`` for Atari, the observation shape for
        vector observations).
      frame_dtype: dtype of frames (uint8 for Atari).
      frame_stack: frames per observation (``None``: an observation is one frame, and is
        returned without a stack dimension).
      frame_capacity: frames kept; default ``capacity + capacity // 8``, room for the
        frames that batches repeat (an observation's older frames, carried over from the
        previous batch) and for each episode's first stack.
    """

    sample_type = SampleBatch

    def __init__(
        self,
        capacity: int,
        frame_shape: tuple[int, ...],
        frame_dtype: torch.dtype,
        frame_stack: Optional[int] = None,
        frame_capacity: Optional[int] = None,
    ) -> None:
        check_count("capacity", capacity)
        if frame_stack is not None:
            check_count("frame_stack", frame_stack)
        if frame_capacity is None:
            frame_capacity = capacity + capacity // 8 + (frame_stack or 1)
        check_count("frame_capacity", frame_capacity)
        self.capacity = capacity
        self.frame_capacity = frame_capacity
        self.frame_shape = tuple(frame_shape)
        self.frame_stack = frame_stack
        stack = frame_stack or 1
        self.frames = allocate_frames(frame_capacity, self.frame_shape, frame_dtype)
        self.observation_ids = torch.zeros(capacity, stack, dtype=torch.int64)
        self.next_observation_ids = torch.zeros(capacity, stack, dtype=torch.int64)
        self.actions = torch.zeros(capacity, dtype=torch.int64)
        self.returns = torch.zeros(capacity, dtype=torch.float32)
        self.discounts = torch.zeros(capacity, dtype=torch.float32)
        self.frames_written = 0
        self.transitions_written = 0
        self.oldest = 0  # id of the oldest transition still stored
        # (first frame id, end transition id) of each stored batch, oldest first.
        self._batches: deque[tuple[int, int]] = deque()

    def __len__(self) -> int:
        return self.transitions_written - self.oldest

    def nbytes(self) -> int:
        """Bytes of all preallocated arrays."""
        arrays = (self.frames, self.observation_ids, self.next_observation_ids, self.actions,
                  self.returns, self.discounts)
        return sum(a.numel() * a.element_size() for a in arrays)

    def add(self, batch: TransitionBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Store a batch; returns ``(ids of the new transitions, ids that left)``.

        The ids that left are those of evicted transitions (oldest first), including any
        whose slot a new transition now holds.
        """
        frames, k = batch.frames, batch.size
        m = frames.shape[0]
        if tuple(frames.shape[1:]) != self.frame_shape or frames.dtype != self.frames.dtype:
            raise ValueError(f"frames must be [M, {', '.join(map(str, self.frame_shape))}] "
                             f"{self.frames.dtype}, got {list(frames.shape)} {frames.dtype}")
        if m > self.frame_capacity or k > self.capacity:
            raise ValueError(f"a batch of {m} frames and {k} transitions does not fit a storage "
                             f"of {self.frame_capacity} frames and {self.capacity} transitions")
        stack = self.observation_ids.shape[1]
        if batch.observation_frames.shape != (k, stack):
            raise ValueError(f"observation_frames must be [{k}, {stack}], "
                             f"got {list(batch.observation_frames.shape)}")
        first_frame = self.frames_written
        rows = (first_frame + torch.arange(m)) % self.frame_capacity
        self.frames[rows] = frames
        self.frames_written += m

        first_id = self.transitions_written
        ids = torch.arange(first_id, first_id + k)
        slots = ids % self.capacity
        self.observation_ids[slots] = first_frame + batch.observation_frames
        self.next_observation_ids[slots] = first_frame + batch.next_observation_frames
        self.actions[slots] = batch.actions
        self.returns[slots] = batch.returns.float()
        self.discounts[slots] = batch.discounts.float()
        self.transitions_written += k
        self._batches.append((first_frame, self.transitions_written))

        old_oldest = self.oldest
        self.oldest = max(self.oldest, self.transitions_written - self.capacity)
        frame_limit = self.frames_written - self.frame_capacity  # ids below are overwritten
        while self._batches and (self._batches[0][0] < frame_limit
                                 or self._batches[0][1] <= self.oldest):
            self.oldest = max(self.oldest, self._batches.popleft()[1])
        return ids, torch.arange(old_oldest, self.oldest)

    def live_ids(self) -> tuple[int, int]:
        """``[oldest, newest + 1)``: the ids of the stored transitions."""
        return self.oldest, self.transitions_written

    def is_live(self, ids: torch.Tensor) -> torch.Tensor:
        """[N] bool: which ids are still stored (not evicted, slot not reused)."""
        return (ids >= self.oldest) & (ids < self.transitions_written)

    def _observations(self, frame_ids: torch.Tensor) -> torch.Tensor:
        # [B, stack, *frame]
        observations = gather_rows(self.frames, frame_ids % self.frame_capacity)
        return observations if self.frame_stack is not None else observations[:, 0]

    def gather(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """Observations rebuilt from frames, and the other fields, of stored ``ids``."""
        if ids.numel() and not bool(self.is_live(ids).all()):
            raise ValueError(f"gather: ids must be stored, in [{self.oldest}, "
                             f"{self.transitions_written}); got {ids.min()}..{ids.max()}")
        slots = ids % self.capacity
        return {
            "observations": self._observations(self.observation_ids[slots]),
            "actions": self.actions[slots],
            "returns": self.returns[slots],
            "discounts": self.discounts[slots],
            "next_observations": self._observations(self.next_observation_ids[slots]),
        }

    def state_dict(self) -> dict[str, Any]:
        """The stored part of the rings (not the unused preallocated rows) and counters."""
        frame_rows = min(self.frames_written, self.frame_capacity)
        slots = min(self.transitions_written, self.capacity)
        return {
            "capacity": self.capacity, "frame_capacity": self.frame_capacity,
            "frames": self.frames[:frame_rows].clone(),
            "observation_ids": self.observation_ids[:slots].clone(),
            "next_observation_ids": self.next_observation_ids[:slots].clone(),
            "actions": self.actions[:slots].clone(), "returns": self.returns[:slots].clone(),
            "discounts": self.discounts[:slots].clone(),
            "frames_written": self.frames_written,
            "transitions_written": self.transitions_written, "oldest": self.oldest,
            "batches": list(self._batches),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output into a storage of the same sizes."""
        for name in ("capacity", "frame_capacity"):
            if state.get(name) != getattr(self, name):
                raise ValueError(f"replay storage {name} {state.get(name)} in the state does not "
                                 f"match this storage's {getattr(self, name)}")
        frame_rows, slots = state["frames"].shape[0], state["actions"].shape[0]
        if tuple(state["frames"].shape[1:]) != self.frame_shape:
            raise ValueError(f"replay storage frames of shape {list(state['frames'].shape[1:])} "
                             f"do not match {list(self.frame_shape)}")
        self.frames[:frame_rows] = state["frames"]
        for name in ("observation_ids", "next_observation_ids", "actions", "returns",
                     "discounts"):
            getattr(self, name)[:slots] = state[name]
        self.frames_written = int(state["frames_written"])
        self.transitions_written = int(state["transitions_written"])
        self.oldest = int(state["oldest"])
        self._batches = deque(tuple(b) for b in state["batches"])
