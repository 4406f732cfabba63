"""Pure loss terms and their targets: policy gradient, baseline and entropy (IMPALA),
reward clipping, n-step double-Q targets and the weighted Huber loss (Ape-X), and R2D2's
value rescaling, transformed n-step targets and sequence priorities.

Every function takes time-major ``[T, B, ...]`` tensors. The IMPALA losses return a
scalar summed over time and batch, as in the IMPALA reference implementation, whose
hyperparameters (learning rate, baseline and entropy costs) assume summed, not averaged,
losses; targets and priorities come back per step or per sequence, without gradient.
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
    """Reward clipping: IMPALA's learner applies it to the raw rewards of an unroll;
    Ape-X's actors apply it to each step's reward before the n-step sum (agents/apex.py).

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


def clipped_surrogate_loss(
    log_probs_t: torch.Tensor,
    behaviour_log_probs_t: torch.Tensor,
    advantages_t: torch.Tensor,
    clip: float,
) -> torch.Tensor:
    """-sum_t,b min(r_t A_t, clip(r_t, 1 - eps, 1 + eps) A_t) with r_t = pi(a_t|x_t) /
    mu(a_t|x_t): PPO's clipped surrogate (Schulman et al. 2017, eq. 7), summed like the
    IMPALA terms. The old policy is the behaviour policy mu that acted, as in APPO.

    Args:
        log_probs_t: [T, B] log pi(a_t|x_t), differentiable.
        behaviour_log_probs_t: [T, B] log mu(a_t|x_t) (no gradient flows into it).
        advantages_t: [T, B] advantages (held constant).
        clip: eps, in (0, 1).
    """
    if log_probs_t.dim() != 2:
        raise ValueError(f"log_probs_t must have shape [T, B], got {tuple(log_probs_t.shape)}")
    _check_time_major("behaviour_log_probs_t", behaviour_log_probs_t, log_probs_t.shape)
    _check_time_major("advantages_t", advantages_t, log_probs_t.shape)
    if not 0.0 < clip < 1.0:
        raise ValueError(f"clip must be in (0, 1), got {clip}")
    ratio = torch.exp(log_probs_t - behaviour_log_probs_t.detach())
    advantages_t = advantages_t.detach()
    surrogate = torch.minimum(ratio * advantages_t,
                              ratio.clamp(1.0 - clip, 1.0 + clip) * advantages_t)
    return -surrogate.sum()


def standardize(values: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` over all elements: PPO's advantage normalisation."""
    return (values - values.mean()) / (values.std() + eps)


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


# ------------------------------------------------------------------ R2D2


def value_rescale(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """The invertible value rescaling ``h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x``.

    Pohlen et al. 2018 ("Observe and Look Further"), Section 3.2, the definition of
    ``h``; used by R2D2 (Kapturowski et al. 2019, Section 2) with ``eps = 1e-3``.
    Computed as ``x / (sqrt(|x| + 1) + 1) + eps x``, the same function, because
    ``sqrt(|x| + 1) - 1`` cancels catastrophically for small ``|x|``.

    Args:
      x: a tensor of any shape, e.g. ``[T, B]`` returns.
      eps: the Lipschitz-regularising slope ``eps >= 0``.

    Returns:
      ``h(x)``, of ``x``'s shape and dtype.
    """
    return x / (torch.sqrt(x.abs() + 1.0) + 1.0) + eps * x


def inverse_value_rescale(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """The closed-form inverse of :func:`value_rescale` (Pohlen et al. 2018, Proposition
    A.2's ``h^-1``):

        ``h^-1(x) = sign(x) (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)``.

    With ``u = sqrt(1 + 4 eps (|x| + 1 + eps))`` and ``s = (u - 1) / (2 eps)``, the
    bracket is ``(s - 1)(s + 1)`` and ``s - 1 = 2 |x| / (u + 1 + 2 eps)``; that form is
    used because it neither cancels for small ``|x|`` nor divides by ``eps`` (so
    ``eps = 0`` works). Inputs below float64 are computed in float64: ``h^-1`` grows
    like ``x^2``, and the round trip ``h^-1(h(x))`` must hold over many decades.

    Args:
      x: a tensor of any shape on the rescaled scale, e.g. ``[T, B]`` Q values.
      eps: the ``eps`` of :func:`value_rescale`, ``>= 0``.

    Returns:
      ``h^-1(x)``, of ``x``'s shape and dtype.
    """
    wide = x.to(torch.float64) if x.is_floating_point() and x.dtype != torch.float64 else x
    magnitude = wide.abs()
    u = torch.sqrt(1.0 + 4.0 * eps * (magnitude + 1.0 + eps))
    s_minus_one = 2.0 * magnitude / (u + 1.0 + 2.0 * eps)
    return (torch.sign(wide) * s_minus_one * (s_minus_one + 2.0)).to(x.dtype)


def sequence_priorities(
    td_abs: torch.Tensor, mask: torch.Tensor, eta: float = 0.9
) -> torch.Tensor:
    """Replay priority of each sequence from its absolute TD errors (R2D2, Kapturowski et
    al. 2019, Section 2.3):

        ``p = eta * max_t |delta_t| + (1 - eta) * mean_t |delta_t|``,

    over the steps ``t`` where ``mask`` holds; R2D2 uses ``eta = 0.9``. A sequence with no
    such step gets priority 0. Unmasked steps never affect the result, even if NaN.

    Args:
      td_abs: [T, B] absolute TD errors (no gradient is kept).
      mask: [T, B] bool, True for the steps that count (a nonzero number counts as True).
      eta: the weight of the maximum, in [0, 1].

    Returns:
      [B] priorities, without gradient.
    """
    if td_abs.dim() != 2:
        raise ValueError(f"td_abs must have shape [T, B], got {tuple(td_abs.shape)}")
    _check_time_major("mask", mask, td_abs.shape)
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"eta must be in [0, 1], got {eta}")
    with torch.no_grad():
        mask = mask if mask.dtype == torch.bool else mask != 0
        count = mask.sum(dim=0)
        if td_abs.shape[0] == 0:
            return td_abs.new_zeros(td_abs.shape[1])
        # where(), not multiplication by the mask, so that NaN padding cannot leak in.
        largest = torch.where(mask, td_abs, float("-inf")).amax(dim=0)
        mean = torch.where(mask, td_abs, 0.0).sum(dim=0) / count.clamp(min=1)
        return torch.where(count > 0, eta * largest + (1.0 - eta) * mean, 0.0)


def transformed_n_step_double_q_targets(
    rewards: torch.Tensor,
    continuations: torch.Tensor,
    q_online: torch.Tensor,
    q_target: torch.Tensor,
    discount: float,
    n: int,
    eps: float = 1e-3,
) -> torch.Tensor:
    """n-step double-Q targets with invertible value rescaling (R2D2, Kapturowski et al.
    2019, Section 2, the target ``y~_t``; Pohlen et al. 2018, Section 3.2):

        ``y_t = h( sum_{k<n} gamma^k C_{t,k} r_{t+k}
                   + gamma^n C_{t,n} h^-1(q_target(s_{t+n}, a*)) )``,
        ``a* = argmax_a q_online(s_{t+n}, a)``,  ``C_{t,k} = prod_{j<k} c_{t+j}``,

    so the online network picks the bootstrap action and the target network evaluates it
    (van Hasselt et al. 2016), and a termination at step ``t + j`` (``c_{t+j} = 0``) drops
    every later reward and the bootstrap. Dropped terms are zeroed, not multiplied by 0, so
    NaN padding after an episode's end cannot leak into a target.

    Args:
      rewards: [T, B] ``r_t``, the reward that followed action ``a_t``.
      continuations: [T, B] float or bool ``c_t``: 1 if the episode goes on after step
        ``t``, 0 if it terminated at step ``t``.
      q_online: [T, B, A] online-network Q values (on the ``h`` scale) at each step's
        observation.
      q_target: [T, B, A] target-network Q values at the same observations.
      discount: ``gamma``.
      n: steps before bootstrapping, ``1 <= n < T``.
      eps: the ``eps`` of :func:`value_rescale`.

    Returns:
      [T - n, B] targets for steps ``0 .. T - n - 1``, on the ``h`` scale, without gradient.
    """
    if q_online.dim() != 3:
        raise ValueError(f"q_online must have shape [T, B, A], got {tuple(q_online.shape)}")
    if q_target.shape != q_online.shape:
        raise ValueError(
            f"q_target must have q_online's shape [T, B, A] = {tuple(q_online.shape)}, "
            f"got {tuple(q_target.shape)}"
        )
    _check_time_major("rewards", rewards, q_online.shape[:2])
    _check_time_major("continuations", continuations, q_online.shape[:2])
    num_steps = q_online.shape[0]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    if num_steps <= n:
        raise ValueError(f"n = {n} needs sequences of T > n steps; rewards has T = {num_steps}")
    with torch.no_grad():
        dtype = torch.promote_types(rewards.dtype, q_target.dtype)
        rewards = rewards.to(dtype)
        continuations = continuations.to(dtype)
        out = num_steps - n
        returns = rewards.new_zeros(out, rewards.shape[1])
        trace = torch.ones_like(returns)  # C_{t,k}, for all t at once
        for k in range(n):
            weighted = discount**k * trace * rewards[k : k + out]
            returns = returns + torch.where(trace != 0, weighted, 0.0)
            trace = trace * continuations[k : k + out]
        best_tpn = q_online[n:].argmax(dim=-1, keepdim=True)
        bootstrap_tpn = inverse_value_rescale(q_target[n:].gather(-1, best_tpn).squeeze(-1), eps)
        bootstrap = torch.where(trace != 0, discount**n * trace * bootstrap_tpn.to(dtype), 0.0)
        return value_rescale(returns + bootstrap, eps)
