"""Replay buffer: a storage and a sampler kept in step (one shard per learner rank)."""

from __future__ import annotations

from typing import Any, Optional, Union

import torch

from distrl.replay.samplers import PrioritizedSampler, UniformSampler
from distrl.replay.sequence_storage import SequenceStorage
from distrl.replay.storage import TransitionStorage
from distrl.types import SampleBatch, SequenceBatch, SequenceSample, TransitionBatch
from distrl.validation import check_count

Sampler = Union[UniformSampler, PrioritizedSampler]


class ReplayBuffer:
    """Transitions in a :class:`TransitionStorage` (or sequences in a
    :class:`~distrl.replay.sequence_storage.SequenceStorage`), drawn by a sampler.

    Every transition the storage evicts is removed from the sampler in the same call,
    so a sample never holds a transition whose frames were overwritten. Priorities
    written back for transitions that left meanwhile (the learner samples the next
    batch while it trains on this one) are dropped, never given to the newcomer in
    their slot.
    """

    def __init__(self, storage: TransitionStorage | SequenceStorage, sampler: Sampler) -> None:
        if sampler.capacity != storage.capacity:
            raise ValueError(f"sampler capacity {sampler.capacity} must equal the storage "
                             f"capacity {storage.capacity}")
        self.storage = storage
        self.sampler = sampler
        self.inserted = 0  # transitions ever added
        self.sampled = 0  # transitions ever drawn

    def __len__(self) -> int:
        return len(self.storage)

    def add(self, batch: TransitionBatch | SequenceBatch,
            priorities: Optional[torch.Tensor] = None) -> None:
        """Store ``batch`` with its initial priorities (``[K]``, ``|TD error|``)."""
        if priorities is not None and priorities.shape != (batch.size,):
            raise ValueError(f"priorities must be [{batch.size}], got {list(priorities.shape)}")
        ids, evicted = self.storage.add(batch)
        self.sampler.remove(evicted)
        kept = ids >= 0  # a sequence storage refuses sequences whose frames are gone
        self.sampler.add(ids[kept], None if priorities is None else priorities[kept])
        self.inserted += batch.size

    def sample(self, batch_size: int, generator: Optional[torch.Generator] = None
               ) -> SampleBatch | SequenceSample:
        """``batch_size`` transitions with observations rebuilt and IS weights."""
        check_count("batch_size", batch_size)
        ids, weights = self.sampler.sample(batch_size, self.storage.live_ids(), generator)
        fields = self.storage.gather(ids)
        self.sampled += batch_size
        return self.storage.sample_type(indices=ids, weights=weights, **fields)

    def update_priorities(self, ids: torch.Tensor, priorities: torch.Tensor) -> int:
        """Write back ``|TD error|`` of drawn ``ids``; returns how many were still stored."""
        live = self.storage.is_live(ids)
        self.sampler.update_priorities(ids[live], priorities[live])
        return int(live.sum())

    def state_dict(self) -> dict[str, Any]:
        return {"storage": self.storage.state_dict(), "sampler": self.sampler.state_dict(),
                "inserted": self.inserted, "sampled": self.sampled}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.storage.load_state_dict(state["storage"])
        self.sampler.load_state_dict(state["sampler"])
        self.inserted = int(state["inserted"])
        self.sampled = int(state["sampled"])
