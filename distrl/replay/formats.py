"""What a replay holds, for the runner: n-step transitions (Ape-X) or sequences (R2D2).

A format builds the writer an actor feeds, sizes the shared-memory slots that carry
the writer's batches (for the worst case), builds the replay storage, and rebuilds a
batch the way the learner will see it, so actors can compute initial priorities.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Union

import torch

from distrl.replay.frames import rebuild_observations
from distrl.replay.sequence_storage import SequenceStorage
from distrl.replay.sequence_writer import SequenceWriter
from distrl.replay.storage import TransitionStorage
from distrl.replay.writers import NStepWriter
from distrl.types import SampleBatch, SequenceBatch, SequenceSample, TransitionBatch
from distrl.validation import check_count

# name -> (shape of one item's field, dtype); the frames field is sized separately.
ItemFields = dict[str, tuple[tuple[int, ...], torch.dtype]]


@dataclass(frozen=True)
class NStepFormat:
    """n-step transitions ``(s_t, a_t, R_t^(n), gamma^n, s_{t+n})`` (Horgan et al. 2018)."""

    n: int
    discount: float

    batch_type = TransitionBatch
    steps_per_item = 1  # env steps one stored item stands for
    # what the learner computes per sampled item (auto sizing's cost): the online network's
    # forward and backward on the state, double-Q's online and target forwards on the next
    trained_steps = 1
    forward_only_steps = 2

    def make_writer(self, num_envs: int, frame_stack: Optional[int], stream: int) -> NStepWriter:
        return NStepWriter(num_envs, self.n, self.discount, frame_stack)

    def max_batch(self, num_envs: int, flush_steps: int, stack: int) -> tuple[int, int]:
        """``(items, frames)`` of the largest batch ``flush_steps`` steps can emit: every
        step could end an episode, whose next observation stores a whole stack, and with
        acting Q values each env's last full transition of the previous flush, held for
        its bootstrap value, comes out in this one."""
        return (num_envs * (flush_steps + self.n),
                num_envs * (flush_steps + self.n + 1 + stack) * stack)

    def item_fields(self, stack: int, state_size: int) -> ItemFields:
        return {"observation_frames": ((stack,), torch.int64),
                "next_observation_frames": ((stack,), torch.int64),
                "actions": ((), torch.int64), "returns": ((), torch.float32),
                "discounts": ((), torch.float32)}

    def make_storage(self, capacity: int, frame_shape: tuple[int, ...],
                     frame_dtype: torch.dtype, frame_stack: Optional[int], num_envs: int,
                     flush_steps: int, state_size: int = 0) -> TransitionStorage:
        """Transitions store no recurrent state: ``state_size`` is not used."""
        return TransitionStorage(capacity, frame_shape, frame_dtype, frame_stack)

    def acting_values(self, writer: NStepWriter) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """The last flushed batch's acting Q values (taken, bootstrap), or None."""
        return writer.acting_values

    def as_sample(self, writer: NStepWriter, batch: TransitionBatch) -> SampleBatch:
        observations, next_observations = rebuild_observations(batch, writer.frame_stack)
        k = batch.size
        return SampleBatch(indices=torch.full((k,), -1, dtype=torch.int64),
                           observations=observations, actions=batch.actions,
                           returns=batch.returns, discounts=batch.discounts,
                           next_observations=next_observations, weights=torch.ones(k))


@dataclass(frozen=True)
class SequenceFormat:
    """Overlapping sequences with stored recurrent state (Kapturowski et al. 2019)."""

    burn_in: int
    trace_length: int
    period: int
    bootstrap: int

    batch_type = SequenceBatch

    @property
    def length(self) -> int:
        """Step slots per stored sequence."""
        return self.burn_in + self.trace_length + self.bootstrap

    @property
    def steps_per_item(self) -> int:
        return self.period

    # what the learner computes per sampled sequence (auto sizing's cost): forward and
    # backward over the trained steps and the bootstrap, forwards alone over the burn-in
    # (online network) and the whole sequence (target network)
    @property
    def trained_steps(self) -> int:
        return self.trace_length + self.bootstrap

    @property
    def forward_only_steps(self) -> int:
        return self.burn_in + self.length

    def make_writer(self, num_envs: int, frame_stack: Optional[int],
                    stream: int) -> SequenceWriter:
        return SequenceWriter(num_envs, self.burn_in, self.trace_length, self.period,
                              self.bootstrap, frame_stack, stream)

    def max_batch(self, num_envs: int, flush_steps: int, stack: int) -> tuple[int, int]:
        """Each step opens at most one sequence per env, and at most
        ``ceil(L / period) + 1`` were open before; a writer sends its frames once, with the
        first batch after them, and emits a sequence at least every ``L`` steps per env."""
        check_count("flush_steps", flush_steps)
        open_before = math.ceil(self.length / self.period) + 1
        return (num_envs * (flush_steps + open_before),
                num_envs * (flush_steps + self.length + 1) * stack)

    def item_fields(self, stack: int, state_size: int) -> ItemFields:
        steps = (self.length,)
        return {"observation_frames": ((self.length, stack), torch.int64),
                "prev_actions": (steps, torch.int64), "prev_rewards": (steps, torch.float32),
                "actions": (steps, torch.int64), "rewards": (steps, torch.float32),
                "terminated": (steps, torch.bool), "valid": (steps, torch.bool),
                "stored_state": ((state_size,), torch.float32),
                "start_state": ((state_size,), torch.float32)}

    def stream_window(self, num_envs: int, flush_steps: int, stack: int) -> int:
        """Stream ids a batch may reach back: a sequence's frames from its first slot to
        its flush, for every env of the writer, with room to spare (a power of two)."""
        span = num_envs * (self.length + flush_steps + self.period + 2) * stack
        return 1 << (2 * span - 1).bit_length()

    def make_storage(self, capacity: int, frame_shape: tuple[int, ...],
                     frame_dtype: torch.dtype, frame_stack: Optional[int], num_envs: int,
                     flush_steps: int, state_size: int = 0) -> SequenceStorage:
        """Room for ``period`` new frames per sequence plus an eighth for episode starts
        and frames sent before their sequences, and for two recurrent states of
        ``state_size`` values per sequence."""
        stack = frame_stack or 1
        frame_capacity = capacity * self.period + capacity * self.period // 8 + \
            self.stream_window(num_envs, flush_steps, stack)
        return SequenceStorage(capacity, self.length, frame_shape, frame_dtype, frame_stack,
                               frame_capacity, self.stream_window(num_envs, flush_steps, stack),
                               state_size)

    def acting_values(self, writer: SequenceWriter) -> Optional[torch.Tensor]:
        """The last flushed batch's acting Q values ``[K, L, A]``, or None."""
        return writer.acting_q

    def as_sample(self, writer: SequenceWriter, batch: SequenceBatch) -> SequenceSample:
        return writer.as_sample(batch)


ExperienceFormat = Union[NStepFormat, SequenceFormat]
