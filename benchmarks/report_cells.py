"""The per-cell figures of a MinAtar suite's report: one agent on one game (its final
return over seeds, the 95% CI, the baseline it is held to) and one agent across games
(the IQM of returns divided by DQN's), each with its Markdown row."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from suite import AGENTS, NORMALISER, REFERENCE_FRAMES, REFERENCES
from suite_runs import RunResult, Suite, frames
from suite_stats import aggregate_iqm, bootstrap_ci, iqm_rows, mean_rows


def seeds_text(n: int) -> str:
    """``1 seed``, ``3 seeds``."""
    return f"{n} seed{'s' * (n != 1)}"


def fmt_ci(low: float | None, high: float | None, digits: int = 1) -> str:
    return "—" if low is None else f"[{low:.{digits}f}, {high:.{digits}f}]"


def baseline(agent: str) -> str | None:
    return AGENTS[agent][1] if agent in AGENTS else None


@dataclass
class Cell:
    """One agent on one game: its planned runs and the figures over the finished ones."""

    agent: str
    game: str
    runs: list[RunResult]
    mean: float | None = None  # mean over finished seeds of the final return
    low: float | None = None  # 95% CI (None with fewer than 2 finished seeds)
    high: float | None = None
    baseline: str | None = None  # DQN or AC(0.8)
    reference: float | None = None  # the baseline's return at 5M frames on this game
    reached: bool | None = None  # mean >= reference; None without either

    @property
    def done(self) -> list[RunResult]:
        return [r for r in self.runs if r.counted]

    @property
    def finals(self) -> np.ndarray:
        """The final return of each finished seed."""
        return np.array([r.final for r in self.done])


def cell_stats(suite: Suite, agent: str, game: str, reps: int, seed: int,
               methods: set[str]) -> Cell:
    cell = Cell(agent, game, suite.cell(agent, game))
    values = cell.finals
    if len(values):
        cell.mean = float(values.mean())
    if len(values) >= 2:
        cell.low, cell.high, how = bootstrap_ci([values], mean_rows, reps, seed)
        methods.add(how)
    cell.baseline = baseline(agent)
    cell.reference = REFERENCES.get(cell.baseline, {}).get(game) if cell.baseline else None
    if cell.reference is not None and cell.mean is not None:
        cell.reached = cell.mean >= cell.reference
    return cell


# The columns of cell_row's rows, as the report's tables head them.
CELL_TABLE_HEADER = (
    "| game | agent | seeds | final return | 95% CI | reference | reached | frames "
    "| eval return | per seed |",
    "|---|---|---:|---:|---|---|---|---|---|---|",
)


def cell_row(cell: Cell) -> str:
    done = cell.done
    if cell.reference is None:
        ref_text, reached = "—", "— (no reference)"
    else:
        ref_text = f"{cell.baseline} {cell.reference:g}"
        if cell.reached is None:
            reached = "— (no finished run)"
        else:
            reached = "yes" if cell.reached else "no"
            budget = min(r.frames for r in done)
            if budget < REFERENCE_FRAMES:
                reached += f" (at {frames(budget)}, reference at {frames(REFERENCE_FRAMES)})"
    evals = [r.eval_return for r in done if r.eval_return is not None]
    eval_text = f"{np.mean(evals):.1f} ({seeds_text(len(evals))})" if evals else "—"
    # Runs end a few frames past the budget (whole batches), so compare them as printed.
    span = list(dict.fromkeys(frames(n) for n in sorted(r.frames for r in done)))
    frames_text = "—" if not span else (span[0] if len(span) == 1 else f"{span[0]}–{span[-1]}")
    mean_text = "—" if cell.mean is None else f"{cell.mean:.1f}"
    return (f"| {cell.game} | {cell.agent} | {len(done)}/{len(cell.runs)} | {mean_text} | "
            f"{fmt_ci(cell.low, cell.high)} | {ref_text} | {reached} | {frames_text} | "
            f"{eval_text} | {', '.join(r.describe() for r in cell.runs)} |")


@dataclass
class Aggregate:
    """One agent across games: IQM of final return / DQN's, finished runs only."""

    agent: str
    iqm: float | None = None
    low: float | None = None
    high: float | None = None
    runs: int = 0
    games: int = 0  # games with at least one finished run and a DQN reference
    notes: list[str] = field(default_factory=list)  # what was not counted, and why


def iqm_stats(suite: Suite, agent: str, reps: int, seed: int, methods: set[str]) -> Aggregate:
    out, per_task = Aggregate(agent), []
    normaliser = REFERENCES[NORMALISER]
    for game in suite.games_of(agent):
        runs = suite.cell(agent, game)
        done = [r for r in runs if r.counted]
        left = [r.describe() for r in runs if not r.counted]
        if game not in normaliser:
            out.notes.append(f"{game}: no {NORMALISER} reference")
            continue
        if not done:
            out.notes.append(f"{game}: no finished run")
            continue
        per_task.append(np.array([r.final for r in done]) / normaliser[game])
        if left:
            out.notes.append(f"{game} {', '.join(left)}")
    if not per_task:
        return out
    out.runs, out.games = sum(len(v) for v in per_task), len(per_task)
    out.iqm = float(aggregate_iqm(np.concatenate(per_task)))
    if out.runs >= 2:
        out.low, out.high, how = bootstrap_ci(per_task, iqm_rows, reps, seed)
        methods.add(how)
    return out


def iqm_row(agg: Aggregate, games: int) -> str:
    iqm = "—" if agg.iqm is None else f"{agg.iqm:.2f}"
    return (f"| {agg.agent} | {iqm} | {fmt_ci(agg.low, agg.high, 2)} | {agg.runs} | "
            f"{agg.games}/{games} | {'; '.join(agg.notes) or '—'} |")


def suite_cells(suite: Suite, reps: int, seed: int,
                methods: set[str]) -> dict[tuple[str, str], Cell]:
    """Every planned (agent, game) cell's figures, game by game in the suite's order."""
    return {(agent, game): cell_stats(suite, agent, game, reps, seed, methods)
            for game in suite.games for agent in suite.agents
            if suite.is_planned(agent, game)}

