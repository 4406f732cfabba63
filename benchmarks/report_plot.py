"""The MinAtar suite's learning curves as a PNG, for ``benchmarks/report.py --png``: one
panel per game, one line per agent (mean over seeds of the trailing 100-episode return,
95% bootstrap band) against env frames, the MinAtar paper's baselines marked at 5M frames."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from suite import CONFIDENCE, FINAL_EPISODES, RANDOM, REFERENCE_FRAMES, REFERENCES, curve_at

if TYPE_CHECKING:
    from suite_runs import Suite


def seed_band(values: np.ndarray, reps: int, rng: np.random.Generator
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over seeds at each point of a ``[seeds, points]`` array (NaN where a seed has no
    data) and its 95% bootstrap band (NaN where fewer than 2 seeds have data)."""
    count = np.sum(~np.isnan(values), axis=0)
    with np.errstate(invalid="ignore"):
        mean = np.nanmean(np.where(count > 0, values, 0.0), axis=0)
    mean[count == 0] = np.nan
    low, high = np.full(values.shape[1], np.nan), np.full(values.shape[1], np.nan)
    tail = 100 * (1 - CONFIDENCE) / 2
    for j in np.flatnonzero(count >= 2):
        v = values[~np.isnan(values[:, j]), j]
        draws = v[rng.integers(0, len(v), size=(reps, len(v)))].mean(axis=1)
        low[j], high[j] = np.percentile(draws, [tail, 100 - tail])
    return mean, low, high


def plot(suite: Suite, path: Path, reps: int, seed: int, points: int = 200) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rng = np.random.default_rng(seed)
    n = max(len(suite.games), 1)
    cols = min(n, 3)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.8 * rows), squeeze=False)
    colours = {agent: f"C{i}" for i, agent in enumerate(suite.agents)}
    for ax, game in zip(axes.flat, suite.games, strict=False):
        agents = [a for a in suite.agents if suite.is_planned(a, game)]
        runs = [r for a in agents for r in suite.cell(a, game)]
        end = max([r.frames for r in runs] + [1])
        grid = np.linspace(0, end, points)
        for agent in agents:
            cell = [r for r in suite.cell(agent, game) if len(r.curve_frames)]
            if not cell:
                continue
            values = np.stack([curve_at(r.curve_frames, r.curve_returns, r.frames, grid)
                               for r in cell])
            mean, low, high = seed_band(values, reps, rng)
            done = sum(r.counted for r in suite.cell(agent, game))
            ax.plot(grid, mean, color=colours[agent],
                    label=f"{agent} ({done}/{len(suite.seeds)} seeds done)")
            ax.fill_between(grid, low, high, color=colours[agent], alpha=0.2, linewidth=0)
        for name, marker in (("DQN", "o"), ("AC(0.8)", "s")):
            value = REFERENCES[name].get(game)
            if value is not None:
                ax.hlines(value, 0.9 * REFERENCE_FRAMES, REFERENCE_FRAMES, colors="black",
                          linestyles="--", linewidth=1)
                ax.plot([REFERENCE_FRAMES], [value], marker=marker, color="black",
                        linestyle="none", label=f"{name} at 5M (MinAtar)")
                ax.annotate(name, (REFERENCE_FRAMES, value), textcoords="offset points",
                            xytext=(4, 3), fontsize=7)
        if not any(len(r.curve_frames) for r in runs):
            ax.text(0.5, 0.5, "no episodes logged yet", transform=ax.transAxes, ha="center")
        if game in RANDOM:
            ax.axhline(RANDOM[game], color="grey", linestyle=":", linewidth=1,
                       label="random play")
        ax.set_xlim(left=0)
        ax.set_title(game)
        ax.set_xlabel("env frames")
        ax.set_ylabel(f"training return ({FINAL_EPISODES}-episode mean)")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(suite.games):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
