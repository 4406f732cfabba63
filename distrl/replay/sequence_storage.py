"""Preallocated FIFO storage of R2D2 sequences whose frames are stored once.

R2D2's sequences overlap (Kapturowski et al. 2019 replay 80-step sequences that overlap
by 40, each behind a 40-step burn-in), so a step's frame appears in about
``L / period = 3`` sequences. Here frames live in one ring and a sequence holds the ids
of its slots' frames, as in :mod:`distrl.replay.storage`; a stored sequence costs about
``period`` new frames plus its per-step fields and two recurrent states.

Frames arrive per *stream* (one :class:`distrl.replay.sequence_writer.SequenceWriter`):
each batch brings the frames its writer saw since its previous batch, and sequences
refer to frames by stream id, also to frames of earlier batches. A ring of the last
``stream_window`` stream ids per stream maps them to storage frame ids. A writer that
starts over (a restarted actor) sends stream id 0 again, which starts its map anew.

Sequences leave in arrival order: when their slot is reused, or when a frame they
refer to is overwritten. Since sequences of several streams interleave, the sequence
whose frames go first need not be the oldest; every sequence up to it leaves with it.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from distrl.replay.storage import allocate_frames, gather_rows
from distrl.types import SequenceBatch, SequenceSample
from distrl.validation import check_count

_STEP_FIELDS = ("prev_actions", "prev_rewards", "actions", "rewards", "terminated", "valid")
_STATE_FIELDS = ("stored_state", "start_state")


class SequenceStorage:
    """Ring storage of fixed-length sequences rebuilt from shared frames.

    Args:
      capacity: sequences kept.
      length: ``L``, step slots per sequence.
      frame_shape, frame_dtype: one frame (``(84, 84)`` uint8 for Atari, the observation
        shape for vectors).
      frame_stack: frames per observation (None: an observation is one frame).
      frame_capacity: frames kept.
      stream_window: stream ids per stream that a batch may still refer to (the newest
        ones); must cover a writer's frames from a sequence's first slot to its flush.
      state_size: values of a flattened recurrent state, so that the stored states are
        allocated with the rest (0: sized by the first batch).
    """

    sample_type = SequenceSample

    def __init__(self, capacity: int, length: int, frame_shape: tuple[int, ...],
                 frame_dtype: torch.dtype, frame_stack: Optional[int], frame_capacity: int,
                 stream_window: int, state_size: int = 0) -> None:
        for name, value in (("capacity", capacity), ("length", length),
                            ("frame_capacity", frame_capacity), ("stream_window", stream_window)):
            check_count(name, value)
        if frame_stack is not None:
            check_count("frame_stack", frame_stack)
        self.capacity, self.length = capacity, length
        self.frame_shape, self.frame_stack = tuple(frame_shape), frame_stack
        self.frame_capacity, self.stream_window = frame_capacity, stream_window
        stack = frame_stack or 1
        self.frames = allocate_frames(frame_capacity, self.frame_shape, frame_dtype)
        self.observation_ids = torch.zeros(capacity, length, stack, dtype=torch.int64)
        self.prev_actions = torch.zeros(capacity, length, dtype=torch.int64)
        self.prev_rewards = torch.zeros(capacity, length)
        self.actions = torch.zeros(capacity, length, dtype=torch.int64)
        self.rewards = torch.zeros(capacity, length)
        self.terminated = torch.zeros(capacity, length, dtype=torch.bool)
        self.valid = torch.zeros(capacity, length, dtype=torch.bool)
        self.stored_state = torch.zeros(capacity, state_size)  # else sized by the first batch
        self.start_state = torch.zeros(capacity, state_size)
        self.min_frame = torch.zeros(capacity, dtype=torch.int64)  # oldest frame id referred to
        self.frames_written = 0
        self.transitions_written = 0  # sequences ever stored (the name samplers expect)
        self.oldest = 0
        self.dropped = 0  # sequences that arrived after one of their frames was overwritten
        # stream -> [frames received, ring of storage ids of its newest stream ids]
        self._streams: dict[int, list[Any]] = {}

    def __len__(self) -> int:
        return self.transitions_written - self.oldest

    def nbytes(self) -> int:
        arrays = (self.frames, self.observation_ids, self.min_frame, self.stored_state,
                  self.start_state, *(getattr(self, name) for name in _STEP_FIELDS))
        return sum(a.numel() * a.element_size() for a in arrays)

    def _stream_map(self, batch: SequenceBatch) -> list[Any]:
        entry = self._streams.get(batch.stream)
        if entry is None or batch.first_frame == 0:
            entry = [0, torch.zeros(self.stream_window, dtype=torch.int64)]
            self._streams[batch.stream] = entry
        if batch.first_frame != entry[0]:
            raise ValueError(f"stream {batch.stream} sent frames from id {batch.first_frame}, "
                             f"expected {entry[0]} (its batches must arrive in order)")
        return entry

    def add(self, batch: SequenceBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Store a batch; returns ``(ids [K] of its sequences, ids that left)``; a sequence
        that refers to an overwritten frame is not stored and gets id -1."""
        frames, k = batch.frames, batch.size
        if tuple(frames.shape[1:]) != self.frame_shape or frames.dtype != self.frames.dtype:
            raise ValueError(f"frames must be [M, {', '.join(map(str, self.frame_shape))}] "
                             f"{self.frames.dtype}, got {list(frames.shape)} {frames.dtype}")
        expected = [k, self.length, self.frame_stack or 1]
        if list(batch.observation_frames.shape) != expected:
            raise ValueError(f"observation_frames must be {expected}, "
                             f"got {list(batch.observation_frames.shape)}")
        m = frames.shape[0]
        if m > self.frame_capacity or k > self.capacity:
            raise ValueError(f"a batch of {m} frames and {k} sequences does not fit a storage "
                             f"of {self.frame_capacity} frames and {self.capacity} sequences")
        entry = self._stream_map(batch)
        first_frame = self.frames_written
        self.frames[(first_frame + torch.arange(m)) % self.frame_capacity] = frames
        self.frames_written += m
        stream_ids = batch.first_frame + torch.arange(m)
        entry[1][stream_ids % self.stream_window] = first_frame + torch.arange(m)
        entry[0] += m

        refs = batch.observation_frames
        if refs.numel() and (int(refs.min()) < entry[0] - self.stream_window
                             or int(refs.max()) >= entry[0]):
            raise ValueError(f"stream {batch.stream}'s sequences refer to frames "
                             f"{int(refs.min())}..{int(refs.max())}, outside the newest "
                             f"stream_window={self.stream_window} of the {entry[0]} it sent")
        storage_ids = entry[1][refs % self.stream_window]  # [K, L, stack]
        frame_limit = self.frames_written - self.frame_capacity  # ids below are overwritten
        min_frame = (storage_ids.flatten(1).min(dim=1).values if k
                     else torch.zeros(0, dtype=torch.int64))
        keep = min_frame >= frame_limit
        self.dropped += int((~keep).sum())
        k = int(keep.sum())

        if self.stored_state.shape[1] != batch.stored_state.shape[1]:
            if self.transitions_written:
                raise ValueError(f"stored_state must have {self.stored_state.shape[1]} values, "
                                 f"got {batch.stored_state.shape[1]}")
            size = batch.stored_state.shape[1]
            self.stored_state = torch.zeros(self.capacity, size)
            self.start_state = torch.zeros(self.capacity, size)
        first_id = self.transitions_written
        ids = torch.full((batch.size,), -1, dtype=torch.int64)
        ids[keep] = torch.arange(first_id, first_id + k)
        slots = ids[keep] % self.capacity
        self.observation_ids[slots] = storage_ids[keep]
        self.min_frame[slots] = min_frame[keep]
        for name in _STEP_FIELDS + _STATE_FIELDS:
            getattr(self, name)[slots] = getattr(batch, name)[keep].to(getattr(self, name).dtype)
        self.transitions_written += k

        old_oldest = self.oldest
        self.oldest = max(self.oldest, self.transitions_written - self.capacity)
        live = torch.arange(self.oldest, self.transitions_written)
        stale = live[self.min_frame[live % self.capacity] < frame_limit]
        if stale.numel():
            self.oldest = int(stale.max()) + 1
        return ids, torch.arange(old_oldest, self.oldest)

    def live_ids(self) -> tuple[int, int]:
        return self.oldest, self.transitions_written

    def is_live(self, ids: torch.Tensor) -> torch.Tensor:
        return (ids >= self.oldest) & (ids < self.transitions_written)

    def gather(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """Time-major fields of stored ``ids`` (see :class:`SequenceSample`)."""
        if ids.numel() and not bool(self.is_live(ids).all()):
            raise ValueError(f"gather: ids must be stored, in [{self.oldest}, "
                             f"{self.transitions_written}); got {ids.min()}..{ids.max()}")
        slots = ids % self.capacity
        observations = gather_rows(self.frames, self.observation_ids[slots] % self.frame_capacity)
        if self.frame_stack is None:
            observations = observations[:, :, 0]
        fields = {name: getattr(self, name)[slots].transpose(0, 1) for name in _STEP_FIELDS}
        return {"observations": observations.transpose(0, 1), **fields,
                "stored_state": self.stored_state[slots], "start_state": self.start_state[slots]}

    def state_dict(self) -> dict[str, Any]:
        frame_rows = min(self.frames_written, self.frame_capacity)
        slots = min(self.transitions_written, self.capacity)
        state = {
            "capacity": self.capacity, "frame_capacity": self.frame_capacity,
            "length": self.length, "stream_window": self.stream_window,
            "frames": self.frames[:frame_rows].clone(),
            "frames_written": self.frames_written, "transitions_written": self.transitions_written,
            "oldest": self.oldest, "dropped": self.dropped,
            "streams": {s: [entry[0], entry[1].clone()] for s, entry in self._streams.items()},
        }
        for name in ("observation_ids", "min_frame", *_STEP_FIELDS, *_STATE_FIELDS):
            state[name] = getattr(self, name)[:slots].clone()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("capacity", "frame_capacity", "length", "stream_window"):
            if state.get(name) != getattr(self, name):
                raise ValueError(f"replay storage {name} {state.get(name)} in the state does not "
                                 f"match this storage's {getattr(self, name)}")
        size = state["stored_state"].shape[1]
        self.stored_state = torch.zeros(self.capacity, size)
        self.start_state = torch.zeros(self.capacity, size)
        self.frames[:state["frames"].shape[0]] = state["frames"]
        slots = state["actions"].shape[0]
        for name in ("observation_ids", "min_frame", *_STEP_FIELDS, *_STATE_FIELDS):
            getattr(self, name)[:slots] = state[name]
        self.frames_written = int(state["frames_written"])
        self.transitions_written = int(state["transitions_written"])
        self.oldest, self.dropped = int(state["oldest"]), int(state["dropped"])
        self._streams = {int(s): [int(e[0]), e[1].clone()] for s, e in state["streams"].items()}
