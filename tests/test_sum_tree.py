"""Tests for distrl/replay/sum_tree.py and the ops distrl::sum_tree_update / sum_tree_sample.

Proportional prioritized replay (Schaul et al. 2016, Section 3.3 eq. 1, Section 3.4,
Appendix B.2.1). The three tiers of STYLE item 9 are checked against each other: the
naive ground truths in tests/reference.py (a list of writes, a linear scan of the
cumulative sum, the weight formula), the vectorised torch path and the compiled op.
Every test of SumTree runs on each path (``kernel=reference|compiled``) and device (cpu,
cuda); the tests of the op itself (opcheck, its messages, bit-for-bit agreement with the
reference path) run on each device. The compiled path is skipped where distrl._C is not
built for that device, cuda where there is no GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from reference import (
    chi2_quantile,
    importance_weights_naive,
    priorities_after_updates,
    stratified_sample_naive,
)

from distrl import ops
from distrl.replay.sum_tree import SumTree, sample_reference, tree_layout, update_reference

DTYPES = [torch.float32, torch.float64]
OPS = ("sum_tree_update", "sum_tree_sample")


def _has_compiled(device: str) -> bool:
    return all(ops.has_kernel(op, device) for op in OPS)


def _device_marks(device: str) -> list:
    if device == "cpu":
        return []
    return [pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _compiled_mark(device: str):
    why = ops.extension_error() or "built without them"
    return pytest.mark.skipif(not _has_compiled(device),
                              reason=f"distrl._C has no {device} sum-tree kernels ({why})")


@dataclass(frozen=True)
class Path:
    """One (kernel, device) pair: builds trees on it and calls its raw update/sample."""

    kernel: str
    device: str

    def tree(self, capacity: int, dtype: torch.dtype = torch.float32) -> SumTree:
        tree = SumTree(capacity, dtype=dtype, device=self.device, kernel=self.kernel)
        assert tree.path == self.kernel  # never a silent fallback to the other path
        return tree

    def ints(self, values) -> torch.Tensor:
        return torch.as_tensor(np.asarray(values), dtype=torch.int64, device=self.device)

    def floats(self, values, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.as_tensor(np.asarray(values, dtype=np.float64), device=self.device).to(dtype)

    def sample(self, tree: SumTree, uniforms: torch.Tensor):
        """The raw op (or its reference twin) on ``tree``'s tensor, given uniforms."""
        if self.kernel == "compiled":
            return ops.sum_tree_sample(tree.tree, tree.capacity, uniforms)
        return sample_reference(tree.tree, tree.capacity, uniforms)

    def generator(self, seed: int) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(seed)


def _path_params() -> list:
    params = []
    for device in ("cpu", "cuda"):
        for kernel in ("reference", "compiled"):
            marks = _device_marks(device)
            if kernel == "compiled":
                marks = marks + [_compiled_mark(device)]
            params.append(pytest.param(Path(kernel, device), marks=marks,
                                       id=f"{kernel}-{device}"))
    return params


PATHS = _path_params()
# For the tests of the compiled op itself (opcheck, its messages, agreement with reference).
COMPILED_DEVICES = [
    pytest.param(d, marks=_device_marks(d) + [_compiled_mark(d)], id=d) for d in ("cpu", "cuda")
]
ALL_DEVICES = [pytest.param(d, marks=_device_marks(d), id=d) for d in ("cpu", "cuda")]


@pytest.fixture(params=PATHS)
def path(request) -> Path:
    return request.param


def _tree_from_leaves(priorities: np.ndarray) -> np.ndarray:
    """The whole [2, width] tree rebuilt bottom-up in float64 from the leaf priorities.

    Each level above the leaves holds, for every block of 8 nodes below, their sum and
    the minimum over positive priorities, until one node (the root) is left; the levels
    are then laid out root first, each padded with empty nodes (0, inf) to a multiple of 8.
    """
    sums = [[float(p) for p in priorities]]
    mins = [[float(p) if p > 0 else math.inf for p in priorities]]
    while len(sums[-1]) > 1:
        below_sums, below_mins = sums[-1], mins[-1]
        blocks = range(0, len(below_sums), 8)
        sums.append([sum(below_sums[j:j + 8]) for j in blocks])
        mins.append([min(below_mins[j:j + 8]) for j in blocks])
    rows = [[], []]
    for level_sums, level_mins in zip(reversed(sums), reversed(mins), strict=True):
        padding = -len(level_sums) % 8
        rows[0] += level_sums + [0.0] * padding
        rows[1] += level_mins + [math.inf] * padding
    return np.array(rows)


def _as_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().double().numpy()


def _below_one(dtype: torch.dtype) -> float:
    """The largest float of ``dtype`` below 1, the top of ``torch.rand``'s range."""
    return torch.nextafter(torch.tensor(1.0, dtype=dtype), torch.tensor(0.0, dtype=dtype)).item()


def _uniforms(kind: str, n: int, dtype: torch.dtype, device: str, seed: int = 0) -> torch.Tensor:
    if kind == "random":
        u = torch.rand(n, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    elif kind == "zero":
        u = torch.zeros(n, dtype=dtype)
    elif kind == "below_one":
        u = torch.full((n,), _below_one(dtype), dtype=dtype)
    elif kind == "alternating":
        u = torch.zeros(n, dtype=dtype)
        u[1::2] = _below_one(dtype)
    else:
        raise AssertionError(kind)
    return u.to(device)



def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


# 0. Layout: level offsets of the 8-ary tree, counted by hand.


@pytest.mark.parametrize("capacity, offsets", [
    (1, [0, 8]),                      # the root is the only leaf
    (8, [0, 8, 16]),                  # root block, one block of 8 leaves
    (9, [0, 8, 16, 32]),              # 2 nodes (one block), 9 leaves (two blocks)
    (64, [0, 8, 16, 80]),             # 8 nodes, 64 leaves: no padding below the root
    (65, [0, 8, 16, 32, 104]),        # 2, 9 -> 16, 65 -> 72
    (1000, [0, 8, 16, 32, 160, 1160]),  # 2, 16, 125 -> 128, 1000
])
def test_tree_layout(capacity, offsets):
    assert tree_layout(capacity) == offsets
    assert SumTree(capacity).tree.shape == (2, offsets[-1])


def test_tree_memory_is_about_capacity():
    # 1 + 1/8 + 1/64 + ... ~ 1.143 entries per leaf, against up to 4 for a binary tree.
    width = tree_layout(2**20)[-1]
    assert width == 1_198_384 and width / 2**20 < 1.15


# 1. Updates: leaves equal the sequential writes, every internal node its children's sum/min.


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("capacity", [1, 2, 3, 5, 1000, 1024, 1025])
def test_update_matches_naive_and_every_node_is_consistent(path, capacity, dtype):
    # Integer-valued priorities (0..9, zeros included): every sum is exact in float32 too,
    # so the whole tree can be compared exactly.
    rng = np.random.default_rng(capacity)
    tree = path.tree(capacity, dtype)
    batches = []
    for _ in range(6):
        size = int(rng.integers(2, min(2 * capacity + 3, 600)))
        indices = rng.integers(0, capacity, size)
        indices[-1] = indices[0]  # at least one duplicate per batch
        priorities = rng.integers(0, 10, size).astype(np.float64)
        priorities[-1] = (priorities[0] + 1) % 10  # ... with a different priority
        batches.append((indices, priorities))
        tree.update(path.ints(indices), path.floats(priorities, dtype))
    want = priorities_after_updates(capacity, batches)
    if capacity >= 1000:
        assert (want == 0).any() and (want > 0).any()
    assert tree.tree.dtype == dtype
    np.testing.assert_array_equal(_as_numpy(tree.priorities()), want)
    np.testing.assert_array_equal(_as_numpy(tree.tree), _tree_from_leaves(want))


# 2. Duplicate indices in one batch: the last write wins.


def test_duplicate_indices_last_write_wins(path):
    tree = path.tree(6)
    tree.update(path.ints([3, 3, 3]), path.floats([1, 5, 2]))
    assert tree.priorities().tolist() == [0, 0, 0, 2, 0, 0]
    assert tree.total() == 2 and tree.min_priority() == 2
    # Index 1 goes to 7 then back to 0; index 4 from 0 to 6; index 3 is overwritten.
    tree.update(path.ints([1, 4, 1, 4, 3]), path.floats([7, 0, 0, 6, 4]))
    assert tree.priorities().tolist() == [0, 0, 0, 4, 6, 0]
    assert tree.total() == 10 and tree.min_priority() == 4
    np.testing.assert_array_equal(
        _as_numpy(tree.tree), _tree_from_leaves(np.array([0, 0, 0, 4, 6, 0.0]))
    )


# 3. Sampling == the naive scan of the cumulative sum, for fixed uniforms.


def _random_priorities(capacity: int, zero_fraction: float, seed: int) -> list:
    rng = np.random.default_rng(seed)
    p = rng.integers(1, 10, capacity).astype(np.float64)
    p[rng.random(capacity) < zero_fraction] = 0
    p[-1] = 3  # a positive last leaf, next to the empty slots [capacity, L)
    return p.tolist()


SAMPLE_CASES = {
    "scattered_zeros": [0, 3, 0, 0, 5, 1, 0, 2, 0, 0, 7, 0, 4],
    "trailing_zeros": [4, 1, 2] + [0] * 7,
    "leading_zeros": [0] * 5 + [2, 3],
    "one_positive": [0, 0, 0, 9, 0, 0],
    "capacity_1": [5],
    "capacity_1025": _random_priorities(1025, 0.3, seed=1),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("case", list(SAMPLE_CASES))
def test_sample_matches_naive(path, case, dtype):
    priorities = np.array(SAMPLE_CASES[case])
    capacity = len(priorities)
    tree = path.tree(capacity, dtype)
    tree.update(path.ints(np.arange(capacity)), path.floats(priorities, dtype))
    for n in (1, 7, 64):
        for kind in ("random", "zero", "below_one", "alternating"):
            uniforms = _uniforms(kind, n, dtype, path.device, seed=n)
            indices, probabilities = path.sample(tree, uniforms)
            assert indices.dtype == torch.int64 and probabilities.dtype == dtype
            want_indices, want_probabilities = stratified_sample_naive(
                priorities, _as_numpy(uniforms)
            )
            got = indices.cpu().numpy()
            np.testing.assert_array_equal(got, want_indices, err_msg=f"n={n} {kind}")
            np.testing.assert_allclose(_as_numpy(probabilities), want_probabilities, rtol=1e-6)
            assert (got < capacity).all() and (priorities[got] > 0).all()
    if case == "capacity_1":
        assert got.tolist() == [0] * 64 and probabilities.tolist() == [1.0] * 64
    if case == "capacity_1025":
        # The top of the mass lands on the last leaf, never in the empty slots past it.
        below = _uniforms("below_one", 64, dtype, path.device)
        assert path.sample(tree, below)[0][-1].item() == capacity - 1


def test_sample_round_off_float32(path):
    """In float32 ``1 + 1e-8 == 1``: the root (1.0) is below the true mass, and the 1e-8
    leaf is reachable only through a mass smaller than its own priority."""
    tree = path.tree(8, torch.float32)
    priorities = np.array([1e-8, 0, 0, 1.0, 0, 0, 0, 0], dtype=np.float32)
    tree.update(path.ints(np.arange(8)), path.floats(priorities))
    assert tree.total() == 1.0
    below = _below_one(torch.float32)
    for u, want in [(0.0, 0), (1e-9, 0), (2e-8, 3), (0.5, 3), (below, 3)]:
        uniforms = path.floats([u])
        indices, probabilities = path.sample(tree, uniforms)
        assert indices.tolist() == [want], u
        naive_indices, naive_probabilities = stratified_sample_naive(
            priorities, _as_numpy(uniforms)
        )
        assert naive_indices.tolist() == [want]
        np.testing.assert_allclose(_as_numpy(probabilities), naive_probabilities, rtol=1e-6)
    for kind in ("zero", "below_one", "alternating", "random"):
        indices, _ = path.sample(tree, _uniforms(kind, 5, torch.float32, path.device))
        assert set(indices.tolist()) <= {0, 3}, kind


def test_sample_round_off_float64_mass_reaches_total(path):
    """``(N - 1 + u) * (total / N)`` with ``u = 1 - 2^-53`` rounds to the total itself: the
    descent must not step into the empty right-hand subtree."""
    tree = path.tree(8, torch.float64)
    priorities = np.array([0.1, 0.2, 0, 0, 0.3, 0, 0, 0])
    tree.update(path.ints(np.arange(8)), path.floats(priorities, torch.float64))
    below = _below_one(torch.float64)
    total = tree.total()
    assert (2 + below) * (total / 3) >= total  # the case is the one it claims to be
    for n in range(1, 10):
        uniforms = _uniforms("below_one", n, torch.float64, path.device)
        indices, _ = path.sample(tree, uniforms)
        want, _ = stratified_sample_naive(priorities, _as_numpy(uniforms))
        assert indices.tolist() == want.tolist()
        assert indices[-1].item() == 4


# 4. A large random run never draws a zero-priority leaf.


def test_never_draws_a_zero_priority_leaf(path):
    rng = np.random.default_rng(1)
    capacity = 3000
    # Real-valued float32 priorities over six decades: sums round at every node.
    priorities = (10.0 ** rng.uniform(-3, 3, capacity)).astype(np.float32)
    priorities[rng.random(capacity) < 0.7] = 0
    tree = path.tree(capacity, torch.float32)
    tree.update(path.ints(np.arange(capacity)), path.floats(priorities))
    # This seed's float32 root rounds up past the exact sum of its leaves, so the top
    # draws of a batch carry more mass than the positive leaves hold: without the
    # "never enter an empty subtree" rule they fall into zeros or the slots past capacity.
    assert tree.total() > priorities.astype(np.float64).sum()
    generator = path.generator(4)
    draws = [tree.sample(512, generator) for _ in range(200)]
    for n in (1, 2, 3, 7, 64, 512):
        for kind in ("zero", "below_one", "alternating"):
            draws.append(path.sample(tree, _uniforms(kind, n, torch.float32, path.device)))
    indices = torch.cat([d[0] for d in draws]).cpu().numpy()
    probabilities = _as_numpy(torch.cat([d[1] for d in draws]))
    assert indices.min() >= 0 and indices.max() < capacity
    assert (priorities[indices] > 0).all()
    np.testing.assert_allclose(probabilities, priorities[indices] / tree.total(), rtol=1e-6)


# 5. Draw frequencies follow P(i) = p_i / total.


def test_frequencies_chi_square(path):
    rng = np.random.default_rng(5)
    capacity, batch_size, n_batches = 50, 256, 400
    priorities = rng.uniform(0.5, 5.0, capacity).astype(np.float32)
    zero = rng.choice(capacity, 8, replace=False)
    priorities[zero] = 0
    tree = path.tree(capacity)
    tree.update(path.ints(np.arange(capacity)), path.floats(priorities))
    generator = path.generator(5)
    per_batch = np.stack([
        np.bincount(tree.sample(batch_size, generator)[0].cpu().numpy(), minlength=capacity)
        for _ in range(n_batches)
    ])
    p = priorities.astype(np.float64) / priorities.astype(np.float64).sum()
    counts = per_batch.sum(0)
    assert counts[zero].sum() == 0
    positive = p > 0
    expected = n_batches * batch_size * p[positive]
    chi2 = (((counts[positive] - expected) ** 2) / expected).sum()
    assert chi2 < chi2_quantile(int(positive.sum()) - 1), chi2
    # Stratification: one draw per segment of mass total/B, so within each batch a leaf of
    # probability P is drawn B*P times give or take less than 2 (multinomial draws are not).
    assert np.abs(per_batch - batch_size * p).max() < 2


# 6. Importance-sampling weights (Section 3.4).


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
def test_importance_weights_match_naive(path, beta, dtype):
    rng = np.random.default_rng(6)
    capacity = 37
    priorities = rng.uniform(0.1, 10.0, capacity)
    priorities[rng.random(capacity) < 0.25] = 0
    priorities = priorities.astype(np.float32 if dtype == torch.float32 else np.float64)
    tree = path.tree(capacity, dtype)
    tree.update(path.ints(np.arange(capacity)), path.floats(priorities, dtype))
    indices, probabilities = tree.sample(64, path.generator(6))
    weights = tree.importance_weights(probabilities, beta)
    assert weights.dtype == dtype
    rtol = 1e-5 if dtype == torch.float32 else 1e-12
    want = importance_weights_naive(priorities, indices.cpu().numpy(), beta, n_items=capacity)
    np.testing.assert_allclose(_as_numpy(weights), want, rtol=rtol)
    # Over the whole buffer the largest weight is 1, held by the smallest priority.
    positive = np.flatnonzero(priorities > 0)
    every = path.floats(priorities[positive] / priorities.astype(np.float64).sum(), dtype)
    every_weight = _as_numpy(tree.importance_weights(every, beta))
    assert every_weight.max() <= 1 + rtol
    assert every_weight[np.argmin(priorities[positive])] == pytest.approx(1.0, rel=rtol)
    np.testing.assert_allclose(
        every_weight, importance_weights_naive(priorities, positive, beta, capacity), rtol=rtol
    )


# 7. The root reads: total and smallest positive priority.


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_total_and_min_priority(path, dtype):
    capacity = 100
    tree = path.tree(capacity, dtype)
    assert tree.total() == 0 and tree.min_priority() == math.inf
    with pytest.raises(ValueError, match="all zero"):
        tree.sample(4)
    rng = np.random.default_rng(7)
    for _ in range(3):
        indices = rng.integers(0, capacity, 40)
        values = rng.uniform(0.01, 3.0, 40) * (rng.random(40) < 0.8)
        tree.update(path.ints(indices), path.floats(values, dtype))
    stored = _as_numpy(tree.priorities())
    assert (stored == 0).any()
    rtol = 1e-6 if dtype == torch.float32 else 1e-13
    assert tree.total() == pytest.approx(stored.sum(), rel=rtol)
    assert tree.min_priority() == stored[stored > 0].min()  # a min has no round-off
    # Back to all zeros: the root reads 0 and +inf again, and sampling is refused.
    tree.update(path.ints(np.arange(capacity)), path.floats(np.zeros(capacity), dtype))
    assert tree.total() == 0 and tree.min_priority() == math.inf
    with pytest.raises(ValueError, match="all zero"):
        tree.sample(4)


# 8. Errors.


@pytest.mark.parametrize("capacity", [0, -3, 2.5])
def test_capacity_must_be_a_positive_int(path, capacity):
    with pytest.raises(ValueError, match="capacity must be a positive int"):
        path.tree(capacity)


BAD_UPDATES = {
    # name: (indices, priorities, exception, message)
    "index_at_capacity": ([1, 5], [1.0, 1.0], (RuntimeError, ValueError),
                          r"indices must lie in \[0, 5\), got 1\.\.5|index 5 is outside the "
                          r"tree's capacity 5"),
    "index_in_empty_slot": ([7], [1.0], (RuntimeError, ValueError),
                            r"indices must lie in \[0, 5\), got 7\.\.7|index 7 is outside the "
                            r"tree's capacity 5"),
    "negative_priority": ([0, 1, 2], [1.0, 2.0, -1.0], (RuntimeError, ValueError),
                          "finite and >= 0"),
    "nan_priority": ([0, 1], [float("nan"), 1.0], (RuntimeError, ValueError), "finite and >= 0"),
    "inf_priority": ([3], [float("inf")], (RuntimeError, ValueError), "finite and >= 0"),
    "int32_indices": (np.array([0, 1], dtype=np.int32), [1.0, 1.0], ValueError,
                      "must be a 1-D int64 tensor"),
    "2d_indices": ([[0, 1]], [[1.0, 1.0]], ValueError, "must be a 1-D int64 tensor"),
    "shape_mismatch": ([0, 1], [1.0], ValueError, "priorities must have the shape of indices"),
}


@pytest.mark.parametrize("case", list(BAD_UPDATES))
def test_bad_update_is_refused_and_leaves_the_tree_unchanged(path, case):
    indices, priorities, error, message = BAD_UPDATES[case]
    tree = path.tree(5)  # the leaf block has 8 slots: 5..7 exist but must stay empty
    tree.update(path.ints(np.arange(5)), path.floats([1, 2, 3, 4, 5]))
    before = tree.tree.clone()
    index_dtype = torch.int32 if case == "int32_indices" else torch.int64
    with pytest.raises(error, match=message):
        tree.update(torch.as_tensor(np.asarray(indices), dtype=index_dtype, device=path.device),
                    path.floats(priorities))
    assert _same_bytes(tree.tree, before)


@pytest.mark.parametrize("index", [8, -1])
def test_index_outside_a_full_tree_is_refused(path, index):
    tree = path.tree(8)
    tree.update(path.ints([0, 7]), path.floats([1, 2]))
    before = tree.tree.clone()
    with pytest.raises((RuntimeError, ValueError),
                       match=r"indices must lie in \[0, 8\)|outside the tree's capacity 8"):
        tree.update(path.ints([1, index]), path.floats([3, 3]))
    assert _same_bytes(tree.tree, before)


def test_sample_and_weight_arguments(path):
    tree = path.tree(4)
    tree.update(path.ints([0]), path.floats([1]))
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        tree.sample(0)
    with pytest.raises(ValueError, match=r"beta must be in \[0, 1\], got 1.5"):
        tree.importance_weights(path.floats([1.0]), 1.5)


@pytest.mark.parametrize("device", COMPILED_DEVICES)
def test_compiled_op_argument_messages(device):
    """Host-side TORCH_CHECKs of csrc/sum_tree.h, shared by the CPU and CUDA kernels."""
    tree = torch.zeros(2, 16, device=device)  # capacities 2..8: a root block, a leaf block
    tree[1] = math.inf
    idx = torch.tensor([0], device=device)
    one = torch.ones(1, device=device)
    cases = [
        (lambda: ops.sum_tree_update(torch.zeros(3, 16, device=device), 8, idx, one),
         r"a tree of capacity 8 must have shape \[2, 16\] \(row 0 sums, row 1 minima\), "
         r"got \[3, 16\]"),
        (lambda: ops.sum_tree_update(tree, 9, idx, one),
         r"a tree of capacity 9 must have shape \[2, 32\]"),
        (lambda: ops.sum_tree_sample(tree, 0, one), "capacity must be >= 1, got 0"),
        (lambda: ops.sum_tree_update(tree.double(), 8, idx, one),
         "priorities must have the tree's dtype"),
        (lambda: ops.sum_tree_update(tree.int(), 8, idx, one.int()),
         "tree must be float32 or float64"),
        (lambda: ops.sum_tree_update(tree, 8, idx.int(), one),
         "indices must be a 1-D int64 tensor"),
        (lambda: ops.sum_tree_update(tree, 8, idx, torch.ones(2, device=device)),
         r"priorities must have shape \[1\]"),
        (lambda: ops.sum_tree_sample(tree, 8, torch.zeros(0, device=device)),
         "uniforms must be a non-empty 1-D tensor"),
        (lambda: ops.sum_tree_sample(tree, 8, torch.zeros(1, device=device, dtype=torch.float64)),
         "uniforms must have the tree's dtype"),
    ]
    before = tree.clone()
    for call, message in cases:
        with pytest.raises(RuntimeError, match=message):
            call()
    assert _same_bytes(tree, before)


# 9. opcheck: schema (tree is mutated, declared Tensor(a!)), fake kernels, autograd, AOT.


def _opcheck_trees(device: str) -> list:
    out = []
    for capacity, dtype in [(1, torch.float32), (8, torch.float32), (13, torch.float64)]:
        tree = SumTree(capacity, dtype=dtype, device=device, kernel="compiled")
        tree.update(torch.arange(capacity, device=device),
                    torch.arange(capacity, dtype=dtype, device=device) % 3 + 1)
        out.append((tree.tree, capacity))
    return out


@pytest.mark.parametrize("device", COMPILED_DEVICES)
def test_opcheck_sum_tree_update(device):
    for tree, n in _opcheck_trees(device):
        for indices in ([0], [n - 1, 0, n - 1], []):
            idx = torch.tensor(indices, dtype=torch.int64, device=device)
            priorities = torch.rand(len(indices), dtype=tree.dtype, device=device)
            result = torch.library.opcheck(torch.ops.distrl.sum_tree_update.default,
                                           (tree.clone(), n, idx, priorities))
            assert set(result.values()) == {"SUCCESS"}, result


@pytest.mark.parametrize("device", COMPILED_DEVICES)
def test_opcheck_sum_tree_sample(device):
    for tree, capacity in _opcheck_trees(device):
        for n in (1, 5, 300):
            uniforms = torch.rand(n, dtype=tree.dtype, device=device)
            result = torch.library.opcheck(torch.ops.distrl.sum_tree_sample.default,
                                           (tree.clone(), capacity, uniforms))
            assert set(result.values()) == {"SUCCESS"}, result


# 10. Checkpointing.


def test_state_dict_round_trip(path):
    rng = np.random.default_rng(10)
    tree = path.tree(37)
    tree.update(path.ints(rng.integers(0, 37, 50)), path.floats(rng.uniform(0, 5, 50)))
    state = tree.state_dict()
    want = tree.sample(64, path.generator(10))
    tree.update(path.ints(np.arange(37)), path.floats(np.ones(37)))  # state is a copy
    restored = path.tree(37)
    restored.load_state_dict(state)
    assert torch.equal(restored.tree, state["tree"])
    got = restored.sample(64, path.generator(10))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    tree.load_state_dict(state)
    got = tree.sample(64, path.generator(10))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with pytest.raises(ValueError, match="capacity 37 in the state does not match this tree's 38"):
        path.tree(38).load_state_dict(state)


# 11. The compiled and reference paths agree bit for bit.


@pytest.mark.parametrize("device", COMPILED_DEVICES)
def test_compiled_and_reference_paths_agree(device):
    capacity = 100_000
    compiled = SumTree(capacity, device=device, kernel="compiled")
    reference = SumTree(capacity, device=device, kernel="reference")
    assert (compiled.path, reference.path) == ("compiled", "reference")
    g = torch.Generator().manual_seed(11)
    for _ in range(5):
        indices = torch.randint(0, capacity, (512,), generator=g)
        indices[256:300] = indices[:44]  # duplicates, with different priorities
        priorities = torch.exp(3 * torch.randn(512, generator=g))
        priorities[torch.rand(512, generator=g) < 0.1] = 0
        compiled.update(indices.to(device), priorities.to(device))
        reference.update(indices.to(device), priorities.to(device))
    assert torch.equal(compiled.tree, reference.tree)
    uniforms = torch.rand(512, generator=g)
    uniforms[0], uniforms[-1] = 0.0, _below_one(torch.float32)
    uniforms = uniforms.to(device)
    got_indices, got_probabilities = ops.sum_tree_sample(compiled.tree, capacity, uniforms)
    want_indices, want_probabilities = sample_reference(reference.tree, capacity, uniforms)
    assert torch.equal(got_indices, want_indices)
    assert torch.equal(got_probabilities, want_probabilities)
    # The raw reference update on a third copy agrees too (no SumTree in between).
    third = reference.tree.clone()
    update_reference(third, capacity, indices.to(device), priorities.to(device))
    assert torch.equal(third, reference.tree)


# 12. The kernel setting.


@pytest.mark.parametrize("device", ALL_DEVICES)
def test_kernel_setting(device, monkeypatch):
    with pytest.raises(ValueError, match=r"auto\|compiled\|reference"):
        SumTree(8, device=device, kernel="bogus")
    assert SumTree(8, device=device, kernel="reference").path == "reference"
    want = "compiled" if _has_compiled(device) else "reference"
    assert SumTree(8, device=device, kernel="auto").path == want
    if ops.has_extension() and not ops.has_kernel("sum_tree_update", device):
        with pytest.raises(ops.KernelError, match=f"no {device} kernel for sum_tree_update"):
            SumTree(8, device=device, kernel="compiled")
    # Without the extension, kernel=compiled is an error and auto takes the reference path.
    monkeypatch.setattr(ops, "_LOAD_ERROR", "No module named 'distrl._C' (simulated)")
    assert not ops.has_extension()
    with pytest.raises(ops.KernelError, match=r"kernel=compiled but distrl._C is not loaded "
                                              r"\(No module named 'distrl._C' \(simulated\)\)"):
        SumTree(8, device=device, kernel="compiled")
    assert SumTree(8, device=device, kernel="auto").path == "reference"


@pytest.mark.skipif(not ops.has_extension() or ops.has_kernel("sum_tree_sample", "cuda"),
                    reason="needs distrl._C built without CUDA kernels")
def test_compiled_without_a_cuda_kernel_is_an_error():
    with pytest.raises(ops.KernelError, match="distrl._C has no cuda kernel for sum_tree_sample"):
        ops.use_compiled("compiled", "sum_tree_sample", "cuda")
    assert ops.use_compiled("auto", "sum_tree_sample", "cuda") is False
