"""Epsilon-greedy exploration shared by the value-based agents (Ape-X, R2D2)."""

from __future__ import annotations

from typing import Optional

import torch


def epsilon_ladder(count: int, base: float = 0.4, exponent: float = 7.0) -> torch.Tensor:
    """[count] exploration rates ``eps_i = base^(1 + exponent * i / (count - 1))``
    (Horgan et al. 2018, Section 4.1: 0.4 and 7; R2D2 uses the same ladder); one actor
    gets ``base``."""
    if count == 1:
        return torch.tensor([base], dtype=torch.float64)
    i = torch.arange(count, dtype=torch.float64)
    return base ** (1 + exponent * i / (count - 1))


def epsilon_greedy(q: torch.Tensor, epsilons: torch.Tensor,
                   generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """[N] actions: ``argmax_a q[i, a]``, except that row ``i`` takes a uniformly random
    action with probability ``epsilons[i]``."""
    n, num_actions = q.shape
    explore = torch.rand(n, generator=generator, dtype=torch.float64) < epsilons
    random = torch.randint(0, num_actions, (n,), generator=generator)
    # The draws stay on the CPU generator (the same streams on any device); the actions
    # come back to the CPU, where envs take them.
    return torch.where(explore, random, q.argmax(dim=-1).cpu())
