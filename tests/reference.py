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
