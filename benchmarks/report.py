"""Tables and learning curves of a MinAtar or Atari suite, from its run directories alone.

    python benchmarks/report.py results/minatar/suite [--write README.md docs/results.md]
        [--png curves.png] [--supplement DIR]
    python benchmarks/report.py results/atari/pong_appo results/atari/pong_impala ... \
        [--suite atari] [--write README.md] [--png pong.png]

The suite is ``--suite``'s, else the one the directory's ``grid.json`` names (MinAtar where it
names none). ``--write FILE...`` (also spelled ``--readme-table``) puts the tables into each
FILE between their markers: a MinAtar suite's tables between
``<!-- minatar-results:begin -->`` and ``<!-- minatar-results:end -->`` (appended with them
to a file that lacks them), and its summary, one row per agent, between
``<!-- minatar-summary:begin -->`` and ``<!-- minatar-summary:end -->`` where a file (the
README) holds those instead. An Atari suite's
report is ``report_atari.py``'s: per game and agent, each
seed's frames and run time to a 20-episode mean of 0 and +18, the evaluation return per
seed and over seeds, frames/s and the command; with a game of the Atari-5 set,
``report_atari5.py``'s human-normalised scores, Atari-5 estimates and IQM; its PNG, one
panel per game and one curve per agent (mean over seeds, min-max band). ``--write``
puts Pong's table between ``<!-- atari-results:start -->`` and ``<!-- atari-results:end
-->`` and the score table between ``<!-- atari5-results:start -->`` and ``<!--
atari5-results:end -->``, which each file must hold (every file is checked before any is
written). An Atari report may read several
directories (each agent's grid, say): one table and one PNG, an agent's seeds pooled over
them, a seed two of them hold refused. The rest of this docstring is the MinAtar report's.

Per game and agent: the final return (mean training return over each run's last 100
episodes, as the MinAtar paper plots) averaged over the finished seeds, its 95% stratified
bootstrap confidence interval, the seeds, each seed's figure, and whether the mean reached
the MinAtar baseline at 5M frames (Ape-X, R2D2 and SEED-R2D2 against DQN; IMPALA and
SEED-IMPALA against AC(0.8)). Across games: the interquartile mean (IQM, Agarwal et al.
2021) of returns divided by DQN's, with its CI. No game or seed is left out: a missing,
failed or unfinished run is listed as such. SEED-IMPALA and SEED-R2D2 against the CI of
their learner (IMPALA, R2D2) on each game they ran. Per agent: the frames/s of wall clock
of its finished runs and the wall time they took, and the wall time of the whole suite.
The PNG has one panel per game, one line per agent (mean over seeds of the 100-episode
trailing mean, 95% CI band) against env frames, and the baselines marked at 5M frames.

``--supplement DIR``: more seeds of the same presets, run apart (with their own grid); the
cells they ran get a table over both seed sets and the SEED comparison on it, under the
suite's tables, which keep the suite's planned seeds.

Runs are the ``<agent>-<game>-s<seed>`` directories ``benchmarks/reproduce.py`` writes;
its ``grid.json`` names the runs asked for, each agent on its own games (without it, every agent
x game x seed seen).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import report_atari  # noqa: E402
import report_atari5  # noqa: E402
from report_cells import (  # noqa: E402
    CELL_TABLE_HEADER,
    Aggregate,
    Cell,
    baseline,
    cell_row,
    fmt_ci,
    iqm_row,
    iqm_stats,
    seeds_text,
    suite_cells,
)
from report_throughput import throughput_table  # noqa: E402
from suite import (  # noqa: E402
    ATARI,
    DEFAULT_SUITE,
    FINAL_EPISODES,
    GRID,
    NORMALISER,
    REFERENCE_FRAMES,
    SUITES,
    read_json,
    suite_of_grid,
)
from suite_runs import (  # noqa: E402
    Suite,
    collect,
    frames,
    pooled,
)
from suite_stats import (  # noqa: E402
    RLIABLE_ERROR,
    difference_ci,
    identical_agent_rates,
    welch_ci,
)

BEGIN, END = "<!-- minatar-results:begin -->", "<!-- minatar-results:end -->"
# The README's short block: one row per agent (summary_markdown)
SUMMARY_BEGIN, SUMMARY_END = "<!-- minatar-summary:begin -->", "<!-- minatar-summary:end -->"
RESULTS_PAGE = "docs/results.md#minatar"  # where the summary sends a reader for the rest


@dataclass
class SuiteFigures:
    """A suite's bootstrapped figures, computed once for both the full tables and the
    README's summary: each cell's, each agent's IQM across games, and the CI methods used."""

    cells: dict[tuple[str, str], Cell]
    aggregates: dict[str, Aggregate]
    methods: set[str]


def suite_figures(suite: Suite, reps: int, seed: int) -> SuiteFigures:
    methods: set[str] = set()
    cells = suite_cells(suite, reps, seed, methods)
    aggregates = {agent: iqm_stats(suite, agent, reps, seed, methods) for agent in suite.agents}
    return SuiteFigures(cells, aggregates, methods)


def markdown(suite: Suite, reps: int, seed: int, title: str,
             supplements: tuple[tuple[str, Suite], ...] = (),
             figures: SuiteFigures | None = None) -> str:
    """The suite's tables under the heading "MinAtar, ``title``" (:func:`budget_title`);
    each of ``supplements`` (name, more seeds run apart) adds :func:`supplement_section`
    under them. ``figures``: :func:`suite_figures`'s, when already computed."""
    figures = figures or suite_figures(suite, reps, seed)
    cells, methods = figures.cells, figures.methods
    rows = [cell_row(cell) for cell in cells.values()]
    aggregates = [iqm_row(figures.aggregates[agent], len(suite.games_of(agent)))
                  for agent in suite.agents]
    lines = [
        f"### MinAtar, {title}",
        "",
        f"Final return: each run's mean training return over its last {FINAL_EPISODES} "
        "episodes (as the MinAtar paper plots), averaged over the finished seeds. "
        f"Reference: the MinAtar README figure at {frames(REFERENCE_FRAMES)} (approximate); "
        "Ape-X, R2D2 and SEED-R2D2 are compared with DQN, IMPALA and SEED (SEED-IMPALA) with "
        "AC(0.8); reached: the mean over seeds is at least the reference. Eval return: "
        "`eval/return_mean` of the final policy, where the runs evaluated.",
        "",
        *CELL_TABLE_HEADER,
        *rows,
        "",
        f"Across games: interquartile mean (IQM, 25% trimmed mean over every run of every "
        f"game) of final return / {NORMALISER}'s return at {frames(REFERENCE_FRAMES)} "
        "(1.0 = DQN), finished runs only; runs and games not counted are listed.",
        "",
        "| agent | IQM (x DQN) | 95% CI | runs | games | not counted |",
        "|---|---:|---|---:|---|---|",
        *aggregates,
    ]
    comparison = seed_comparison(cells, reps, seed)
    if comparison:
        lines += ["", comparison.rstrip("\n")]
    for name, extra in supplements:
        lines += ["", supplement_section(suite, extra, name, reps, seed, methods).rstrip("\n")]
    lines += ["", ci_note(methods, reps), "", throughput_table(suite)]
    return "\n".join(lines)


def summary_markdown(suite: Suite, reps: int, seed: int, title: str,
                     figures: SuiteFigures | None = None) -> str:
    """The README's block: per agent, the games whose mean final return reached its
    baseline (the per-game table's "reached") and the IQM across games (x DQN) with its
    CI, the same figures as :func:`markdown`'s tables, which hold the rest."""
    figures = figures or suite_figures(suite, reps, seed)
    cells = figures.cells
    rows = []
    for agent in suite.agents:
        mine = [cell for cell in cells.values() if cell.agent == agent]
        reached = sum(1 for cell in mine if cell.reached)
        short = [cell.game for cell in mine if cell.reached is False]
        unknown = len(mine) - reached - len(short)
        games = f"{reached} of {len(mine)}"
        if short:
            games += f" (not {', '.join(short)})"
        if unknown:
            games += f"; {unknown} without a finished run or a reference"
        agg = figures.aggregates[agent]
        iqm = "—" if agg.iqm is None else f"{agg.iqm:.2f} {fmt_ci(agg.low, agg.high, 2)}"
        rows.append(f"| {agent} | {baseline(agent) or '—'} | {games} | {iqm} | {agg.runs} |")
    return "\n".join([
        f"### MinAtar, {title}",
        "",
        f"Final return: each run's mean training return over its last {FINAL_EPISODES} "
        "episodes, averaged over seeds; reached: that mean is at least the MinAtar paper's "
        f"baseline at {frames(REFERENCE_FRAMES)}. IQM: interquartile mean over every run of "
        f"every game of final return / {NORMALISER}'s, with its 95% bootstrap CI. Per game "
        f"and seed, with evaluation returns and wall times: [the results page]({RESULTS_PAGE}).",
        "",
        "| agent | baseline | games reached | IQM (x DQN) [95% CI] | runs |",
        "|---|---|---|---|---:|",
        *rows,
    ]) + "\n"


def minatar_blocks(path: Path, table: str, summary: str) -> list[tuple[str, str, str]]:
    """What ``--write`` puts into ``path``: the summary where it holds the summary's
    markers (the README), the full tables where it holds theirs, and the full tables
    (appended) where it holds neither."""
    text = path.read_text() if path.exists() else ""
    blocks = [(block, begin, end) for block, begin, end in
              ((summary, SUMMARY_BEGIN, SUMMARY_END), (table, BEGIN, END))
              if begin in text and end in text]
    return blocks or [(table, BEGIN, END)]


def supplement_section(suite: Suite, extra: Suite, name: str, reps: int, seed: int,
                       methods: set[str]) -> str:
    """The cells that ``extra`` ran (more seeds of the same presets, after the suite), over
    the suite's seeds and its together, and the SEED comparison on them. The tables
    above keep the suite's planned seeds; this one says what the added seeds change."""
    both = pooled(suite, extra)
    cells = suite_cells(both, reps, seed, methods)
    lines = [
        f"#### With the supplementary seeds of `{name}`",
        "",
        f"Seeds {', '.join(str(s) for s in extra.seeds)} of the same presets, run after the "
        "suite and kept apart, pooled with the suite's seeds on the cells they ran; the "
        "tables above stay on the suite's planned seeds.",
        "",
        *CELL_TABLE_HEADER,
        *(cell_row(c) for c in cells.values()),
    ]
    comparison = seed_comparison(cells, reps, seed)
    if comparison:
        lines += ["", comparison.rstrip("\n")]
    return "\n".join(lines) + "\n"


SEED_LEARNERS = {"seed": "impala", "seed_r2d2": "r2d2"}  # SEED agent -> its learner's agent


def seed_comparison(cells: dict[tuple[str, str], Cell], reps: int, seed: int) -> str:
    """Per game that a SEED agent ran: its mean final return against its learner's mean and
    95% CI on the same game (the cells of :func:`suite_cells`), whether the SEED mean lies
    inside that interval (the suite's test), the two-sample bootstrap CI of the gap
    between the two means (which also counts the SEED agent's own seed spread) and the
    gap's Welch interval (:func:`suite_stats.welch_ci`, which keeps its 5% on few seeds)."""
    games = list(dict.fromkeys(game for _, game in cells))
    rows = []
    seed_counts: set[tuple[int, int]] = set()  # (SEED's, the learner's) finished seeds
    for seed_agent, learner in SEED_LEARNERS.items():
        for game in games:
            mine, theirs = cells.get((seed_agent, game)), cells.get((learner, game))
            if mine is None or theirs is None or (mine.mean is None and theirs.mean is None):
                continue
            if mine.mean is None or theirs.low is None:
                verdict = "— (not both: SEED finished and 2 learner seeds)"
            else:
                inside = theirs.low <= mine.mean <= theirs.high
                verdict = "yes" if inside else (
                    "no, above" if mine.mean > theirs.high else "no, below")
            gap_text = welch_text = "—"
            if len(mine.done) >= 2 and len(theirs.done) >= 2:
                low, high = difference_ci(mine.finals, theirs.finals, reps, seed)
                gap_text = f"{mine.mean - theirs.mean:+.1f} {fmt_ci(low, high)}"
                welch_text = fmt_ci(*(float(x) for x in welch_ci(mine.finals, theirs.finals)))
                seed_counts.add((len(mine.done), len(theirs.done)))
            mine_text = "—" if mine.mean is None else (
                f"{mine.mean:.1f} {fmt_ci(mine.low, mine.high)} ({seeds_text(len(mine.done))})")
            theirs_text = "—" if theirs.mean is None else (
                f"{theirs.mean:.1f} {fmt_ci(theirs.low, theirs.high)} "
                f"({seeds_text(len(theirs.done))})")
            rows.append(f"| {game} | {seed_agent} | {mine_text} | {learner} | {theirs_text} | "
                        f"{gap_text} | {welch_text} | {verdict} |")
    if not rows:
        return ""
    return "\n".join([
        "SEED against its learner on the same game: the SEED agent's mean final return, "
        "the gap to its learner's (IMPALA for SEED-IMPALA, R2D2 for SEED-R2D2) with the "
        "two-sample bootstrap 95% CI of that gap (each agent's seeds resampled apart; with "
        "2 seeds or more each) and its Welch 95% interval (t with Welch-Satterthwaite "
        "degrees of freedom), and whether the SEED mean lies inside the learner's 95% CI.",
        "",
        "| game | SEED agent | final return [95% CI] | learner | final return [95% CI] "
        "| SEED − learner [bootstrap 95% CI] | Welch 95% CI | inside the learner's CI |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        *([""] if seed_counts else []),
        *(identical_agent_note(n_new, n_base, seed) for n_new, n_base in sorted(seed_counts)),
    ]) + "\n"


IDENTICAL_AGENT_SIMS = 2000  # simulated pairs of suites behind identical_agent_note


def identical_agent_note(n_new: int, n_base: int, seed: int) -> str:
    """What the SEED tests say of an agent identical to its learner, at these seed counts
    (:func:`suite_stats.identical_agent_rates`): how much each verdict weighs."""
    inside, excludes, welch = identical_agent_rates(n_new, n_base, IDENTICAL_AGENT_SIMS, 1000,
                                                    seed)
    return (f"With {seeds_text(n_new)} against {n_base}, an agent identical to its learner "
            f"lies inside the learner's CI in {100 * inside:.0f}% of "
            f"{IDENTICAL_AGENT_SIMS:,} simulated pairs of suites (normal scores); the gap's "
            f"bootstrap CI excludes 0 in {100 * excludes:.0f}% and its Welch interval in "
            f"{100 * welch:.0f}% (5% is the nominal rate): on so few seeds the bootstrap "
            "verdicts are a rough guide.")






def ci_note(methods: set[str], reps: int) -> str:
    """Which bootstrap made the intervals, said once under the tables."""
    how = []
    if "rliable" in methods:
        how.append("rliable.library.get_interval_estimates")
    if "numpy" in methods:
        reason = (f"rliable.library does not import ({RLIABLE_ERROR})" if RLIABLE_ERROR
                  else "seeds per game differ, which rliable's matrix cannot hold")
        how.append(f"numpy, the same resampling ({reason})")
    source = " and ".join(how) if how else "none computed (fewer than 2 finished runs per cell)"
    return (f"95% CIs: percentile stratified bootstrap over seeds (each game's runs resampled "
            f"separately), {reps:,} resamples, by {source}; a cell with one seed has none. "
            "IQM by rliable.metrics.aggregate_iqm.")


def budget_title(path: Path, suite: Suite) -> str:
    """What the suite's table is, for its heading: the frames each run was given (its
    grid.json's ``frames``, else the most any run reached), else the directory's name."""
    grid = read_json(path / GRID)
    budget = grid.get("frames") if isinstance(grid, dict) else None
    if isinstance(budget, (int, float)) and budget >= 1e6:
        return f"{budget / 1e6:g}M frames"
    reached = [run.frames for run in suite.runs.values() if run.frames]
    return frames(max(reached)) if reached else path.name


def with_table(text: str, table: str, begin: str, end: str) -> str | None:
    """``text`` with ``table`` between the markers ``begin`` and ``end``; None where it
    lacks them."""
    if begin not in text or end not in text:
        return None
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1].removeprefix("\n")
    return head + f"{begin}\n{table}{end}\n" + tail


def write_tables(paths: list[Path], tables: list[tuple[str, str, str]],
                 append: bool = True) -> None:
    """Put each of ``tables`` (table, begin marker, end marker) between its markers in
    every file of ``paths``, so that all of them hold the same blocks. Where a file lacks a
    pair of markers, append the block with them, or (``append`` false) refuse with
    SystemExit; every file is checked before any is written."""
    texts = {}
    for path in dict.fromkeys(paths):
        text = path.read_text() if path.exists() else ""
        for table, begin, end in tables:
            replaced = with_table(text, table, begin, end)
            if replaced is not None:
                text = replaced
            elif append:
                text += ("\n" if text and not text.endswith("\n") else "") + (
                    f"{begin}\n{table}{end}\n")
            else:
                raise SystemExit(f"report: --write: '{path}' holds no {begin} ... {end} "
                                 "markers: add them where the table goes (no file was "
                                 "written)")
        texts[path] = text
    for path, text in texts.items():
        path.write_text(text)


def _collect_or_exit(path: Path) -> Suite:
    if not path.is_dir():
        raise SystemExit(f"report: no directory '{path}'")
    suite = collect(path)
    if not suite.agents:
        raise SystemExit(f"report: no runs in '{path}' (and no {GRID})")
    return suite


def suite_name(path: Path, asked: str | None) -> str:
    """The suite ``path`` holds: ``asked`` (--suite), which must not contradict its
    grid.json, else the one its grid.json names."""
    grid = read_json(path / GRID)
    recorded = suite_of_grid(grid) if isinstance(grid, dict) else None
    if asked is not None and recorded is not None and asked != recorded:
        raise SystemExit(f"report: --suite {asked}, but {path / GRID} holds the {recorded} "
                         "suite's grid")
    return asked or recorded or DEFAULT_SUITE


def atari_main(args: argparse.Namespace, sources: list[tuple[Suite, Path]]) -> None:
    """An Atari suite's tables (and README blocks, PNG) from one or more directories: Pong's
    reach table (:mod:`report_atari`) when one has Pong, the human-normalised score table
    (:mod:`report_atari5`) of each that has an Atari-5 game, all of these in one block;
    each kind of table between its own markers."""
    if args.supplement:
        raise SystemExit("report: --supplement pools MinAtar seeds; give an Atari suite's "
                         "directories one after another instead")
    levels = list(ATARI.reach)
    tables = []
    scored = [(suite, path) for suite, path in sources if report_atari5.has_scores(suite)]
    if any("Pong" in suite.games for suite, _ in sources) or not scored:
        title = ", ".join(path.name for _, path in sources)
        try:
            table = report_atari.markdown(sources, title, levels)
        except ValueError as error:
            raise SystemExit(f"report: {error}") from None
        tables.append((table, report_atari.BEGIN, report_atari.END))
    if scored:  # one block holds every archive's score table, in the order given
        tables.append(("\n".join(report_atari5.markdown(suite, path, args.reps, args.seed)
                                 for suite, path in scored),
                       report_atari5.BEGIN, report_atari5.END))
    print("\n".join(table for table, _, _ in tables), end="")
    if args.write:
        write_tables(args.write, tables, append=False)
    if args.png:
        report_atari.plot(sources, args.png, levels)
        print(f"\nlearning curves: {args.png}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("suite", type=Path, nargs="+",
                        help="directory of run directories (an Atari suite: one or more)")
    parser.add_argument("--suite", dest="kind", choices=sorted(SUITES),
                        help="minatar or atari (default: the one grid.json names, else "
                             "minatar)")
    parser.add_argument("--write", "--readme-table", dest="write", type=Path, nargs="+",
                        metavar="FILE", default=[],
                        help=f"also write the tables into each FILE (README.md "
                             f"docs/results.md) between {BEGIN} and {END} (an Atari "
                             f"suite's between {report_atari.BEGIN} and {report_atari.END}, "
                             "which each FILE must hold)")
    parser.add_argument("--png", type=Path, metavar="FILE", help="learning curves")
    parser.add_argument("--reps", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap random seed")
    parser.add_argument("--supplement", type=Path, metavar="DIR", action="append", default=[],
                        help="more seeds of the same presets, run apart: a table of the "
                             "cells they ran over both seed sets (repeatable)")
    args = parser.parse_args(argv)
    kinds = {suite_name(path, args.kind) for path in args.suite}
    if len(kinds) > 1:
        raise SystemExit(f"report: the directories hold grids of several suites "
                         f"({', '.join(sorted(kinds))}); give one suite's")
    if kinds == {ATARI.name}:
        atari_main(args, [(_collect_or_exit(path), path) for path in args.suite])
        return
    if len(args.suite) > 1:
        raise SystemExit("report: a MinAtar report reads one directory; more seeds of its "
                         "presets go with --supplement DIR")
    args.suite = args.suite[0]
    suite = _collect_or_exit(args.suite)
    supplements = []
    for path in args.supplement:
        supplements.append((path.name, _collect_or_exit(path)))
    figures = suite_figures(suite, args.reps, args.seed)
    title = budget_title(args.suite, suite)
    try:
        table = markdown(suite, args.reps, args.seed, title, tuple(supplements), figures)
    except ValueError as error:
        raise SystemExit(f"report: --supplement: {error}") from None
    print(table, end="")
    if args.write:
        summary = summary_markdown(suite, args.reps, args.seed, title, figures)
        for path in dict.fromkeys(args.write):
            write_tables([path], minatar_blocks(path, table, summary))
    if args.png:
        from report_plot import plot

        plot(suite, args.png, args.reps, args.seed)
        print(f"\nlearning curves: {args.png}")


if __name__ == "__main__":
    main()
