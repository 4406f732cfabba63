"""Stratified-bootstrap confidence intervals and the interquartile mean of a suite's
scores (Agarwal et al. 2021), by ``rliable`` where it imports, else the same with numpy."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import scipy.stats
from suite import CONFIDENCE

# The percentile interval's bounds, in percent: 2.5 and 97.5 for a 95% interval.
PERCENTILES = (100 * (1 - CONFIDENCE) / 2, 100 - 100 * (1 - CONFIDENCE) / 2)

try:  # the IQM as rliable defines it (25% trimmed mean over all runs and tasks)
    from rliable.metrics import aggregate_iqm
except Exception:  # noqa: BLE001 - any import failure: the same formula with scipy
    def aggregate_iqm(scores: np.ndarray) -> float:
        return scipy.stats.trim_mean(scores, proportiontocut=0.25, axis=None)

try:
    from rliable import library as rly_library
    RLIABLE_ERROR = ""
except Exception as error:  # noqa: BLE001 - e.g. arch built for another pandas
    rly_library = None
    RLIABLE_ERROR = f"{type(error).__name__}: {error}"


def bootstrap_ci(per_task: list[np.ndarray], statistic: Callable[[np.ndarray], np.ndarray],
                 reps: int, seed: int) -> tuple[float, float, str]:
    """95% percentile CI of ``statistic`` under the stratified bootstrap: each task's runs
    are resampled with replacement, separately (Agarwal et al. 2021, rliable's default).

    Args:
        per_task: one array of run scores per task (game); lengths may differ.
        statistic: ``[reps, runs] -> [reps]``, the aggregate of each resample's runs.
        reps: bootstrap resamples.
        seed: random seed of the resampling.

    Returns ``(low, high, how)``: rliable's ``get_interval_estimates`` when it imports and
    every task has as many runs; numpy otherwise (``how`` names which).
    """
    sizes = {len(v) for v in per_task}
    if rly_library is not None and len(sizes) == 1:
        matrix = np.stack(per_task, axis=1)  # [runs, tasks], as rliable takes it
        np.random.seed(seed)  # rliable's StratifiedBootstrap draws from numpy's global RNG
        _, intervals = rly_library.get_interval_estimates(
            {"x": matrix}, lambda x: np.array([statistic(x.reshape(1, -1))[0]]),
            reps=reps, confidence_interval_size=CONFIDENCE)
        low, high = intervals["x"][:, 0]
        return float(low), float(high), "rliable"
    rng = np.random.default_rng(seed)
    samples = np.concatenate(
        [v[rng.integers(0, len(v), size=(reps, len(v)))] for v in per_task], axis=1)
    low, high = np.percentile(statistic(samples), PERCENTILES)
    return float(low), float(high), "numpy"


def mean_rows(x: np.ndarray) -> np.ndarray:
    return x.mean(axis=1)


def iqm_rows(x: np.ndarray) -> np.ndarray:
    """IQM of each row: the 25% trimmed mean, as ``rliable.metrics.aggregate_iqm``."""
    return scipy.stats.trim_mean(x, proportiontocut=0.25, axis=1)


def difference_ci(a: np.ndarray, b: np.ndarray, reps: int, seed: int) -> tuple[float, float]:
    """95% percentile CI of ``mean(a) - mean(b)`` under the two-sample bootstrap: each
    agent's seeds are resampled with replacement, separately (Efron & Tibshirani 1993,
    Section 16.2). An interval without 0 says the gap is larger than the seeds' spread
    explains; with 3 seeds per agent (the bootstrap then under-covers) it is a rough guide."""
    rng = np.random.default_rng(seed)
    means_a = a[rng.integers(0, len(a), size=(reps, len(a)))].mean(axis=1)
    means_b = b[rng.integers(0, len(b), size=(reps, len(b)))].mean(axis=1)
    low, high = np.percentile(means_a - means_b, PERCENTILES)
    return float(low), float(high)


def welch_ci(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """95% Welch interval of ``mean(a) - mean(b)`` over the last axis (seeds):
    ``gap +- t * se`` with ``se^2 = var(a)/n_a + var(b)/n_b`` (sample variances) and the
    Welch-Satterthwaite degrees of freedom ``se^4 / ((var(a)/n_a)^2/(n_a-1) +
    (var(b)/n_b)^2/(n_b-1))`` (Welch 1947). Unlike the bootstrap it widens for few seeds
    (t, not the seeds' range), so for normal scores it excludes 0 for identical agents at
    its nominal 5%. Needs 2 seeds a side; two constant samples give the gap itself."""
    gap = a.mean(axis=-1) - b.mean(axis=-1)
    va = a.var(axis=-1, ddof=1) / a.shape[-1]
    vb = b.var(axis=-1, ddof=1) / b.shape[-1]
    se2 = va + vb
    spread = se2 > 0
    safe = np.where(spread, se2, 1.0)
    df = safe**2 / np.where(spread, va**2 / (a.shape[-1] - 1) + vb**2 / (b.shape[-1] - 1), 1.0)
    half = np.where(spread, scipy.stats.t.ppf(PERCENTILES[1] / 100, df) * np.sqrt(safe), 0.0)
    return gap - half, gap + half


def identical_agent_rates(n_new: int, n_base: int, sims: int, reps: int,
                          seed: int) -> tuple[float, float, float]:
    """How often the two SEED tests fire when the SEED agent and its learner are the same
    agent: ``(inside, excludes)``, the fraction of ``sims`` simulated pairs of suites
    (``n_new`` and ``n_base`` seeds drawn from one normal distribution) in which the new
    agent's mean lies inside the base agent's 95% percentile-bootstrap CI of its mean (what
    :func:`bootstrap_ci` gives one game), and in which the two-sample bootstrap CI of the gap
    (:func:`difference_ci`) excludes 0. Both tests are location- and scale-free, so one
    normal stands for any. The percentile bootstrap under-covers on few seeds: with 3
    each the base agent's interval is the range of its 3 seeds, an identical agent lies
    inside it about 63% of the time (83% for a z-interval of known variance) and the gap's
    interval excludes 0 about 20% of the time (not 5%). The third rate is how often
    :func:`welch_ci` excludes 0 in the same suites (about 5%)."""
    rng = np.random.default_rng(seed)
    rows = np.arange(sims)[:, None, None]
    base = rng.standard_normal((sims, n_base))
    new = rng.standard_normal((sims, n_new))
    base_means = base[rows, rng.integers(0, n_base, size=(sims, reps, n_base))].mean(-1)
    new_means = new[rows, rng.integers(0, n_new, size=(sims, reps, n_new))].mean(-1)
    low, high = np.percentile(base_means, PERCENTILES, axis=1)
    mean_new = new.mean(axis=1)
    inside = float(((low <= mean_new) & (mean_new <= high)).mean())
    gap_low, gap_high = np.percentile(new_means - base_means, PERCENTILES, axis=1)
    excludes = float(((gap_low > 0) | (gap_high < 0)).mean())
    welch_low, welch_high = welch_ci(new, base)
    welch_excludes = float(((welch_low > 0) | (welch_high < 0)).mean())
    return inside, excludes, welch_excludes
