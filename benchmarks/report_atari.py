"""The Atari suite's report, for ``benchmarks/report.py DIR --suite atari``: per game and
agent, the seeds finished, each seed's frames and run time to a 20-episode mean of 0 and
of +18 (``curve.py --reach``'s figures), the evaluation return per seed and over seeds, the
frames per second of run time and the run.py command; and the learning curves as a PNG (the
20-episode mean over seeds as a line, their min-max as a band, the levels dashed).

A run's episodes come from its event files, else from the ``episodes.csv`` that
``reproduce.py`` keeps beside its summary.json (in the archive too), else the reach figures
are the summary's own.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from ale_speed import BUSY_ELSEWHERE_LIMIT
from atari_scores import REFERENCES
from attempt_record import read_episodes_and_epsilons
from curve import (
    GAP_S,
    WINDOW,
    Episodes,
    episode_columns,
    first_reaching,
    near_greedy_episodes,
    reach_record,
    run_clock,
    trailing_mean,
)
from grid_plan import Run, run_overrides
from report_cells import seeds_text
from report_throughput import duration
from suite import (
    ATARI,
    CARRY,
    EPISODES,
    GRID,
    SUMMARY,
    SuiteSpec,
    curve_at,
    read_attempts,
    read_json,
    run_name,
)
from suite_runs import RunResult, Suite, frames, superseded_failure

BEGIN, END = "<!-- atari-results:start -->", "<!-- atari-results:end -->"
RUN_CMD = "python run.py"  # as the command column shows it
# A replay agent's envs exploring at most this much: the near-greedy end of its ladder,
# whose training return is the one to set beside an evaluation at epsilon 0.001.
NEAR_GREEDY_EPSILON = 0.01
GAP_MARK = "*"  # after a seed whose run time is the gap rule's: its attempts are not recorded
FINAL_EPISODES = 100


@dataclass
class AtariRun:
    """One planned run: what the suite's collector read, its episodes and reach figures."""

    result: RunResult
    episodes: Episodes | None  # (frames, raw return, wall time) per episode
    reach: list[dict]  # curve.reach_record's, one per level; [] when nothing tells
    # ale-py's frames/s alone where each attempt ran (reproduce.py's ale_alone records)
    ale: list[dict] = field(default_factory=list)
    # each episode's epsilon where the run logged it (NaN before it did), else None
    epsilons: np.ndarray | None = None
    # each episode's seconds of running (curve.run_clock's), and whether the record of the
    # run's attempts gave them (else the gap rule: a run started by hand)
    clock: np.ndarray | None = None
    clock_recorded: bool = True

    @property
    def fps(self) -> float | None:
        """Env frames per second of run time from the first episode to the last, on the
        run's clock (the reach times')."""
        if self.episodes is None or self.clock is None or len(self.episodes[0]) < 2:
            return None
        seconds = float(self.clock[-1] - self.clock[0])
        return (float(self.episodes[0][-1] - self.episodes[0][0]) / seconds if seconds > 0
                else None)

    @property
    def seed_text(self) -> str:
        """``s0``, ``s0*`` where the run's clock is the gap rule's."""
        return f"s{self.result.seed}" + ("" if self.clock_recorded else GAP_MARK)


def episodes_of(run_dir: Path) -> Episodes | None:
    """The run's episodes: its event files', else its ``episodes.csv``'s, else (an archived
    run still going on another machine) its carry's, else None."""
    return episodes_and_epsilons(run_dir)[0]


def episodes_and_epsilons(run_dir: Path, superseded: bool | None = None
                          ) -> tuple[Episodes | None, np.ndarray | None]:
    """:func:`episodes_of`'s episodes and, where the run logged them, their epsilons.
    ``superseded``: whether the archive's summary.json is a failure resumed since
    (:func:`superseded_failure`; read here when not given)."""
    episodes, epsilons = read_episodes_and_epsilons(run_dir)
    if episodes is not None:
        return episodes, epsilons
    if superseded is None:
        superseded = superseded_failure(read_json(run_dir / SUMMARY), run_dir)
    kept_files = (run_dir / EPISODES, run_dir / CARRY / EPISODES)
    if superseded:
        kept_files = kept_files[::-1]  # the failed attempt's episodes stop where it did
    for kept in kept_files:
        if kept.is_file():
            columns = episode_columns(kept)
            return (None, None) if columns is None else (columns[:3], columns[3])
    return None, None


def ale_records(run_dir: Path, summary: object) -> list[dict]:
    """ale-py alone where each attempt ran, as ``reproduce.py`` timed it: an ended run's
    ``summary`` (its summary.json) lists every attempt's; a run still going has them in its
    attempt lines, in its directory or its carry. Attempts made before reproduce.py timed
    it have none."""
    if isinstance(summary, dict) and "ale_alone" in summary:
        return list(summary["ale_alone"])
    for where in (run_dir, run_dir / CARRY):
        lines = read_attempts(where)
        if lines:
            return [line["ale_alone"] for line in lines if line.get("ale_alone")]
    return []


def read_atari_run(result: RunResult, run_dir: Path, levels: list[float]) -> AtariRun:
    """``result`` with its episodes (read from ``run_dir``), the reach figures of each
    level (from the episodes, else from its summary.json's ``reach``) and its ale-py
    timings."""
    summary = read_json(run_dir / SUMMARY)
    superseded = superseded_failure(summary, run_dir)
    if superseded:
        summary = None  # its carry's attempts hold every attempt's figures
    ale = ale_records(run_dir, summary)
    episodes, epsilons = (episodes_and_epsilons(run_dir, superseded) if run_dir.is_dir()
                          else (None, None))
    if episodes is not None:
        clock, recorded = run_clock(episodes[2], result.spans)
        return AtariRun(result, episodes, reach_record(*episodes, levels, clock), ale,
                        epsilons, clock, recorded)
    recorded = (summary.get("reach") or {}) if isinstance(summary, dict) else {}
    kept = recorded.get("levels", [])
    by_level = {float(figure["level"]): figure for figure in kept}
    reach = [by_level.get(float(level), {"level": float(level), "frames": None,
                                         "run_time_s": None}) for level in levels]
    # a summary written before reach figures were timed inside the attempts has no "clock"
    return AtariRun(result, None, reach if kept else [], ale,
                    clock_recorded=not kept or recorded.get("clock") == "attempts")


def atari_runs(suite: Suite, suite_dir: Path, levels: list[float]
               ) -> dict[tuple[str, str], list[AtariRun]]:
    """Every planned (agent, game) cell's runs, seed by seed, game by game."""
    return {(agent, game): [read_atari_run(r, suite_dir / run_name(agent, game, r.seed), levels)
                            for r in suite.cell(agent, game)]
            for game in suite.games for agent in suite.agents if suite.is_planned(agent, game)}


Sources = list[tuple[Suite, Path]]  # each archive (or --out) directory read, with its path


def merged_runs(sources: Sources, levels: list[float]
                ) -> dict[tuple[str, str], list[tuple[AtariRun, Path]]]:
    """Every (agent, game) cell of every source, its runs pooled over the sources (e.g. an
    agent's seeds run in two grids), each with the directory it came from; a seed that two
    sources both hold is refused, as it would count twice."""
    cells: dict[tuple[str, str], dict[int, tuple[AtariRun, Path]]] = {}
    for suite, suite_dir in sources:
        for key, runs in atari_runs(suite, suite_dir, levels).items():
            pooled = cells.setdefault(key, {})
            for run in runs:
                held = pooled.get(run.result.seed)
                if held is None or held[0].result.status == "missing":
                    pooled[run.result.seed] = (run, suite_dir)
                elif run.result.status != "missing":
                    raise ValueError(f"seed {run.result.seed} of {key[0]} on {key[1]} is in "
                                     f"both {held[1]} and {suite_dir}")
    return {key: [pooled[seed] for seed in sorted(pooled)] for key, pooled in cells.items()}


def level_text(level: float) -> str:
    """``0``, ``+18``, ``-5``: a level of Pong's score as the table heads it."""
    return f"{level:+g}" if level > 0 else f"{level:g}"


def reach_text(run: AtariRun, index: int) -> str:
    """One seed's figure in a reach column: ``s0 6.1M frames, 1h40m``, or why there is
    none (not reached, unfinished, missing)."""
    result = run.result
    name = run.seed_text
    if result.status == "missing":
        return f"{name} missing"
    if not run.reach:
        return f"{name} — (no episodes kept)"
    figure = run.reach[index]
    if figure["frames"] is not None:
        return f"{name} {frames(figure['frames'])}, {duration(figure['run_time_s'])}"
    if result.status == "finished":
        return f"{name} not reached"
    return f"{name} not reached ({result.status.replace('_', ' ')} at {frames(result.frames)})"


def eval_texts(runs: list[AtariRun]) -> tuple[str, str]:
    """Each seed's evaluation return (``eval/return_mean``) and their mean over the finished
    seeds that evaluated."""
    per_seed = ", ".join(
        f"s{r.result.seed} " + ("—" if r.result.eval_return is None
                                else f"{r.result.eval_return:.1f}") for r in runs)
    values = [r.result.eval_return for r in runs
              if r.result.counted and r.result.eval_return is not None]
    mean = f"{np.mean(values):.1f} ({seeds_text(len(values))})" if values else "—"
    return per_seed, mean


def ale_text(runs: list[AtariRun]) -> str:
    """ale-py's frames/s alone where each seed ran: ``s0 6,120 (AMD EPYC, 2 cores)``, a
    range and each machine where its attempts ran on several, ``s1 not timed`` where no
    attempt was timed (runs before reproduce.py timed it). A timing during which other
    processes kept more than ``BUSY_ELSEWHERE_LIMIT`` cores busy was not alone: it is
    left out and counted (``s0 12,229 (AMD EPYC, 2 cores; 2 timings not alone)``)."""
    cells = []
    for run in runs:
        alone = [a for a in run.ale
                 if float(a.get("busy_elsewhere", 0.0)) <= BUSY_ELSEWHERE_LIMIT]
        crowded = len(run.ale) - len(alone)
        figures = [float(a["frames_per_s"]) for a in alone]
        name = f"s{run.result.seed}"
        if run.result.status == "missing":
            cells.append(f"{name} missing")
        elif not run.ale:
            cells.append(f"{name} not timed")
        else:
            where = list(dict.fromkeys(str(a["machine"]) for a in alone))
            if crowded:
                where.append(f"{crowded} timing{'s' * (crowded > 1)} not alone")
            if figures:
                low, high = min(figures), max(figures)
                value = (f"{low:,.0f}" if round(low) == round(high)
                         else f"{low:,.0f}-{high:,.0f}")
                cells.append(f"{name} {value} ({'; '.join(where)})")
            else:
                cells.append(f"{name} not timed alone ({'; '.join(where)})")
    return "; ".join(cells)


SEED_PLACEHOLDER = "<s>"


def command_text(spec: SuiteSpec, agent: str, game: str, grid: dict) -> str | None:
    """The run.py command of one seed of the cell (``seed=<s>``) in backticks, as the grid
    asked for it (its budget and ``--set`` overrides), without where it logs; None without
    a grid.json or for an agent the suite does not know."""
    if "frames" not in grid or agent not in spec.agents:
        return None
    run = Run(agent, game, 0, Path(run_name(agent, game, 0)), spec)
    words = [RUN_CMD]
    for override in run_overrides(run, grid["frames"], grid.get("overrides", [])):
        if override == f"seed={run.seed}":
            words.append(f"seed={SEED_PLACEHOLDER}")
        elif not override.startswith(("log.dir=", "log.name=")):
            words.append(shlex.quote(override))
    return f"`{' '.join(words)}`"


def markdown(sources: Sources, title: str, levels: list[float], spec: SuiteSpec = ATARI) -> str:
    """The table of one or more directories of the suite, one row per game and agent
    (seeds pooled over the directories), and what its columns mean."""
    heads = " | ".join(f"to {level_text(level)}: frames, run time" for level in levels)
    lines = [
        f"### Atari: {title}",
        "",
        f"Per seed, the first episode at which the mean raw return of the last {WINDOW} "
        "episodes reaches each level: its env frames and the run time to it, as "
        "`benchmarks/curve.py --reach` finds them. Run time: the time inside the run's "
        "attempts up to it, from the first attempt's start, as `benchmarks/reproduce.py` "
        "recorded each attempt's start and wall time; a seed marked "
        f"{GAP_MARK} was started by hand, so no record holds its attempts, and its run time "
        f"is the wall time since its first episode less every gap over {GAP_S / 60:g} "
        "minutes between two episodes (when the run was stopped). Eval "
        "return: `eval/return_mean` of the final policy; the mean is over the finished seeds. "
        "Frames/s: env frames per second of run time from the first episode to the last, "
        "median over the seeds with episodes. ale-py alone: frames/s of ale-py's vector env "
        "with random actions on the machine each seed ran on, timed by "
        "`benchmarks/reproduce.py` before its runs started (`benchmarks/ale_speed.py`); a "
        "timing during which other processes kept more than "
        f"{BUSY_ELSEWHERE_LIMIT:g} cores busy is left out and counted as not alone.",
        "",
        f"| game | agent | preset | seeds | {heads} | eval return per seed "
        "| eval return, mean | frames/s, median | ale-py alone, frames/s | command |",
        "|---|---|---|---:|" + "---|" * len(levels) + "---|---:|---:|---|---|",
    ]
    for (agent, game), pairs in merged_runs(sources, levels).items():
        runs = [run for run, _ in pairs]
        done = sum(r.result.counted for r in runs)
        reach = " | ".join("; ".join(reach_text(r, i) for r in runs) for i in range(len(levels)))
        per_seed, mean = eval_texts(runs)
        speeds = [fps for fps in (r.fps for r in runs) if fps is not None]
        fps = f"{np.median(speeds):,.0f}" if speeds else "—"
        preset = spec.preset(agent) if agent in spec.agents else "—"
        commands = list(dict.fromkeys(
            command_text(spec, agent, game, read_json(directory / GRID) or {})
            for directory in dict.fromkeys(d for _, d in pairs)))
        command = "; ".join(c for c in commands if c is not None) or "—"
        lines.append(f"| {game} | {agent} | {preset} | {done}/{len(runs)} | {reach} | "
                     f"{per_seed} | {mean} | {fps} | {ale_text(runs)} | {command} |")
    near_greedy = near_greedy_lines(sources, levels)
    if near_greedy:
        lines += ["", *near_greedy]
    return "\n".join(lines) + "\n"


def near_greedy_lines(sources: Sources, levels: list[float]) -> list[str]:
    """For the runs that logged each episode's epsilon (Ape-X, R2D2, SEED-R2D2), the same
    figures over the episodes of their near-greedy envs alone: how many and from which
    frames, the mean of the last 100, and the reach of each level by a mean of 20 of them.
    The whole ladder's return (the table's) counts envs that act at random 40% of the
    time; these are the ones to set beside an evaluation at epsilon 0.001."""
    rows = []
    for (agent, game), pairs in merged_runs(sources, levels).items():
        for run, _ in pairs:
            if run.episodes is None or run.epsilons is None:
                continue
            kept_frames, returns, clock = near_greedy_episodes(run.episodes, run.epsilons,
                                                               NEAR_GREEDY_EPSILON, run.clock)
            if not len(returns):
                continue
            texts = []
            for level in levels:
                at = first_reaching(returns, level)
                texts.append("not reached" if at is None else
                             f"{frames(int(kept_frames[at]))}, {duration(float(clock[at]))}")
            unknown = int(np.isnan(run.epsilons).sum())
            rows.append(f"| {game} | {agent} | {run.seed_text} | {len(returns)} from "
                        f"{frames(int(kept_frames[0]))} ({unknown} without an epsilon) | "
                        f"{returns[-FINAL_EPISODES:].mean():.2f} | {' | '.join(texts)} |")
    if not rows:
        return []
    heads = " | ".join(f"to {level_text(level)}" for level in levels)
    return [
        f"Near-greedy envs: the episodes of the envs exploring with epsilon at most "
        f"{NEAR_GREEDY_EPSILON:g} (the least exploring end of Ape-X's and R2D2's ladder), "
        "for the runs that log each episode's epsilon (`episode/epsilon`; a run resumed by "
        "code that logs it has it from then on). The table above counts every env of the "
        "ladder, down to those acting at random 40% of the time; these are the training "
        "returns to set beside the evaluation at epsilon 0.001. Reach: the first of these "
        f"episodes at which the mean of the last {WINDOW} of them reaches the level, its "
        "frames and the run time to it (the run's clock, as in the table).",
        "",
        f"| game | agent | seed | episodes | last {FINAL_EPISODES}, mean | {heads} |",
        "|---|---|---|---|---:|" + "---|" * len(levels),
        *rows,
    ]


def has_curve(run: AtariRun) -> bool:
    """Whether the run has the ``WINDOW`` episodes its first curve point needs."""
    return run.episodes is not None and len(run.episodes[0]) >= WINDOW


def seed_curves(runs: list[AtariRun], grid: np.ndarray) -> np.ndarray:
    """Each run's 20-episode mean at ``grid`` (``[runs, points]``): NaN before its 20th
    episode; past its last episode, NaN for a run not finished and its last value for a
    finished one (a run that met ``stop_at_return`` ended there, it did not drop out)."""
    end = int(grid[-1])
    return np.stack([curve_at(r.episodes[0], trailing_mean(r.episodes[1]),
                              end if r.result.status == "finished" else int(r.episodes[0][-1]),
                              grid) for r in runs])


def min_max_band(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The curve drawn for an agent on a game from its seeds' curves, a ``[seeds, points]``
    array with NaN where a seed has no point: the mean over the seeds that have one, and
    the band from their lowest to their highest; NaN where no seed has one."""
    seen = ~np.all(np.isnan(values), axis=0)
    mean, low, high = (np.full(values.shape[1], np.nan) for _ in range(3))
    mean[seen] = np.nanmean(values[:, seen], axis=0)
    low[seen] = np.nanmin(values[:, seen], axis=0)
    high[seen] = np.nanmax(values[:, seen], axis=0)
    return mean, low, high


def plot(sources: Sources, path: Path, levels: list[float], points: int = 400) -> None:
    """One panel per game (three to a row), one curve per agent: the mean over seeds of the
    20-episode mean return against env frames, the seeds' min-max as a band; on Pong each
    level dashed, on the games Dopamine's baselines cover their 10M-frame DQN and Rainbow
    scores marked at 10M frames."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pooled = merged_runs(sources, levels)
    cells = {key: [run for run, _ in pairs] for key, pairs in pooled.items()}
    games = list(dict.fromkeys(g for suite, _ in sources for g in suite.games))
    agents = list(dict.fromkeys(a for suite, _ in sources for a in suite.agents))
    panels = max(len(games), 1)
    columns = min(panels, 3)
    rows = -(-panels // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(7 * columns, 4.5 * rows), squeeze=False)
    for ax in axes.flat[panels:]:
        ax.set_visible(False)
    colours = {agent: f"C{i}" for i, agent in enumerate(agents)}
    for ax, game in zip(axes.flat, games, strict=False):
        drawn = {agent: [r for r in cells.get((agent, game), []) if has_curve(r)]
                 for agent in agents}
        end = max([int(r.episodes[0][-1]) for runs in drawn.values() for r in runs] + [1])
        grid = np.linspace(0, end, points)
        for agent, runs in drawn.items():
            if not runs:
                continue
            mean, low, high = min_max_band(seed_curves(runs, grid))
            done = sum(r.result.counted for r in cells[agent, game])
            ax.plot(grid, mean, color=colours[agent],
                    label=f"{agent} (mean of {seeds_text(len(runs))}, {done} finished)")
            ax.fill_between(grid, low, high, color=colours[agent], alpha=0.2, linewidth=0)
        for level in levels if game == "Pong" else []:
            ax.axhline(level, color="black", linestyle="--", linewidth=1)
        for key, marker in (("dopamine_dqn_10m", "v"), ("dopamine_rainbow_10m", "^")):
            reference = REFERENCES[key]
            if game in reference["scores"]:
                ax.plot([10_000_000], [reference["scores"][game]], marker=marker,
                        color="black", linestyle="none", label=reference["label"])
        if any(drawn.values()):
            ax.legend(fontsize=8, loc="lower right" if game == "Pong" else "best")
        else:
            ax.text(0.5, 0.5, f"no run has {WINDOW} episodes yet", transform=ax.transAxes,
                    ha="center")
        ax.set_xlim(left=0)
        ax.set_title(f"{game}: band = min-max over seeds" + (
            ", dashed = " + ", ".join(level_text(level) for level in levels)
            if game == "Pong" else ""))
        ax.set_xlabel("env frames")
        ax.set_ylabel(f"raw return, mean of the last {WINDOW} episodes")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
