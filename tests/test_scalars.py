"""benchmarks/scalars.py: a run's tensorboard scalars, their means in bins of env frames,
from a run directory or from its archive's xz-compressed event files."""

from __future__ import annotations

import lzma
import sys
from pathlib import Path

import numpy as np
import pytest
from torch.utils.tensorboard import SummaryWriter

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import scalars  # noqa: E402
import suite  # noqa: E402

# (frames, entropy) of two attempts, each its own event file: the first wrote two points
# past its last checkpoint (at 400 frames), which the second, resumed from it, purges
FIRST = [(100, 1.0), (200, 3.0), (500, 50.0), (600, 60.0)]
SECOND = [(500, 10.0), (600, 20.0), (1000, 30.0)]


def _attempt(run_dir: Path, points: list[tuple[int, float]], suffix: str,
             purge_step: int | None = None) -> Path:
    writer = SummaryWriter(str(run_dir), filename_suffix=suffix, purge_step=purge_step)
    for frames, value in points:
        writer.add_scalar("policy/entropy", value, global_step=frames)
        writer.add_scalar("episode/length", 2 * value, global_step=frames)
    writer.close()
    return next(run_dir.glob(f"events.out.tfevents.*{suffix}"))


def _run(root: Path) -> Path:
    run_dir = root / "appo-BattleZone-s0"
    _attempt(run_dir, FIRST, ".1")
    _attempt(run_dir, SECOND, ".2", purge_step=400)
    return run_dir


def test_bins_hold_the_mean_of_their_points_over_every_attempt(tmp_path):
    """Bins of 0-500 and 500-1,000 frames: (1 + 3) / 2 = 2; the point at 500, on the edge,
    goes to the second bin with the last one, at its closed end: (10 + 20 + 30) / 3 = 20,
    the first attempt's purged 50 and 60 left out."""
    table = scalars.table([_run(tmp_path)], ["policy/entropy", "episode/length"], 2, 1000)
    lines = table.splitlines()
    assert lines[0] == "| run | tag | 0-500 | 500-1,000 |"
    assert "| appo-BattleZone-s0 | policy/entropy | 2 | 20 |" in lines
    assert "| appo-BattleZone-s0 | episode/length | 4 | 40 |" in lines


def test_an_empty_bin_is_a_dash_and_the_bins_end_at_the_last_step_by_default(tmp_path):
    """Without --frames the bins split 0-1,000 (the last step): 0-250 holds 1 and 3,
    250-500 nothing, 500-750 10 and 20, 750-1,000 30."""
    table = scalars.table([_run(tmp_path)], ["policy/entropy"], 4, None)
    assert "| appo-BattleZone-s0 | policy/entropy | 2 | — | 15 | 30 |" in table.splitlines()


def test_an_archive_reads_as_its_run(tmp_path):
    """A finished run's archive keeps its event files xz-compressed under ``events/``."""
    run_dir = _run(tmp_path / "runs")
    archive = tmp_path / "archive" / run_dir.name
    (archive / suite.KEPT_EVENTS).mkdir(parents=True)
    for path in suite.event_files(run_dir):
        packed = archive / suite.KEPT_EVENTS / f"{path.name}.xz"
        packed.write_bytes(lzma.compress(path.read_bytes()))
    tags = ["policy/entropy"]
    assert scalars.table([archive], tags, 2, 1000) == scalars.table([run_dir], tags, 2, 1000)


def test_a_tag_the_run_never_wrote_is_refused_with_the_tags_it_did(tmp_path):
    with pytest.raises(SystemExit, match=r"has no policy/entropyy; its tags: episode/length, "
                                         r"policy/entropy$"):
        scalars.table([_run(tmp_path)], ["policy/entropyy"], 2, None)


def test_binned_means_against_a_hand_computed_case():
    edges = np.array([0.0, 10.0, 20.0])
    steps = np.array([0, 9, 10, 20, 25])  # 25 lies past the last edge: left out
    values = np.array([1.0, 2.0, 4.0, 8.0, 100.0])
    assert scalars.binned_means(steps, values, edges) == [1.5, 6.0]


def test_a_mean_from_100_up_is_written_whole_and_below_it_to_3_digits():
    assert [scalars.value_text(m) for m in (25_261.4, 100.0, 2.0666, -0.00512, float("nan"))] \
        == ["25,261", "100", "2.07", "-0.00512", "—"]


def test_a_curve_reads_a_resumed_run_as_tensorboard_does_and_a_throughput_every_event(
        tmp_path):
    """The first attempt's two points past the checkpoint its successor resumed from are
    dropped when the files are read as one run, kept when each is read on its own (rates.py:
    that work was done, in clock time)."""
    files = suite.event_files(_run(tmp_path))
    as_run = suite.read_scalars(files, as_one_run=True)["policy/entropy"]
    each = suite.read_scalars(files, as_one_run=False)["policy/entropy"]
    assert [(e.step, e.value) for e in as_run] == [(100, 1.0), (200, 3.0), *SECOND]
    assert sorted(e.value for e in each) == sorted(v for _, v in FIRST + SECOND)
