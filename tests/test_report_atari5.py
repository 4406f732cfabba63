"""The human-normalised score table of an Atari-5 suite: per-game HNS, each seed's Atari-5
estimate and their mean, the comparison with Dopamine's Rainbow, the IQM over games and
seeds, and the README block between its own markers."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import report  # noqa: E402
import report_atari5  # noqa: E402
import suite  # noqa: E402
from atari_scores import ATARI5, REFERENCES, human_normalized  # noqa: E402
from test_reproduce import make_run, row_of, write_grid  # noqa: E402

DQN = REFERENCES["dopamine_dqn_10m"]["scores"]


def dqn_suite(root: Path, seeds: list[int], skip: tuple[str, int] | None = None) -> None:
    """IMPALA on the five games, every run's last 100 episodes at Dopamine's DQN score;
    ``skip`` leaves one (game, seed) unfinished."""
    write_grid(root, ["impala"], list(ATARI5), seeds)
    grid = json.loads((root / "grid.json").read_text())
    (root / "grid.json").write_text(json.dumps({**grid, "suite": "atari",
                                                "frames": 10_000_000}))
    for game in ATARI5:
        for seed in seeds:
            status = None if skip == (game, seed) else "finished"
            make_run(root, "impala", game, seed, [DQN[game]] * 100, 10_000_000, status,
                     eval_return=DQN[game])


def test_per_game_hns_and_the_atari5_estimate_of_each_seed(tmp_path):
    dqn_suite(tmp_path, [0, 1])
    table = report_atari5.markdown(report.collect(tmp_path), tmp_path, reps=200)
    qbert = row_of(table, "Qbert", "impala")
    assert qbert[2] == "2/2"
    assert qbert[3].startswith("1,245.0")
    # (1,245 - 163.9) / (13,455 - 163.9) = 8.13%
    assert qbert[4] == "8.1"
    # Dopamine's DQN scores give its estimate, 35.2, on each seed; Rainbow's is 39.4
    assert "impala: Atari-5 estimate 35.2% [35.2, 35.2]** (2 seeds: s0 35.2, s1 35.2)" in table
    assert ("Below Rainbow's by 4.2 points; below Rainbow's score on BattleZone, "
            "NameThisGame, Phoenix, Qbert.") in table
    # IQM over 10 runs: the 2 lowest (Qbert) and 2 highest (NameThisGame) are trimmed
    middle = [human_normalized(g, DQN[g]) for g in ("BattleZone", "DoubleDunk", "Phoenix")]
    # each game's two runs are equal, so every resample within games has the same IQM; a
    # resample of the 10 pooled runs would spread it
    iqm = f"{sum(middle) / 3:.1f}"
    assert f"IQM of HNS over 5 games and 10 runs {iqm}% [{iqm}, {iqm}]." in table
    heading = f"### Atari: human-normalised scores at 10.0M frames ({tmp_path.name})"
    assert table.splitlines()[0] == heading
    assert "Protocol: the papers' (up to 30 no-op starts, no sticky actions)" in table


def test_a_game_row_averages_its_seeds_and_sets_both_references_beside_them(tmp_path):
    """Seed 1 scores Rainbow's Qbert (5,154), seed 0 DQN's (1,245): the row's final and
    evaluation return are their mean, 3,199.5, HNS (3,199.5 - 163.9) / 13,291.1 = 22.8%;
    DQN's and Rainbow's Qbert with their HNS, 8.1% and 37.5%, in their own columns; each
    seed's estimate from its own five scores (s1's Qbert term 0.0805 log10(38.54))."""
    dqn_suite(tmp_path, [0, 1])
    shutil.rmtree(tmp_path / suite.run_name("impala", "Qbert", 1))
    make_run(tmp_path, "impala", "Qbert", 1, [5154.0] * 100, 10_000_000, "finished",
             eval_return=5154.0)
    table = report_atari5.markdown(report.collect(tmp_path), tmp_path, reps=200)
    qbert = row_of(table, "Qbert", "impala")
    assert qbert[3].startswith("3,199.5 [")
    assert qbert[4] == "22.8"
    assert qbert[6:9] == ["3,199.5", "1,245.0 (8.1)", "5,154.0 (37.5)"]
    # the mean of the seeds' estimates, (35.19 + 39.64) / 2, not the estimate of the
    # seeds' mean scores (38.1); Rainbow's is 39.37
    assert "Atari-5 estimate 37.4% [35.2, 39.6]** (2 seeds: s0 35.2, s1 39.6)" in table
    assert "Below Rainbow's by 2.0 points" in table


def test_a_seed_whose_learner_ran_on_a_gpu_is_marked_in_its_row(tmp_path):
    """Part of a grid may run on a GPU machine: a finished run whose command put the
    learner on a GPU, and a carried one with such an attempt, are marked; the rest not."""
    dqn_suite(tmp_path, [0, 1, 2], skip=("Phoenix", 2))
    finished = tmp_path / suite.run_name("impala", "Qbert", 1) / suite.SUMMARY
    record = json.loads(finished.read_text())
    finished.write_text(json.dumps({**record, "command": [
        "python", "run.py", "+experiment=atari_short_impala", "agent.device=cuda"]}))
    carried = tmp_path / suite.run_name("impala", "Phoenix", 2)
    for path in carried.glob("events.out.tfevents.*"):
        path.unlink()
    (carried / suite.CARRY).mkdir()
    (carried / suite.CARRY / suite.CARRY_MANIFEST).write_text(json.dumps({"frames": 4_000_000}))
    (carried / suite.CARRY / suite.ATTEMPTS).write_text(
        json.dumps({"attempt": 1, "command": ["python", "run.py", "agent.device=cpu"]}) + "\n"
        + json.dumps({"attempt": 2, "command": ["python", "run.py", "agent.device=cuda:0"]})
        + "\n")
    table = report_atari5.markdown(report.collect(tmp_path), tmp_path, reps=200)
    assert row_of(table, "Qbert", "impala")[5] == "s0 1245.0; s1 1245.0 (GPU learner); s2 1245.0"
    phoenix = row_of(table, "Phoenix", "impala")[5]
    assert phoenix.endswith("s2 unfinished (4.0M frames, no episodes) (GPU learner)"), phoenix
    assert "(GPU learner)" not in row_of(table, "BattleZone", "impala")[5]


def test_a_failed_run_resumed_since_reads_from_its_carry(tmp_path):
    """A failed attempt's summary.json stays in the archive while the harness resumes the
    run; once a later attempt is carried, the run is the carry's (unfinished, at the
    carry's frames, its wall time every attempt's), not the old failure."""
    dqn_suite(tmp_path, [0], skip=("Qbert", 0))
    run = tmp_path / suite.run_name("impala", "Qbert", 0)
    for path in run.glob("events.out.tfevents.*"):
        path.unlink()
    (run / suite.SUMMARY).write_text(json.dumps(
        {"agent": "impala", "game": "Qbert", "seed": 0, "status": "failed", "exit_code": 1,
         "attempt": 1, "frames": 2_000_000, "wall_s_total": 600.0}))
    table = report_atari5.markdown(report.collect(tmp_path), tmp_path, reps=200)
    assert row_of(table, "Qbert", "impala")[5] == "s0 failed (exit 1, 2.0M frames, no episodes)"
    (run / suite.CARRY).mkdir()
    (run / suite.CARRY / suite.CARRY_MANIFEST).write_text(json.dumps({"frames": 6_000_000}))
    (run / suite.CARRY / suite.ATTEMPTS).write_text(
        json.dumps({"attempt": 1, "status": "failed", "wall_s": 600.0}) + "\n"
        + json.dumps({"attempt": 2, "status": "stopped", "wall_s": 900.0}) + "\n")
    result = report.collect(tmp_path).runs["impala", "Qbert", 0]
    assert (result.status, result.frames, result.wall_s) == ("unfinished", 6_000_000, 1500.0)
    table = report_atari5.markdown(report.collect(tmp_path), tmp_path, reps=200)
    assert row_of(table, "Qbert", "impala")[5] == "s0 unfinished (6.0M frames, no episodes)"


def test_a_seed_without_all_five_games_gives_no_estimate(tmp_path):
    dqn_suite(tmp_path, [0, 1], skip=("Phoenix", 1))
    # the unfinished run evaluated too, at 0: its evaluation stays out of the game's mean
    shutil.rmtree(tmp_path / suite.run_name("impala", "Phoenix", 1))
    make_run(tmp_path, "impala", "Phoenix", 1, [DQN["Phoenix"]] * 100, 10_000_000, None,
             eval_return=0.0)
    table = report_atari5.markdown(report.collect(tmp_path), tmp_path, reps=200)
    assert "(1 seed: s0 35.2)" in table
    phoenix = row_of(table, "Phoenix", "impala")
    assert phoenix[2] == "1/2"
    assert phoenix[6] == f"{DQN['Phoenix']:,.1f}"


def test_the_readme_gets_the_score_table_between_its_markers(tmp_path):
    suite_dir = tmp_path / "atari5"
    suite_dir.mkdir()
    dqn_suite(suite_dir, [0])
    readme = tmp_path / "README.md"
    readme.write_text(f"# distrl\n\n{report_atari5.BEGIN}\nold\n{report_atari5.END}\nkept\n")
    report.main([str(suite_dir), "--suite", "atari", "--readme-table", str(readme),
                 "--reps", "100"])
    text = readme.read_text()
    assert "old" not in text and text.endswith(f"{report_atari5.END}\nkept\n")
    assert "| Qbert | impala | 1/1 |" in text
    assert "Atari-5 estimate 35.2%" in text


def test_two_archives_are_both_written_into_the_one_block(tmp_path):
    """APPO's grid and SEED-APPO's live in two archives, and the README has one Atari-5
    block: it gets both tables, in the order given (the second once replaced the first)."""
    first, second = tmp_path / "atari5_appo", tmp_path / "atari5_seed_appo"
    for path, seeds in ((first, [0, 1]), (second, [0])):
        path.mkdir()
        dqn_suite(path, seeds)
    readme = tmp_path / "README.md"
    readme.write_text(f"# distrl\n\n{report_atari5.BEGIN}\nold\n{report_atari5.END}\nkept\n")
    report.main([str(first), str(second), "--suite", "atari", "--write", str(readme),
                 "--reps", "100"])
    text = readme.read_text()
    block = text[text.index(report_atari5.BEGIN):text.index(report_atari5.END)]
    assert "old" not in block and text.endswith(f"{report_atari5.END}\nkept\n")
    assert block.index("(atari5_appo)") < block.index("(atari5_seed_appo)")
    assert "| Qbert | impala | 2/2 |" in block and "| Qbert | impala | 1/1 |" in block


def test_a_readme_without_the_markers_is_refused(tmp_path):
    dqn_suite(tmp_path, [0])
    readme = tmp_path / "README.md"
    readme.write_text("# distrl\n")
    with pytest.raises(SystemExit, match="atari5-results"):
        report.main([str(tmp_path), "--suite", "atari", "--readme-table", str(readme)])


def test_the_heading_names_machados_protocol_when_the_grid_asked_for_it(tmp_path):
    dqn_suite(tmp_path, [0])
    grid = json.loads((tmp_path / "grid.json").read_text())
    grid["overrides"] = ["env.protocol=machado"]
    (tmp_path / "grid.json").write_text(json.dumps(grid))
    table = report_atari5.markdown(report.collect(tmp_path), tmp_path, reps=100)
    assert "Protocol: Machado et al. 2018's (sticky actions 0.25" in table


def test_the_table_ends_with_the_grids_wall_time(tmp_path):
    """Issue 47 asks for the grid's wall time beside its table: two seeds' runs of 3,000 s
    each at 3,333 frames/s, one after another (no spans, so no overlap to discount), and
    one run unfinished after two attempts of 600 s: 10 x 3,000 - 3,000 + 1,200 s."""
    dqn_suite(tmp_path, [0, 1], skip=("Qbert", 1))
    for run_dir in tmp_path.iterdir():
        record_path = run_dir / suite.SUMMARY
        if record_path.exists():
            record = json.loads(record_path.read_text())
            record_path.write_text(json.dumps({**record, "fps": 3333.0, "wall_s_total": 3000.0}))
    unfinished = tmp_path / suite.run_name("impala", "Qbert", 1)
    (unfinished / suite.ATTEMPTS).write_text('{"wall_s": 600.0}\n{"wall_s": 600.0}\n')
    table = report_atari5.markdown(report.collect(tmp_path), tmp_path, reps=100)
    assert "| impala | 9 | 1 | 3,333 | 3,333-3,333 | 50m00s | 7h50m |" in table  # 28,200 s
    assert table.rstrip().endswith("Wall time of the suite so far: 7h50m, one run at a time.")
