"""Which stored transitions a learner batch takes, and with which importance weights.

Both samplers see transitions by id (see :mod:`distrl.replay.storage`): ``add`` when
they arrive, ``remove`` when they leave, ``sample`` among those stored.

- :class:`UniformSampler`: every stored transition equally likely, weights 1.
- :class:`PrioritizedSampler`: proportional prioritization (Schaul et al. 2016, Section
  3.3, eq. 1): ``P(i) = p_i^alpha / sum_k p_k^alpha``, importance weights
  ``w_i = (N P(i))^-beta / max_j w_j`` over the drawn batch ``j`` (Section 3.4; the batch
  maximum, as seed_rl, Acme and Dopamine take it), with beta annealed linearly from
  ``beta`` to ``beta_final`` over ``beta_steps`` samples (Ape-X keeps beta = 0.4 fixed).
  A priority of exactly 0 marks an item with nothing to train on (an R2D2 sequence with
  no trainable step, :func:`distrl.rl.losses.sequence_priorities`): it is never drawn and so
  never enters a batch's normalisation; ``epsilon`` is added to every other priority.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from distrl.replay.sum_tree import SumTree
from distrl.validation import check_unit_interval

PRIORITY_DTYPE = torch.float64  # of the prioritized sampler's sum tree


class UniformSampler:
    """Draws stored transitions uniformly, with replacement (DQN, Mnih et al. 2015)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity

    def add(self, ids: torch.Tensor, priorities: Optional[torch.Tensor] = None) -> None:
        """Nothing to record: the storage's live range is the whole state."""

    def remove(self, ids: torch.Tensor) -> None:
        """Nothing to record."""

    def update_priorities(self, ids: torch.Tensor, priorities: torch.Tensor) -> None:
        """Uniform sampling has no priorities."""

    def sample(
        self, batch_size: int, live: tuple[int, int], generator: Optional[torch.Generator] = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids [B], weights [B] = 1)`` drawn from the ids ``[live[0], live[1])``."""
        oldest, end = live
        if end <= oldest:
            raise ValueError("cannot sample from an empty replay buffer")
        ids = oldest + torch.randint(0, end - oldest, (batch_size,), generator=generator)
        return ids, torch.ones(batch_size)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class PrioritizedSampler:
    """Proportional prioritized sampling over a :class:`SumTree` (Schaul et al. 2016).

    Args:
      capacity: slots (the storage's capacity); id ``k`` has slot ``k % capacity``.
      alpha: priority exponent, 0 = uniform (Ape-X: 0.6).
      beta: importance-sampling exponent at the start (Ape-X: 0.4).
      beta_final: beta reached after ``beta_steps`` samples (None: beta stays fixed).
      beta_steps: samples over which beta is annealed linearly.
      epsilon: added to every positive priority, so a transition whose TD error is tiny
        can still be drawn again (Schaul et al. 2016, Section 3.3). An exact 0 stays 0:
        the item has no step to train on and is never drawn.
      kernel: ``auto|compiled|reference``, the sum tree's path (:mod:`distrl.ops`).
    """

    def __init__(
        self,
        capacity: int,
        alpha: float = 0.6,
        beta: float = 0.4,
        beta_final: Optional[float] = None,
        beta_steps: int = 0,
        epsilon: float = 1e-6,
        kernel: str = "auto",
    ) -> None:
        check_unit_interval("alpha", alpha)
        check_unit_interval("beta", beta)
        if beta_final is not None:
            check_unit_interval("beta_final", beta_final)
        if isinstance(beta_steps, bool) or not isinstance(beta_steps, int) or beta_steps < 0:
            raise ValueError(f"beta_steps must be an int >= 0, got {beta_steps!r}")
        if not epsilon >= 0:
            raise ValueError(f"epsilon must be >= 0, got {epsilon!r}")
        self.capacity = capacity
        self.alpha, self.beta = alpha, beta
        self.beta_final, self.beta_steps = beta_final, beta_steps
        self.epsilon = epsilon
        self.tree = SumTree(capacity, dtype=PRIORITY_DTYPE, kernel=kernel)
        self.max_priority = 1.0  # given to transitions that arrive without a priority
        self.samples = 0

    def current_beta(self) -> float:
        """beta after ``self.samples`` samples, annealed linearly to ``beta_final``."""
        if self.beta_final is None or self.beta_steps == 0:
            return self.beta if self.beta_final is None else self.beta_final
        fraction = min(1.0, self.samples / self.beta_steps)
        return self.beta + fraction * (self.beta_final - self.beta)

    def _set(self, ids: torch.Tensor, priorities: torch.Tensor) -> None:
        priorities = priorities.detach().double().cpu()
        if not bool((torch.isfinite(priorities) & (priorities >= 0)).all()):
            raise ValueError("priorities must be finite and >= 0")
        if priorities.numel():
            self.max_priority = max(self.max_priority, float(priorities.max()))
        stored = torch.where(priorities > 0, (priorities + self.epsilon).pow(self.alpha), 0.0)
        self.tree.update(ids % self.capacity, stored)

    def add(self, ids: torch.Tensor, priorities: Optional[torch.Tensor] = None) -> None:
        """New transitions, with their priorities (``|TD error|``, Ape-X computes them in
        the actors) or, without, the largest priority seen so far (Schaul et al. 2016)."""
        if priorities is None:
            priorities = torch.full((ids.numel(),), self.max_priority, dtype=torch.float64)
        self._set(ids, priorities)

    def remove(self, ids: torch.Tensor) -> None:
        """Transitions that left the storage are never drawn again."""
        self.tree.update(ids % self.capacity, torch.zeros(ids.numel(), dtype=torch.float64))

    def update_priorities(self, ids: torch.Tensor, priorities: torch.Tensor) -> None:
        """New priorities for drawn ids (the caller drops ids that left meanwhile)."""
        self._set(ids, priorities)

    def sample(
        self, batch_size: int, live: tuple[int, int], generator: Optional[torch.Generator] = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(ids [B], weights [B])``: stratified proportional draws among the ``live`` ids
        and their normalised importance weights."""
        oldest, end = live
        if end <= oldest or not self.tree.total() > 0:
            raise ValueError("cannot sample from an empty replay buffer")
        slots, probabilities = self.tree.sample(batch_size, generator)
        weights = self.tree.importance_weights(probabilities, self.current_beta())
        self.samples += 1
        # A slot holds the newest id with that residue: the one in [end - capacity, end).
        ids = end - 1 - (end - 1 - slots) % self.capacity
        return ids, weights.float()

    def state_dict(self) -> dict[str, Any]:
        return {"tree": self.tree.state_dict(), "max_priority": self.max_priority,
                "samples": self.samples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.tree.load_state_dict(state["tree"])
        self.max_priority = float(state["max_priority"])
        self.samples = int(state["samples"])
