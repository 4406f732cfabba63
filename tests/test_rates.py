"""benchmarks/rates.py: a run's frames/s and updates/s between two clock times, from its
``learner/updates`` reports, on event files written with hand-set wall times."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import rates  # noqa: E402

# 2026-12-03 15:00:00 UTC
T0 = dt.datetime(2026, 12, 3, 15, 0, tzinfo=dt.timezone.utc).timestamp()


def _attempt(run_dir: Path, first: int, reports: int, start_wall: float,
             frames_per_report: int, updates_per_report: int) -> None:
    """One attempt's event file: a report every 10 s; the frames grow by
    ``frames_per_report`` every other report (a replay actor's bursts)."""
    writer = SummaryWriter(str(run_dir), filename_suffix=f".{first}")
    for k in range(reports):
        frames = (first + k // 2) * frames_per_report
        writer.add_scalar(rates.UPDATES_TAG, (first + k) * updates_per_report,
                          global_step=frames, walltime=start_wall + 10 * k)
    writer.close()


@pytest.fixture
def run_dir(tmp_path):
    run_dir = tmp_path / "apex-Pong-s0"
    # attempt 1: 15:00:00-15:09:50 (60 reports); attempt 2 from 16:00:00 (30 reports)
    _attempt(run_dir, 0, 60, T0, 2000, 3)
    _attempt(run_dir, 60, 30, T0 + 3600, 2000, 3)
    return run_dir


def test_a_clock_window_gives_the_differences_over_its_first_and_last_report(run_dir, capsys):
    # 15:01:00 .. 15:05:00: reports 6 .. 30, frames 3 x 2000 .. 15 x 2000, updates 18 .. 90
    rates.main([str(run_dir), "--from", "15:01", "--to", "15:05"])
    row = capsys.readouterr().out.splitlines()[2]
    assert row == ("| apex-Pong-s0 | 2026-12-03 15:01:00 | 2026-12-03 15:05:00 | 240 | 100 | "
                   "0.300 | 25 (13) |")


def test_without_a_window_the_newest_attempt_alone(run_dir):
    measured = rates.run_rates(run_dir, None, None)
    assert measured.start.wall == T0 + 3600 and measured.end.wall == T0 + 3600 + 290
    assert measured.updates_per_s == pytest.approx(29 * 3 / 290)
    assert measured.reports == 30


def test_an_iso_window_across_the_gap_between_attempts(run_dir):
    measured = rates.run_rates(run_dir, "2026-12-03T15:09:00", "2026-12-03T16:00:10")
    # from report 54 (15:09:00) to report 61 (16:00:10): 7 updates of 3 in 3,070 s
    assert measured.seconds == 3070 and measured.end.updates - measured.start.updates == 21


def test_a_window_with_one_report_names_the_run_and_its_span(run_dir):
    with pytest.raises(SystemExit, match=r"apex-Pong-s0 has fewer than two reports between "
                       r"2026-12-03 15:30:00 and 2026-12-03 15:40:00 UTC \(its reports: "
                       r"2026-12-03 15:00:00 to 2026-12-03 16:04:50\)"):
        rates.run_rates(run_dir, "15:30", "15:40")


def test_a_time_that_is_not_one_is_refused():
    with pytest.raises(SystemExit, match=r"'25:00' is not a time"):
        rates.clock_time("25:00", dt.date(2026, 12, 3))


def test_an_archived_run_is_read_from_its_kept_compressed_events(run_dir, tmp_path):
    """A finished run's archive holds its events xz-compressed in events/ (carry.py): the
    same figures as from the run directory."""
    import lzma

    kept = tmp_path / "archive" / run_dir.name / "events"
    kept.mkdir(parents=True)
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        (kept / f"{path.name}.xz").write_bytes(lzma.compress(path.read_bytes()))
    archived = rates.run_rates(kept.parent, "15:01", "16:02")
    direct = rates.run_rates(run_dir, "15:01", "16:02")
    assert (archived.start, archived.end, archived.reports) == (
        direct.start, direct.end, direct.reports)
    assert archived.reports == 54 + 13  # 15:01:00-15:09:50 and 16:00:00-16:02:00


def test_a_directory_without_events_is_named(tmp_path):
    with pytest.raises(SystemExit, match=r"rates: .*empty holds no tensorboard event file"):
        rates.run_rates(tmp_path / "empty", None, None)
