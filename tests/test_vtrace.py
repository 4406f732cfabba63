"""Tests for distrl/rl/vtrace.py: V-trace (Espeholt et al. 2018, IMPALA, Section 4.1, eq. 1).

The vectorised path is checked against the naive eq. 1 sum in tests/reference.py, against
the n-step return it must reduce to on-policy, against hand-computed numbers, and for
invariance under splitting the trace in time. Every test runs twice, once on the torch
reference path and once on the compiled op (skipped where distrl._C is not built).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from marks import needs_extension
from reference import vtrace_naive

from distrl.rl import vtrace
from distrl.rl.vtrace import VTraceReturns, action_log_probs, from_importance_weights, from_logits

SHAPES = [(1, 1), (1, 5), (7, 3), (20, 8)]


@pytest.fixture(
    autouse=True,
    params=[
        "reference",
        pytest.param("compiled", marks=needs_extension),
    ],
)
def kernel(request, monkeypatch):
    """Run the test on one kernel path by changing the default of both entry points."""
    for fn in (from_importance_weights, from_logits):
        monkeypatch.setitem(fn.__kwdefaults__, "kernel", request.param)
    return request.param

# (clip_rho_threshold, clip_c_threshold, clip_pg_rho_threshold)
CLIPS = {
    "ones": (1.0, 1.0, 1.0),
    "none": (None, None, None),
    "small": (0.5, 0.5, 0.5),
    "large": (10.0, 10.0, 10.0),
    "mixed": (2.0, 0.5, None),
}


def _inputs(seq_len: int, batch: int, seed: int = 0, dtype=torch.float64) -> dict:
    """Random [T, B] V-trace inputs with episode ends (zero discounts) mid-trace.

    ``log_rhos ~ N(0, 1)`` puts ratios on both sides of every threshold used here.
    """
    g = torch.Generator().manual_seed(seed)
    gamma = 0.5 + 0.5 * torch.rand(batch, generator=g, dtype=torch.float64)
    not_done = (torch.rand(seq_len, batch, generator=g, dtype=torch.float64) > 0.2).double()
    out = dict(
        log_rhos=torch.randn(seq_len, batch, generator=g, dtype=torch.float64),
        discounts=gamma * not_done,
        rewards=torch.randn(seq_len, batch, generator=g, dtype=torch.float64),
        values=torch.randn(seq_len, batch, generator=g, dtype=torch.float64),
        bootstrap_value=torch.randn(batch, generator=g, dtype=torch.float64),
    )
    return {k: v.to(dtype) for k, v in out.items()}


def _clip_kwargs(clips: tuple, lambda_: float = 1.0) -> dict:
    rho, c, pg = clips
    return dict(
        clip_rho_threshold=rho, clip_c_threshold=c, clip_pg_rho_threshold=pg, lambda_=lambda_
    )


def _np(inputs: dict) -> dict:
    return {k: v.double().numpy() for k, v in inputs.items()}


# 1. Vectorised path == naive eq. 1 sum.


@pytest.mark.parametrize("lambda_", [1.0, 0.95, 0.5])
@pytest.mark.parametrize("clip_name", list(CLIPS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"T{s[0]}B{s[1]}")
def test_matches_naive_reference_float64(shape, clip_name, lambda_):
    inputs = _inputs(*shape, seed=shape[0] * 100 + shape[1])
    kwargs = _clip_kwargs(CLIPS[clip_name], lambda_)
    if shape[0] > 1:
        # The random draw must actually contain an episode end and a live step.
        assert (inputs["discounts"] == 0).any() and (inputs["discounts"] > 0).any()
    got = from_importance_weights(**inputs, **kwargs)
    want_vs, want_pg = vtrace_naive(**_np(inputs), **kwargs)
    np.testing.assert_allclose(got.vs.numpy(), want_vs, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got.pg_advantages.numpy(), want_pg, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("clip_name", ["ones", "mixed"])
def test_matches_naive_reference_float32(clip_name):
    inputs = _inputs(20, 8, seed=3, dtype=torch.float32)
    kwargs = _clip_kwargs(CLIPS[clip_name], 0.95)
    got = from_importance_weights(**inputs, **kwargs)
    assert got.vs.dtype == torch.float32 and got.pg_advantages.dtype == torch.float32
    want_vs, want_pg = vtrace_naive(**_np(inputs), **kwargs)
    np.testing.assert_allclose(got.vs.numpy(), want_vs, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got.pg_advantages.numpy(), want_pg, rtol=1e-5, atol=1e-5)


def test_discounted_scan_is_the_backward_sum():
    """``acc_t = sum_{u>=t} (prod_{i=t}^{u-1} coefs_i) deltas_u``: the contract of the op
    that a compiled kernel will replace."""
    g = torch.Generator().manual_seed(7)
    deltas = torch.randn(6, 4, generator=g, dtype=torch.float64)
    coefs = torch.rand(6, 4, generator=g, dtype=torch.float64)
    coefs[2, 1] = 0.0
    d, c = deltas.numpy(), coefs.numpy()
    want = np.zeros((6, 4))
    for b in range(4):
        for t in range(6):
            want[t, b] = sum(np.prod(c[t:u, b]) * d[u, b] for u in range(t, 6))
    np.testing.assert_allclose(vtrace._discounted_scan(deltas, coefs).numpy(), want, rtol=1e-12)


# 2. On-policy, no trace cutting: vs is the n-step bootstrapped return.


@pytest.mark.parametrize("threshold", [1.0, None, 3.0])
@pytest.mark.parametrize("shape", [(1, 3), (9, 4)], ids=lambda s: f"T{s[0]}B{s[1]}")
def test_on_policy_is_n_step_return(shape, threshold):
    inputs = _inputs(*shape, seed=11)
    inputs["log_rhos"] = torch.zeros(shape, dtype=torch.float64)
    out = from_importance_weights(
        **inputs,
        clip_rho_threshold=threshold,
        clip_c_threshold=threshold,
        clip_pg_rho_threshold=threshold,
        lambda_=1.0,
    )
    r = inputs["rewards"].numpy()
    gam = inputs["discounts"].numpy()
    boot = inputs["bootstrap_value"].numpy()
    seq_len, batch = shape
    returns = np.zeros((seq_len + 1, batch))
    returns[seq_len] = boot
    for b in range(batch):
        for s in range(seq_len):
            # Forward discounted sum: sum_t (prod_{i<t} gamma_i) r_t + (prod all gamma) V(x_T).
            total, scale = 0.0, 1.0
            for t in range(s, seq_len):
                total += scale * r[t, b]
                scale *= gam[t, b]
            returns[s, b] = total + scale * boot[b]
    np.testing.assert_allclose(out.vs.numpy(), returns[:seq_len], rtol=1e-10, atol=1e-10)
    # With rho = 1 the advantage is the one-step TD error against the n-step return.
    want_pg = r + gam * returns[1:] - inputs["values"].numpy()
    np.testing.assert_allclose(out.pg_advantages.numpy(), want_pg, rtol=1e-10, atol=1e-10)


# 3. Splitting the trace in time.


def _piece(inputs: dict, start: int, stop: int, bootstrap_value: torch.Tensor) -> dict:
    sliced = {k: v[start:stop] for k, v in inputs.items() if k != "bootstrap_value"}
    return dict(sliced, bootstrap_value=bootstrap_value)


@pytest.mark.parametrize("lambda_", [1.0, 0.5])
@pytest.mark.parametrize("clip_name", ["ones", "none", "mixed"])
@pytest.mark.parametrize("split", [1, 6, 11])
def test_split_in_time_with_carried_correction(split, clip_name, lambda_):
    """V-trace over [0, T) from V-trace over [k, T) and over [0, k).

    From eq. 1, ``v_t - V(x_t) = sum_{u=t}^{T-1} (prod_{i=t}^{u-1} gamma_i c_i) delta_u``.
    Each ``delta_u`` only looks at step ``u`` and ``V(x_{u+1})``, so:

    * the later piece [k, T) with the original bootstrap reproduces ``vs[k:]`` and
      ``pg_advantages[k:]`` exactly (nothing flows forward in time);
    * the earlier piece [0, k) with ``bootstrap_value = V(x_k)`` has the same deltas for
      ``u < k`` and misses only the terms ``u >= k``, which factor as
      ``(prod_{i=t}^{k-1} gamma_i c_i) (v_k - V(x_k))``. Hence for ``t < k``:
      ``vs[t] = vs_first[t] + (prod_{i=t}^{k-1} gamma_i c_i) (vs[k] - V(x_k))``.
    """
    inputs = _inputs(12, 5, seed=split)
    kwargs = _clip_kwargs(CLIPS[clip_name], lambda_)
    full = from_importance_weights(**inputs, **kwargs)

    later = from_importance_weights(
        **_piece(inputs, split, 12, inputs["bootstrap_value"]), **kwargs
    )
    torch.testing.assert_close(later.vs, full.vs[split:], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        later.pg_advantages, full.pg_advantages[split:], rtol=1e-12, atol=1e-12
    )

    values_k = inputs["values"][split]
    first = from_importance_weights(**_piece(inputs, 0, split, values_k), **kwargs)
    ratio = np.exp(inputs["log_rhos"].numpy()[:split])
    c_bar = kwargs["clip_c_threshold"]
    cs = lambda_ * (ratio if c_bar is None else np.minimum(c_bar, ratio))
    gamma_c = inputs["discounts"].numpy()[:split] * cs
    trace = np.stack([np.prod(gamma_c[t:], axis=0) for t in range(split)])  # [k, B]
    carried = (full.vs[split] - values_k).numpy()
    np.testing.assert_allclose(
        full.vs[:split].numpy(), first.vs.numpy() + trace * carried, rtol=1e-10, atol=1e-10
    )
    # The correction is not vacuous: some column carries a non-zero amount back.
    assert np.abs(trace[-1] * carried).max() > 1e-3


@pytest.mark.parametrize("threshold", [1.0, None, 2.0])
@pytest.mark.parametrize("split", [1, 6, 11])
def test_split_in_time_bootstrapping_from_vs(split, threshold):
    """With ``rho_bar == c_bar`` and ``lambda = 1`` (so ``rho_t == c_t``) the earlier piece
    bootstrapped from the later piece's ``v_k`` is exact, advantages included.

    The recursion step at ``k - 1`` is
    ``v_{k-1} - V_{k-1} = rho (r + gamma V_k - V_{k-1}) + gamma c (v_k - V_k)``, which for
    ``rho == c`` equals ``rho (r + gamma v_k - V_{k-1})``: the delta of a trace that
    ends at ``k`` with bootstrap ``v_k``. Everything before ``k - 1`` then matches.
    """
    inputs = _inputs(12, 5, seed=20 + split)
    kwargs = dict(
        clip_rho_threshold=threshold, clip_c_threshold=threshold, clip_pg_rho_threshold=1.0
    )
    full = from_importance_weights(**inputs, **kwargs)
    later = from_importance_weights(
        **_piece(inputs, split, 12, inputs["bootstrap_value"]), **kwargs
    )
    first = from_importance_weights(**_piece(inputs, 0, split, later.vs[0]), **kwargs)
    stitched_vs = torch.cat([first.vs, later.vs])
    stitched_pg = torch.cat([first.pg_advantages, later.pg_advantages])
    torch.testing.assert_close(stitched_vs, full.vs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(stitched_pg, full.pg_advantages, rtol=1e-12, atol=1e-12)


def test_episode_end_cuts_the_trace():
    """A zero discount at step k makes vs[:k+1] and pg_advantages[:k+1] blind to
    everything after step k."""
    inputs = _inputs(10, 4, seed=5)
    inputs["discounts"][4] = 0.0
    a = from_importance_weights(**inputs, clip_rho_threshold=None, clip_c_threshold=None)
    changed = {k: v.clone() for k, v in inputs.items()}
    for key in ("log_rhos", "rewards", "values"):
        changed[key][5:] += 1.7
    changed["bootstrap_value"] += 3.0
    b = from_importance_weights(**changed, clip_rho_threshold=None, clip_c_threshold=None)
    torch.testing.assert_close(a.vs[:5], b.vs[:5], rtol=0, atol=0)
    torch.testing.assert_close(a.pg_advantages[:5], b.pg_advantages[:5], rtol=0, atol=0)
    assert (a.vs[5:] - b.vs[5:]).abs().min() > 1e-3


# 4. from_logits == from_importance_weights with hand-computed log ratios.


def _np_log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


@pytest.mark.parametrize("lambda_", [1.0, 0.5])
def test_from_logits_matches_importance_weights(lambda_):
    seq_len, batch, num_actions = 8, 4, 5
    g = torch.Generator().manual_seed(9)
    behaviour_logits = torch.randn(seq_len, batch, num_actions, generator=g, dtype=torch.float64)
    target_logits = torch.randn(seq_len, batch, num_actions, generator=g, dtype=torch.float64)
    actions = torch.randint(0, num_actions, (seq_len, batch), generator=g)
    inputs = _inputs(seq_len, batch, seed=10)
    del inputs["log_rhos"]

    bl, tl, a = behaviour_logits.numpy(), target_logits.numpy(), actions.numpy()
    probs_pi = np.exp(tl) / np.exp(tl).sum(-1, keepdims=True)
    probs_mu = np.exp(bl) / np.exp(bl).sum(-1, keepdims=True)
    t_idx, b_idx = np.meshgrid(np.arange(seq_len), np.arange(batch), indexing="ij")
    log_rhos = np.log(probs_pi[t_idx, b_idx, a]) - np.log(probs_mu[t_idx, b_idx, a])

    kwargs = _clip_kwargs(CLIPS["mixed"], lambda_)
    got = from_logits(behaviour_logits, target_logits, actions, **inputs, **kwargs)
    want = from_importance_weights(torch.from_numpy(log_rhos), **inputs, **kwargs)
    torch.testing.assert_close(got.vs, want.vs, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got.pg_advantages, want.pg_advantages, rtol=1e-10, atol=1e-10)
    want_vs, _ = vtrace_naive(log_rhos, **_np(inputs), **kwargs)
    np.testing.assert_allclose(got.vs.numpy(), want_vs, rtol=1e-10, atol=1e-10)

    np.testing.assert_allclose(
        action_log_probs(target_logits, actions).numpy(),
        np.log(probs_pi[t_idx, b_idx, a]),
        rtol=1e-12,
    )
    np.testing.assert_allclose(
        action_log_probs(behaviour_logits, actions).numpy(),
        _np_log_softmax(bl)[t_idx, b_idx, a],
        rtol=1e-12,
    )


def test_action_log_probs_is_differentiable():
    logits = torch.zeros(2, 1, 3, requires_grad=True)
    logp = action_log_probs(logits, torch.tensor([[0], [2]]))
    torch.testing.assert_close(logp, torch.full((2, 1), -math.log(3.0)))
    logp.sum().backward()
    # d log softmax(z)_a / dz = onehot(a) - softmax(z) = onehot(a) - 1/3.
    want = torch.tensor([[[2 / 3, -1 / 3, -1 / 3]], [[-1 / 3, -1 / 3, 2 / 3]]])
    torch.testing.assert_close(logits.grad, want)


# 5. Hand-computed T=2, B=1.


HAND_CASES = {
    # values V = [1, 2], V(x_2) = 3, r = [1, 1.5], gamma = [0.9, 0.5], ratios = [2, 0.5].
    # Thresholds 1, lambda 1: rho = c = rho_pg = [1, 0.5].
    #   delta_1 = 0.5 * (1.5 + 0.5 * 3 - 2) = 0.5        -> v_1 = 2 + 0.5 = 2.5
    #   delta_0 = 1 * (1 + 0.9 * 2 - 1) = 1.8
    #   v_0 - V_0 = 1.8 + 0.9 * c_0 * (v_1 - V_1) = 1.8 + 0.9 * 1 * 0.5 = 2.25 -> v_0 = 3.25
    #   pg_0 = 1 * (1 + 0.9 * 2.5 - 1) = 2.25;  pg_1 = 0.5 * (1.5 + 0.5 * 3 - 2) = 0.5
    "clipped": (dict(), [3.25, 2.5], [2.25, 0.5]),
    # No clipping, lambda 0.5: rho = rho_pg = [2, 0.5], c = 0.5 * [2, 0.5] = [1, 0.25].
    #   delta_1 = 0.5 * 1 = 0.5                          -> v_1 = 2.5
    #   delta_0 = 2 * (1 + 0.9 * 2 - 1) = 3.6
    #   v_0 - V_0 = 3.6 + 0.9 * 1 * 0.5 = 4.05           -> v_0 = 5.05
    #   pg_0 = 2 * (1 + 0.9 * 2.5 - 1) = 4.5;  pg_1 = 0.5 * 1 = 0.5
    "unclipped_lambda": (
        dict(
            clip_rho_threshold=None,
            clip_c_threshold=None,
            clip_pg_rho_threshold=None,
            lambda_=0.5,
        ),
        [5.05, 2.5],
        [4.5, 0.5],
    ),
}


@pytest.mark.parametrize("case", list(HAND_CASES))
def test_hand_computed(case):
    kwargs, want_vs, want_pg = HAND_CASES[case]
    out = from_importance_weights(
        log_rhos=torch.tensor([[math.log(2.0)], [math.log(0.5)]], dtype=torch.float64),
        discounts=torch.tensor([[0.9], [0.5]], dtype=torch.float64),
        rewards=torch.tensor([[1.0], [1.5]], dtype=torch.float64),
        values=torch.tensor([[1.0], [2.0]], dtype=torch.float64),
        bootstrap_value=torch.tensor([3.0], dtype=torch.float64),
        **kwargs,
    )
    assert isinstance(out, VTraceReturns)
    np.testing.assert_allclose(out.vs.numpy()[:, 0], want_vs, rtol=1e-12)
    np.testing.assert_allclose(out.pg_advantages.numpy()[:, 0], want_pg, rtol=1e-12)


# 6. Shape, dtype and argument errors.


@pytest.mark.parametrize(
    "name, bad_shape, message",
    [
        ("rewards", (20, 7), "rewards must have shape [T, B] = (20, 8), got (20, 7)"),
        ("discounts", (19, 8), "discounts must have shape [T, B] = (20, 8), got (19, 8)"),
        ("values", (20, 8, 1), "values must have shape [T, B] = (20, 8), got (20, 8, 1)"),
        ("bootstrap_value", (1, 8), "bootstrap_value must have shape [B] = (8,), got (1, 8)"),
        ("log_rhos", (20,), "log_rhos must have shape [T, B], got (20,)"),
    ],
)
def test_shape_error_names_argument(name, bad_shape, message):
    inputs = _inputs(20, 8)
    inputs[name] = torch.zeros(bad_shape, dtype=torch.float64)
    with pytest.raises(ValueError, match=re.escape(message)):
        from_importance_weights(**inputs)


def test_from_logits_shape_errors():
    inputs = _inputs(4, 3)
    del inputs["log_rhos"]
    logits = torch.zeros(4, 3, 2, dtype=torch.float64)
    actions = torch.zeros(4, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match=re.escape("actions must have shape [T, B] = (4, 3)")):
        from_logits(logits, logits, actions[:, :2], **inputs)
    with pytest.raises(ValueError, match=re.escape("behaviour_logits must have shape [T, B, A]")):
        from_logits(logits[..., :1], logits, actions, **inputs)
    with pytest.raises(ValueError, match="actions must have dtype torch.int64"):
        from_logits(logits, logits, actions.int(), **inputs)


def test_dtype_and_threshold_errors():
    inputs = _inputs(4, 3)
    with pytest.raises(ValueError, match="values must have the floating dtype"):
        from_importance_weights(**dict(inputs, values=inputs["values"].float()))
    with pytest.raises(ValueError, match="clip_c_threshold must be a positive float or None"):
        from_importance_weights(**inputs, clip_c_threshold=0.0)
    with pytest.raises(ValueError, match=re.escape("lambda_ must be in [0, 1], got 1.5")):
        from_importance_weights(**inputs, lambda_=1.5)


# 7. The outputs are targets: no gradient flows into them.


def test_outputs_are_detached():
    inputs = {k: v.requires_grad_() for k, v in _inputs(5, 3).items()}
    out = from_importance_weights(**inputs)
    assert not out.vs.requires_grad and out.vs.grad_fn is None
    assert not out.pg_advantages.requires_grad and out.pg_advantages.grad_fn is None
    assert torch.is_grad_enabled()  # grad mode is restored for the caller's loss

    target_logits = torch.randn(5, 3, 4, dtype=torch.float64, requires_grad=True)
    del inputs["log_rhos"]
    out = from_logits(
        torch.randn(5, 3, 4, dtype=torch.float64),
        target_logits,
        torch.zeros(5, 3, dtype=torch.int64),
        **inputs,
    )
    assert not out.vs.requires_grad and not out.pg_advantages.requires_grad
    # The loss built on top still differentiates through the policy and the values.
    loss = -(
        action_log_probs(target_logits, torch.zeros(5, 3, dtype=torch.int64)) * out.pg_advantages
    )
    loss = loss.sum() + ((out.vs - inputs["values"]) ** 2).sum()
    loss.backward()
    assert target_logits.grad is not None and target_logits.grad.abs().sum() > 0
    assert inputs["values"].grad is not None and inputs["values"].grad.abs().sum() > 0
