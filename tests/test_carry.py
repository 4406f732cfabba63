"""benchmarks/carry.py: a checkpoint carried in byte planes comes back byte for byte, packs
smaller than its words in place, and a carry saved before byte planes is repacked without
losing the carry in place when its bytes do not match. The harness around it (a run stopped
on one machine, resumed on another) is tested in test_reproduce.py."""

from __future__ import annotations

import json
import lzma
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import carry  # noqa: E402
import suite  # noqa: E402


def float_weights(count: int, seed: int = 0) -> bytes:
    """float32 values of a trained layer's scale: random mantissas, few exponents."""
    return np.random.default_rng(seed).normal(0, 0.05, count).astype(np.float32).tobytes()


def stopped_run(run_dir: Path, checkpoint: bytes) -> Path:
    (run_dir / "checkpoints").mkdir(parents=True)
    path = run_dir / "checkpoints" / "checkpoint-000000000042.pt"
    path.write_bytes(checkpoint)
    (run_dir / "events.out.tfevents.1.vm.1.0").write_bytes(b"event records " * 50)
    return path


def carried(archive_run: Path) -> dict:
    return json.loads((archive_run / carry.CARRY / carry.MANIFEST).read_text())


def test_byte_planes_hold_each_words_bytes_together_and_invert():
    words = bytes(range(10))  # two words and a 2-byte tail
    assert carry._to_planes(words) == bytes([0, 4, 1, 5, 2, 6, 3, 7, 8, 9])
    assert carry._from_planes(carry._to_planes(words)) == words


@pytest.mark.parametrize("tail", [0, 3])
def test_a_checkpoint_comes_back_byte_for_byte_across_chunks(tmp_path, monkeypatch, tail):
    monkeypatch.setattr(carry, "_CHUNK", 64)  # 16 chunks and a short last one
    checkpoint = float_weights(256) + b"\x07" * tail
    original = stopped_run(tmp_path / "a", checkpoint)
    carry.save(tmp_path / "a", tmp_path / "archive", frames=42)
    entry = carried(tmp_path / "archive")["files"]["checkpoints/" + original.name]
    assert entry["byte_planes"] == 64 and entry["bytes"] == len(checkpoint)
    stored = lzma.decompress((tmp_path / "archive" / carry.CARRY / f"{original.name}.xz")
                             .read_bytes())
    assert stored[:64] == carry._to_planes(checkpoint[:64]) != checkpoint[:64]

    carry.restore(tmp_path / "archive", tmp_path / "b")
    assert (tmp_path / "b" / "checkpoints" / original.name).read_bytes() == checkpoint
    assert [p.read_bytes() for p in suite.event_files(tmp_path / "b")] == [b"event records " * 50]


def test_float32_weights_pack_smaller_in_byte_planes(tmp_path):
    """The reason for the layout: xz finds the exponent bytes' repeats only side by side."""
    source = tmp_path / "weights.pt"
    source.write_bytes(float_weights(1 << 18))  # 1 MiB
    plain = carry._compress(source, tmp_path / "plain.xz")
    planes = carry._compress(source, tmp_path / "planes.xz", byte_planes=True)
    assert plain["sha256"] == planes["sha256"]
    assert planes["stored_bytes"] < 0.95 * plain["stored_bytes"]


def saved_in_place(tmp_path: Path, checkpoint: bytes, monkeypatch) -> Path:
    """A carry as written before byte planes: the checkpoint's words as they are."""
    stopped_run(tmp_path / "a", checkpoint)
    plain = carry._compress

    def unplaned(source, target, byte_planes=False):
        return plain(source, target)

    monkeypatch.setattr(carry, "_compress", unplaned)
    carry.save(tmp_path / "a", tmp_path / "archive", frames=42)
    monkeypatch.setattr(carry, "_compress", plain)
    return tmp_path / "archive"


def test_repack_puts_an_older_carry_in_byte_planes_with_the_same_bytes(tmp_path, monkeypatch):
    checkpoint = float_weights(1 << 18)
    archive_run = saved_in_place(tmp_path, checkpoint, monkeypatch)
    before = carried(archive_run)
    name = before["checkpoint"]
    assert "byte_planes" not in before["files"][name]

    assert carry.main(["repack", str(archive_run)]) == 0
    after = carried(archive_run)
    assert after["files"][name]["byte_planes"] == carry._CHUNK
    assert after["files"][name]["sha256"] == before["files"][name]["sha256"]
    assert after["files"][name]["stored_bytes"] < before["files"][name]["stored_bytes"]
    assert {k: v for k, v in after.items() if k != "files"} == \
        {k: v for k, v in before.items() if k != "files"}
    assert sorted(p.name for p in archive_run.iterdir()) == [carry.CARRY]  # no leftovers
    carry.restore(archive_run, tmp_path / "b")
    assert (tmp_path / "b" / name).read_bytes() == checkpoint
    assert "in byte planes already" in carry.repack(archive_run)


def test_repack_of_a_damaged_carry_fails_and_keeps_it_as_it_was(tmp_path, monkeypatch, capsys):
    archive_run = saved_in_place(tmp_path, float_weights(4096), monkeypatch)
    packed = next((archive_run / carry.CARRY).glob("checkpoint-*.pt.xz"))
    original = lzma.decompress(packed.read_bytes())
    packed.write_bytes(lzma.compress(bytes([original[0] ^ 1]) + original[1:]))
    before = {p.name: p.read_bytes() for p in (archive_run / carry.CARRY).iterdir()}

    assert carry.main(["repack", str(archive_run)]) == 1
    assert f"carry: {packed}: {len(original)} bytes with sha256" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in (archive_run / carry.CARRY).iterdir()} == before
    assert sorted(p.name for p in archive_run.iterdir()) == [carry.CARRY]


def test_a_finished_run_keeps_every_attempts_events_and_loses_its_carry(tmp_path):
    """The events of a carried attempt (restored into the run directory) and of the last
    one, both kept compressed; an older kept set is replaced, not added to."""
    run_dir, archive_run = tmp_path / "a", tmp_path / "archive"
    stopped_run(run_dir, float_weights(64))
    carry.save(run_dir, archive_run, frames=42)
    (run_dir / "events.out.tfevents.2.vm.2.0").write_bytes(b"last attempt " * 30)
    (archive_run / carry.KEPT_EVENTS).mkdir()
    (archive_run / carry.KEPT_EVENTS / "events.out.tfevents.0.vm.0.0.xz").write_bytes(b"old")

    line = carry.keep_events(run_dir, archive_run)

    assert line == (f"2 event file(s) kept in {archive_run / carry.KEPT_EVENTS} (0.0 MiB), "
                    "its carry deleted")
    assert not (archive_run / carry.CARRY).exists()
    kept = suite.archived_event_files(archive_run)
    assert [p.name for p in kept] == ["events.out.tfevents.1.vm.1.0.xz",
                                      "events.out.tfevents.2.vm.2.0.xz"]
    assert [lzma.decompress(p.read_bytes()) for p in kept] == [
        b"event records " * 50, b"last attempt " * 30]
