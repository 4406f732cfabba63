"""Naive ground truths for tests, written straight from the papers' formulas.

Slow on purpose (Python loops, float64 numpy) and sharing no code with ``distrl``, so
that a vectorised or compiled path that agrees with them is agreeing with the paper.
"""

from __future__ import annotations

import math

import numpy as np


def vtrace_naive(
    log_rhos: np.ndarray,
    discounts: np.ndarray,
    rewards: np.ndarray,
    values: np.ndarray,
    bootstrap_value: np.ndarray,
    clip_rho_threshold: float | None = 1.0,
    clip_c_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    lambda_: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """V-trace by the sum of IMPALA eq. 1, term by term (Espeholt et al. 2018, Section 4.1).

    For each column ``b`` and each ``s``, with ``V(x_T) = bootstrap_value``:

        v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t V
        delta_t V = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t))
        rho_t = min(rho_bar, pi/mu), c_i = lambda * min(c_bar, pi/mu)   (Remark 1)

    ``gamma_i`` is the discount of the transition ``i -> i+1``. The policy-gradient
    advantage (Section 4.2) is ``rho_pg_s (r_s + gamma_s v_{s+1} - V(x_s))``, ``v_T =``
    the bootstrap. Thresholds of None mean no clipping. Every trace product is
    recomputed from its factors (O(T^3) per column): keep ``T`` small.

    Args:
      log_rhos, discounts, rewards, values: [T, B] arrays.
      bootstrap_value: [B].

    Returns:
      ``(vs, pg_advantages)``, each a [T, B] float64 array.
    """
    log_rhos = np.asarray(log_rhos, dtype=np.float64)
    discounts = np.asarray(discounts, dtype=np.float64)
    rewards = np.asarray(rewards, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    bootstrap_value = np.asarray(bootstrap_value, dtype=np.float64)
    num_steps, batch = log_rhos.shape

    def clip(x: float, threshold: float | None) -> float:
        return x if threshold is None else min(threshold, x)

    vs = np.zeros((num_steps, batch))
    pg_advantages = np.zeros((num_steps, batch))
    for b in range(batch):

        def value_at(t: int, b: int = b) -> float:
            return float(bootstrap_value[b]) if t == num_steps else float(values[t, b])

        ratio = [math.exp(log_rhos[t, b]) for t in range(num_steps)]
        rho = [clip(ratio[t], clip_rho_threshold) for t in range(num_steps)]
        c = [lambda_ * clip(ratio[t], clip_c_threshold) for t in range(num_steps)]
        for s in range(num_steps):
            total = value_at(s)
            for t in range(s, num_steps):
                trace = 1.0
                for i in range(s, t):
                    trace *= discounts[i, b] * c[i]
                delta = rho[t] * (rewards[t, b] + discounts[t, b] * value_at(t + 1) - value_at(t))
                total += trace * delta
            vs[s, b] = total
        for s in range(num_steps):
            v_next = float(bootstrap_value[b]) if s + 1 == num_steps else vs[s + 1, b]
            rho_pg = clip(ratio[s], clip_pg_rho_threshold)
            pg_advantages[s, b] = rho_pg * (rewards[s, b] + discounts[s, b] * v_next - values[s, b])
    return vs, pg_advantages


def _log_softmax_naive(logits: np.ndarray) -> np.ndarray:
    """log pi(a) = z_a - log sum_b exp(z_b), one row at a time."""
    out = np.zeros_like(logits, dtype=np.float64)
    for index in np.ndindex(logits.shape[:-1]):
        row = [float(z) for z in logits[index]]
        top = max(row)
        log_total = top + math.log(sum(math.exp(z - top) for z in row))
        out[index] = [z - log_total for z in row]
    return out


def impala_loss_naive(
    target_logits: np.ndarray,
    behaviour_logits: np.ndarray,
    actions: np.ndarray,
    rewards: np.ndarray,
    dones: np.ndarray,
    values: np.ndarray,
    *,
    discount: float,
    baseline_cost: float,
    entropy_cost: float,
    clip_rewards_to_one: bool,
    normalize_advantages: bool,
    lambda_: float = 1.0,
) -> dict[str, float]:
    """IMPALA's loss (Espeholt et al. 2018, Section 4.2) term by term, every term on.

    ``L = -sum_t,b log pi(a_t|x_t) A_t + baseline_cost * 0.5 sum_t,b (v_t - V(x_t))^2
    + entropy_cost * sum_t,b sum_a pi log pi``, with ``v_t`` and ``A_t`` from
    :func:`vtrace_naive` (thresholds 1), rewards clipped to [-1, 1] when asked (Table G.1),
    discounts 0 after a step that ended its episode, and the advantages standardised over
    the batch (mean 0, sample standard deviation 1, PPO's convention) when asked.

    Args:
      target_logits, behaviour_logits: [T, B, A]; actions, rewards, dones: [T, B];
      values: [T + 1, B], the last row the bootstrap value.

    Returns:
      ``policy``, ``baseline``, ``entropy`` (the unweighted terms) and ``total``.
    """
    log_pi = _log_softmax_naive(np.asarray(target_logits, np.float64))
    log_mu = _log_softmax_naive(np.asarray(behaviour_logits, np.float64))
    num_steps, batch = np.asarray(actions).shape
    taken_pi = np.array([[log_pi[t, b, actions[t, b]] for b in range(batch)]
                         for t in range(num_steps)])
    taken_mu = np.array([[log_mu[t, b, actions[t, b]] for b in range(batch)]
                         for t in range(num_steps)])
    rewards = np.asarray(rewards, np.float64)
    if clip_rewards_to_one:
        rewards = np.array([[max(-1.0, min(1.0, r)) for r in row] for row in rewards])
    discounts = np.array([[0.0 if done else discount for done in row] for row in dones])
    values = np.asarray(values, np.float64)
    vs, advantages = vtrace_naive(taken_pi - taken_mu, discounts, rewards, values[:-1],
                                  values[-1], lambda_=lambda_)
    if normalize_advantages:
        flat = [float(a) for a in advantages.flatten()]
        mean = sum(flat) / len(flat)
        std = math.sqrt(sum((a - mean) ** 2 for a in flat) / (len(flat) - 1))
        advantages = (advantages - mean) / (std + 1e-8)
    policy = -sum(taken_pi[t, b] * advantages[t, b]
                  for t in range(num_steps) for b in range(batch))
    baseline = 0.5 * sum((vs[t, b] - values[t, b]) ** 2
                         for t in range(num_steps) for b in range(batch))
    entropy = sum(math.exp(lp) * lp for lp in log_pi.flatten())
    total = policy + baseline_cost * baseline + entropy_cost * entropy
    return {"policy": float(policy), "baseline": float(baseline), "entropy": float(entropy),
            "total": float(total)}


# ------------------------------------------------------------------ prioritized replay


def priorities_after_updates(capacity: int, batches: list) -> np.ndarray:
    """The priority of every item after a sequence of update batches, one write at a time.

    Schaul et al. 2016 ("Prioritized Experience Replay"), Section 3.3: each transition
    carries a priority ``p_i`` that is overwritten whenever its TD error is recomputed.
    Writes are applied in order, batch after batch and element after element, so an
    index repeated inside a batch keeps its last priority.

    Args:
      capacity: number of items; all start at priority 0.
      batches: a list of ``(indices [N], priorities [N])`` pairs (lists or arrays).

    Returns:
      [capacity] float64 array of priorities.
    """
    priorities = np.zeros(capacity, dtype=np.float64)
    for indices, values in batches:
        indices = np.asarray(indices).tolist()
        values = np.asarray(values, dtype=np.float64).tolist()
        for index, value in zip(indices, values, strict=True):
            priorities[index] = value
    return priorities


def stratified_sample_naive(
    priorities: np.ndarray, uniforms: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Stratified proportional sampling by a linear scan of the cumulative sum.

    Schaul et al. 2016, Section 3.3, eq. 1 (with ``alpha`` already applied, so the
    stored priority is ``p_i^alpha``): ``P(i) = p_i / sum_k p_k``. Appendix B.2.1: the
    range ``[0, total)`` is cut into ``N`` equal segments and draw ``i`` takes the item
    whose cumulative-sum interval holds the mass ``m_i = (i + u_i) * (total / N)``, i.e.
    the ``j`` with ``cumsum[j-1] <= m_i < cumsum[j]`` (such a ``j`` has ``p_j > 0``). If
    round-off puts ``m_i >= total``, the last item with a positive priority is taken.

    The mass is evaluated as ``(i + u_i) * (total / N)`` in float64, the order the
    distrl kernels use, so that a mass falling exactly on an interval edge is the same
    number in both; with integer-valued priorities every later step is exact.

    Args:
      priorities: [capacity] non-negative, with a positive sum.
      uniforms: [N] in ``[0, 1)``.

    Returns:
      ``(indices [N] int64, probabilities [N] float64)``.
    """
    priorities = np.asarray(priorities, dtype=np.float64)
    uniforms = np.asarray(uniforms, dtype=np.float64)
    cumsum = []
    running = 0.0
    for p in priorities.tolist():
        running += p
        cumsum.append(running)
    total = running
    if not total > 0:
        raise ValueError("stratified_sample_naive: the priorities are all zero")
    last_positive = max(j for j, p in enumerate(priorities.tolist()) if p > 0)
    n = len(uniforms)
    indices = np.zeros(n, dtype=np.int64)
    probabilities = np.zeros(n, dtype=np.float64)
    for i in range(n):
        mass = (i + float(uniforms[i])) * (total / n)
        chosen = last_positive
        for j in range(len(cumsum)):
            if mass < cumsum[j]:
                chosen = j
                break
        indices[i] = chosen
        probabilities[i] = priorities[chosen] / total
    return indices, probabilities


def importance_weights_naive(
    priorities: np.ndarray, drawn_indices: np.ndarray, beta: float, n_items: int
) -> np.ndarray:
    """Normalised importance-sampling weights, straight from the formula.

    Schaul et al. 2016, Section 3.4: ``w_i = (N * P(i))^-beta``, normalised by
    ``max_j w_j`` so that weights only ever scale the update down; ``P(i) = p_i / total``
    (Section 3.3, eq. 1). The maximum is taken over the drawn batch, as the reference
    implementations do (seed_rl's ``prioritized_replay``, Dopamine's
    ``PrioritizedReplayBuffer`` users, Acme's ``importance_sampling_exponent`` path), so
    the batch's largest weight is 1 whatever else the buffer holds.

    Args:
      priorities: [capacity] non-negative, with a positive sum.
      drawn_indices: [B] indices of drawn items (each with ``p > 0``).
      beta: the exponent.
      n_items: ``N``, the number of stored items (it cancels in the normalisation).

    Returns:
      [B] float64 weights in ``(0, 1]``.
    """
    priorities = np.asarray(priorities, dtype=np.float64).tolist()
    total = sum(priorities)

    def weight(j: int) -> float:
        return (n_items * (priorities[j] / total)) ** (-beta)

    drawn = [int(i) for i in np.asarray(drawn_indices).tolist()]
    max_weight = max(weight(j) for j in drawn)
    return np.array([weight(j) / max_weight for j in drawn])


# ------------------------------------------------------------------ n-step transitions


def n_step_transitions_naive(episodes: list, n: int, discount: float) -> dict:
    """Every n-step transition of complete episodes, by the plain formula.

    Ape-X (Horgan et al. 2018, Section 3.1), with the rule for episode ends of
    distrl/replay/writers.py: for step ``t`` let ``m`` be the number of steps from ``t``
    to the episode's end, capped at ``n``. Then ``R_t = sum_{k<m} gamma^k r_{t+k}``; if the
    episode goes on after step ``t+n-1`` the transition bootstraps from ``s_{t+n}`` with
    discount ``gamma^n``, otherwise (the episode ended at step ``t+m-1``, which may be
    step ``t+n-1`` itself) the discount is 0 and the next observation is ``s_t``.
    If the episode was truncated (``ended == "trunc"``) within the window, the transition
    is left out: the observation to bootstrap from is unknown.

    Args:
      episodes: one list per env of that env's steps over consecutive episodes, each
        ``(observation, action, reward, ended)``: the observation acted on, the action,
        the reward that followed, whether the episode ended with this step (True for a
        termination, ``"trunc"`` for a truncation). Each list
        must end with an ended step, so that every transition is determined.
      n: steps per transition.
      discount: ``gamma``.

    Returns:
      ``{(env, t): (observation, action, return, discount, next_observation, emitted_at)}``
      with Python floats; ``emitted_at`` is the step at which the transition is known
      (``t + m - 1``), and the observations are the objects given.
    """
    out = {}
    for env, steps in enumerate(episodes):
        if not steps or not steps[-1][3]:
            raise ValueError(f"n_step_transitions_naive: env {env}'s steps must end an episode")
        for t in range(len(steps)):
            total = 0.0
            ended = False
            last = t
            for k in range(n):
                last = t + k
                _, _, reward, step_ended = steps[last]
                total += discount**k * reward
                if step_ended:
                    ended = step_ended
                    break
            observation, action = steps[t][0], steps[t][1]
            if ended == "trunc":
                continue
            if ended:
                out[(env, t)] = (observation, action, total, 0.0, observation, last)
            else:
                out[(env, t)] = (observation, action, total, discount**n, steps[t + n][0], last)
    return out


Z_999 = 3.090232306167813  # standard normal 0.999 quantile


def chi2_quantile(df: int, z: float = Z_999) -> float:
    """Chi-square quantile by Wilson and Hilferty (1931): ``(X/df)^(1/3)`` is nearly normal
    with mean ``1 - 2/(9 df)`` and variance ``2/(9 df)``; ``z`` is the normal quantile."""
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * math.sqrt(h)) ** 3


# ------------------------------------------------------------------ R2D2


def value_rescale_naive(x: float, eps: float = 1e-3) -> float:
    """``h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x`` as written in Pohlen et al. 2018,
    Section 3.2, on one Python float."""
    x = float(x)
    sign = (x > 0) - (x < 0)
    return sign * (math.sqrt(abs(x) + 1.0) - 1.0) + eps * x


def inverse_value_rescale_naive(x: float, eps: float = 1e-3) -> float:
    """``h^-1(x) = sign(x) (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)``,
    Pohlen et al. 2018, Proposition A.2, as written, on one Python float (``eps > 0``)."""
    x = float(x)
    sign = (x > 0) - (x < 0)
    root = (math.sqrt(1.0 + 4.0 * eps * (abs(x) + 1.0 + eps)) - 1.0) / (2.0 * eps)
    return sign * (root**2 - 1.0)


def sequence_priorities_naive(td_abs: np.ndarray, mask: np.ndarray, eta: float) -> np.ndarray:
    """R2D2's sequence priority (Kapturowski et al. 2019, Section 2.3), column by column:
    ``eta * max + (1 - eta) * mean`` of the masked ``|delta_t|``, or 0 if none is masked.

    Args:
      td_abs, mask: [T, B] arrays.

    Returns:
      [B] float64 array.
    """
    td_abs = np.asarray(td_abs, dtype=np.float64)
    mask = np.asarray(mask)
    out = np.zeros(td_abs.shape[1])
    for b in range(td_abs.shape[1]):
        kept = [float(td_abs[t, b]) for t in range(td_abs.shape[0]) if mask[t, b]]
        if kept:
            out[b] = eta * max(kept) + (1.0 - eta) * sum(kept) / len(kept)
    return out


def transformed_n_step_targets_naive(
    rewards: np.ndarray,
    continuations: np.ndarray,
    q_online: np.ndarray,
    q_target: np.ndarray,
    discount: float,
    n: int,
    eps: float = 1e-3,
) -> np.ndarray:
    """R2D2's transformed n-step double-Q target (Kapturowski et al. 2019, Section 2),
    one step and one term at a time:

        y_t = h( sum_{k<n} gamma^k (prod_{j<k} c_{t+j}) r_{t+k}
                 + gamma^n (prod_{j<n} c_{t+j}) h^-1(q_target[t+n, argmax_a q_online[t+n, a]]) )

    Every product is recomputed from its factors; the argmax takes the first of equal
    maxima, as torch does.

    Args:
      rewards, continuations: [T, B] arrays.
      q_online, q_target: [T, B, A] arrays.

    Returns:
      [T - n, B] float64 array.
    """
    rewards = np.asarray(rewards, dtype=np.float64)
    continuations = np.asarray(continuations, dtype=np.float64)
    q_online = np.asarray(q_online, dtype=np.float64)
    q_target = np.asarray(q_target, dtype=np.float64)
    num_steps, batch, num_actions = q_online.shape
    targets = np.zeros((num_steps - n, batch))
    for b in range(batch):
        for t in range(num_steps - n):
            total = 0.0
            for k in range(n):
                alive = 1.0
                for j in range(k):
                    alive *= continuations[t + j, b]
                total += discount**k * alive * rewards[t + k, b]
            alive = 1.0
            for j in range(n):
                alive *= continuations[t + j, b]
            best = 0
            for a in range(1, num_actions):
                if q_online[t + n, b, a] > q_online[t + n, b, best]:
                    best = a
            bootstrap = inverse_value_rescale_naive(float(q_target[t + n, b, best]), eps)
            total += discount**n * alive * bootstrap
            targets[t, b] = value_rescale_naive(total, eps)
    return targets


def rmsprop_tf_reference(
    params: list[np.ndarray],
    grad_fn,
    num_steps: int,
    lr: float,
    decay: float,
    eps: float,
    momentum: float = 0.0,
    centered: bool = False,
) -> list[list[np.ndarray]]:
    """TensorFlow 1's RMSProp (``tf.train.RMSPropOptimizer``; kernels ApplyRMSProp and
    ApplyCenteredRMSProp), the optimizer of IMPALA and Ape-X, one element at a time:

        ms  <- decay * ms + (1 - decay) * g^2        slot initialised to ONES
        mg  <- decay * mg + (1 - decay) * g          centered only; zeros
        mom <- momentum * mom + lr * g / sqrt(ms + eps)   (centered: ms - mg^2 + eps)
        var <- var - mom                             mom initialised to zeros

    Args:
      params: the initial parameters, arrays of any shape.
      grad_fn: ``grad_fn(t, params) -> grads``, the gradients at step ``t`` (0-based) at
        the current ``params`` (copies), one array per parameter, same shapes.
      num_steps: how many updates.

    Returns:
      The parameters after each update: ``num_steps`` lists of float64 arrays.
    """
    params = [np.array(p, dtype=np.float64) for p in params]
    ms = [np.ones_like(p) for p in params]
    mg = [np.zeros_like(p) for p in params]
    mom = [np.zeros_like(p) for p in params]
    trajectory = []
    for t in range(num_steps):
        grads = grad_fn(t, [p.copy() for p in params])
        for k, param in enumerate(params):
            grad = np.asarray(grads[k], dtype=np.float64)
            for i in np.ndindex(param.shape):
                g = float(grad[i])
                ms[k][i] = decay * ms[k][i] + (1.0 - decay) * g * g
                if centered:
                    mg[k][i] = decay * mg[k][i] + (1.0 - decay) * g
                    denom = ms[k][i] - mg[k][i] ** 2 + eps
                else:
                    denom = ms[k][i] + eps
                mom[k][i] = momentum * mom[k][i] + lr * g / math.sqrt(denom)
                param[i] -= mom[k][i]
        trajectory.append([p.copy() for p in params])
    return trajectory


def adam_tf_reference(
    params: list[np.ndarray],
    grad_fn,
    num_steps: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
) -> list[list[np.ndarray]]:
    """TensorFlow's Adam (``tf.compat.v1.train.AdamOptimizer``, kernel ApplyAdam, and
    ``tf.keras.optimizers.Adam``), the optimizer of R2D2, one element at a time:

        t    <- t + 1
        lr_t <- lr * sqrt(1 - beta2^t) / (1 - beta1^t)
        m    <- beta1 * m + (1 - beta1) * g          slots initialised to zeros
        v    <- beta2 * v + (1 - beta2) * g^2
        var  <- var - lr_t * m / (sqrt(v) + eps)

    Args and returns as :func:`rmsprop_tf_reference`.
    """
    params = [np.array(p, dtype=np.float64) for p in params]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    trajectory = []
    for t in range(1, num_steps + 1):
        lr_t = lr * math.sqrt(1.0 - beta2**t) / (1.0 - beta1**t)
        grads = grad_fn(t - 1, [p.copy() for p in params])
        for k, param in enumerate(params):
            grad = np.asarray(grads[k], dtype=np.float64)
            for i in np.ndindex(param.shape):
                g = float(grad[i])
                m[k][i] = beta1 * m[k][i] + (1.0 - beta1) * g
                v[k][i] = beta2 * v[k][i] + (1.0 - beta2) * g * g
                param[i] -= lr_t * m[k][i] / (math.sqrt(v[k][i]) + eps)
        trajectory.append([p.copy() for p in params])
    return trajectory
