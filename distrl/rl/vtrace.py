"""V-trace off-policy value targets and policy-gradient advantages, time-major ``[T, B]``.

Espeholt et al. 2018, "IMPALA: Scalable Distributed Deep-RL with Importance Weighted
Actor-Learner Architectures", Section 4.1 (eq. 1), Section 4.2 (policy gradient) and
Remark 1 (the lambda variant ``c_i = lambda * min(c_bar, rho_i)``).

Pure tensor functions: no config, no state. Targets are returned detached, as in the
paper, where ``v_s`` is a regression target and the advantage a fixed weight. The
``kernel`` argument picks the compiled op ``distrl::vtrace`` (csrc/) or the vectorised
torch code here, the reference path (see :mod:`distrl.ops`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from distrl import ops


class VTraceReturns(NamedTuple):
    """What :func:`from_importance_weights` returns; both ``[T, B]``, detached."""

    vs: torch.Tensor
    """[T, B] V-trace targets ``v_s`` (eq. 1)."""
    pg_advantages: torch.Tensor
    """[T, B] ``rho_pg_s * (r_s + gamma_s * v_{s+1} - V(x_s))`` (Section 4.2)."""


def _check_shape(name: str, tensor: torch.Tensor, expected: tuple[int, ...], dims: str) -> None:
    if tuple(tensor.shape) != expected:
        raise ValueError(f"{name} must have shape {dims} = {expected}, got {tuple(tensor.shape)}")


def _check_float(name: str, tensor: torch.Tensor, dtype: torch.dtype) -> None:
    if tensor.dtype != dtype:
        raise ValueError(
            f"{name} must have the floating dtype of log_rhos/logits ({dtype}), got {tensor.dtype}"
        )


def _check_threshold(name: str, value: float | None) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"{name} must be a positive float or None (no clipping), got {value}")


def _discounted_scan(deltas: torch.Tensor, coefs: torch.Tensor) -> torch.Tensor:
    """Backward linear recursion ``acc_t = deltas_t + coefs_t * acc_{t+1}``, ``acc_T = 0``.

    This is the sequential part of V-trace (IMPALA eq. 1 rewritten as
    ``v_s - V(x_s) = delta_s V + gamma_s c_s (v_{s+1} - V(x_{s+1}))``). A Python loop
    over ``T`` of ``[B]``-vector ops: ``T`` is short (an unroll), and a loop-free form
    via cumulative products would divide by products of discounts that are zero at
    episode ends. The compiled op does this whole function in one C++/CUDA pass.

    Args:
      deltas: [T, B] the summands ``delta_t``.
      coefs: [T, B] the per-step decay ``coefs_t`` applied to ``acc_{t+1}``.

    Returns:
      [T, B] ``acc_t`` for ``t = 0 .. T-1``.
    """
    acc = torch.empty_like(deltas)
    carry = deltas.new_zeros(deltas.shape[1:])
    for t in range(deltas.shape[0] - 1, -1, -1):
        carry = deltas[t] + coefs[t] * carry
        acc[t] = carry
    return acc


def _check_inputs(log_rhos: torch.Tensor, discounts: torch.Tensor, rewards: torch.Tensor,
                  values: torch.Tensor, bootstrap_value: torch.Tensor, lambda_: float,
                  **thresholds: float | None) -> None:
    """Raise ValueError naming the argument whose shape, dtype or value is wrong."""
    if log_rhos.dim() != 2:
        raise ValueError(f"log_rhos must have shape [T, B], got {tuple(log_rhos.shape)}")
    if not log_rhos.is_floating_point():
        raise ValueError(f"log_rhos must have a floating dtype, got {log_rhos.dtype}")
    seq_len, batch = log_rhos.shape
    for name, tensor in (("discounts", discounts), ("rewards", rewards), ("values", values)):
        _check_shape(name, tensor, (seq_len, batch), "[T, B]")
        _check_float(name, tensor, log_rhos.dtype)
    _check_shape("bootstrap_value", bootstrap_value, (batch,), "[B]")
    _check_float("bootstrap_value", bootstrap_value, log_rhos.dtype)
    for name, threshold in thresholds.items():
        _check_threshold(name, threshold)
    if not 0.0 <= lambda_ <= 1.0:
        raise ValueError(f"lambda_ must be in [0, 1], got {lambda_}")


def from_importance_weights(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    clip_rho_threshold: float | None = 1.0,
    clip_c_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    lambda_: float = 1.0,
    *,
    kernel: str = "auto",
) -> VTraceReturns:
    """V-trace targets and advantages from log importance weights (IMPALA eq. 1, Remark 1).

    Espeholt et al. 2018, Section 4.1, eq. 1, with per-step discounts:

        v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t V,
        delta_t V = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t)),

    ``rho_t = min(rho_bar, pi(a_t|x_t) / mu(a_t|x_t))``,
    ``c_i = lambda * min(c_bar, pi(a_i|x_i) / mu(a_i|x_i))`` (Remark 1) and
    ``V(x_T) = bootstrap_value``. Computed with the recursion
    ``v_s - V(x_s) = delta_s V + gamma_s c_s (v_{s+1} - V(x_{s+1}))``. The policy-gradient
    advantage (Section 4.2) is ``rho_pg_s (r_s + gamma_s v_{s+1} - V(x_s))`` with
    ``v_T = bootstrap_value``. Both outputs are detached: they are targets.

    Args:
      log_rhos: [T, B] ``log pi(a_t|x_t) - log mu(a_t|x_t)``, target over behaviour policy.
      discounts: [T, B] ``gamma_t``, discount of the transition from ``t`` to ``t+1``;
        the caller sets it to ``gamma * (1 - done_t)``.
      rewards: [T, B] ``r_t``.
      values: [T, B] ``V(x_t)`` under the current value function.
      bootstrap_value: [B] ``V(x_T)``.
      clip_rho_threshold: ``rho_bar``; None means no clipping.
      clip_c_threshold: ``c_bar``; None means no clipping.
      clip_pg_rho_threshold: ``rho_bar`` of the policy-gradient advantage; None, no clipping.
      lambda_: the ``lambda`` of Remark 1, multiplying every ``c_i``.
      kernel: ``auto`` (compiled op where built, else the torch reference), ``compiled``
        or ``reference``; see :mod:`distrl.ops`.

    Returns:
      VTraceReturns with ``vs`` [T, B] and ``pg_advantages`` [T, B], both detached.

    Raises:
      ValueError: a shape or dtype does not match, or a threshold is not positive.
      distrl.ops.KernelError: ``kernel="compiled"`` and the op is not built for the device.
    """
    _check_inputs(log_rhos, discounts, rewards, values, bootstrap_value, lambda_,
                  clip_rho_threshold=clip_rho_threshold, clip_c_threshold=clip_c_threshold,
                  clip_pg_rho_threshold=clip_pg_rho_threshold)
    with torch.no_grad():
        if ops.use_compiled(kernel, "vtrace", log_rhos.device):
            vs, pg_advantages = ops.vtrace(
                log_rhos, discounts, rewards, values, bootstrap_value,
                clip_rho_threshold, clip_c_threshold, clip_pg_rho_threshold, lambda_,
            )
            return VTraceReturns(vs=vs, pg_advantages=pg_advantages)
        rhos_t = torch.exp(log_rhos)
        clipped_rhos_t = (
            rhos_t if clip_rho_threshold is None else rhos_t.clamp(max=clip_rho_threshold)
        )
        cs_t = rhos_t if clip_c_threshold is None else rhos_t.clamp(max=clip_c_threshold)
        if lambda_ != 1.0:
            cs_t = lambda_ * cs_t
        values_tp1 = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
        deltas_t = clipped_rhos_t * (rewards + discounts * values_tp1 - values)
        vs = values + _discounted_scan(deltas_t, discounts * cs_t)

        vs_tp1 = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
        pg_rhos_t = (
            rhos_t if clip_pg_rho_threshold is None else rhos_t.clamp(max=clip_pg_rho_threshold)
        )
        pg_advantages = pg_rhos_t * (rewards + discounts * vs_tp1 - values)
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages)


def action_log_probs(logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[a_t]``: log-probability of the taken actions, differentiable.

    Args:
      logits: [T, B, A] unnormalised action preferences.
      actions: [T, B] int64 actions in ``[0, A)``.

    Returns:
      [T, B] ``log pi(a_t | x_t)``.
    """
    if logits.dim() != 3:
        raise ValueError(f"logits must have shape [T, B, A], got {tuple(logits.shape)}")
    _check_shape("actions", actions, tuple(logits.shape[:2]), "[T, B]")
    if actions.dtype != torch.int64:
        raise ValueError(f"actions must have dtype torch.int64, got {actions.dtype}")
    return F.log_softmax(logits, dim=-1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)


def from_logits(
    behaviour_logits: torch.Tensor,
    target_logits: torch.Tensor,
    actions: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    clip_rho_threshold: float | None = 1.0,
    clip_c_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    lambda_: float = 1.0,
    *,
    kernel: str = "auto",
) -> VTraceReturns:
    """V-trace (IMPALA eq. 1, Remark 1) with importance weights from softmax policies.

    ``log rho_t = log pi(a_t|x_t) - log mu(a_t|x_t)`` with ``pi = softmax(target_logits)``
    and ``mu = softmax(behaviour_logits)``; the rest is :func:`from_importance_weights`.
    For the policy-gradient loss itself, take :func:`action_log_probs` of
    ``target_logits`` separately: the outputs here are detached.

    Args:
      behaviour_logits: [T, B, A] logits of the acting (behaviour) policy ``mu``.
      target_logits: [T, B, A] logits of the learner's (target) policy ``pi``.
      actions: [T, B] int64 actions taken by the behaviour policy.
      discounts: [T, B] ``gamma_t = gamma * (1 - done_t)``.
      rewards: [T, B] ``r_t``.
      values: [T, B] ``V(x_t)``.
      bootstrap_value: [B] ``V(x_T)``.
      clip_rho_threshold, clip_c_threshold, clip_pg_rho_threshold, lambda_, kernel: as in
        :func:`from_importance_weights`.

    Returns:
      VTraceReturns with ``vs`` [T, B] and ``pg_advantages`` [T, B], both detached.
    """
    if target_logits.dim() != 3:
        raise ValueError(
            f"target_logits must have shape [T, B, A], got {tuple(target_logits.shape)}"
        )
    _check_shape("behaviour_logits", behaviour_logits, tuple(target_logits.shape), "[T, B, A]")
    with torch.no_grad():
        log_rhos = action_log_probs(target_logits, actions) - action_log_probs(
            behaviour_logits, actions
        )
    return from_importance_weights(
        log_rhos,
        discounts,
        rewards,
        values,
        bootstrap_value,
        clip_rho_threshold=clip_rho_threshold,
        clip_c_threshold=clip_c_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold,
        lambda_=lambda_,
        kernel=kernel,
    )
