"""benchmarks/reproduce.py (the resumable grid) and benchmarks/report.py (tables, curves):
run directories made with distrl's MetricLogger or by tests/fake_run.py, no training."""

from __future__ import annotations

import argparse
import itertools
import json
import lzma
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import fake_run
import numpy as np
import pytest
import scipy.stats

from distrl.telemetry.logging import MetricLogger

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import attempt_record  # noqa: E402
import curve  # noqa: E402
import grid_plan  # noqa: E402
import report  # noqa: E402
import report_atari  # noqa: E402
import report_cells  # noqa: E402
import report_plot  # noqa: E402
import report_throughput  # noqa: E402
import reproduce  # noqa: E402
import suite  # noqa: E402
import suite_runs  # noqa: E402
import suite_stats  # noqa: E402

FAKE = f"{sys.executable} {REPO / 'tests' / 'fake_run.py'}"
TEST_MACHINE = "Test CPU, 2 cores"


@pytest.fixture(autouse=True)
def ale_timings(monkeypatch) -> list[tuple[list[str], float]]:
    """reproduce.py's timing of ale-py alone (``ale_speed.ale_alone``, whose own test is
    tests/test_ale_speed.py), replaced so that an Atari grid here starts at once: each call
    is recorded, and every game runs at 6,000 frames/s on ``TEST_MACHINE``."""
    calls: list[tuple[list[str], float]] = []

    def timed(games: list[str], seconds: float) -> dict:
        calls.append((list(games), seconds))
        return {"machine": TEST_MACHINE, "measured": "2026-11-29T08:00:00", "envs": 64,
                "threads": 2, "seconds": seconds,
                "frames_per_s": {game: 6000.0 for game in games}}

    monkeypatch.setattr(reproduce, "ale_alone", timed)
    return calls


def make_run(root: Path, agent: str, game: str, seed: int, returns: list[float],
             last_frame: int = 5_000_000, status: str | None = "finished",
             exit_code: int = 0, eval_return: float | None = None) -> Path:
    """A run directory as reproduce.py leaves it: ``returns`` logged by MetricLogger as
    episodes spread evenly up to ``last_frame``, and a summary.json with ``status``
    (None: no summary, i.e. unfinished)."""
    run_dir = root / suite.run_name(agent, game, seed)
    logger = MetricLogger(str(run_dir), stream=open(os.devnull, "w"))  # noqa: SIM115
    steps = np.linspace(last_frame / len(returns), last_frame, len(returns)).astype(int)
    for value, frames in zip(returns, steps, strict=True):
        logger.episode(value, 10, int(frames))
    if eval_return is not None:
        logger.add("eval/return_mean", eval_return)
    logger.report(last_frame, {"perf/fps": 1000.0})
    logger.close()
    if status is not None:
        (run_dir / suite.SUMMARY).write_text(json.dumps(
            {"agent": agent, "game": game, "seed": seed, "status": status,
             "exit_code": exit_code}))
    return run_dir


def write_grid(root: Path, agents: list[str], games: list[str], seeds: list[int]) -> None:
    (root / suite.GRID).write_text(json.dumps({"agents": agents, "games": games,
                                               "seeds": seeds}))


def cell(root: Path, agent: str, game: str, reps: int = 2000) -> report_cells.Cell:
    return report_cells.cell_stats(report.collect(root), agent, game, reps, 0, set())


def row_of(table: str, game: str, agent: str) -> list[str]:
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[:2] == [game, agent]:
            return cells
    raise AssertionError(f"no row for {game} {agent} in\n{table}")


# ---------------------------------------------------------------- report: numbers


def test_final_return_is_the_mean_of_the_last_100_episodes_and_the_ci_contains_it(tmp_path):
    # 50 early episodes at 0 must not count; seeds' final returns are 4, 6 and 11.
    for seed, value in enumerate([4.0, 6.0, 11.0]):
        make_run(tmp_path, "apex", "Breakout", seed, [0.0] * 50 + [value] * 100)
    got = cell(tmp_path, "apex", "Breakout")
    assert [r.final for r in got.runs] == [4.0, 6.0, 11.0]
    assert got.mean == pytest.approx(7.0)
    assert got.low < got.mean < got.high
    assert 4.0 <= got.low and got.high <= 11.0  # a resampled mean stays within the seeds
    row = row_of(report.markdown(report.collect(tmp_path), 2000, 0, "t"), "Breakout", "apex")
    assert row[2:5] == ["3/3", "7.0", f"[{got.low:.1f}, {got.high:.1f}]"]
    assert row[-1] == "s0 4.0, s1 6.0, s2 11.0"


def test_ci_narrows_with_more_seeds():
    def width(values):
        low, high, _ = suite_stats.bootstrap_ci([np.array(values)], suite_stats.mean_rows, 2000, 0)
        assert low <= np.mean(values) <= high
        return high - low

    three, nine = width([1.0, 2.0, 3.0]), width([1.0, 2.0, 3.0] * 3)
    assert nine < 0.7 * three  # about 1/sqrt(3) of it


def test_ci_of_identical_seeds_is_the_value_and_one_seed_has_none(tmp_path):
    for seed in range(3):
        make_run(tmp_path, "impala", "Breakout", seed, [5.0] * 100)
    identical = suite_stats.bootstrap_ci([np.full(3, 5.0)], suite_stats.mean_rows, 2000, 0)
    assert identical[:2] == (5.0, 5.0)
    got = cell(tmp_path, "impala", "Breakout")
    assert (got.mean, got.low, got.high) == (5.0, 5.0, 5.0)
    make_run(tmp_path, "impala", "Freeway", 0, [30.0] * 10)
    one = cell(tmp_path, "impala", "Freeway")
    assert (one.mean, one.low, one.high) == (30.0, None, None)


def test_iqm_of_normalised_returns_matches_a_hand_computation(tmp_path):
    # Breakout / DQN 10: 0, 1, 2, 3; Freeway / DQN 50: 0.5, 1, 1.5, 10. The 25% trimmed
    # mean of all 8 drops 2 at each end: mean(1, 1, 1.5, 2) = 1.375.
    for seed, value in enumerate([0.0, 10.0, 20.0, 30.0]):
        make_run(tmp_path, "apex", "Breakout", seed, [value] * 100)
    for seed, value in enumerate([25.0, 50.0, 75.0, 500.0]):
        make_run(tmp_path, "apex", "Freeway", seed, [value] * 100)
    agg = report_cells.iqm_stats(report.collect(tmp_path), "apex", 2000, 0, set())
    assert agg.iqm == pytest.approx(1.375)
    assert (agg.runs, agg.games, agg.notes) == (8, 2, [])
    assert agg.low <= agg.iqm <= agg.high


@pytest.mark.parametrize("per_task, how", [
    ([np.zeros(2), np.full(3, 10.0)], "numpy"),  # runs per game differ: numpy's resampling
    ([np.zeros(3), np.full(3, 10.0)], "rliable"),
])
def test_the_bootstrap_resamples_each_games_runs_apart(per_task, how):
    """Stratified: every resample keeps each game's number of runs, so with constant
    scores per game its mean never moves (2 zeros and 3 tens: 6; 3 and 3: 5). Resampling
    the pooled runs would spread it over [0, 10]."""
    want = float(np.concatenate(per_task).mean())
    assert suite_stats.bootstrap_ci(per_task, suite_stats.mean_rows, 1000, 0) == (
        pytest.approx(want), pytest.approx(want), how)


def test_reached_marks_against_each_agents_baseline(tmp_path):
    make_run(tmp_path, "impala", "Breakout", 0, [18.0] * 100)  # AC(0.8): 17.5
    make_run(tmp_path, "apex", "Breakout", 0, [9.0] * 100)  # DQN: 10
    make_run(tmp_path, "r2d2", "Breakout", 0, [12.0] * 100, last_frame=1_000_000)
    table = report.markdown(report.collect(tmp_path), 200, 0, "t")
    assert row_of(table, "Breakout", "impala")[5:7] == ["AC(0.8) 17.5", "yes"]
    assert row_of(table, "Breakout", "apex")[5:7] == ["DQN 10", "no"]
    # above DQN, but at 1M frames: said so
    assert row_of(table, "Breakout", "r2d2")[6] == (
        "yes (at 1.0M frames, reference at 5.0M frames)")
    assert cell(tmp_path, "apex", "Breakout").reached is False


def test_frames_column_names_a_range_only_where_the_budgets_differ(tmp_path):
    # Runs stop a whole batch past their budget: 5,000,688 and 5,000,000 are one budget.
    make_run(tmp_path, "apex", "Breakout", 0, [9.0] * 100, last_frame=5_000_688)
    make_run(tmp_path, "apex", "Breakout", 1, [9.0] * 100, last_frame=5_000_000)
    make_run(tmp_path, "r2d2", "Breakout", 0, [9.0] * 100, last_frame=1_000_000)
    make_run(tmp_path, "r2d2", "Breakout", 1, [9.0] * 100, last_frame=5_000_000)
    table = report.markdown(report.collect(tmp_path), 200, 0, "t")
    assert row_of(table, "Breakout", "apex")[7] == "5.0M frames"
    assert row_of(table, "Breakout", "r2d2")[7] == "1.0M frames–5.0M frames"


def test_missing_failed_and_unfinished_runs_are_shown_never_dropped(tmp_path):
    write_grid(tmp_path, ["impala"], ["Breakout", "Seaquest"], [0, 1, 2, 3])
    make_run(tmp_path, "impala", "Breakout", 0, [20.0] * 100, eval_return=21.0)
    make_run(tmp_path, "impala", "Breakout", 1, [2.0] * 100, last_frame=1_200_000,
             status=None)  # stopped halfway: not counted
    make_run(tmp_path, "impala", "Breakout", 2, [1.0] * 100, last_frame=2_000_000,
             status="failed", exit_code=-9)
    table = report.markdown(report.collect(tmp_path), 200, 0, "t")
    row = row_of(table, "Breakout", "impala")
    assert row[2:4] == ["1/4", "20.0"]
    assert row[8] == "21.0 (1 seed)"
    assert row[-1] == ("s0 20.0, s1 unfinished (1.2M frames, 2.0), "
                       "s2 failed (exit -9, 2.0M frames, 1.0), s3 missing")
    seaquest = row_of(table, "Seaquest", "impala")
    assert seaquest[2:5] == ["0/4", "—", "—"]
    assert seaquest[6] == "— (no finished run)"
    assert seaquest[-1] == "s0 missing, s1 missing, s2 missing, s3 missing"
    # the IQM: the one finished run, 20 / DQN's 10; what was left out is listed
    iqm = row_of(table, "impala", "2.00")
    assert iqm[2:5] == ["—", "1", "1/2"]
    assert iqm[5] == ("Breakout s1 unfinished (1.2M frames, 2.0), s2 failed (exit -9, "
                      "2.0M frames, 1.0), s3 missing; Seaquest: no finished run")


def test_throughput_table_gives_each_agents_frames_per_second_and_the_suite_wall_time(
        tmp_path):
    write_grid(tmp_path, ["impala", "apex"], ["Breakout"], [0, 1, 2])
    for seed, fps, wall in ((0, 1000.0, 5000.0), (1, 3000.0, 2000.0)):
        run_dir = make_run(tmp_path, "impala", "Breakout", seed, [1.0] * 100)
        summary = json.loads((run_dir / suite.SUMMARY).read_text())
        summary.update(fps=fps, wall_s_total=wall)
        (run_dir / suite.SUMMARY).write_text(json.dumps(summary))
    stopped = make_run(tmp_path, "impala", "Breakout", 2, [1.0] * 10, last_frame=100_000,
                       status=None)  # two attempts so far, no summary: time counted, no fps
    (stopped / suite.ATTEMPTS).write_text('{"wall_s": 60.0}\n{"wall_s": 40.0}\n')
    table = report_throughput.throughput_table(report.collect(tmp_path))
    assert "| impala | 2 | 1 | 2,000 | 1,000-3,000 | 58m20s | 1h58m |" in table  # 7,100 s
    assert "| apex | 0 | — | — | — | — | 0m00s |" in table
    assert "Wall time of the suite so far: 1h58m, one run at a time." in table


def test_runs_side_by_side_count_once_in_the_suites_wall_time(tmp_path):
    """Two runs of ``--jobs 2`` overlap by 10 minutes; a third run, archived before the
    spans were recorded, had two attempts of which only the last one's start is known."""
    def summary(seed: int, spans: list | None, wall_total: float, **extra) -> None:
        run_dir = make_run(tmp_path, "apex", "Breakout", seed, [1.0] * 100)
        record = json.loads((run_dir / suite.SUMMARY).read_text())
        record.update(fps=1000.0, wall_s_total=wall_total, **extra)
        if spans is not None:
            record["spans"] = spans
        (run_dir / suite.SUMMARY).write_text(json.dumps(record))

    summary(0, [["2026-11-26T10:00:00", 1800.0]], 1800.0, jobs=2)  # 10:00-10:30
    summary(1, [["2026-11-26T09:50:00", 600.0], ["2026-11-26T10:20:00", 1200.0]], 1800.0,
            jobs=2)  # 9:50-10:00 and 10:20-10:40
    summary(2, None, 900.0, started="2026-11-26T12:00:00", wall_s=300.0)  # + 600 s unplaced
    table = report_throughput.throughput_table(report.collect(tmp_path))
    assert "| apex | 3 | 1, 2 | 1,000 | 1,000-1,000 | 30m00s | 1h15m |" in table
    # 9:50-10:40 (50 min) + 12:00-12:05 + 10 min of an attempt that ran at an unknown time;
    # every planned run finished, so the suite's wall time is no longer "so far"
    assert ("Wall time of the suite: 1h05m of clock time in which at least one run "
            "was going (an hour of two runs side by side counts once); its runs took 1h15m "
            "between them.") in table


def test_at_a_time_counts_the_runs_of_another_invocation_that_shared_the_machine(tmp_path):
    """An Ape-X run of ``--jobs 2`` whose partner ended, beside an R2D2 run that another
    ``reproduce.py --jobs 1`` started: both shared the machine, whatever their --jobs said.
    A run alone, though started by ``--jobs 2``, had the machine to itself."""
    def summary(agent: str, seed: int, started: str, wall: float, jobs: int) -> None:
        run_dir = make_run(tmp_path, agent, "Breakout", seed, [1.0] * 100)
        record = json.loads((run_dir / suite.SUMMARY).read_text())
        record.update(fps=1000.0, wall_s_total=wall, jobs=jobs, spans=[[started, wall]])
        (run_dir / suite.SUMMARY).write_text(json.dumps(record))

    write_grid(tmp_path, ["apex", "r2d2"], ["Breakout"], [0, 1])
    summary("apex", 0, "2026-11-27T01:35:00", 1800.0, jobs=2)  # 1:35-2:05
    summary("r2d2", 0, "2026-11-27T01:40:00", 1700.0, jobs=1)  # 1:40-2:08, beside it
    summary("apex", 1, "2026-11-27T03:00:00", 1800.0, jobs=2)  # alone
    summary("r2d2", 1, "2026-11-27T02:00:00", 1800.0, jobs=1)  # 2:00-2:30: 3 at 2:00
    table = report_throughput.throughput_table(report.collect(tmp_path))
    assert "| apex | 2 | 1, 3 | 1,000 |" in table
    assert "| r2d2 | 2 | 3 | 1,000 |" in table
    spans = report.collect(tmp_path).runs["r2d2", "Breakout", 0].spans
    assert suite_runs.most_at_once(spans, spans) == 1  # only itself
    assert suite_runs.most_at_once([], spans) == 0


def test_a_finished_runs_summary_keeps_every_attempts_span_and_its_jobs(tmp_path):
    out = tmp_path / "out"
    stopped = out / "impala-Breakout-s0"
    stopped.mkdir(parents=True)
    (stopped / suite.ATTEMPTS).write_text(
        '{"attempt": 1, "status": "stopped", "started": "2026-11-26T09:00:00", "wall_s": 5.0}\n')
    assert reproduce.main(grid_args(out, "--jobs", "2", agents=("impala",), seeds=("0",))) == 0
    record = json.loads((stopped / suite.SUMMARY).read_text())
    assert record["jobs"] == 2 and record["attempt"] == 2
    assert record["spans"][0] == ["2026-11-26T09:00:00", 5.0]
    assert record["spans"][1] == [record["started"], record["wall_s"]]
    assert report.collect(out).runs["impala", "Breakout", 0].spans[0][1] == 5.0


def test_seed_is_compared_with_its_learners_interval_on_each_game(tmp_path):
    write_grid(tmp_path, ["impala", "seed"], ["Breakout", "Seaquest"], [0, 1, 2])
    for game, learner, seed_agent in (("Breakout", [10.0, 12.0, 14.0], [11.0, 13.0]),
                                      ("Seaquest", [4.0, 5.0, 6.0], [30.0, 31.0, 32.0])):
        for s, value in enumerate(learner):
            make_run(tmp_path, "impala", game, s, [value] * 100)
        for s, value in enumerate(seed_agent):
            make_run(tmp_path, "seed", game, s, [value] * 100)
    suite_ = report.collect(tmp_path)
    text = report.seed_comparison(report.suite_cells(suite_, 500, 0, set()), 500, 0)
    breakout = row_of(text, "Breakout", "seed")
    impala_ci = report_cells.cell_stats(suite_, "impala", "Breakout", 500, 0, set())
    assert impala_ci.low <= 12.0 <= impala_ci.high  # SEED's mean, 12, inside [10, 14]'s CI
    assert breakout[2].startswith("12.0 ") and breakout[3] == "impala"
    assert breakout[-1] == "yes"
    # gap 12 - 12 = 0; SEED's two seeds and IMPALA's three spread it both ways
    assert breakout[-3].startswith("+0.0 [-") and breakout[-3].endswith("]")
    seaquest = row_of(text, "Seaquest", "seed")
    assert seaquest[-1] == "no, above"
    # every resample of {30, 31, 32} minus one of {4, 5, 6} lies in [24, 28]
    low, high = (float(x) for x in seaquest[-3].split("[")[1].rstrip("]").split(","))
    assert seaquest[-3].startswith("+26.0 ") and 24.0 <= low < 26.0 < high <= 28.0
    assert text in report.markdown(suite_, 500, 0, "t")
    # how much the verdicts weigh at these seed counts: Breakout 2 against 3, Seaquest 3
    # against 3, one line each
    notes = [line for line in text.splitlines() if "an agent identical to its learner" in line]
    assert [note.split(",")[0] for note in notes] == ["With 2 seeds against 3",
                                                      "With 3 seeds against 3"]


SEED_GAP_RETURNS = {"impala": [10.0, 12.0, 14.0, 20.0, 22.0],
                    "seed": [16.0, 18.0, 20.0, 17.0, 21.0]}


def test_supplementary_seeds_are_pooled_as_if_run_in_the_suite(tmp_path):
    """Seeds 3 and 4 run apart (their own directory and grid) and pooled by --supplement
    give the very rows a suite of seeds 0-4 in one directory gives; the suite's own
    tables keep seeds 0-2."""
    suite_dir, extra_dir, whole_dir = tmp_path / "suite", tmp_path / "extra", tmp_path / "all"
    for root in (suite_dir, extra_dir, whole_dir):
        root.mkdir()
    write_grid(suite_dir, ["impala", "seed", "apex"], ["Breakout"], [0, 1, 2])
    write_grid(extra_dir, ["impala", "seed"], ["Breakout"], [3, 4])
    write_grid(whole_dir, ["impala", "seed"], ["Breakout"], [0, 1, 2, 3, 4])
    for agent, values in SEED_GAP_RETURNS.items():
        for s, value in enumerate(values):
            make_run(suite_dir if s < 3 else extra_dir, agent, "Breakout", s, [value] * 100)
            make_run(whole_dir, agent, "Breakout", s, [value] * 100)
    for s in range(3):
        make_run(suite_dir, "apex", "Breakout", s, [15.0] * 100)
    suite_, extra = report.collect(suite_dir), report.collect(extra_dir)
    text = report.markdown(suite_, 500, 0, "t", (("extra", extra),))
    section = text.split("#### With the supplementary seeds of `extra`")[1]
    whole = report.markdown(report.collect(whole_dir), 500, 0, "t")
    for agent in ("impala", "seed"):
        assert row_of(section, "Breakout", agent) == row_of(whole, "Breakout", agent)
        assert row_of(text, "Breakout", agent)[2] == "3/3"  # the suite's table: seeds 0-2
    comparison = row_of(section.split("SEED against its learner")[1], "Breakout", "seed")
    assert comparison == row_of(whole.split("SEED against its learner")[1], "Breakout", "seed")
    assert comparison[-3].startswith("+2.8 ")  # 18.4 - 15.6
    with pytest.raises(AssertionError):  # Ape-X ran no supplementary seed: not pooled
        row_of(section, "Breakout", "apex")


def test_a_seed_in_both_the_suite_and_the_supplement_is_refused(tmp_path, capsys):
    suite_dir, extra_dir = tmp_path / "suite", tmp_path / "extra"
    for root, seeds in ((suite_dir, (0, 1)), (extra_dir, (1, 2))):
        for s in seeds:
            make_run(root, "impala", "Breakout", s, [10.0 + s] * 100)
    with pytest.raises(SystemExit, match="impala Breakout seed 1 is in both the suite and "
                                         "the supplement"):
        report.main([str(suite_dir), "--supplement", str(extra_dir), "--reps", "100"])
    with pytest.raises(SystemExit, match="no directory"):
        report.main([str(suite_dir), "--supplement", str(tmp_path / "nowhere")])


def test_identical_agent_rates_match_a_direct_count():
    # 3 seeds each. With 1000 resamples the base agent's 95% interval is the range of its 3
    # seeds (each extreme's all-alike resample has probability 1/27 > 2.5%), so the inside
    # rate is how often a mean of 3 new draws lies in the range of 3 others, counted here
    # without any bootstrap. The gap's interval: each agent's 27 resampled means are
    # equally likely, so all 729 gaps are enumerated and their percentiles taken.
    inside, excludes, welch = suite_stats.identical_agent_rates(3, 3, 4000, 1000, 0)
    rng = np.random.default_rng(7)
    base, new = rng.standard_normal((100_000, 3)), rng.standard_normal((100_000, 3))
    direct_inside = ((base.min(1) <= new.mean(1)) & (new.mean(1) <= base.max(1))).mean()
    assert inside == pytest.approx(direct_inside, abs=0.03)
    assert 0.55 < inside < 0.70  # well under the 83% of a known-variance interval
    picks = np.array(list(itertools.product(range(3), repeat=3)))  # the 27 resamples
    base, new = base[:20_000], new[:20_000]
    gaps = (new[:, picks].mean(-1)[:, :, None] - base[:, picks].mean(-1)[:, None, :])
    low, high = np.percentile(gaps.reshape(len(gaps), -1), [2.5, 97.5], axis=1)
    direct_excludes = ((low > 0) | (high < 0)).mean()
    assert excludes == pytest.approx(direct_excludes, abs=0.03)
    assert 0.12 < excludes < 0.30  # far above the nominal 5%
    assert welch < 0.06  # Welch's t keeps (in fact stays under) its 5% on 3 seeds


def test_identical_agent_rates_near_their_nominal_values_with_many_seeds():
    # 20 seeds each: the bootstrap covers almost as a z-interval does. Known variance
    # gives P(|Z| < 1.96 / sqrt 2) = 0.834 inside and 5% excluding 0.
    inside, excludes, welch = suite_stats.identical_agent_rates(20, 20, 2000, 1000, 0)
    assert 0.76 < inside < 0.86
    assert 0.03 < excludes < 0.10
    assert 0.03 < welch < 0.07


def test_welch_interval_matches_scipys_and_a_hand_computation():
    a, b = np.array([201.3, 200.1, 155.1]), np.array([238.4, 193.2, 238.4])
    low, high = suite_stats.welch_ci(a, b)
    reference = scipy.stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert (low, high) == pytest.approx((reference.low, reference.high), rel=1e-12)
    # By hand: variances 693.48 and 681.08 over 3 seeds each, se^2 = 458.19, df = 3.9997
    # (equal n and near-equal variances: almost 4), t(0.975, 4) = 2.7764.
    assert (high - low) / 2 == pytest.approx(2.7764 * 458.19**0.5, rel=1e-3)
    assert (low + high) / 2 == pytest.approx(185.5 - 223.33, abs=0.01)
    # Rows of simulated suites at once, and no spread at all: the gap itself.
    lows, highs = suite_stats.welch_ci(np.stack([a, np.full(3, 5.0)]),
                                       np.stack([b, np.full(3, 2.0)]))
    assert lows[0] == pytest.approx(low) and (lows[1], highs[1]) == (3.0, 3.0)


def grid_of(agents: list[str], games: list[str], seeds: list[int]) -> argparse.Namespace:
    """What ``reproduce.py --agents ... --games ... --seeds ...`` passes to update_grid."""
    return argparse.Namespace(agents=agents, games=games, seeds=seeds, frames=1000, set=[],
                              archive=None)


def test_each_agent_is_reported_on_the_games_it_was_asked_for_only(tmp_path):
    reproduce.update_grid(tmp_path, grid_of(["impala"], ["Breakout", "Seaquest"], [0, 1]))
    reproduce.update_grid(tmp_path, grid_of(["seed"], ["Breakout"], [0, 1]))
    grid = json.loads((tmp_path / suite.GRID).read_text())
    assert grid["games_by_agent"] == {"impala": ["Breakout", "Seaquest"], "seed": ["Breakout"]}
    for s, value in enumerate([10.0, 14.0]):
        make_run(tmp_path, "impala", "Breakout", s, [value] * 100)
    make_run(tmp_path, "seed", "Breakout", 0, [11.0] * 100)
    table = report.markdown(report.collect(tmp_path), 200, 0, "t")
    assert row_of(table, "Seaquest", "impala")[2] == "0/2"  # asked for, not run: shown
    with pytest.raises(AssertionError, match="no row for Seaquest seed"):
        row_of(table, "Seaquest", "seed")  # never asked for: no "missing" row
    assert row_of(table, "seed", "1.10")[4:6] == ["1/1", "Breakout s1 missing"]  # IQM, x DQN
    comparison = [line for line in table.splitlines() if line.startswith("| Breakout | seed |")
                  and "| impala |" in line]
    assert comparison == ["| Breakout | seed | 11.0 — (1 seed) | impala | 12.0 [10.0, 14.0] "
                          "(2 seeds) | — | — | yes |"]  # one SEED seed: no interval of the gap
    # a run found on a game nobody asked for is shown all the same
    make_run(tmp_path, "seed", "Seaquest", 1, [3.0] * 100)
    assert row_of(report.markdown(report.collect(tmp_path), 200, 0, "t"),
                  "Seaquest", "seed")[2:4] == ["1/2", "3.0"]


def test_a_grid_json_without_games_by_agent_plans_every_agent_on_every_game(tmp_path):
    write_grid(tmp_path, ["impala", "seed"], ["Breakout", "Seaquest"], [0])  # the old format
    assert row_of(report.markdown(report.collect(tmp_path), 200, 0, "t"),
                  "Seaquest", "seed")[2] == "0/1"
    reproduce.update_grid(tmp_path, grid_of(["apex"], ["Breakout"], [0]))
    assert json.loads((tmp_path / suite.GRID).read_text())["games_by_agent"] == {
        "impala": ["Breakout", "Seaquest"], "seed": ["Breakout", "Seaquest"],
        "apex": ["Breakout"]}


def test_png_and_readme_table_are_written(tmp_path):
    suite_dir = tmp_path / "suite"
    rng = np.random.default_rng(0)
    for agent in ("impala", "apex"):
        for game in ("Breakout", "Asterix"):
            for seed in range(2):
                make_run(suite_dir, agent, game, seed,
                         list(np.linspace(0, 12, 300) + rng.normal(0, 1, 300)),
                         last_frame=3_000_000)
    png, readme = tmp_path / "curves.png", tmp_path / "README.md"
    readme.write_text("# Results\n\nkept text\n")
    report.main([str(suite_dir), "--png", str(png), "--readme-table", str(readme),
                 "--reps", "200"])
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    report.main([str(suite_dir), "--readme-table", str(readme), "--reps", "200"])
    text = readme.read_text()
    assert text.startswith("# Results\n\nkept text\n")
    assert text.count(report.BEGIN) == 1 and text.count(report.END) == 1
    assert "| Asterix | apex | 2/2 |" in text
    # no grid.json: the heading names the most frames a run reached
    assert f"{report.BEGIN}\n### MinAtar, 3.0M frames\n" in text


def test_one_command_writes_the_same_block_into_the_readme_and_the_results_page(tmp_path):
    suite_dir = tmp_path / "suite"
    for seed in range(2):
        make_run(suite_dir, "impala", "Breakout", seed, [18.0 + seed] * 100)
    (suite_dir / suite.GRID).write_text(json.dumps({
        "agents": ["impala"], "games": ["Breakout"], "seeds": [0, 1], "frames": 5_000_000}))
    readme, page = tmp_path / "README.md", tmp_path / "docs" / "results.md"
    page.parent.mkdir()
    readme.write_text(f"# distrl\n\n{report.BEGIN}\nold\n{report.END}\nkept\n")
    page.write_text(f"# Results\n\nabove\n\n{report.BEGIN}\nolder\n{report.END}\n\nbelow\n")
    report.main([str(suite_dir), "--write", str(readme), str(page), "--reps", "100"])
    readme_text, page_text = readme.read_text(), page.read_text()
    block = readme_text.split(report.BEGIN)[1].split(report.END)[0]
    assert block == page_text.split(report.BEGIN)[1].split(report.END)[0]
    # the heading says what the table is (the grid's budget), not the folder's name
    assert block.startswith("\n### MinAtar, 5M frames\n")
    assert "| Breakout | impala | 2/2 | 18.5 |" in block
    assert readme_text.startswith("# distrl\n\n") and readme_text.endswith(
        f"{report.END}\nkept\n")
    assert page_text.startswith("# Results\n\nabove\n\n") and page_text.endswith(
        f"{report.END}\n\nbelow\n")
    # --readme-table is the same option: run again, nothing changes
    report.main([str(suite_dir), "--readme-table", str(readme), str(page), "--reps", "100"])
    assert (readme.read_text(), page.read_text()) == (readme_text, page_text)


def test_a_file_with_the_summary_markers_gets_one_row_per_agent_with_the_tables_figures(
        tmp_path):
    """The README holds the summary's markers, the results page the tables': IMPALA
    reaches AC(0.8) on Breakout (17.5) with 18.0 and 19.0, not on Seaquest (15) with 10.0
    twice; Ape-X's one game, Breakout, has no finished run. The summary's IQM is the
    tables' IQM row, and the README gets no full table."""
    suite_dir = tmp_path / "suite"
    for seed in range(2):
        make_run(suite_dir, "impala", "Breakout", seed, [18.0 + seed] * 100)
        make_run(suite_dir, "impala", "Seaquest", seed, [10.0] * 100)
    make_run(suite_dir, "apex", "Breakout", 0, [5.0] * 100, 2_000_000, status=None)
    (suite_dir / suite.GRID).write_text(json.dumps({
        "agents": ["impala", "apex"], "games": ["Breakout", "Seaquest"], "seeds": [0, 1],
        "frames": 5_000_000,
        "games_by_agent": {"impala": ["Breakout", "Seaquest"], "apex": ["Breakout"]}}))
    readme, page = tmp_path / "README.md", tmp_path / "results.md"
    readme.write_text(f"# distrl\n\n{report.SUMMARY_BEGIN}\nold\n{report.SUMMARY_END}\nkept\n")
    page.write_text(f"{report.BEGIN}\nolder\n{report.END}\n")
    report.main([str(suite_dir), "--write", str(readme), str(page), "--reps", "100"])
    text = readme.read_text()
    assert report.BEGIN not in text and text.endswith(f"{report.SUMMARY_END}\nkept\n")
    summary = text.split(report.SUMMARY_BEGIN)[1].split(report.SUMMARY_END)[0]
    assert summary.startswith("\n### MinAtar, 5M frames\n")
    impala = next(line for line in summary.splitlines() if line.startswith("| impala |"))
    iqm = next(line for line in page.read_text().splitlines()
               if line.startswith("| impala |") and "/2 |" in line)
    iqm_cells = [cell.strip() for cell in iqm.strip("|").split("|")]
    assert impala == (f"| impala | AC(0.8) | 1 of 2 (not Seaquest) | "
                      f"{iqm_cells[1]} {iqm_cells[2]} | 4 |")
    assert "| apex | DQN | 0 of 1; 1 without a finished run or a reference | — | 0 |" in summary


def test_seed_band_is_the_mean_and_a_bootstrap_band_where_two_seeds_have_data():
    values = np.array([[1.0, 2.0, np.nan], [3.0, 2.0, 5.0]])
    mean, low, high = report_plot.seed_band(values, 500, np.random.default_rng(0))
    np.testing.assert_allclose(mean, [2.0, 2.0, 5.0])
    assert low[0] < 2.0 < high[0] and (low[1], high[1]) == (2.0, 2.0)
    assert np.isnan(low[2]) and np.isnan(high[2])


def test_smoothed_curve_is_a_trailing_100_episode_mean():
    returns = np.arange(150, dtype=float)
    out = suite.smoothed(returns)
    assert out[0] == 0.0 and out[9] == pytest.approx(4.5)
    assert out[149] == pytest.approx(np.mean(returns[50:]))


# ---------------------------------------------------------------- reproduce.py


def grid_args(out: Path, *extra: str, agents=("impala", "apex"), seeds=("0", "1")) -> list[str]:
    return ["--out", str(out), "--agents", *agents, "--games", "Breakout", "--seeds", *seeds,
            "--frames", "1000", "--run-cmd", FAKE, *extra]


def invocations(run_dir: Path) -> list[dict]:
    lines = (run_dir / "invocations.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_dry_run_prints_fresh_resumed_and_skipped_commands(tmp_path, capsys):
    out = tmp_path / "out"
    make_run(out, "impala", "Breakout", 0, [1.0] * 10)  # finished
    stopped = out / "impala-Breakout-s1"
    (stopped / "checkpoints").mkdir(parents=True)
    (stopped / "checkpoints" / "checkpoint-000000000012.pt").write_text("")
    assert reproduce.main(grid_args(out, "--dry-run", "--set", "agent.lr=0.1",
                                    "env.x=2")) == 0
    lines = capsys.readouterr().out.splitlines()
    summary = out / "impala-Breakout-s0" / suite.SUMMARY
    assert lines[0] == f"# skip impala-Breakout-s0: finished ({summary})"
    assert lines[1] == "# impala-Breakout-s1: resume"
    assert lines[2].split()[2:] == [
        "+experiment=minatar_impala", "env=MinAtar-Breakout", "seed=1", "total_frames=1000",
        f"log.dir={out}", "log.name=impala-Breakout-s1", "agent.lr=0.1", "env.x=2",
        f"hydra.run.dir={stopped}/hydra/attempt-1", f"resume={stopped}"]
    assert lines[3:5] == ["# apex-Breakout-s0: fresh", lines[4]]
    assert "+experiment=minatar_apex" in lines[4] and "resume=" not in lines[4]
    assert len(lines) == 7 and not (out / "apex-Breakout-s0").exists()  # nothing ran


def test_runs_n_at_a_time_then_skips_finished_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_STEP_S", "0.04")
    out = tmp_path / "out"
    assert reproduce.main(grid_args(out, "--jobs", "2", "--set", "x=1")) == 0
    runs = sorted(p for p in out.iterdir() if p.is_dir())
    spans = []
    for run_dir in runs:
        first, last = invocations(run_dir)
        spans.append((first["start"], last["end"]))
        summary = json.loads((run_dir / suite.SUMMARY).read_text())
        assert (summary["status"], summary["exit_code"], summary["frames"]) == ("finished", 0,
                                                                               1000)
        assert summary["episodes"] == 40 and summary["overrides"][-1] == "x=1"
        assert summary["final_return_100"] == pytest.approx(summary["seed"] + 0.525)
        assert len(summary["curve"]) == 20 and summary["curve_interval_frames"] == 50
    assert len(runs) == 4
    lines = (out / "summary.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["run"] for line in lines) == [p.name for p in runs]
    busy = [sum(s <= t < e for s, e in spans) for t, _ in spans]
    assert max(busy) == 2  # two at once, never three
    capsys.readouterr()
    assert reproduce.main(grid_args(out, "--jobs", "2")) == 0
    assert capsys.readouterr().out.count("[reproduce] skip") == 4
    assert all(len(invocations(p)) == 2 for p in runs)  # none started again


def test_trailing_curve_is_the_smoothed_curve_at_evenly_spaced_frames():
    frames = np.array([100, 250, 400, 1000])
    returns = np.array([1.0, 3.0, 5.0, 7.0])
    curve = suite.trailing_curve(frames, returns, last_frame=1000, points=10)
    # nothing before the first episode (frame 100 is the first grid point it covers)
    assert curve["frames"] == [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000]
    assert curve["return_mean"] == [1.0, 1.0, 2.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0, 4.0]


def test_archive_rebuilds_the_table_and_lets_a_fresh_out_skip_finished_runs(
        tmp_path, capsys):
    out, archive = tmp_path / "out", tmp_path / "archive"
    assert reproduce.main(grid_args(out, "--archive", str(archive))) == 0
    names = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert sorted(p.name for p in archive.iterdir() if p.is_dir()) == names
    assert {p.name for p in (archive / names[0]).iterdir()} == {suite.SUMMARY}
    assert json.loads((archive / suite.GRID).read_text())["agents"] == ["impala", "apex"]
    # the archive alone gives the same table as the run directories, and the same curve
    from_runs, from_archive = report.collect(out), report.collect(archive)
    capsys.readouterr()
    assert report.markdown(from_archive, 200, 0, "x") == report.markdown(from_runs, 200, 0, "x")
    for key, run in from_runs.runs.items():
        kept = from_archive.runs[key]
        assert (kept.status, kept.frames, kept.episodes) == ("finished", 1000, 40)
        grid = np.linspace(0, 1000, 200)
        np.testing.assert_allclose(
            suite.curve_at(kept.curve_frames, kept.curve_returns, kept.frames, grid),
            suite.curve_at(run.curve_frames, run.curve_returns, run.frames, grid),
            atol=0.06)
    # a fresh checkout: no run directories, the archive says they finished
    fresh = tmp_path / "fresh"
    assert reproduce.main(grid_args(fresh, "--archive", str(archive))) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum("[reproduce] skip" in line for line in lines) == 4
    assert f"finished ({archive / names[0] / suite.SUMMARY})" in "\n".join(lines)
    assert not any(p.is_dir() for p in fresh.iterdir())  # nothing ran


def test_a_finished_run_of_other_preset_settings_is_named_when_skipped(
        tmp_path, monkeypatch, capsys):
    presets = tmp_path / "presets"
    presets.mkdir()
    preset = presets / "minatar_impala.yaml"
    preset.write_text("# @package _global_\nagent:\n  passes: 4\n")
    monkeypatch.setattr(suite, "PRESETS", presets)
    out, archive = tmp_path / "out", tmp_path / "archive"
    assert reproduce.main(grid_args(out, "--archive", str(archive), agents=("impala",),
                                    seeds=("0",))) == 0
    kept = json.loads((archive / "impala-Breakout-s0" / suite.SUMMARY).read_text())
    assert kept["preset_sha"] == suite.preset_fingerprint("impala") is not None
    # comments and layout are not settings: no note
    preset.write_text("# @package _global_\n# why four passes\nagent: {passes: 4}\n")
    capsys.readouterr()
    assert reproduce.main(grid_args(tmp_path / "fresh", "--archive", str(archive),
                                    agents=("impala",), seeds=("0",))) == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        f"[reproduce] skip impala-Breakout-s0: finished "
        f"({archive / 'impala-Breakout-s0' / suite.SUMMARY})")
    # a changed setting is named, with both fingerprints; the run is not overwritten
    preset.write_text("# @package _global_\nagent:\n  passes: 1\n")
    now = suite.preset_fingerprint("impala")
    assert now != kept["preset_sha"]
    assert reproduce.main(grid_args(tmp_path / "fresh", "--archive", str(archive),
                                    agents=("impala",), seeds=("0",))) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line.endswith(f"; it ran with other settings of minatar_impala (fingerprint "
                         f"{kept['preset_sha']}, today {now}): move it away to rerun it")
    assert json.loads((archive / "impala-Breakout-s0" / suite.SUMMARY).read_text()) == kept


def test_a_run_whose_preset_came_to_name_its_default_is_skipped_without_a_note(
        tmp_path, monkeypatch, capsys):
    """A default that moved into the preset (SAME_SETTINGS_AS_TODAY) is not another
    setting: the runs made under the old text ran with today's settings."""
    presets = tmp_path / "presets"
    presets.mkdir()
    preset = presets / "minatar_impala.yaml"
    preset.write_text("# @package _global_\nagent:\n  passes: 4\n")
    monkeypatch.setattr(suite, "PRESETS", presets)
    archive = tmp_path / "archive"
    assert reproduce.main(grid_args(tmp_path / "out", "--archive", str(archive),
                                    agents=("impala",), seeds=("0",))) == 0
    old = json.loads((archive / "impala-Breakout-s0" / suite.SUMMARY).read_text())["preset_sha"]
    preset.write_text("# @package _global_\nagent:\n  passes: 4\n  vtrace_lambda: 1.0\n")
    monkeypatch.setattr(suite, "SAME_SETTINGS_AS_TODAY",
                        {"minatar_impala": {old: "vtrace_lambda 1.0, the default then"}})
    capsys.readouterr()
    assert reproduce.main(grid_args(tmp_path / "fresh", "--archive", str(archive),
                                    agents=("impala",), seeds=("0",))) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(
        f"({archive / 'impala-Breakout-s0' / suite.SUMMARY})")


def test_every_archived_minatar_run_of_the_replay_agents_ran_with_todays_settings():
    """The committed suite's Ape-X, R2D2 and SEED-R2D2 runs: their preset's fingerprint is
    today's, or one listed as the same settings (the defaults that moved into the preset)."""
    archive = Path(__file__).resolve().parents[1] / "results" / "minatar" / "suite"
    for agent in ("apex", "r2d2", "seed_r2d2"):
        preset, today = suite.MINATAR.preset(agent), suite.preset_fingerprint(agent)
        summaries = sorted(archive.glob(f"{agent}-*/{suite.SUMMARY}"))
        assert summaries, f"no {agent} runs in {archive}"
        for path in summaries:
            recorded = json.loads(path.read_text())["preset_sha"]
            assert suite.same_settings(preset, recorded, today), path


def test_failed_run_sets_the_exit_code_and_is_retried_from_its_checkpoint(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_FAIL", "apex-Breakout-s1")
    out = tmp_path / "out"
    assert reproduce.main(grid_args(out, "--jobs", "2", agents=("apex",))) == 1
    assert capsys.readouterr().out.splitlines()[-1] == (
        "[reproduce] failed: apex-Breakout-s1 (exit 3)")
    failed = json.loads((out / "apex-Breakout-s1" / suite.SUMMARY).read_text())
    assert (failed["status"], failed["exit_code"]) == ("failed", 3)
    monkeypatch.delenv("FAKE_FAIL")
    assert reproduce.main(grid_args(out, agents=("apex",))) == 0
    argv = invocations(out / "apex-Breakout-s1")[-2]["argv"]
    assert argv[-1] == f"resume={out / 'apex-Breakout-s1'}"
    again = json.loads((out / "apex-Breakout-s1" / suite.SUMMARY).read_text())
    assert (again["status"], again["attempt"], again["resumed"]) == ("finished", 2, True)


def alive(pid: int) -> bool:
    """A live process (a zombie, dead but not yet reaped by its new parent, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def grids():
    """reproduce.py processes a test starts; one a failed test left running is killed (its
    runs then get SIGTERM from their parent-death signal)."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def start_grid(grids: list, out: Path, env: dict[str, str], *extra: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "benchmarks" / "reproduce.py"),
         *grid_args(out, "--jobs", "2", *extra, seeds=("0", "1", "2"), agents=("impala",))],
        env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    grids.append(proc)
    return proc


def wait_started(out: Path, names: list[str]) -> list[dict]:
    """The runs' first invocation records, once each has written one (the test's time
    limit ends a run that never starts)."""
    files = [out / name / "invocations.jsonl" for name in names]
    while not all(f.exists() and f.read_text().strip() for f in files):
        time.sleep(0.05)
    return [json.loads(f.read_text().splitlines()[0]) for f in files]


def test_sigterm_stops_every_run_cleanly_and_a_rerun_resumes_them(tmp_path, monkeypatch,
                                                                  grids):
    out = tmp_path / "out"
    grid = start_grid(grids, out, {"FAKE_STEP_S": "0.3", "FAKE_ACTOR": "1"})
    names = ["impala-Breakout-s0", "impala-Breakout-s1"]
    started = wait_started(out, names)
    while not all(suite.has_checkpoint(out / name) for name in names):  # a step done
        time.sleep(0.05)
    grid.send_signal(signal.SIGTERM)
    output, _ = grid.communicate(timeout=10)
    assert grid.returncode == 128 + signal.SIGTERM, output
    pids = [p for s in started for p in (s["pid"], s["actor_pid"])]
    assert not [pid for pid in pids if alive(pid)]
    for name in names:
        attempt = json.loads((out / name / suite.ATTEMPTS).read_text())
        assert (attempt["status"], attempt["exit_code"]) == ("stopped", 0)
        assert not (out / name / suite.SUMMARY).exists()
        assert suite.has_checkpoint(out / name)
    assert not (out / "impala-Breakout-s2").exists()  # never started
    assert "1 not started" in output

    monkeypatch.setenv("FAKE_STEP_S", "0")
    assert reproduce.main(grid_args(out, "--jobs", "2", seeds=("0", "1", "2"),
                                    agents=("impala",))) == 0
    for name in names:
        argv = invocations(out / name)[-2]["argv"]
        assert argv[-1] == f"resume={out / name}"
        summary = json.loads((out / name / suite.SUMMARY).read_text())
        assert (summary["status"], summary["attempt"], summary["frames"]) == ("finished", 2,
                                                                              1000)
        # one curve across both attempts: every step's 2 episodes once, the event written
        # past the stop's checkpoint purged
        assert summary["episodes"] == 40
        assert max(c["return_mean"] for c in summary["curve"]) < 999
        assert summary["wall_s_total"] > summary["wall_s"]


def test_a_run_that_ignores_sigterm_is_killed_with_its_children(tmp_path, grids):
    out = tmp_path / "out"
    env = {"FAKE_STEP_S": "0.3", "FAKE_ACTOR": "1", "FAKE_IGNORE_TERM": "1"}
    grid = start_grid(grids, out, env, "--stop-timeout", "1")
    started = wait_started(out, ["impala-Breakout-s0", "impala-Breakout-s1"])
    grid.send_signal(signal.SIGINT)
    output, _ = grid.communicate(timeout=10)
    assert grid.returncode == 128 + signal.SIGINT, output
    assert "still running after 1 s: killing it" in output
    assert not [p for s in started for p in (s["pid"], s["actor_pid"]) if alive(p)]
    attempt = json.loads((out / "impala-Breakout-s0" / suite.ATTEMPTS).read_text())
    assert (attempt["status"], attempt["exit_code"]) == ("stopped", -signal.SIGKILL)


def test_a_run_another_reproduce_holds_is_left_alone(tmp_path, capsys):
    import fcntl

    out = tmp_path / "out"
    run_dir = out / "apex-Breakout-s0"
    run_dir.mkdir(parents=True)
    with open(run_dir / ".reproduce.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert reproduce.main(grid_args(out, agents=("apex",), seeds=("0",))) == 0
    assert "skip apex-Breakout-s0: another reproduce.py is running it" in capsys.readouterr().out
    assert not (run_dir / "invocations.jsonl").exists()


def test_no_run_starts_after_no_start_after_and_the_running_one_finishes(tmp_path, monkeypatch,
                                                                         capsys):
    monkeypatch.setenv("FAKE_STEP_S", "0.05")  # a run takes >= 1 s, the window is 0.6 s
    out = tmp_path / "out"
    assert reproduce.main(grid_args(out, "--jobs", "1", "--no-start-after", "0.01")) == 0
    printed = capsys.readouterr().out
    ran = [p.name for p in out.iterdir() if p.is_dir()]
    assert ran == ["impala-Breakout-s0"]
    summary = json.loads((out / ran[0] / suite.SUMMARY).read_text())
    assert (summary["status"], summary["frames"]) == ("finished", 1000)
    assert "--no-start-after 0.01 min reached: 3 run(s) not started, 1 running on" in printed
    assert "3 not started" in printed.splitlines()[-1]


def test_stop_after_checkpoints_every_run_and_a_rerun_resumes_them(tmp_path, monkeypatch,
                                                                   capsys):
    monkeypatch.setenv("FAKE_STEP_S", "0.5")  # a run takes 10 s; stopped at 4.8 s
    out = tmp_path / "out"
    assert reproduce.main(grid_args(out, "--jobs", "2", "--stop-after", "0.08")) == 0
    printed = capsys.readouterr().out
    assert "--stop-after 0.08 min reached: stopping 2 run(s)" in printed
    names = ["impala-Breakout-s0", "impala-Breakout-s1"]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == names
    for name in names:
        attempt = json.loads((out / name / suite.ATTEMPTS).read_text())
        assert (attempt["status"], attempt["exit_code"]) == ("stopped", 0)
        assert suite.has_checkpoint(out / name) and not (out / name / suite.SUMMARY).exists()
    monkeypatch.setenv("FAKE_STEP_S", "0")
    assert reproduce.main(grid_args(out, "--jobs", "2")) == 0
    for name in names:
        assert invocations(out / name)[-2]["argv"][-1] == f"resume={out / name}"
        assert json.loads((out / name / suite.SUMMARY).read_text())["status"] == "finished"


@pytest.mark.parametrize("flag", ["--stop-after", "--no-start-after"])
def test_a_negative_time_limit_is_refused_naming_the_flag(tmp_path, capsys, flag):
    with pytest.raises(SystemExit):
        reproduce.main(grid_args(tmp_path / "out", flag, "-1"))
    assert f"{flag} must be a number of minutes >= 0, got -1.0" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_difference_ci_of_a_constant_shift_is_the_shift_and_of_like_sets_holds_zero():
    a, b = np.array([5.0, 5.0, 5.0]), np.array([2.0, 2.0])
    assert suite_stats.difference_ci(a, b, 1000, 0) == (3.0, 3.0)
    # {0, 10} against itself: each resampled mean is 0, 5 or 10 (1/4, 1/2, 1/4), so the gap
    # is -10 with probability 1/16 > 2.5%: the interval is [-10, 10]
    assert suite_stats.difference_ci(np.array([0.0, 10.0]), np.array([0.0, 10.0]),
                                     20000, 0) == (-10.0, 10.0)


# ---------------------------------------------------------------- the Atari suite


def atari_presets(tmp_path: Path, monkeypatch, *agents: str) -> Path:
    """A presets directory holding the Atari presets of ``agents`` only."""
    presets = tmp_path / "presets"
    presets.mkdir()
    for agent in agents:
        (presets / f"{suite.ATARI.preset(agent)}.yaml").write_text(
            "# @package _global_\nagent:\n  passes: 4\n")
    monkeypatch.setattr(suite, "PRESETS", presets)
    return presets


def atari_args(out: Path, *extra: str, agents=("appo",), seeds=("1",)) -> list[str]:
    return ["--suite", "atari", "--out", str(out), "--agents", *agents, "--games", "Pong",
            "--seeds", *seeds, "--frames", "1000", "--run-cmd", FAKE, *extra]


def test_an_atari_run_is_its_agents_atari_preset_and_resumes_a_run_started_by_hand(
        tmp_path, monkeypatch, capsys):
    """A run started by hand with the grid's log.dir and log.name (its Hydra files in
    hydra/attempt-1, no attempts.jsonl) is resumed as the grid's, in attempt 2."""
    atari_presets(tmp_path, monkeypatch, "appo", "seed_r2d2")
    out = tmp_path / "pong"
    by_hand = out / "appo-Pong-s1"
    (by_hand / "hydra" / "attempt-1" / ".hydra").mkdir(parents=True)
    (by_hand / "checkpoints").mkdir()
    (by_hand / "checkpoints" / "checkpoint-000000000500.pt").write_text("")
    assert reproduce.main(atari_args(out, "--dry-run", "--set", "stop_at_return=19",
                                     "log.progress=lines", agents=("appo", "seed_r2d2"))) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "# appo-Pong-s1: resume"
    assert lines[1].split()[2:] == [
        "+experiment=atari_short_appo", "env.id=Pong", "seed=1", "total_frames=1000",
        f"log.dir={out}", "log.name=appo-Pong-s1", "stop_at_return=19", "log.progress=lines",
        f"hydra.run.dir={by_hand}/hydra/attempt-2", f"resume={by_hand}"]
    assert lines[2] == "# seed_r2d2-Pong-s1: fresh"
    assert lines[3].split()[2:4] == ["+experiment=atari_short_seed_r2d2", "env.id=Pong"]
    assert "resume=" not in lines[3] and len(lines) == 4


def test_a_run_started_by_hand_is_continued_by_the_grid_as_attempt_2(tmp_path, monkeypatch):
    atari_presets(tmp_path, monkeypatch, "appo")
    out = tmp_path / "pong"
    by_hand = out / "appo-Pong-s1"
    (by_hand / "hydra" / "attempt-1").mkdir(parents=True)  # Hydra's, under run.py
    subprocess.run([*FAKE.split(), "+experiment=atari_short_appo", "env=Pong", "seed=1",
                    "total_frames=1000", f"log.dir={out}", "log.name=appo-Pong-s1"],
                   env={**os.environ, "FAKE_FAIL": "appo-Pong-s1"}, check=False,
                   stdout=subprocess.DEVNULL)  # stops halfway, its checkpoint at 500 frames
    assert reproduce.main(atari_args(out)) == 0
    argv = invocations(by_hand)[-2]["argv"]
    assert argv[-2:] == [f"hydra.run.dir={by_hand}/hydra/attempt-2", f"resume={by_hand}"]
    summary = json.loads((by_hand / suite.SUMMARY).read_text())
    assert (summary["status"], summary["attempt"], summary["resumed"]) == ("finished", 2, True)
    assert summary["unrecorded_attempts"] == 1
    assert summary["episodes"] == 40  # one curve over both attempts


def test_a_run_directory_a_run_py_holds_is_left_alone(tmp_path, monkeypatch, capsys):
    import fcntl

    atari_presets(tmp_path, monkeypatch, "appo")
    out = tmp_path / "pong"
    run_dir = out / "appo-Pong-s1"
    run_dir.mkdir(parents=True)
    events = run_dir / "events.out.tfevents.1.host.1.0"  # no checkpoint yet: "fresh"
    events.write_text("")
    with open(run_dir / "distrl.lock", "w") as held:  # as distrl.run.run_lock.take holds it
        held.write(json.dumps({"pid": 4242, "since": "2026-11-27 21:49:08 UTC"}))
        held.flush()
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert reproduce.main(atari_args(out, "--dry-run")) == 0
        assert capsys.readouterr().out == (
            "# skip appo-Pong-s1: a run.py is running in it (pid 4242, since 2026-11-27 "
            "21:49:08 UTC); invoke again once it has stopped\n")
        assert reproduce.main(atari_args(out)) == 0
        assert ("skip appo-Pong-s1: a run.py is running in it (pid 4242"
                in capsys.readouterr().out)
    assert events.exists() and not (run_dir / "discarded").exists()  # its events stay
    assert not (run_dir / "invocations.jsonl").exists()  # nothing started


def test_an_agent_without_its_preset_file_is_refused_before_anything_starts(
        tmp_path, monkeypatch, capsys):
    presets = atari_presets(tmp_path, monkeypatch, "appo")
    out = tmp_path / "pong"
    for extra in ((), ("--dry-run",)):
        assert reproduce.main(atari_args(out, *extra, agents=("appo", "r2d2"))) == 2
        assert capsys.readouterr().err == (
            f"reproduce.py: error: no run started: no such preset file of --suite atari: "
            f"{presets / 'atari_short_r2d2.yaml'} (--agents r2d2)\n")
    assert not out.exists()
    # the agents offered are the suite's
    for argv in (atari_args(out, agents=("seed",)), grid_args(out, agents=("appo",))):
        with pytest.raises(SystemExit):
            reproduce.main(argv)
        assert "argument --agents: invalid choice" in capsys.readouterr().err


def test_a_grid_of_one_suite_is_not_extended_with_the_other(tmp_path, monkeypatch, capsys):
    presets = atari_presets(tmp_path, monkeypatch, "appo")
    for agent in ("impala", "apex"):
        (presets / f"{suite.MINATAR.preset(agent)}.yaml").write_text("agent: {passes: 1}\n")
    minatar, legacy, atari = tmp_path / "minatar", tmp_path / "legacy", tmp_path / "atari"
    minatar.mkdir()
    reproduce.update_grid(minatar, grid_of(["impala"], ["Breakout"], [0]))
    assert json.loads((minatar / suite.GRID).read_text())["suite"] == "minatar"
    legacy.mkdir()
    write_grid(legacy, ["impala"], ["Breakout"], [0])  # written before grids named a suite
    for out in (minatar, legacy):
        before = (out / suite.GRID).read_text()
        assert reproduce.main(atari_args(out)) == 2
        assert capsys.readouterr().err == (
            f"reproduce.py: error: {out / suite.GRID} holds the minatar suite's grid: it "
            "cannot take --suite atari runs; give this suite its own --out and --archive\n")
        assert (out / suite.GRID).read_text() == before
        assert [p.name for p in out.iterdir()] == [suite.GRID]
    # an Atari archive under a MinAtar grid: refused too, and update_grid itself refuses
    atari.mkdir()
    reproduce.update_grid(atari, argparse.Namespace(**{**vars(grid_of(["appo"], ["Pong"], [0])),
                                                      "suite": "atari"}))
    fresh = tmp_path / "fresh"
    assert reproduce.main(grid_args(fresh, "--archive", str(atari))) == 2
    assert f"{atari / suite.GRID} holds the atari suite's grid" in capsys.readouterr().err
    assert not fresh.exists()
    with pytest.raises(ValueError, match="holds the atari suite's grid"):
        reproduce.update_grid(atari, grid_of(["impala"], ["Breakout"], [0]))


def hand_built_episodes() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """30 episodes, 1,000 frames and 30 s apart: 10 returning -21, then 20 returning +20;
    the step to episode 22 takes 4 minutes (run time) and the one to episode 25 an hour
    (the run stopped, then resumed: not run time)."""
    frames = np.arange(1, 31) * 1000
    returns = np.array([-21.0] * 10 + [20.0] * 20)
    steps = np.full(30, 30.0)
    steps[0], steps[22], steps[25] = 0.0, 240.0, 3600.0
    return frames, returns, 1.8e9 + np.cumsum(steps)


def test_reach_figures_of_an_episode_list_leave_out_a_gap_over_five_minutes():
    # 0: episode 20's window holds 9 x -21 and 11 x +20, mean +1.55 (episode 19's: -0.5),
    #    after 20 steps of 30 s.
    # 18: only an all-(+20) window, episodes 10-29, reaches it: at episode 29, after
    #    27 steps of 30 s, the 240 s one, and not the hour.
    record = attempt_record.reach(hand_built_episodes(), [0.0, 18.0, 20.5])
    assert record == {"window": 20, "gap_s": 300.0, "clock": "gaps", "levels": [
        {"level": 0.0, "frames": 21_000, "run_time_s": 600.0},
        {"level": 18.0, "frames": 30_000, "run_time_s": 1050.0},
        {"level": 20.5, "frames": None, "run_time_s": None}]}
    assert attempt_record.reach(hand_built_episodes(), []) is None


def test_a_run_without_tensorboard_records_its_console_evaluation_and_its_reach(tmp_path):
    """log.tensorboard=false: the evaluation is read from the console line, and the
    reach figures still come from the episodes given (which the line's episode count must
    not take the place of), timed inside this attempt and the earlier one."""
    run = grid_plan.Run("appo", "Pong", 0, tmp_path / "appo-Pong-s0", suite.ATARI)
    run.run_dir.mkdir()
    args = argparse.Namespace(frames=20_000_000, set=[], reach=[0.0], jobs=1)
    earlier = [{"started": "2026-11-26T09:00:00", "wall_s": 5.0}]
    text = "[distrl] eval: 10 episodes at epsilon 0.001: return mean 12.5\n"
    frames, returns, wall = hand_built_episodes()
    first = time.time() - 10_000.0  # the first episode's end, 10,000 s ago
    episodes = (frames, returns, first + wall - wall[0])
    record = attempt_record.summarise(run, ["run.py"], 2, True, 0, "finished",
                                      time.time() - first + 60.0, 100.0, text, args,
                                      episodes, earlier)
    assert record["eval"] == {"return_mean": 12.5, "episodes": 10, "source": "stdout"}
    assert record["spans"][0] == ["2026-11-26T09:00:00", 5.0]
    # the episodes' wall times lie 60 s after this attempt's start and far after the
    # earlier one: 5 s of it, then 60 s and episode 20's 20 steps of 30 s
    assert record["reach"]["clock"] == "attempts"
    assert record["reach"]["levels"][0]["frames"] == 21_000
    assert record["reach"]["levels"][0]["run_time_s"] == pytest.approx(665.0, abs=1.5)


def test_an_atari_grid_records_the_reach_and_archives_every_episode(tmp_path, monkeypatch,
                                                                    capsys):
    atari_presets(tmp_path, monkeypatch, "appo")
    monkeypatch.setenv("FAKE_EVAL", "1")
    out, archive = tmp_path / "pong", tmp_path / "archive"
    assert reproduce.main(atari_args(out, "--archive", str(archive), seeds=("0", "1"))) == 0
    assert json.loads((archive / suite.GRID).read_text())["suite"] == "atari"
    for seed in (0, 1):
        kept = archive / f"appo-Pong-s{seed}"
        assert {p.name for p in kept.iterdir()} == {suite.SUMMARY, suite.EPISODES,
                                                    suite.KEPT_EVENTS}
        # its tensorboard record, compressed, with the run directory's bytes
        ran = suite.event_files(out / kept.name)
        assert len(ran) == 1
        assert [lzma.decompress(p.read_bytes()) for p in suite.archived_event_files(kept)] == [
            ran[0].read_bytes()]
        summary = json.loads((kept / suite.SUMMARY).read_text())
        assert (summary["env"], summary["suite"]) == ("Pong", "atari")
        assert summary["overrides"][:2] == ["+experiment=atari_short_appo", "env.id=Pong"]
        assert summary["preset_sha"] == suite.preset_fingerprint("appo", suite.ATARI)
        assert summary["preset_sha"] is not None
        frames, returns, wall = curve.read_returns(kept / suite.EPISODES)
        # fake_run: 2 episodes per 50 frames, each returning seed + frames / 1000
        assert len(frames) == 40 and frames[19] == 499
        np.testing.assert_allclose(returns[:2], seed + 0.05)
        # the archive alone gives the recorded figures (its wall times kept to the ms): 0 at
        # the 20th episode, 18 never
        # timed inside the attempt its summary records (start-up included), as the report
        # times it from the archive
        assert summary["reach"]["clock"] == "attempts"
        recorded = summary["reach"]["levels"]
        clock, from_attempts = curve.run_clock(wall, suite.spans_beside(kept))
        assert from_attempts and clock[0] >= 0.0
        again = curve.reach_record(frames, returns, wall, [0.0, 18.0], clock)
        assert [level["frames"] for level in recorded] == [499, None]
        assert [level["frames"] for level in again] == [499, None]
        assert recorded[0]["run_time_s"] == pytest.approx(again[0]["run_time_s"], abs=2e-3)
        assert (out / kept.name / suite.EPISODES).read_text() == (
            kept / suite.EPISODES).read_text()
        assert summary["unrecorded_attempts"] == 0
    capsys.readouterr()
    report.main([str(archive)])  # the suite from grid.json
    row = row_of(capsys.readouterr().out, "Pong", "appo")
    assert row[2:4] == ["atari_short_appo", "2/2"]
    assert row[4].startswith("s0 499 frames, ") and "; s1 499 frames, " in row[4]
    assert row[5:8] == ["s0 not reached; s1 not reached", "s0 10.0, s1 11.0", "10.5 (2 seeds)"]


def write_atari_run(archive: Path, agent: str, seed: int, status: str,
                    episodes: tuple[np.ndarray, np.ndarray, np.ndarray],
                    eval_return: float | None = None, exit_code: int = 0,
                    spans: list[list] | None = None) -> Path:
    """An archived Atari run as reproduce.py keeps it: summary.json (with the attempts'
    ``spans`` where given, else as a run started by hand has it) and episodes.csv."""
    run_dir = archive / suite.run_name(agent, "Pong", seed)
    run_dir.mkdir(parents=True)
    frames, returns, wall = episodes
    (run_dir / suite.SUMMARY).write_text(json.dumps({
        "agent": agent, "game": "Pong", "seed": seed, "status": status,
        "exit_code": exit_code, "frames": int(frames[-1]), "episodes": len(frames),
        "final_return_100": float(returns[-100:].mean()),
        "eval": None if eval_return is None else {"return_mean": eval_return},
        **({} if spans is None else {"spans": spans})}))
    curve.write_csv(run_dir / suite.EPISODES, frames, returns, wall)
    return run_dir


def pong_episodes(late: float, count: int = 40) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``count`` episodes 500,000 frames and 4 minutes apart (less than the 5 that make a
    gap): 20 returning -21, then ``late``."""
    frames = np.arange(1, count + 1) * 500_000
    returns = np.array([-21.0] * 20 + [late] * (count - 20))[:count]
    return frames, returns, 1.8e9 + 240.0 * np.arange(count)


def test_a_replay_agents_near_greedy_envs_get_their_own_reach_on_the_runs_clock(tmp_path,
                                                                             capsys):
    archive = tmp_path / "apex_runs"
    archive.mkdir()
    (archive / suite.GRID).write_text(json.dumps({
        "suite": "atari", "agents": ["apex"], "games": ["Pong"], "seeds": [0],
        "games_by_agent": {"apex": ["Pong"]}, "frames": 20_000_000, "overrides": []}))
    # 80 episodes 100k frames and 200 s apart. The first 20 were logged before epsilons
    # were (NaN, -21); then envs at epsilon 0.4 (even i, -10) and 0.005 (odd i) alternate.
    # The 30 near-greedy ones (i = 21, 23, .., 79) return -21 ten times, then +20: a mean
    # of 20 of them reaches 0 at the 21st (9 x -21: i = 61, 6.2M frames, 61 x 200 s =
    # 3h23m of the run's clock, although they are 400 s apart) and +18 at the 30th (i =
    # 79: 8.0M frames, 4h23m); their mean is (10 x -21 + 20 x 20) / 30 = 6.33.
    i = np.arange(80)
    epsilons = np.where(i < 20, np.nan, np.where(i % 2 == 0, 0.4, 0.005))
    returns = np.where(i < 20, -21.0, np.where(i % 2 == 0, -10.0, np.where(i < 40, -21.0,
                                                                            20.0)))
    frames, wall = (i + 1) * 100_000, 1.8e9 + 200.0 * i
    run_dir = write_atari_run(archive, "apex", 0, "finished", (frames, returns, wall))
    curve.write_csv(run_dir / suite.EPISODES, frames, returns, wall, epsilons)
    report.main([str(archive)])
    table = capsys.readouterr().out
    near_greedy = [cells for cells in ([c.strip() for c in line.strip("|").split("|")]
                                       for line in table.splitlines()) if cells[2:3] == ["s0*"]]
    # s0*: no record of its attempts, so its clock is the gap rule's
    assert near_greedy == [[
        "Pong", "apex", "s0*", "30 from 2.2M frames (20 without an epsilon)", "6.33",
        "6.2M frames, 3h23m", "8.0M frames, 4h23m"]]
    # the main table's reach counts the whole ladder: 0 at i = 55 (10 x -10, 2 x -21 and
    # 8 x 20 from i = 36: +18), 5.6M frames and 55 x 200 s = 3h03m; +18 never
    assert row_of(table, "Pong", "apex")[4:6] == ["s0* 5.6M frames, 3h03m", "s0* not reached"]


def test_a_failed_run_resumed_since_is_reported_from_its_carry(tmp_path, capsys):
    """A failed attempt's summary.json and episodes.csv stay in the archive while the
    harness resumes the run; once a later attempt is carried, the table reads the carry's
    episodes and calls the run unfinished, not failed where the old attempt stopped."""
    archive = tmp_path / "pong_runs"
    archive.mkdir()
    (archive / suite.GRID).write_text(json.dumps({
        "suite": "atari", "agents": ["impala"], "games": ["Pong"], "seeds": [0],
        "games_by_agent": {"impala": ["Pong"]}, "frames": 40_000_000, "overrides": []}))
    run_dir = write_atari_run(archive, "impala", 0, "failed", pong_episodes(-21.0, 16),
                              exit_code=1)
    report.main([str(archive)])
    assert row_of(capsys.readouterr().out, "Pong", "impala")[4] == \
        "s0* not reached (failed at 8.0M frames)"
    carried = run_dir / suite.CARRY
    carried.mkdir()
    (carried / suite.CARRY_MANIFEST).write_text(json.dumps({"frames": 20_000_000}))
    (carried / suite.ATTEMPTS).write_text(
        json.dumps({"attempt": 1, "status": "failed", "exit_code": 1}) + "\n"
        + json.dumps({"attempt": 2, "status": "stopped", "exit_code": 143}) + "\n")
    curve.write_csv(carried / suite.EPISODES, *pong_episodes(20.0))
    report.main([str(archive)])
    row = row_of(capsys.readouterr().out, "Pong", "impala")
    # pong_episodes(20.0): 0 at episode 30 (15.5M frames, 30 x 4 min), +18 at episode 39
    # (20.0M frames, 39 x 4 min = 2h36m); no attempt records a start: the gap rule's clock
    assert row[3:6] == ["0/1", "s0* 15.5M frames, 2h00m", "s0* 20.0M frames, 2h36m"]


def test_the_pong_table_gives_each_seeds_reach_and_the_mean_evaluation(tmp_path, capsys):
    archive = tmp_path / "atari_runs"
    archive.mkdir()
    (archive / suite.GRID).write_text(json.dumps({
        "suite": "atari", "agents": ["appo", "impala"], "games": ["Pong"], "seeds": [0, 1, 2],
        "games_by_agent": {"appo": ["Pong"], "impala": ["Pong"]}, "frames": 20_000_000,
        "overrides": ["stop_at_return=19"]}))
    # Episodes counted from 0. s0 reaches 0 at episode 30 (window 11-30: 9 x -21, 11 x +20),
    # 30 x 4 min = 2h00m of run time, and +18 at episode 39 (window all +20), 38 x 4 min =
    # 2h32m: the 2-hour stop before episode 35 is not counted. s1 (+15 after -21) reaches 0
    # at episode 31 (8 x -21, 12 x +15), 2h04m, and never +18.
    frames, returns, wall = pong_episodes(20.0)
    wall[35:] += 7200.0
    write_atari_run(archive, "appo", 0, "finished", (frames, returns, wall), eval_return=20.3)
    write_atari_run(archive, "appo", 1, "finished", pong_episodes(15.0), eval_return=19.7)
    # s2 as s0 without the stop, its episodes 288 s apart (still under the 5-minute gap)
    frames, returns, wall = pong_episodes(20.0)
    write_atari_run(archive, "appo", 2, "finished",
                    (frames, returns, 1.8e9 + (wall - 1.8e9) * 1.2), eval_return=19.0)
    # a failed run's evaluation is shown, and left out of the mean over finished seeds
    write_atari_run(archive, "impala", 0, "failed", pong_episodes(-21.0, 16), exit_code=1,
                    eval_return=-21.0)
    report.main([str(archive)])
    table = capsys.readouterr().out
    # frames/s: 19.5M frames over 38 x 240 s (s0), 39 x 240 s (s1) and 39 x 288 s (s2):
    # 2,138, 2,083 and 1,736, whose median is 2,083 (their mean: 1,986); s2 reaches 0 at
    # 30 x 288 s = 2h24m and +18 at 39 x 288 s = 3h07m; the evaluation mean (20.3 + 19.7 +
    # 19.0) / 3 = 19.7. No summary records the attempts (runs started by hand): every seed
    # is timed by the gap rule, and marked so.
    assert row_of(table, "Pong", "appo") == [
        "Pong", "appo", "atari_short_appo", "3/3",
        "s0* 15.5M frames, 2h00m; s1* 16.0M frames, 2h04m; s2* 15.5M frames, 2h24m",
        "s0* 20.0M frames, 2h32m; s1* not reached; s2* 20.0M frames, 3h07m",
        "s0 20.3, s1 19.7, s2 19.0", "19.7 (3 seeds)", "2,083",
        "s0 not timed; s1 not timed; s2 not timed",
        "`python run.py +experiment=atari_short_appo env.id=Pong seed=<s> "
        "total_frames=20000000 stop_at_return=19`"]
    assert row_of(table, "Pong", "impala")[3:9] == [
        "0/3", "s0* not reached (failed at 8.0M frames); s1 missing; s2 missing",
        "s0* not reached (failed at 8.0M frames); s1 missing; s2 missing",
        "s0 -21.0, s1 —, s2 —", "—", "2,083"]  # 7.5M frames over 15 x 240 s
    assert table.splitlines()[0] == "### Atari: atari_runs"
    # the README's markers take the table; a README without them is refused, untouched
    readme, bare, png = tmp_path / "README.md", tmp_path / "BARE.md", tmp_path / "pong.png"
    readme.write_text(f"# distrl\n\n{report_atari.BEGIN}\nold\n"
                      f"{report_atari.END}\nkept\n")
    report.main([str(archive), "--suite", "atari", "--readme-table", str(readme),
                 "--png", str(png)])
    assert readme.read_text() == (f"# distrl\n\n{report_atari.BEGIN}\n{table}"
                                  f"{report_atari.END}\nkept\n")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bare.write_text("# distrl\n")
    with pytest.raises(SystemExit, match="holds no <!-- atari-results:start --> ... "
                                         "<!-- atari-results:end --> markers"):
        report.main([str(archive), "--readme-table", str(bare)])
    assert bare.read_text() == "# distrl\n"
    # with several files, one without the markers: none is written
    readme.write_text(f"# distrl\n\n{report_atari.BEGIN}\nold\n{report_atari.END}\n")
    with pytest.raises(SystemExit, match="no file was written"):
        report.main([str(archive), "--write", str(readme), str(bare)])
    assert readme.read_text() == f"# distrl\n\n{report_atari.BEGIN}\nold\n{report_atari.END}\n"
    with pytest.raises(SystemExit, match="holds the atari suite's grid"):
        report.main([str(archive), "--suite", "minatar"])


def test_the_pong_table_times_a_recorded_run_inside_its_attempts(tmp_path, capsys):
    """A run slowed until its games end in clusters more than 5 minutes apart: the gap
    rule would count none of that time as running; the attempts reproduce.py recorded
    time it, start-up included and the stop between two attempts left out."""
    archive = tmp_path / "atari_runs"
    archive.mkdir()
    (archive / suite.GRID).write_text(json.dumps({
        "suite": "atari", "agents": ["appo"], "games": ["Pong"], "seeds": [0, 1],
        "games_by_agent": {"appo": ["Pong"]}, "frames": 20_000_000, "overrides": []}))
    # s0: 40 episodes 7 minutes apart, the first 60 s into its first attempt; a 2-hour
    # stop before episode 35, where its second attempt starts 60 s before that episode.
    frames, returns, wall = pong_episodes(20.0)
    wall = 1.8e9 + 420.0 * np.arange(40)
    wall[35:] += 7200.0

    def stamp(t: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))

    spans = [[stamp(wall[0] - 60.0), 60.0 + 34 * 420.0 + 30.0],
             [stamp(wall[35] - 60.0), 60.0 + 4 * 420.0 + 30.0]]
    write_atari_run(archive, "appo", 0, "finished", (frames, returns, wall), 20.0, spans=spans)
    # s1: pong_episodes' 4 minutes apart, no record of its attempts: the gap rule, marked
    write_atari_run(archive, "appo", 1, "finished", pong_episodes(20.0), 20.0)
    report.main([str(archive)])
    row = row_of(capsys.readouterr().out, "Pong", "appo")
    # s0 reaches 0 at episode 30: 60 + 30 x 420 s = 3h31m; +18 at episode 39: the first
    # attempt's 60 + 34 x 420 + 30 s, then 60 + 4 x 420 s of the second, 16,110 s = 4h28m.
    # s1: 30 and 39 x 240 s. Frames/s: s0 19.5M frames over 16,110 - 60 s, 1,215; s1 19.5M
    # over 39 x 240 s, 2,083; their median 1,649.
    assert row[4:6] == ["s0 15.5M frames, 3h31m; s1* 15.5M frames, 2h00m",
                        "s0 20.0M frames, 4h28m; s1* 20.0M frames, 2h36m"]
    assert row[8] == "1,649"


def test_a_lost_run_is_never_run_again_and_the_table_shows_how_far_it_got(tmp_path, capsys):
    archive = tmp_path / "pong_appo"
    archive.mkdir()
    (archive / suite.GRID).write_text(json.dumps({
        "suite": "atari", "agents": ["appo"], "games": ["Pong"], "seeds": [1],
        "games_by_agent": {"appo": ["Pong"]}, "frames": 20_000_000, "overrides": []}))
    lost = archive / "appo-Pong-s1"
    lost.mkdir()
    (lost / suite.SUMMARY).write_text(json.dumps({
        "agent": "appo", "game": "Pong", "seed": 1, "status": "lost", "frames": 14_380_000,
        "final_return_100": -2.1, "lost": "its machine went before runs were carried",
        "reach": {"levels": [{"level": 0.0, "frames": 9_840_000, "run_time_s": 7320.0},
                             {"level": 18.0, "frames": None, "run_time_s": None}]}}))
    out = tmp_path / "out"
    args = ["--suite", "atari", "--out", str(out), "--archive", str(archive), "--agents",
            "appo", "--games", "Pong", "--seeds", "1", "--frames", "20000000", "--run-cmd", FAKE]
    assert reproduce.main([*args, "--dry-run"]) == 0
    assert reproduce.main(args) == 0
    printed = capsys.readouterr().out
    line = ("skip appo-Pong-s1: lost at 14,380,000 frames (its machine went before runs were "
            f"carried; {lost / suite.SUMMARY}); a reported seed is not run again")
    assert f"# {line}" in printed and f"[reproduce] {line}" in printed
    assert not (out / "appo-Pong-s1" / "invocations.jsonl").exists()
    report.main([str(archive)])
    row = row_of(capsys.readouterr().out, "Pong", "appo")
    # its summary's reach figures predate the attempts' clock: the gap rule's, marked so
    assert row[3:7] == ["0/1", "s1* 9.8M frames, 2h02m",
                        "s1* not reached (lost at 14.4M frames)", "s1 —"]


def test_one_pong_table_pools_each_agents_seeds_over_several_archives(tmp_path, capsys):
    """Each agent's grid in its own archive, one table and one PNG: APPO's seed 0 from one
    archive and seeds 1 and 2 from another make one row of 3 seeds, each archive's command
    named; a seed that two archives both hold is refused."""
    def grid(path: Path, agents: list[str], seeds: list[int], overrides: list[str]) -> Path:
        path.mkdir()
        (path / suite.GRID).write_text(json.dumps({
            "suite": "atari", "agents": agents, "games": ["Pong"], "seeds": seeds,
            "games_by_agent": {a: ["Pong"] for a in agents}, "frames": 20_000_000,
            "overrides": overrides}))
        return path

    first = grid(tmp_path / "pong_appo_s0", ["appo"], [0], ["stop_at_return=19"])
    later = grid(tmp_path / "pong_appo", ["appo"], [1, 2], ["distributed.learner_threads=1"])
    other = grid(tmp_path / "pong_impala", ["impala"], [0, 1], [])
    write_atari_run(first, "appo", 0, "finished", pong_episodes(20.0), eval_return=20.0)
    write_atari_run(later, "appo", 1, "finished", pong_episodes(20.0), eval_return=19.0)
    write_atari_run(later, "appo", 2, "finished", pong_episodes(-21.0), eval_return=-20.0)
    write_atari_run(other, "impala", 1, "finished", pong_episodes(10.0), eval_return=9.0)
    png = tmp_path / "pong.png"
    report.main([str(first), str(later), str(other), "--png", str(png)])
    table = capsys.readouterr().out
    assert table.splitlines()[0] == "### Atari: pong_appo_s0, pong_appo, pong_impala"
    appo = row_of(table, "Pong", "appo")
    assert appo[3] == "3/3"
    assert appo[6:8] == ["s0 20.0, s1 19.0, s2 -20.0", "6.3 (3 seeds)"]
    assert appo[10] == ("`python run.py +experiment=atari_short_appo env.id=Pong seed=<s> "
                        "total_frames=20000000 stop_at_return=19`; `python run.py "
                        "+experiment=atari_short_appo env.id=Pong seed=<s> "
                        "total_frames=20000000 distributed.learner_threads=1`")
    assert row_of(table, "Pong", "impala")[3] == "1/2"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    write_atari_run(grid(tmp_path / "again", ["appo"], [1], []), "appo", 1, "finished",
                    pong_episodes(0.0))
    with pytest.raises(SystemExit, match="seed 1 of appo on Pong is in both .*pong_appo and "
                                         ".*again"):
        report.main([str(later), str(tmp_path / "again")])
    minatar = [make_run(tmp_path / name, "impala", "Breakout", 0, [1.0]).parent
               for name in ("m1", "m2")]
    with pytest.raises(SystemExit, match="a MinAtar report reads one directory"):
        report.main([str(path) for path in minatar])


def test_a_finished_seeds_curve_holds_its_last_value_and_an_unfinished_one_stops():
    """A finished run (one that met stop_at_return early, say) stays in the mean over seeds
    at its last 20-episode mean; a run still going counts only as far as it got."""
    def run(status: str, step: int, value: float) -> report_atari.AtariRun:
        frames = np.arange(1, 21) * step
        episodes = (frames, np.full(20, value), np.arange(20) * 60.0)
        return report_atari.AtariRun(suite_runs.RunResult("appo", "Pong", 0, status),
                                     episodes, [])

    curves = report_atari.seed_curves([run("finished", 100, 1.0), run("unfinished", 50, 3.0)],
                                      np.array([1000, 2000, 3000]))
    np.testing.assert_array_equal(curves, [[np.nan, 1.0, 1.0], [3.0, np.nan, np.nan]])


# ------------------------------------------------- carrying a stopped run to another machine

def test_a_stopped_run_is_carried_in_the_archive_and_continues_on_a_fresh_machine(
        tmp_path, monkeypatch, capsys):
    """A run stopped on one machine continues on another that has only the archive: its
    checkpoint and events come back from the carry, one curve across the attempts, and the
    carry is deleted once the run finishes."""
    import carry

    archive = tmp_path / "archive"
    monkeypatch.setenv("FAKE_STEP_S", "0.5")  # stopped at 4.8 s of a 10 s run
    monkeypatch.setenv("FAKE_EPSILON", "1")  # a replay agent's episodes carry their epsilon
    first = tmp_path / "machine-a"
    assert reproduce.main(grid_args(first, "--stop-after", "0.08", "--archive", str(archive),
                                    agents=("impala",), seeds=("0",))) == 0
    name = "impala-Breakout-s0"
    manifest = json.loads((archive / name / carry.CARRY / carry.MANIFEST).read_text())
    checkpoint = first / name / manifest["checkpoint"]
    assert manifest["files"][manifest["checkpoint"]]["bytes"] == checkpoint.stat().st_size
    assert len(manifest["files"]) == 1 + len(suite.event_files(first / name))
    stopped_at = int(checkpoint.read_text())
    assert 0 < stopped_at < 1000
    # the archive alone shows the run so far: unfinished, its frames and its episodes
    shown = report.collect(archive).runs["impala", "Breakout", 0]
    episodes = report_atari.episodes_of(archive / name)
    assert (shown.status, shown.frames) == ("unfinished", manifest["frames"])
    assert shown.episodes == len(episodes[0]) >= 2 * stopped_at // 50
    # each episode's epsilon is carried beside its return (the one past the checkpoint too)
    carried = curve.episode_columns(archive / name / carry.CARRY / suite.EPISODES)[3]
    np.testing.assert_allclose(carried, np.resize(fake_run.EPSILONS, len(carried)),
                               rtol=1e-6)
    assert len(carried) == len(episodes[0])
    capsys.readouterr()

    second = tmp_path / "machine-b"  # a fresh checkout: no run directory at all
    reproduce.dry_run(reproduce.plan(second, ["impala"], ["Breakout"], [0],
                                     suite.SUITES["minatar"]),
                      reproduce.parse_args(grid_args(second, "--archive", str(archive),
                                                     agents=("impala",), seeds=("0",))))
    planned = capsys.readouterr().out
    assert f"resume, once {archive / name / carry.CARRY} is restored" in planned
    assert f"resume={second / name}" in planned
    monkeypatch.setenv("FAKE_STEP_S", "0")
    assert reproduce.main(grid_args(second, "--archive", str(archive), agents=("impala",),
                                    seeds=("0",))) == 0
    printed = capsys.readouterr().out
    assert f"restored checkpoints/{checkpoint.name}" in printed
    run = invocations(second / name)[-2]
    assert run["argv"][-1] == f"resume={second / name}"
    summary = json.loads((archive / name / suite.SUMMARY).read_text())
    assert (summary["status"], summary["attempt"], summary["frames"]) == ("finished", 2, 1000)
    assert summary["episodes"] == 40  # machine A's steps and machine B's, each once
    assert summary["wall_s_total"] > summary["wall_s"]  # machine A's attempt counts
    # frames/s over both attempts' wall time, not the last attempt's alone
    assert summary["fps"] == round(1000 / summary["wall_s_total"], 1)
    assert not (archive / name / carry.CARRY).exists()
    assert f"{name}: finished, its carry deleted" in printed
    assert not (archive / name / suite.KEPT_EVENTS).exists()  # MinAtar's: minutes, not kept


def test_a_damaged_carry_fails_the_run_and_loses_nothing(tmp_path, monkeypatch, capsys):
    import lzma

    import carry

    archive = tmp_path / "archive"
    monkeypatch.setenv("FAKE_STEP_S", "0.5")
    assert reproduce.main(grid_args(tmp_path / "a", "--stop-after", "0.08", "--archive",
                                    str(archive), agents=("impala",), seeds=("0",))) == 0
    kept = archive / "impala-Breakout-s0" / carry.CARRY
    packed = next(kept.glob("checkpoint-*.pt.xz"))
    # one bit flipped, the length kept: only the sha256 can tell
    original = lzma.decompress(packed.read_bytes())
    packed.write_bytes(lzma.compress(bytes([original[0] ^ 1]) + original[1:]))
    before = {p.name: p.read_bytes() for p in kept.iterdir()}
    capsys.readouterr()
    fresh = tmp_path / "b"
    assert reproduce.main(grid_args(fresh, "--archive", str(archive), agents=("impala",),
                                    seeds=("0",))) == 1
    printed = capsys.readouterr().out
    assert "failed impala-Breakout-s0: its carry cannot be restored" in printed
    assert f"{packed}: {len(original)} bytes with sha256" in printed
    assert not (fresh / "impala-Breakout-s0" / "invocations.jsonl").exists()  # never started
    assert not list((fresh / "impala-Breakout-s0").rglob("*.pt"))
    assert {p.name: p.read_bytes() for p in kept.iterdir()} == before


def test_a_checkpoint_over_the_limit_is_not_carried(tmp_path, monkeypatch, capsys):
    import carry

    monkeypatch.setattr(carry, "LIMIT_BYTES", 1)  # the fake checkpoints hold a few bytes
    monkeypatch.setenv("FAKE_STEP_S", "0.5")
    archive = tmp_path / "archive"
    assert reproduce.main(grid_args(tmp_path / "a", "--stop-after", "0.08", "--archive",
                                    str(archive), agents=("impala",), seeds=("0",))) == 0
    assert "(over 0 MiB, a replay inside?); it resumes only from" in capsys.readouterr().out
    assert not (archive / "impala-Breakout-s0" / carry.CARRY).exists()


# ---------------------------------------------------------------- ale-py alone, per attempt


def test_ale_py_is_timed_once_before_the_first_run_and_kept_with_every_attempt(
        tmp_path, monkeypatch, capsys, ale_timings):
    """An Atari grid times ale-py alone on its games once, before its first run starts,
    and each attempt's record keeps the figure of the invocation that ran it: a run
    resumed by a second invocation (another machine) lists both, attempt by attempt, and
    the report shows each seed's range and machines."""
    atari_presets(tmp_path, monkeypatch, "appo")
    out = tmp_path / "pong"
    monkeypatch.setenv("FAKE_FAIL", "appo-Pong-s1")  # stops halfway, checkpointed
    assert reproduce.main(atari_args(out, seeds=("1", "2"))) == 1
    assert ale_timings == [(["Pong"], 5.0)]
    assert ("[reproduce] ale-py alone on Test CPU, 2 cores (64 envs, 2 threads, random "
            "actions, 5 s each): Pong 6,000 frames/s") in capsys.readouterr().out
    first = {"machine": TEST_MACHINE, "measured": "2026-11-29T08:00:00", "envs": 64,
             "threads": 2, "seconds": 5.0, "frames_per_s": 6000.0, "attempt": 1}
    done = json.loads((out / "appo-Pong-s2" / suite.SUMMARY).read_text())
    assert done["ale_alone"] == [first]
    monkeypatch.delenv("FAKE_FAIL")

    def elsewhere(games: list[str], seconds: float) -> dict:
        return {**first, "machine": "Other CPU, 16 cores", "seconds": seconds,
                "frames_per_s": {game: 20000.0 for game in games}}

    monkeypatch.setattr(reproduce, "ale_alone", elsewhere)
    assert reproduce.main(atari_args(out, "--ale-seconds", "2", seeds=("1", "2"))) == 0
    resumed = json.loads((out / "appo-Pong-s1" / suite.SUMMARY).read_text())
    assert resumed["attempt"] == 2 and [a["attempt"] for a in resumed["ale_alone"]] == [1, 2]
    assert [a["frames_per_s"] for a in resumed["ale_alone"]] == [6000.0, 20000.0]
    assert resumed["ale_alone"][1]["seconds"] == 2.0
    lines = suite.read_attempts(out / "appo-Pong-s1")
    assert [line["ale_alone"]["machine"] for line in lines] == [TEST_MACHINE,
                                                                "Other CPU, 16 cores"]
    report.main([str(out)])
    row = row_of(capsys.readouterr().out, "Pong", "appo")
    assert row[-2] == ("s1 6,000-20,000 (Test CPU, 2 cores; Other CPU, 16 cores); "
                       "s2 6,000 (Test CPU, 2 cores)")


def test_a_timing_beside_other_work_is_said_so_and_left_out_of_the_alone_figures(
        tmp_path, monkeypatch, capsys):
    """Seed 1 stops in its first attempt, timed alone (6,000 frames/s); a second
    invocation, timed while other processes kept a core busy (3,000), finishes it and runs
    seed 2. The second says so on its line; the report keeps 6,000 as seed 1's figure and
    counts the other, and seed 2, timed only beside other work, is "not timed alone"."""
    atari_presets(tmp_path, monkeypatch, "appo")
    out = tmp_path / "pong"
    monkeypatch.setenv("FAKE_FAIL", "appo-Pong-s1")
    assert reproduce.main(atari_args(out, seeds=("1",))) == 1
    monkeypatch.delenv("FAKE_FAIL")
    capsys.readouterr()

    def crowded(games: list[str], seconds: float) -> dict:
        return {"machine": TEST_MACHINE, "measured": "2026-12-03T14:47:00", "envs": 64,
                "threads": 2, "seconds": seconds, "busy_elsewhere": 1.0,
                "frames_per_s": {game: 3000.0 for game in games}}

    monkeypatch.setattr(reproduce, "ale_alone", crowded)
    assert reproduce.main(atari_args(out, seeds=("1", "2"))) == 0
    assert ("Pong 3,000 frames/s (not alone: other processes kept 1.00 cores busy)"
            in capsys.readouterr().out)
    report.main([str(out)])
    row = row_of(capsys.readouterr().out, "Pong", "appo")
    assert row[-2] == ("s1 6,000 (Test CPU, 2 cores; 1 timing not alone); "
                       "s2 not timed alone (1 timing not alone)")


def test_ale_py_is_not_timed_with_ale_seconds_0_nor_for_minatar(tmp_path, monkeypatch,
                                                                 ale_timings, capsys):
    assert reproduce.main(grid_args(tmp_path / "minatar", agents=("apex",))) == 0
    atari_presets(tmp_path, monkeypatch, "appo")
    assert reproduce.main(atari_args(tmp_path / "pong", "--ale-seconds", "0")) == 0
    summary = json.loads((tmp_path / "pong" / "appo-Pong-s1" / suite.SUMMARY).read_text())
    assert summary["ale_alone"] == []
    assert ale_timings == [] and "ale-py alone" not in capsys.readouterr().out
    report.main([str(tmp_path / "pong")])
    assert row_of(capsys.readouterr().out, "Pong", "appo")[-2] == "s1 not timed"


def test_a_negative_ale_seconds_is_refused_naming_the_flag(tmp_path, capsys):
    with pytest.raises(SystemExit):
        reproduce.main(atari_args(tmp_path / "pong", "--ale-seconds", "-1"))
    assert "--ale-seconds must be a number of seconds >= 0, got -1.0" in capsys.readouterr().err


def test_the_atari_curve_is_the_mean_of_the_seeds_with_a_min_max_band():
    """Two seeds, the second without its first point: the mean and band at each point over
    the seeds that have it; NaN where none has."""
    nan = np.nan
    mean, low, high = report_atari.min_max_band(np.array([[1.0, nan, 4.0, nan],
                                                          [3.0, 5.0, -2.0, nan]]))
    np.testing.assert_array_equal(mean, [2.0, 5.0, 1.0, nan])
    np.testing.assert_array_equal(low, [1.0, 5.0, -2.0, nan])
    np.testing.assert_array_equal(high, [3.0, 5.0, 4.0, nan])


def test_a_tuning_run_below_its_rule_is_ruled_out_for_good_and_one_above_goes_on(
        tmp_path, monkeypatch, capsys):
    """``--rule-out-at 500 0.6``: at the first episode past 500 frames (549) the last 20
    episodes average seed + 0.05 x (1 + 2 x (2 + ... + 10) + 11) / 20 = seed + 0.3, so seed
    0 (0.3) is stopped and recorded as ruled out, its events kept and no carry left, and it
    is skipped from then on; seed 1 (1.3) runs on to its end."""
    atari_presets(tmp_path, monkeypatch, "appo")
    monkeypatch.setenv("FAKE_STEP_S", "0.25")  # 50 frames a step, 5 s a run
    monkeypatch.setattr(reproduce, "JUDGE_EVERY_S", 0.0)
    out, archive = tmp_path / "pong", tmp_path / "archive"
    args = atari_args(out, "--archive", str(archive), "--rule-out-at", "500", "0.6",
                      seeds=("0", "1"))
    assert reproduce.main(args) == 0
    printed = capsys.readouterr().out
    reading = ("its 20-game mean at 549 frames, the first episode past 500, was "
               "{mean}, {verdict} 0.6")
    assert (f"appo-Pong-s0: ruled out: {reading.format(mean='0.30', verdict='below')}; "
            "stopping it") in printed
    assert f"appo-Pong-s1: {reading.format(mean='1.30', verdict='not below')}: it goes on" \
        in printed
    ruled = json.loads((archive / "appo-Pong-s0" / suite.SUMMARY).read_text())
    assert ruled["status"] == suite.RULED_OUT
    assert ruled["ruled_out"] == {"at_frames": 500, "below": 0.6, "window": 20,
                                  "episode_frames": 549, "mean": 0.3}
    assert 549 < ruled["frames"] < 1000  # stopped on its way, checkpointed
    assert {p.name for p in (archive / "appo-Pong-s0").iterdir()} == {
        suite.SUMMARY, suite.EPISODES, suite.KEPT_EVENTS}  # its curve and events, no carry
    done = json.loads((archive / "appo-Pong-s1" / suite.SUMMARY).read_text())
    assert (done["status"], done["frames"], "ruled_out" in done) == ("finished", 1000, False)

    invoked = len(invocations(out / "appo-Pong-s0"))
    assert reproduce.main(args) == 0  # again: neither run starts
    printed = capsys.readouterr().out
    assert (f"skip appo-Pong-s0: ruled out: {reading.format(mean='0.30', verdict='below')}; "
            "a ruled-out run is not resumed") in printed
    assert len(invocations(out / "appo-Pong-s0")) == invoked
    report.main([str(archive)])
    row = row_of(capsys.readouterr().out, "Pong", "appo")
    assert row[3] == "1/2"  # the ruled-out seed is not counted as finished
