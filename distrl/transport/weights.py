"""Versioned weight store: the learner publishes, actors pull when a newer version exists.

All floating-point tensors of a model's state dict live in one flat float32 buffer
(shared memory when asked), guarded by a sequence counter (a seqlock): the writer
makes it odd while copying and sets it to ``2 * version`` when done; a reader that
sees the counter change under it retries, so it never loads a torn copy.
"""

from __future__ import annotations

import time

import torch
from torch import nn


class WeightStore:
    """Holds the newest published weights of one model architecture.

    Args:
        model: a model of the architecture to store (its current weights are version 0).
        shared: put the buffer in shared memory so spawned processes can pull.
    """

    def __init__(self, model: nn.Module, shared: bool = False):
        self._layout = [
            (name, tuple(t.shape), t.numel())
            for name, t in model.state_dict().items()
            if t.dtype.is_floating_point
        ]
        numel = sum(n for _, _, n in self._layout)
        self.flat = torch.zeros(numel, dtype=torch.float32)
        self.sequence = torch.zeros(1, dtype=torch.int64)
        if shared:
            self.flat.share_memory_()
            self.sequence.share_memory_()
        self._write(model, version=0)

    @property
    def version(self) -> int:
        """The newest complete version (a write in progress reports the previous one)."""
        return int(self.sequence.item()) // 2

    def publish(self, model: nn.Module, version: int) -> None:
        """Learner side: make ``model``'s weights the newest version."""
        if version <= self.version:
            raise ValueError(f"version must increase: {version} <= {self.version}")
        self._write(model, version)

    def _write(self, model: nn.Module, version: int) -> None:
        state = model.state_dict()
        with torch.no_grad():
            on_device = any(state[name].device.type != "cpu" for name, _, _ in self._layout)
            # A GPU learner's weights come over in one copy, gathered on the GPU before
            # the seqlock opens, rather than one synchronising copy per tensor.
            gathered = (torch.cat([state[name].reshape(-1).float()
                                   for name, _, _ in self._layout]).cpu()
                        if on_device else None)
            self.sequence.fill_(2 * version - 1 if version > 0 else 1)
            if gathered is not None:
                self.flat.copy_(gathered)
            else:
                offset = 0
                for name, _shape, numel in self._layout:
                    self.flat[offset : offset + numel].copy_(state[name].reshape(-1))
                    offset += numel
        self.sequence.fill_(2 * version)

    def pull_if_newer(self, model: nn.Module, have_version: int, retries: int = 100) -> int | None:
        """Actor side: load the newest weights into ``model`` if newer than ``have_version``.

        Returns the version loaded, or None when nothing newer was published.
        """
        newest = self.snapshot(have_version, retries)
        if newest is None:
            return None
        version, flat = newest
        self._load(model, flat)
        return version

    def snapshot(self, have_version: int, retries: int = 100) -> tuple[int, torch.Tensor] | None:
        """A consistent copy ``(version, flat weights)`` of the newest version if it is newer
        than ``have_version``, else None (what a learner broadcasts to actor-only ranks)."""
        for _ in range(retries):
            before = int(self.sequence.item())
            if before % 2 == 1:
                time.sleep(0.0005)
                continue
            if before // 2 <= have_version:
                return None
            flat = self.flat.clone()
            if int(self.sequence.item()) == before:
                return before // 2, flat
        return None

    def publish_flat(self, flat: torch.Tensor, version: int) -> None:
        """Publish weights received as a flat tensor (a :meth:`snapshot` of another store).
        The version may equal the current one: an actor-only rank's store starts at 0 and
        then takes the learner's weights of whatever version it has."""
        if version < self.version:
            raise ValueError(f"version must not decrease: {version} < {self.version}")
        self.sequence.fill_(max(2 * version - 1, 1))
        self.flat.copy_(flat)
        self.sequence.fill_(2 * version)

    def _load(self, model: nn.Module, flat: torch.Tensor) -> None:
        state = model.state_dict()
        offset = 0
        with torch.no_grad():
            for name, shape, numel in self._layout:
                state[name].copy_(flat[offset : offset + numel].view(shape))
                offset += numel
