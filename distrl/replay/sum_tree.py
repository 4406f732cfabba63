"""Sum tree over a torch tensor: proportional prioritized sampling (Schaul et al. 2016).

The tree is one tensor that its owner holds (so it can sit in shared memory, on a GPU or
in a checkpoint), of shape ``[2, 2L]`` with ``L`` the smallest power of two that holds
``capacity`` leaves: row 0 sums, row 1 minima over positive priorities (``+inf`` where a
subtree has none). Node 1 is the root, node ``k`` has children ``2k`` and ``2k + 1``,
leaf ``i`` is node ``L + i``; slots past ``capacity`` stay at zero and are never drawn.

Two paths compute the same thing (:mod:`distrl.ops` picks one from ``kernel``): the
compiled ops ``distrl::sum_tree_update`` / ``distrl::sum_tree_sample`` (csrc/), and the
vectorised torch functions :func:`update_reference` / :func:`sample_reference` here.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from distrl import ops


def leaf_slots(capacity: int) -> int:
    """``L``: the smallest power of two ``>= capacity``."""
    if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
        raise ValueError(f"capacity must be a positive int, got {capacity!r}")
    return 1 << (capacity - 1).bit_length()


def empty_tree(
    capacity: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """A ``[2, 2L]`` tree holding ``capacity`` zero priorities."""
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    leaves = leaf_slots(capacity)
    tree = torch.zeros(2, 2 * leaves, dtype=dtype, device=device)
    tree[1].fill_(float("inf"))
    return tree


def _depth(tree: torch.Tensor) -> tuple[int, int]:
    leaves = tree.shape[1] // 2
    return leaves, leaves.bit_length() - 1


def _check_indices(indices: torch.Tensor, limit: int) -> None:
    if indices.numel():
        low, high = int(indices.min()), int(indices.max())
        if low < 0 or high >= limit:
            raise ValueError(f"sum_tree_update: indices must lie in [0, {limit}), "
                             f"got {low}..{high}")


def _check_priorities(priorities: torch.Tensor) -> None:
    if not bool((torch.isfinite(priorities) & (priorities >= 0)).all()):
        raise ValueError("sum_tree_update: priorities must be finite and >= 0")


def update_reference(tree: torch.Tensor, indices: torch.Tensor, priorities: torch.Tensor) -> None:
    """Set leaves ``indices`` to ``priorities`` in place; the torch twin of the compiled op.

    A duplicated index keeps its last priority in the batch; then each changed ancestor
    is recomputed once per level from its two children.

    Args:
      tree: [2, 2L] tree.
      indices: [N] int64 in ``[0, L)``.
      priorities: [N] finite and ``>= 0``, the tree's dtype.
    """
    leaves, depth = _depth(tree)
    if indices.numel() == 0:
        return
    _check_indices(indices, leaves)
    _check_priorities(priorities)
    unique, inverse = torch.unique(indices, return_inverse=True)
    order = torch.arange(indices.numel(), device=indices.device)
    last = torch.full_like(unique, -1).scatter_reduce(0, inverse, order, reduce="amax")
    leaf_priorities = priorities[last]
    sums, mins = tree[0], tree[1]
    nodes = unique + leaves
    sums[nodes] = leaf_priorities
    mins[nodes] = torch.where(leaf_priorities > 0, leaf_priorities, float("inf"))
    for _ in range(depth):
        nodes = torch.unique_consecutive(nodes >> 1)  # sorted stays sorted under >> 1
        sums[nodes] = sums[2 * nodes] + sums[2 * nodes + 1]
        mins[nodes] = torch.minimum(mins[2 * nodes], mins[2 * nodes + 1])


def sample_reference(
    tree: torch.Tensor, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stratified proportional draws, the torch twin of the compiled op.

    Schaul et al. 2016, Appendix B.2.1: the total mass is cut into ``N`` equal segments
    and draw ``i`` takes the leaf holding mass ``(i + uniforms[i]) * total / N``. The
    descent never enters an empty subtree, so round-off at a segment edge cannot land
    on a zero-priority leaf.

    Args:
      tree: [2, 2L] tree with a positive total.
      uniforms: [N] in ``[0, 1)``.

    Returns:
      ``(indices [N] int64, probabilities [N])``, ``P(i) = p_i / total``.
    """
    leaves, depth = _depth(tree)
    sums = tree[0]
    total = sums[1].double()
    batch = uniforms.numel()
    mass = (torch.arange(batch, dtype=torch.float64, device=tree.device) + uniforms.double()) * (
        total / batch
    )
    node = torch.ones(batch, dtype=torch.int64, device=tree.device)
    for _ in range(depth):
        left = sums[2 * node].double()
        right = sums[2 * node + 1].double()
        go_right = ((mass >= left) & (right > 0)) | ~(left > 0)
        mass = mass - torch.where(go_right, left, 0.0)
        node = 2 * node + go_right.long()
    return node - leaves, (sums[node].double() / total).to(tree.dtype)


class SumTree:
    """Priorities of ``capacity`` items for proportional prioritized replay.

    Args:
      capacity: number of items, any positive int.
      dtype: float32 (default) or float64 priorities.
      device: where the tree lives; the compiled op runs on CPU and, if built, CUDA.
      kernel: ``auto|compiled|reference`` (see :mod:`distrl.ops`).
    """

    def __init__(
        self,
        capacity: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        kernel: str = "auto",
    ) -> None:
        self.capacity = capacity
        self.tree = empty_tree(capacity, dtype, device)
        self.leaves = self.tree.shape[1] // 2
        self.kernel = kernel
        self._compiled_update = ops.use_compiled(kernel, "sum_tree_update", device)
        self._compiled_sample = ops.use_compiled(kernel, "sum_tree_sample", device)

    @property
    def path(self) -> str:
        """``compiled`` or ``reference``: which path :meth:`sample` and :meth:`update` take."""
        return "compiled" if self._compiled_sample and self._compiled_update else "reference"

    def update(self, indices: torch.Tensor, priorities: torch.Tensor) -> None:
        """Set the priorities of ``indices``; the last of a duplicated index wins.

        Args:
          indices: [N] int64 item indices in ``[0, capacity)``.
          priorities: [N] finite, ``>= 0``; cast to the tree's dtype. Zero means "never draw".
        """
        if indices.dtype != torch.int64 or indices.dim() != 1:
            raise ValueError(f"indices must be a 1-D int64 tensor, got {indices.dtype} "
                             f"of shape {tuple(indices.shape)}")
        if priorities.shape != indices.shape:
            raise ValueError(f"priorities must have the shape of indices {tuple(indices.shape)}, "
                             f"got {tuple(priorities.shape)}")
        priorities = priorities.to(self.tree.dtype)
        if self._compiled_update and self.tree.device.type != "cpu":
            # The CUDA op checks nothing on the host: a bad index would be a device-side
            # assert, which ends the CUDA context.
            _check_indices(indices, self.capacity)
            _check_priorities(priorities)
        elif self.capacity < self.leaves:
            # The CPU op and update_reference check [0, L) and the priorities; the slots
            # between capacity and L must stay empty.
            _check_indices(indices, self.capacity)
        if self._compiled_update:
            ops.sum_tree_update(self.tree, indices, priorities)
        else:
            update_reference(self.tree, indices, priorities)

    def sample(
        self, batch_size: int, generator: Optional[torch.Generator] = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch_size`` stratified proportional draws: ``(indices, probabilities)``."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size}")
        total = self.total()
        if not total > 0:
            raise ValueError("cannot sample from a sum tree whose priorities are all zero")
        if not math.isfinite(total):
            raise ValueError(f"cannot sample: the total priority overflowed {self.tree.dtype} "
                             f"({total}); use dtype=torch.float64 or smaller priorities")
        uniforms = torch.rand(batch_size, generator=generator, dtype=self.tree.dtype,
                              device=self.tree.device)
        if self._compiled_sample:
            return ops.sum_tree_sample(self.tree, uniforms)
        return sample_reference(self.tree, uniforms)

    def total(self) -> float:
        """Sum of all priorities (the root), read without a scan."""
        return float(self.tree[0, 1])

    def min_priority(self) -> float:
        """Smallest positive priority (``inf`` when none), read without a scan."""
        return float(self.tree[1, 1])

    def importance_weights(self, probabilities: torch.Tensor, beta: float) -> torch.Tensor:
        """Normalised importance-sampling weights (Schaul et al. 2016, Section 3.4).

        ``w_i = (N P(i))^-beta / max_j w_j``; the largest weight belongs to the smallest
        probability ``P_min = p_min / total``, so ``w_i = (P(i) / P_min)^-beta`` and ``N``
        cancels. ``p_min`` is the root of the min row, so no leaf is scanned.

        Args:
          probabilities: [N] ``P(i)`` of the drawn items, as returned by :meth:`sample`.
          beta: the exponent, in ``[0, 1]``.
        """
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        min_probability = self.tree[1, 1] / self.tree[0, 1]
        return (probabilities / min_probability).pow(-beta)

    def priorities(self) -> torch.Tensor:
        """[capacity] the leaf priorities (a view)."""
        return self.tree[0, self.leaves:self.leaves + self.capacity]

    def share_memory_(self) -> SumTree:
        self.tree.share_memory_()
        return self

    def state_dict(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "tree": self.tree.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a tree saved by :meth:`state_dict`; the capacity must match."""
        if state.get("capacity") != self.capacity:
            raise ValueError(f"sum tree capacity {state.get('capacity')} in the state does not "
                             f"match this tree's {self.capacity}")
        tree = state["tree"]
        if tree.shape != self.tree.shape:
            raise ValueError(f"sum tree tensor of shape {tuple(tree.shape)} does not match "
                             f"{tuple(self.tree.shape)}")
        self.tree.copy_(tree)
