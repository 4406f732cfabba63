"""The console progress: the plain line's content for a hand-made report, the choice
between a live bar and plain lines (log.progress), and its config error."""

from __future__ import annotations

import dataclasses
import io
import math
from types import SimpleNamespace
from typing import Any

import pytest
from fake_meter import fixed_meter

from distrl.config import ConfigError, LogConfig
from distrl.telemetry.progress import (
    ProgressDisplay,
    ProgressReport,
    choose_mode,
    duration_text,
    format_line,
)

REPORT = ProgressReport(
    frames=120_000, total_frames=5_000_000, fps=28_900.0, cpu_busy=1.94, cores=2.0,
    memory_bytes=1.2 * 2**30,
    split={"env": 41.0, "forward": 22.0, "learn": 30.0, "copy": 7.0},
    bound="learner x2.3",
    extra={"perf/updates_per_s": 46.25, "learner/updates": 183,
           "episode/mean_return_20": 3.1})


def test_the_plain_line_shows_progress_speed_time_to_go_cpu_memory_split_and_bound():
    # 4,880,000 frames to go at 28,900 frames/s: 168.9 s
    assert format_line(REPORT) == (
        "[distrl] frames=120000/5000000 (2.4%) fps=28900 eta=2m49s cpu=1.9/2 mem=1.2GiB "
        "time=env 41% fwd 22% learn 30% copy 7% bound=learner x2.3 updates_per_s=46.25 "
        "updates=183 mean_return_20=3.1")


def test_the_line_before_anything_is_measured():
    start = ProgressReport(frames=0, total_frames=1000, fps=0.0)
    assert format_line(start) == ("[distrl] frames=0/1000 (0.0%) fps=0 eta=? cpu=? mem=? "
                                  "time=? bound=?")
    done = ProgressReport(frames=1040, total_frames=1000, fps=50.0)
    assert "frames=1040/1000 (100.0%)" in format_line(done) and "eta=0s" in format_line(done)


@pytest.mark.parametrize("seconds, text", [(0.4, "0s"), (45, "45s"), (168.9, "2m49s"),
                                           (3600 * 3 + 7 * 60 + 20, "3h07m"),
                                           (math.nan, "?"), (math.inf, "?")])
def test_time_to_go_text(seconds, text):
    assert duration_text(seconds) == text


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_mode_bar_only_on_an_interactive_terminal(monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    assert choose_mode("auto", _Terminal()) == "bar"
    assert choose_mode("auto", io.StringIO()) == "lines"  # a log file, a pipe, CI
    assert choose_mode("lines", _Terminal()) == "lines"  # forced plain lines
    assert choose_mode("bar", io.StringIO()) == "bar"
    monkeypatch.setenv("TERM", "dumb")
    assert choose_mode("auto", _Terminal()) == "lines"
    closed = io.StringIO()
    closed.close()
    assert choose_mode("auto", closed) == "lines"


def test_a_bad_progress_setting_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match=r"^log\.progress must be one of auto, bar, lines; "
                                          r"got 'fancy'$"):
        LogConfig(progress="fancy")
    with pytest.raises(ValueError, match="log.progress must be one of"):
        choose_mode("fancy", io.StringIO())


def test_lines_mode_prints_one_line_per_report_and_nothing_between():
    out = io.StringIO()
    display = ProgressDisplay("lines", out, 5_000_000)
    display.tick(60_000)
    display.show(REPORT)
    display.tick(130_000)
    display.close()
    assert out.getvalue() == format_line(REPORT) + "\n"


def test_bar_mode_draws_the_panel():
    out = io.StringIO()
    display = ProgressDisplay("bar", out, 5_000_000)
    display.show(REPORT)
    display.close()
    text = out.getvalue()
    assert "frames 120,000 / 5,000,000 (2.4%)" in text and "eta 2m49s" in text
    assert "bound learner x2.3" in text and "cpu 1.9 of 2 cores" in text


def test_the_eta_takes_the_speed_since_the_process_started_where_it_is_known():
    # 4,880,000 frames to go: at 20,000 frames/s since the start, 244 s, whatever this
    # report's own speed; without it, at the report's 28,900 frames/s, 169 s
    assert format_line(dataclasses.replace(REPORT, fps=0.0, average_fps=20_000.0)).startswith(
        "[distrl] frames=120000/5000000 (2.4%) fps=0 eta=4m04s ")
    assert REPORT.eta_s == pytest.approx(4_880_000 / 28_900)


def reporter_at(monkeypatch, times: list[float]) -> tuple[Any, list[ProgressReport]]:
    """A loop.Reporter of a 10,000-frame run whose reports come at ``times`` (monotonic
    seconds), and the reports it shows."""
    from distrl.training import loop

    shown: list[ProgressReport] = []
    meter = fixed_meter()
    reporter = loop.Reporter(
        SimpleNamespace(add_many=lambda scalars: None, write=lambda frames, line: None,
                        mean_recent_return=lambda n: math.nan),
        SimpleNamespace(throughput=lambda span: {}, report=lambda span: ({}, {})),
        SimpleNamespace(updates=0), meter, 10_000, None,
        SimpleNamespace(show=shown.append))
    clock = iter(times)
    monkeypatch.setattr(loop.time, "monotonic", lambda: next(clock))
    return reporter, shown


def test_the_reporter_gives_the_eta_the_frames_per_s_since_the_process_started(monkeypatch):
    """Two reports 10 s apart after a resume at 1,000 frames at 100 s: 1,000 frames in the
    first, none in the second (a replay run between its actors' bursts). The second's
    frames/s and ETA are at 1,000 frames over 20 s, 50 frames/s: 8,000 frames left, 160 s,
    not the report's own 0."""
    reporter, shown = reporter_at(monkeypatch, [110.0, 120.0])
    mark = reporter(2_000, (1_000, 0, 100.0), math.nan)
    reporter(2_000, mark, math.nan)
    assert [report.fps for report in shown] == [100.0, 50.0]
    assert [report.average_fps for report in shown] == [100.0, 50.0]
    assert shown[1].eta_s == pytest.approx(8_000 / 50.0)


def test_the_line_shows_the_frames_per_s_of_the_last_five_minutes(monkeypatch):
    """Resumed at 1,000 frames at 100 s; reports at 200 s (11,000 frames), 400 s (no new
    frames) and 700 s (41,000). At 400 s the window reaches back to the start: 10,000
    frames over 300 s; at 700 s to the report of 400 s: 30,000 frames over 300 s, 100
    frames/s, where the run's average since its start is 40,000 over 600 s."""
    reporter, shown = reporter_at(monkeypatch, [200.0, 400.0, 700.0])
    mark = (1_000, 0, 100.0)
    for frames in (11_000, 11_000, 41_000):
        mark = reporter(frames, mark, math.nan)
    assert [report.fps for report in shown] == pytest.approx([100.0, 10_000 / 300, 100.0])
    assert shown[2].average_fps == pytest.approx(40_000 / 600)
