"""Sum tree over a torch tensor: proportional prioritized sampling (Schaul et al. 2016).

The tree is one tensor that its owner holds (so it can sit in shared memory, on a GPU or
in a checkpoint): an 8-ary tree over ``capacity`` leaves, stored level by level in a
``[2, width]`` tensor, row 0 sums and row 1 minima over positive priorities (``+inf``
where a subtree has none). Level 0 is the root alone, at column 0; node ``j`` of a level
has children ``8j .. 8j+7`` of the next; the last level holds the leaves. Every level
starts at a multiple of 8 columns, so a node's children share one aligned 64-byte cache
line (float64) or half of one (float32): a draw touches about a third of the lines that
a binary tree's descent does. :func:`tree_layout` gives the level offsets; csrc/sum_tree.h
computes the same.

Two paths compute the same thing, bit for bit (:mod:`distrl.ops` picks one from
``kernel``): the compiled ops ``distrl::sum_tree_update`` / ``distrl::sum_tree_sample``
(csrc/), and the vectorised torch functions :func:`update_reference` /
:func:`sample_reference` here.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch

from distrl import ops

FANOUT = 8  # children per node; csrc/sum_tree.h kFanout


def tree_layout(capacity: int) -> list[int]:
    """Column where each level starts, root level first, plus the total width at the end.

    With ``D`` the least depth such that ``8^D >= capacity``, level ``d`` holds
    ``ceil(capacity / 8^(D - d))`` nodes, padded with empty nodes to a multiple of 8.
    """
    if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
        raise ValueError(f"capacity must be a positive int, got {capacity!r}")
    depth, span = 0, 1
    while span < capacity:
        span *= FANOUT
        depth += 1
    offsets, position = [], 0
    for _ in range(depth + 1):
        offsets.append(position)
        nodes = -(-capacity // span)
        position += -(-nodes // FANOUT) * FANOUT
        span //= FANOUT
    return offsets + [position]


def empty_tree(
    capacity: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """A ``[2, width]`` tree holding ``capacity`` zero priorities."""
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    width = tree_layout(capacity)[-1]
    tree = torch.zeros(2, width, dtype=dtype, device=device)
    tree[1].fill_(float("inf"))
    return tree


def tree_nbytes(capacity: int, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of the tree :func:`empty_tree` allocates for ``capacity`` leaves."""
    return 2 * tree_layout(capacity)[-1] * dtype.itemsize


def _check_indices(indices: torch.Tensor, limit: int) -> None:
    if indices.numel():
        low, high = int(indices.min()), int(indices.max())
        if low < 0 or high >= limit:
            raise ValueError(f"sum_tree_update: indices must lie in [0, {limit}), "
                             f"got {low}..{high}")


def _check_priorities(priorities: torch.Tensor) -> None:
    if not bool((torch.isfinite(priorities) & (priorities >= 0)).all()):
        raise ValueError("sum_tree_update: priorities must be finite and >= 0")


def _checked_layout(tree: torch.Tensor, capacity: int) -> list[int]:
    offsets = tree_layout(capacity)
    if tree.dim() != 2 or tree.shape != (2, offsets[-1]):
        raise ValueError(f"a tree of capacity {capacity} must have shape [2, {offsets[-1]}], "
                         f"got {list(tree.shape)}")
    return offsets


def _blocks(row: torch.Tensor, offsets: list[int], level: int) -> torch.Tensor:
    """Level ``level`` of a row as ``[nodes, 8]``: row ``j`` holds the children of node
    ``j`` of level ``level - 1``."""
    return row[offsets[level]:offsets[level + 1]].view(-1, FANOUT)


def update_reference(
    tree: torch.Tensor, capacity: int, indices: torch.Tensor, priorities: torch.Tensor
) -> None:
    """Set leaves ``indices`` to ``priorities`` in place; the torch twin of the compiled op.

    A duplicated index keeps its last priority in the batch; then each changed ancestor
    is recomputed once per level from its 8 children: the sum in float64, child by child
    (the compiled kernels' order, so both round alike), the minimum.

    Args:
      tree: ``[2, width]`` tree of ``capacity`` leaves.
      capacity: number of leaves.
      indices: [N] int64 in ``[0, capacity)``.
      priorities: [N] finite and ``>= 0``, the tree's dtype.
    """
    offsets = _checked_layout(tree, capacity)
    if indices.numel() == 0:
        return
    _check_indices(indices, capacity)
    _check_priorities(priorities)
    unique, inverse = torch.unique(indices, return_inverse=True)
    order = torch.arange(indices.numel(), device=indices.device)
    last = torch.full_like(unique, -1).scatter_reduce(0, inverse, order, reduce="amax")
    leaf_priorities = priorities[last]
    sums, mins = tree[0], tree[1]
    depth = len(offsets) - 2
    leaves = offsets[depth]
    sums[leaves + unique] = leaf_priorities
    mins[leaves + unique] = torch.where(leaf_priorities > 0, leaf_priorities, float("inf"))
    nodes = unique
    for level in range(depth, 0, -1):
        nodes = torch.unique_consecutive(nodes // FANOUT)  # sorted stays sorted under // 8
        child_sums = _blocks(sums, offsets, level)[nodes]
        total = torch.zeros(nodes.numel(), dtype=torch.float64, device=tree.device)
        for c in range(FANOUT):
            total = total + child_sums[:, c].double()
        sums[offsets[level - 1] + nodes] = total.to(tree.dtype)
        mins[offsets[level - 1] + nodes] = _blocks(mins, offsets, level)[nodes].amin(dim=1)


def sample_reference(
    tree: torch.Tensor, capacity: int, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stratified proportional draws, the torch twin of the compiled op.

    Schaul et al. 2016, Appendix B.2.1: the total mass is cut into ``N`` equal segments
    and draw ``i`` takes the leaf holding mass ``(i + uniforms[i]) * total / N``. At each
    level the draw enters the child whose interval of the running (float64) prefix sum
    holds its mass; an empty child has an empty interval, and a mass that round-off puts
    past the children's total enters the last non-empty child, so no draw ever reaches a
    zero-priority leaf.

    Args:
      tree: ``[2, width]`` tree of ``capacity`` leaves with a positive total.
      capacity: number of leaves.
      uniforms: [N] in ``[0, 1)``.

    Returns:
      ``(indices [N] int64, probabilities [N])``, ``P(i) = p_i / total``.
    """
    offsets = _checked_layout(tree, capacity)
    depth = len(offsets) - 2
    sums = tree[0]
    total = sums[0].double()
    batch = uniforms.numel()
    # Divide by a tensor on the tree's device, not a Python number: CUDA divides by a
    # host scalar as a multiplication by its reciprocal, one rounding more than the
    # compiled op's (and the CPU's) true division, which moves draws at segment edges.
    segment = total / torch.full((), batch, dtype=torch.float64, device=tree.device)
    draws = torch.arange(batch, dtype=torch.float64, device=tree.device)
    mass = (draws + uniforms.double()) * segment
    node = torch.zeros(batch, dtype=torch.int64, device=tree.device)
    positions = torch.arange(FANOUT, device=tree.device)
    for level in range(1, depth + 1):
        children = _blocks(sums, offsets, level)[node].double()
        prefix = torch.zeros(batch, FANOUT + 1, dtype=torch.float64, device=tree.device)
        for c in range(FANOUT):
            prefix[:, c + 1] = prefix[:, c] + children[:, c]
        below = (prefix[:, 1:] <= mass.unsqueeze(1)).sum(dim=1)
        last_positive = torch.where(children > 0, positions, 0).amax(dim=1)
        chosen = torch.where(below == FANOUT, last_positive, below)
        mass = mass - prefix.gather(1, chosen.unsqueeze(1)).squeeze(1)
        node = FANOUT * node + chosen
    leaf_sums = sums[offsets[depth]:offsets[depth] + capacity]
    return node, (leaf_sums[node].double() / total).to(tree.dtype)


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
        self._leaf_offset = tree_layout(capacity)[-2]
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
            # assert, which ends the CUDA context. The CPU op and update_reference check.
            _check_indices(indices, self.capacity)
            _check_priorities(priorities)
        if self._compiled_update:
            ops.sum_tree_update(self.tree, self.capacity, indices, priorities)
        else:
            update_reference(self.tree, self.capacity, indices, priorities)

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
            return ops.sum_tree_sample(self.tree, self.capacity, uniforms)
        return sample_reference(self.tree, self.capacity, uniforms)

    def total(self) -> float:
        """Sum of all priorities (the root), read without a scan."""
        return float(self.tree[0, 0])

    def min_priority(self) -> float:
        """Smallest positive priority (``inf`` when none), read without a scan."""
        return float(self.tree[1, 0])

    def importance_weights(self, probabilities: torch.Tensor, beta: float) -> torch.Tensor:
        """Normalised importance-sampling weights (Schaul et al. 2016, Section 3.4).

        ``w_i = (N P(i))^-beta / max_j w_j`` with the maximum over the drawn batch ``j``,
        as seed_rl, Acme and Dopamine normalise: the largest weight belongs to the batch's
        smallest probability, so ``w_i = (P(i) / min_j P(j))^-beta`` and ``N`` cancels.
        Normalising by the whole buffer's smallest priority instead makes every weight
        depend on one rarely drawn item (on Ape-X-like priorities the mean weight was
        about 8x smaller; one item of near-zero priority shrank them all ~500x).

        Args:
          probabilities: [B] ``P(i) > 0`` of the drawn items, as returned by :meth:`sample`.
          beta: the exponent, in ``[0, 1]``.
        """
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        if probabilities.numel() == 0:
            return probabilities.clone()
        return (probabilities / probabilities.min()).pow(-beta)

    def priorities(self) -> torch.Tensor:
        """[capacity] the leaf priorities (a view)."""
        return self.tree[0, self._leaf_offset:self._leaf_offset + self.capacity]

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
