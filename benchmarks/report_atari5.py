"""The human-normalised score table of an Atari suite, for ``benchmarks/report.py DIR``
when the suite has games of the Atari-5 set (Aitchison et al. 2023; arithmetic in
``atari_scores.py``).

Per game and agent: the final return (mean training return over each run's last 100
episodes, the statistic of Dopamine's published curves) averaged over the finished seeds
with its 95% bootstrap interval over seeds, each seed's figure, its human-normalised score
(HNS), the mean evaluation return, and Dopamine's 10M-frame DQN and Rainbow beside it. Per
agent: the Atari-5 estimate of the 57-game median HNS for each seed that finished all five
games, their mean with its 95% bootstrap interval over seeds, against Dopamine's DQN and
Rainbow estimates and, below Rainbow's, by how much and on which games; and the IQM of HNS
over games and seeds with its stratified bootstrap interval (Agarwal et al. 2021). Then
the grid's throughput and wall time (``report_throughput.py``, as the MinAtar report). The
protocol (the papers' 30 no-op starts, or Machado et al.'s sticky actions) is read from the
grid's overrides and named in the heading, as is the frame budget.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from atari_scores import ATARI5, RANDOM_HUMAN, REFERENCES, atari5_estimate, human_normalized
from report_cells import fmt_ci, seeds_text
from report_throughput import throughput_table
from suite import GRID, read_json
from suite_runs import RunResult, Suite, frames
from suite_stats import bootstrap_ci, iqm_rows, mean_rows

BEGIN, END = "<!-- atari5-results:start -->", "<!-- atari5-results:end -->"
DQN, RAINBOW = REFERENCES["dopamine_dqn_10m"], REFERENCES["dopamine_rainbow_10m"]


def protocol_text(grid: dict) -> str:
    """The protocol the grid's runs used, from its ``--set`` overrides."""
    overrides = grid.get("overrides", [])
    if "env.protocol=machado" in overrides:
        return ("Machado et al. 2018's (sticky actions 0.25, full action set, no no-op "
                "starts), as Dopamine's")
    return "the papers' (up to 30 no-op starts, no sticky actions)"


def counted(runs: list[RunResult]) -> list[RunResult]:
    return [r for r in runs if r.counted]


def per_seed_estimates(suite: Suite, agent: str) -> dict[int, float]:
    """Each seed's Atari-5 estimate, for the seeds that finished all five games."""
    out = {}
    for seed in suite.seeds:
        runs = [suite.runs.get((agent, game, seed)) for game in ATARI5]
        if all(r is not None and r.counted for r in runs):
            out[seed] = atari5_estimate({r.game: r.final for r in runs})
    return out


def mean_ci(values: list[float], reps: int, seed: int) -> tuple[float, float | None,
                                                                 float | None]:
    """Mean of ``values`` and its 95% percentile bootstrap interval (None with one value)."""
    array = np.asarray(values, dtype=float)
    if len(array) < 2:
        return float(array.mean()), None, None
    low, high, _ = bootstrap_ci([array], mean_rows, reps, seed)
    return float(array.mean()), low, high


def game_row(agent: str, game: str, runs: list[RunResult], reps: int, seed: int) -> str:
    done = counted(runs)
    finals = [r.final for r in done]
    if finals:
        mean, low, high = mean_ci(finals, reps, seed)
        final = f"{mean:,.1f} {fmt_ci(low, high)}"
        hns = f"{human_normalized(game, mean):.1f}" if game in RANDOM_HUMAN else "—"
    else:
        final = hns = "—"
    evals = [r.eval_return for r in done if r.eval_return is not None]
    eval_mean = f"{np.mean(evals):,.1f}" if evals else "—"
    per_seed = "; ".join(r.describe() for r in runs)
    refs = " | ".join(
        f"{ref['scores'][game]:,.1f} ({human_normalized(game, ref['scores'][game]):.1f})"
        if game in ref["scores"] else "—" for ref in (DQN, RAINBOW))
    return (f"| {game} | {agent} | {len(done)}/{len(runs)} | {final} | {hns} | {per_seed} "
            f"| {eval_mean} | {refs} |")


def agent_summary(suite: Suite, agent: str, reps: int, seed: int) -> list[str]:
    """The agent's Atari-5 estimate (per seed, mean and interval, against the references)
    and its IQM of HNS over games and seeds."""
    lines = []
    games = suite.games_of(agent)
    if all(game in games for game in ATARI5):
        estimates = per_seed_estimates(suite, agent)
        dqn, rainbow = atari5_estimate(DQN["scores"]), atari5_estimate(RAINBOW["scores"])
        if estimates:
            mean, low, high = mean_ci(list(estimates.values()), reps, seed)
            seeds = ", ".join(f"s{s} {v:.1f}" for s, v in estimates.items())
            line = (f"- **{agent}: Atari-5 estimate {mean:.1f}% {fmt_ci(low, high)}** "
                    f"({seeds_text(len(estimates))}: {seeds}); Dopamine's DQN {dqn:.1f}%, "
                    f"Rainbow {rainbow:.1f}% at 10M frames.")
            if mean < rainbow:
                behind = [game for game in ATARI5
                          if np.mean([r.final for r in counted(suite.cell(agent, game))])
                          < RAINBOW["scores"][game]]
                line += (f" Below Rainbow's by {rainbow - mean:.1f} points; below Rainbow's "
                         f"score on {', '.join(behind) or 'no game'}.")
            lines.append(line)
        else:
            lines.append(f"- **{agent}: Atari-5 estimate —**: no seed has finished all five "
                         f"games ({', '.join(ATARI5)}).")
    per_game = [np.array([human_normalized(game, r.final)
                          for r in counted(suite.cell(agent, game))])
                for game in games if game in RANDOM_HUMAN]
    per_game = [scores for scores in per_game if len(scores)]
    if per_game:
        pooled = np.concatenate(per_game)
        iqm = float(iqm_rows(pooled.reshape(1, -1))[0])
        low, high, _ = bootstrap_ci(per_game, iqm_rows, reps, seed)
        lines.append(f"- {agent}: IQM of HNS over {len(per_game)} games and "
                     f"{len(pooled)} runs {iqm:.1f}% {fmt_ci(low, high)}.")
    return lines


def has_scores(suite: Suite) -> bool:
    """Whether the suite has a game of the Atari-5 set (the table is for those suites)."""
    return any(game in ATARI5 for game in suite.games)


def markdown(suite: Suite, suite_dir: Path, reps: int = 2000, seed: int = 0) -> str:
    grid = read_json(suite_dir / GRID) or {}
    budget = frames(grid["frames"]) if "frames" in grid else "the grid's frames"
    lines = [
        f"### Atari: human-normalised scores at {budget} ({suite_dir.name})",
        "",
        f"Protocol: {protocol_text(grid)}. Final return: mean training return of each run's "
        "last 100 episodes, averaged over the finished seeds, with its 95% bootstrap "
        "interval over seeds; HNS = 100 (score - random) / (human - random), of that mean. "
        "Dopamine's columns: their 10M-frame training returns (sticky actions 0.25, 5 "
        "seeds) and their HNS. A seed marked (GPU learner) trained its learner on a GPU, "
        "with that machine's cores acting; the others trained theirs on the CPU.",
        "",
        "| game | agent | seeds | final return [95% CI] | HNS % | per seed | eval return, "
        "mean | Dopamine DQN 10M (HNS) | Dopamine Rainbow 10M (HNS) |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for game in suite.games:
        for agent in suite.agents:
            if suite.is_planned(agent, game):
                lines.append(game_row(agent, game, suite.cell(agent, game), reps, seed))
    lines.append("")
    for agent in suite.agents:
        lines += agent_summary(suite, agent, reps, seed)
    lines += ["", throughput_table(suite).rstrip("\n")]
    return "\n".join(lines) + "\n"
