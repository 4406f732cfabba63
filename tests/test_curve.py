"""benchmarks/curve.py: a run's binned return curve as a Markdown table and a PNG, from a
tiny events directory written by distrl's MetricLogger."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from distrl.telemetry.logging import MetricLogger

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import curve  # noqa: E402


def _run_dir(root: Path) -> Path:
    """Ten episodes, returning 1 .. 10, ending at frames 100 .. 1000."""
    run_dir = root / "run"
    logger = MetricLogger(str(run_dir), stream=open(os.devnull, "w"))  # noqa: SIM115
    for k in range(1, 11):
        logger.episode(float(k), 10, 100 * k)
    logger.close()
    return run_dir


def test_table_and_png_beside_it(tmp_path, capsys):
    run_dir = _run_dir(tmp_path)
    curve.main([str(run_dir), "--bins", "5"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[:8] == [
        "10 episodes up to 1,000 frames",
        "| frames | episodes | mean raw return | min | max |", "|---|---|---|---|---|",
        "| 0-200 | 1 | 1.00 | 1 | 1 |", "| 200-400 | 2 | 2.50 | 2 | 3 |",
        "| 400-600 | 2 | 4.50 | 4 | 5 |", "| 600-800 | 2 | 6.50 | 6 | 7 |",
        "| 800-1,000 | 3 | 9.00 | 8 | 10 |"]  # the last bin holds the episode at 1,000
    png = run_dir / "curve.png"
    assert lines[8] == f"curve: {png}"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    assert matplotlib.image.imread(png).shape[:2] == (400, 700)  # 7 x 4 inches at 100 dpi


def test_png_goes_where_asked(tmp_path, capsys):
    run_dir = _run_dir(tmp_path)
    out = tmp_path / "elsewhere.png"
    curve.main([str(run_dir), "--png", str(out)])
    assert out.is_file() and not (run_dir / "curve.png").exists()
    assert capsys.readouterr().out.splitlines()[-1] == f"curve: {out}"


def test_csv_round_trip_gives_the_same_table(tmp_path, capsys):
    run_dir = _run_dir(tmp_path)
    csv = tmp_path / "episodes.csv"
    curve.main([str(run_dir), "--bins", "5", "--csv", str(csv)])
    from_events = capsys.readouterr().out.splitlines()
    assert csv.read_text().splitlines()[:2][0] == curve.CSV_HEADER
    curve.main([str(csv), "--bins", "5", "--png", str(tmp_path / "b.png")])
    assert capsys.readouterr().out.splitlines()[:8] == from_events[:8]


def test_reach_is_the_first_20_episode_mean_at_the_level_and_skips_long_gaps(tmp_path,
                                                                             capsys):
    # 40 episodes returning 0, 1, ..., 39, one every 100 frames and 60 s, with a 2-hour stop
    # after the 30th: the 20-episode mean first reaches 10 at episode 21 (0..20 -> 10.0)
    # and 25 at episode 36 (16..35 -> 25.5)
    frames = np.arange(1, 41) * 100
    wall = np.arange(40) * 60.0 + np.where(np.arange(40) >= 30, 7200.0, 0.0)
    csv = tmp_path / "run.csv"
    curve.write_csv(csv, frames, np.arange(40.0), wall)
    curve.main([str(csv), "--bins", "2", "--reach", "10", "25", "50"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[5:9] == [
        "reach 10: 2,100 frames, 20m00s of run time (20-episode mean)",
        "reach 25: 3,600 frames, 34m00s of run time (20-episode mean)",  # 35 steps, 1 a gap
        "reach 50: not reached (best 20-episode mean 29.50 by 4,000 frames)",
        "run time: since the first episode, less every gap over 5 minutes between two (no "
        "record of every attempt beside it)"]
    assert (tmp_path / "run.png").is_file()


def test_the_attempts_record_times_the_run_from_its_start_and_only_inside_its_attempts():
    # Two attempts: 1,000 s from t=10,000 and 500 s from t=20,000. Episodes end 100 s into
    # the first (start-up counted), 8 minutes later (a pause inside an attempt, which the
    # gap rule would drop), 3 s after the first attempt's recorded end (its start is kept
    # to the whole second), then 50 s and 400 s into the second.
    spans = [(10_000.0, 1_000.0), (20_000.0, 500.0)]
    wall = np.array([10_100.0, 10_580.0, 11_003.0, 20_050.0, 20_400.0])
    np.testing.assert_allclose(curve.attempt_clock(wall, spans),
                               [100.0, 580.0, 1_000.0, 1_050.0, 1_400.0])
    clock, recorded = curve.run_clock(wall, spans)
    assert recorded
    # the gap rule counts none of it: every step between these episodes is over 5 minutes
    np.testing.assert_allclose(curve.run_time(wall), np.zeros(5))
    # an episode in no recorded attempt (one started by hand): the gap rule, and said so
    outside = np.append(wall, 30_000.0)
    assert curve.attempt_clock(outside, spans) is None
    clock, recorded = curve.run_clock(outside, spans)
    assert not recorded
    np.testing.assert_allclose(clock, curve.run_time(outside))
    assert curve.run_clock(wall, [])[1] is False


def test_reach_from_an_archive_is_timed_on_the_attempts_recorded_beside_it(tmp_path, capsys):
    # the 40 episodes of the gap test above, one a minute with a 2-hour stop after the 30th,
    # in an archived run whose summary.json records the two attempts: the first from 100 s
    # before the first episode to the 30th, the second from 60 s before the 31st
    import json

    frames = np.arange(1, 41) * 100
    wall = 1.8e9 + np.arange(40) * 60.0 + np.where(np.arange(40) >= 30, 7200.0, 0.0)
    run = tmp_path / "appo-Pong-s0"
    run.mkdir()
    curve.write_csv(run / "episodes.csv", frames, np.arange(40.0), wall)
    stamp = [time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))
             for t in (wall[0] - 100.0, wall[30] - 60.0)]
    (run / "summary.json").write_text(json.dumps({"spans": [[stamp[0], 100.0 + 29 * 60.0],
                                                            [stamp[1], 600.0]]}))
    curve.main([str(run / "episodes.csv"), "--bins", "2", "--reach", "10", "25"])
    lines = capsys.readouterr().out.splitlines()
    # 10 at episode 21: 100 s + 20 minutes; 25 at episode 36: the first attempt's 1,840 s,
    # then 60 s + 5 minutes of the second
    assert lines[5:8] == [
        "reach 10: 2,100 frames, 21m40s of run time (20-episode mean)",
        "reach 25: 3,600 frames, 36m40s of run time (20-episode mean)",
        "run time: inside the attempts reproduce.py recorded, from the first one's start"]


def test_reach_times_are_whole_minutes_as_the_atari_report_writes_them(tmp_path, capsys):
    """The run time to a level is written as the Atari report writes it: under an hour to
    the second (3,579.6 s is 59m40s), over it cut to whole minutes (7,199.4 s is 1h59m,
    rounding the minutes printed 2h00m; 29,012.6 s is 8h03m)."""
    from report_throughput import duration

    for seconds, expected in ((3579.6, "59m40s"), (7199.4, "1h59m"), (29012.6, "8h03m")):
        # 200 episodes (no gap over 5 minutes), the last 20 won: the 20-game mean reaches
        # 18 at the last one, ``seconds`` after the first
        wall = np.linspace(0.0, seconds, 200)
        returns = np.where(np.arange(200) >= 180, 19.0, -21.0)
        csv = tmp_path / f"{seconds}.csv"
        curve.write_csv(csv, np.arange(1, 201) * 100, returns, wall)
        curve.main([str(csv), "--bins", "1", "--reach", "18"])
        line = [s for s in capsys.readouterr().out.splitlines() if s.startswith("reach")]
        assert line == [f"reach 18: 20,000 frames, {expected} of run time (20-episode mean)"]
    assert duration(29012.6) == "8h03m"  # the report's figure for the same time


def test_near_greedy_reach_is_timed_on_the_runs_clock_not_on_its_own_sparse_episodes():
    """80 episodes 100 s apart, every fourth at epsilon 0.001 (so 400 s apart, more than
    the 5-minute gap that marks a stopped run) and returning 20, the rest -21: the near-
    greedy envs' 20-game mean reaches 18 at their 20th game, episode 80, 7,900 s into the
    run; timed on their own episodes every gap would count as a stop, and it was 0 s."""
    n = 80
    near = np.arange(n) % 4 == 3
    columns = (np.arange(1, n + 1) * 1000, np.where(near, 20.0, -21.0),
               1_000_000.0 + np.arange(n) * 100.0, np.where(near, 0.001, 0.4))
    (frames, returns, clock), unknown = curve.near_greedy(columns, 0.01, Path("run"))
    assert unknown == 0 and len(returns) == 20
    np.testing.assert_array_equal(clock, np.arange(3, n, 4) * 100.0)
    assert curve.reach_lines(frames, returns, columns[2], [18.0], clock) == [
        "reach 18: 80,000 frames, 2h11m of run time (20-episode mean)"]


def test_a_window_of_whole_returns_summing_to_the_level_reaches_it():
    # These 20 Pong scores sum to 360: their mean is 18 exactly, which a convolution with
    # weights of 1/20 computes as 17.999999999999996 and so would never call reached.
    window = np.array([15, 20, 15, 16, 17, 17, 18, 21, 19, 15, 16, 17, 21, 18, 21, 18, 20, 18,
                       19, 19], dtype=np.float64)
    assert np.convolve(window, np.ones(20) / 20, mode="valid")[0] < 18.0
    returns = np.concatenate([np.full(30, -21.0), window])
    frames, wall = np.arange(1, 51) * 1000, np.arange(50) * 10.0
    assert curve.trailing_mean(returns)[49] == 18.0
    assert np.isnan(curve.trailing_mean(returns)[18])
    assert curve.reached(frames, returns, wall, 18.0) == (50_000, 490.0)
    assert curve.reach_record(frames, returns, wall, [18.0, 18.5]) == [
        {"level": 18.0, "frames": 50_000, "run_time_s": 490.0},
        {"level": 18.5, "frames": None, "run_time_s": None}]


def _ladder_run_dir(root: Path) -> Path:
    """Six episodes returning 1 .. 6 at frames 100 .. 600; the first two written before
    the run logged epsilons (a run resumed by code that logs them), the others at epsilon
    0.4, 0.01, 0.4, 0.001."""
    run_dir = root / "ladder"
    logger = MetricLogger(str(run_dir), stream=open(os.devnull, "w"))  # noqa: SIM115
    for k, epsilon in enumerate([None, None, 0.4, 0.01, 0.4, 0.001], start=1):
        logger.episode(float(k), 10, 100 * k, epsilon)
    logger.close()
    return run_dir


def test_each_episodes_epsilon_belongs_to_its_return_and_earlier_ones_have_none(tmp_path):
    epsilons = curve.episode_columns(_ladder_run_dir(tmp_path))[3]
    np.testing.assert_allclose(epsilons, [np.nan, np.nan, 0.4, 0.01, 0.4, 0.001], rtol=1e-6)
    assert curve.episode_columns(_run_dir(tmp_path))[3] is None  # a run that logged none


def test_max_epsilon_keeps_the_near_greedy_envs_episodes_and_the_csv_keeps_all(tmp_path,
                                                                              capsys):
    run_dir, csv = _ladder_run_dir(tmp_path), tmp_path / "episodes.csv"
    curve.main([str(run_dir), "--bins", "1", "--max-epsilon", "0.01", "--csv", str(csv)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [
        "episodes at epsilon <= 0.01: 2 (2 of the run's episodes have no epsilon recorded)",
        "2 episodes up to 600 frames"]
    assert lines[4] == "| 0-600 | 2 | 5.00 | 4 | 6 |"  # returns 4 and 6
    rows = csv.read_text().splitlines()
    assert rows[0] == f"{curve.CSV_HEADER},epsilon" and len(rows) == 7
    assert rows[1].startswith("100,1,") and rows[1].endswith(",nan")
    assert rows[4].startswith("400,4,") and rows[4].endswith(",0.01")
    np.testing.assert_array_equal(curve.episode_columns(csv)[3],
                                  [np.nan, np.nan, 0.4, 0.01, 0.4, 0.001])
    curve.main([str(csv), "--bins", "1", "--max-epsilon", "0.01", "--png",
                str(tmp_path / "b.png")])
    assert capsys.readouterr().out.splitlines()[4] == "| 0-600 | 2 | 5.00 | 4 | 6 |"
    # a ladder value as the bound keeps its envs, though tensorboard stored it in float32
    curve.main([str(run_dir), "--bins", "1", "--max-epsilon", "0.4"])
    assert capsys.readouterr().out.splitlines()[0].startswith("episodes at epsilon <= 0.4: 4 ")


def test_max_epsilon_on_a_run_without_epsilons_names_the_agents_that_log_them(tmp_path):
    with pytest.raises(SystemExit, match=r"records no episode/epsilon: --max-epsilon needs a "
                       r"run of an agent with an epsilon per env \(Ape-X, R2D2, SEED-R2D2\)"):
        curve.main([str(_run_dir(tmp_path)), "--max-epsilon", "0.01"])
    with pytest.raises(SystemExit, match=r"no episode of .* was played at epsilon <= 0.0001"):
        curve.main([str(_ladder_run_dir(tmp_path)), "--max-epsilon", "0.0001"])


def test_a_rules_reading_is_the_20_game_mean_at_the_first_episode_past_its_frames():
    frames = np.arange(1, 31) * 100  # 100 .. 3,000
    returns = np.arange(30, dtype=float)  # 0 .. 29
    # first past 2,000 is the 21st episode (2,100; index 20): the mean of 1 .. 20 is 10.5
    assert curve.mean_past(frames, returns, 2000) == (2100, 10.5, 20)
    # only 5 episodes by the first past 400 (500): their mean, 2.0
    assert curve.mean_past(frames, returns, 400) == (500, 2.0, 4)
    assert curve.mean_past(frames, returns, 3000) is None  # none has ended past it yet
    assert curve.mean_past(frames, returns, 2000, window=5) == (2100, 18.0, 20)  # 16 .. 20
