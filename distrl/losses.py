"""Pure loss terms: policy gradient, baseline and entropy (IMPALA), reward clipping.

Every function takes time-major ``[T, B]`` tensors and returns a scalar summed over
time and batch, as in the IMPALA reference implementation, whose hyperparameters
(learning rate, baseline and entropy costs) assume summed, not averaged, losses.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

REWARD_CLIPPING = ("none", "abs_one", "soft_asymmetric")


def _check_time_major(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(
            f"{name} must have shape [T, B] = {tuple(shape)}, got {tuple(tensor.shape)}"
        )


def clip_rewards(rewards: torch.Tensor, mode: str) -> torch.Tensor:
    """Reward clipping applied by the learner; the actors always store raw rewards.

    ``abs_one`` clips to [-1, 1] (Mnih et al. 2015; IMPALA Table G.1);
    ``soft_asymmetric`` is IMPALA's 5 * tanh(r / 5), scaled by 0.3 for negative r (its
    DMLab-30 setting).
    """
    if mode == "none":
        return rewards
    if mode == "abs_one":
        return rewards.clamp(-1.0, 1.0)
    if mode == "soft_asymmetric":
        squeezed = torch.tanh(rewards / 5.0)
        return torch.where(rewards < 0, 0.3 * squeezed, squeezed) * 5.0
    raise ValueError(f"reward clipping must be one of {', '.join(REWARD_CLIPPING)}; got {mode!r}")


def policy_gradient_loss(
    logits_t: torch.Tensor, actions_t: torch.Tensor, advantages_t: torch.Tensor
) -> torch.Tensor:
    """-sum_t,b log pi(a_t|x_t) * A_t, with A_t held constant (IMPALA eq. 2's first term).

    Args:
        logits_t: [T, B, A] target-policy logits.
        actions_t: [T, B] int64 actions taken.
        advantages_t: [T, B] V-trace policy-gradient advantages (no gradient flows into them).
    """
    if logits_t.dim() != 3:
        raise ValueError(f"logits_t must have shape [T, B, A], got {tuple(logits_t.shape)}")
    _check_time_major("actions_t", actions_t, logits_t.shape[:2])
    _check_time_major("advantages_t", advantages_t, logits_t.shape[:2])
    log_probs = -F.cross_entropy(
        logits_t.flatten(0, 1), actions_t.flatten(0, 1), reduction="none"
    ).view_as(advantages_t)
    return -(log_probs * advantages_t.detach()).sum()


def baseline_loss(vs_t: torch.Tensor, values_t: torch.Tensor) -> torch.Tensor:
    """0.5 * sum_t,b (v_s - V(x_s))^2: the value regression towards V-trace targets (IMPALA 4.2)."""
    if vs_t.dim() != 2:
        raise ValueError(f"vs_t must have shape [T, B], got {tuple(vs_t.shape)}")
    _check_time_major("values_t", values_t, vs_t.shape)
    return 0.5 * ((vs_t.detach() - values_t) ** 2).sum()


def entropy_loss(logits_t: torch.Tensor) -> torch.Tensor:
    """sum_t,b sum_a pi(a|x) log pi(a|x): the negative entropy, minimised to keep exploring."""
    log_policy = F.log_softmax(logits_t, dim=-1)
    return (log_policy.exp() * log_policy).sum()


def entropy(logits_t: torch.Tensor) -> torch.Tensor:
    """Mean policy entropy in nats over ``[T, B]`` (a diagnostic, not a loss)."""
    log_policy = F.log_softmax(logits_t, dim=-1)
    return -(log_policy.exp() * log_policy).sum(-1).mean()


def n_step_double_q_targets(
    returns: torch.Tensor,
    discounts: torch.Tensor,
    next_online_q: torch.Tensor,
    next_target_q: torch.Tensor,
) -> torch.Tensor:
    """n-step double-Q targets (Horgan et al. 2018, eq. 1 with van Hasselt et al. 2016):

    ``G_t = R_t^(n) + gamma^n * q_target(s_{t+n}, argmax_a q(s_{t+n}, a))``, where the
    online network picks the action and the target network evaluates it; ``discounts``
    holds ``gamma^n``, or 0 where the episode ended within the n steps.

    Args:
      returns: [B] ``R_t^(n)``.
      discounts: [B] ``gamma^n`` or 0.
      next_online_q, next_target_q: [B, A] action values of ``s_{t+n}``.

    Returns:
      [B] targets, without gradient.
    """
    with torch.no_grad():
        best = next_online_q.argmax(dim=-1, keepdim=True)
        bootstrap = next_target_q.gather(-1, best).squeeze(-1)
        return returns + discounts * bootstrap


def weighted_huber_loss(
    td_errors: torch.Tensor, weights: torch.Tensor, delta: float = 1.0
) -> torch.Tensor:
    """Mean over the batch of ``w_i * huber(td_i)``: quadratic within ``delta``, linear
    beyond (Mnih et al. 2015's error clipping), weighted by importance-sampling weights
    (Schaul et al. 2016, Algorithm 1)."""
    return (weights * F.huber_loss(td_errors, torch.zeros_like(td_errors), reduction="none",
                                   delta=delta)).mean()
