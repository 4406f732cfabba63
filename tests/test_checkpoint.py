"""Tests for distrl.checkpoint: atomic save (no temp file, old checkpoints untouched when a
write fails), pruning, resolve, clear CheckpointError messages, and the RNG round trip."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from distrl import checkpoint
from distrl.checkpoint import (
    CHECKPOINT_PATTERN,
    CheckpointError,
    list_checkpoints,
    load,
    resolve,
    rng_state,
    save,
    set_rng_state,
)


def _state(step: int) -> dict:
    return {"format": 1, "step": step, "weights": torch.arange(6.0) * step}


def _step_of(path: Path) -> int:
    match = CHECKPOINT_PATTERN.match(path.name)
    assert match is not None, path.name
    return int(match.group(1))


def _contents(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.fixture(autouse=True)
def _restore_global_rng():
    """The RNG tests reseed the global generators; leave them as they were."""
    state = rng_state()
    yield
    set_rng_state(state)


def test_save_writes_one_named_file_and_no_temp_file(tmp_path: Path) -> None:
    path = save(_state(5), tmp_path / "ckpts", step=5)
    assert path.parent == tmp_path / "ckpts"
    assert path.name == "checkpoint-000000000005.pt"  # zero-padded: names sort like steps
    assert _step_of(path) == 5
    assert [p.name for p in (tmp_path / "ckpts").iterdir()] == [path.name]
    state = load(path)
    assert state["step"] == 5 and torch.equal(state["weights"], torch.arange(6.0) * 5)


def test_keep_prunes_the_oldest(tmp_path: Path) -> None:
    for step in (1, 2, 3, 10):
        save(_state(step), tmp_path, step=step, keep=2)
    assert [_step_of(p) for p in list_checkpoints(tmp_path)] == [3, 10]
    save(_state(11), tmp_path, step=11, keep=1)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-000000000011.pt"]


def test_list_checkpoints_sorts_by_step_and_ignores_other_files(tmp_path: Path) -> None:
    for name in ("checkpoint-10.pt", "checkpoint-9.pt", "checkpoint-100.pt",
                 ".checkpoint-abc.tmp", "checkpoint-7.pt.bak", "notes.txt"):
        (tmp_path / name).write_bytes(b"x")
    # Numeric order: a string sort would put 10 and 100 before 9.
    assert [p.name for p in list_checkpoints(tmp_path)] == [
        "checkpoint-9.pt", "checkpoint-10.pt", "checkpoint-100.pt"
    ]
    assert list_checkpoints(tmp_path / "missing") == []


@pytest.mark.parametrize("step", [3, 2], ids=["new-step", "same-step"])
@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_a_failed_save_leaves_existing_checkpoints_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException, step: int
) -> None:
    save(_state(1), tmp_path, step=1, keep=2)
    save(_state(2), tmp_path, step=2, keep=2)
    before = _contents(tmp_path)
    seen_during_write = []

    def write_some_bytes_then_fail(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")
        f.flush()
        seen_during_write.append(_contents(tmp_path))
        raise error

    monkeypatch.setattr(checkpoint.torch, "save", write_some_bytes_then_fail)
    with pytest.raises(type(error)):
        save(_state(step), tmp_path, step=step, keep=2)
    # Mid-write, the bytes went to a hidden temp file beside the checkpoints, not to
    # checkpoint-<step>.pt (which for step 2 would have clobbered a good checkpoint).
    (during,) = seen_during_write
    temps = [name for name in during if name not in before]
    assert len(temps) == 1 and temps[0].startswith(".checkpoint-"), during.keys()
    assert during[temps[0]] == b"PK\x03\x04 half a checkpoint"
    assert {k: v for k, v in during.items() if k in before} == before
    # Afterwards: no temp file, no new checkpoint, 1 and 2 neither pruned nor changed.
    assert _contents(tmp_path) == before
    assert load(tmp_path)["step"] == 2


def test_load_of_a_truncated_or_garbage_file_says_resume_and_the_path(tmp_path: Path) -> None:
    truncated = save(_state(4), tmp_path, step=4)
    data = truncated.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    garbage = tmp_path / "checkpoint-5.pt"
    garbage.write_bytes(b"this is not a checkpoint at all")
    empty = tmp_path / "checkpoint-6.pt"
    empty.write_bytes(b"")
    for path in (truncated, garbage, empty):
        with pytest.raises(CheckpointError) as info:
            load(path)
        message = str(info.value)
        assert message.startswith("resume: cannot read checkpoint"), message
        assert str(path) in message


@pytest.mark.parametrize("foreign", [{"a": 1}, [1, 2, 3], torch.zeros(2)])
def test_load_of_a_foreign_torch_file(tmp_path: Path, foreign: object) -> None:
    path = tmp_path / "model.pt"
    torch.save(foreign, path)
    with pytest.raises(CheckpointError, match="is not a distrl checkpoint") as info:
        load(path)
    assert str(path) in str(info.value) and "resume" in str(info.value)


def test_load_of_a_missing_path(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="resume: checkpoint '.*nope.pt' does not exist"):
        load(tmp_path / "nope.pt")
    with pytest.raises(CheckpointError, match="resume: no checkpoint-\\*.pt found in directory"):
        load(tmp_path)


def test_resolve_picks_the_newest(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    for step in (3, 12, 7):
        save(_state(step), run_dir / "checkpoints", step=step, keep=5)
    newest = run_dir / "checkpoints" / "checkpoint-000000000012.pt"
    assert resolve(run_dir) == newest
    assert resolve(run_dir / "checkpoints") == newest
    assert load(run_dir)["step"] == 12
    # An explicit file is taken as given, even an older one.
    older = run_dir / "checkpoints" / "checkpoint-000000000007.pt"
    assert resolve(older) == older
    # checkpoints/ wins over checkpoint files lying in the run directory itself.
    save(_state(99), run_dir, step=99)
    assert resolve(run_dir) == newest
    flat = tmp_path / "flat"
    save(_state(4), flat, step=4)
    assert resolve(flat) == flat / "checkpoint-000000000004.pt"


def _draw() -> tuple[list[float], list[float], list[float]]:
    return (torch.rand(3).tolist(), np.random.rand(3).tolist(),
            [random.random() for _ in range(3)])


def test_rng_state_round_trip(tmp_path: Path) -> None:
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    _draw()
    state = rng_state()
    expected = _draw()
    other = _draw()
    assert other != expected  # the streams moved on
    set_rng_state(state)
    assert _draw() == expected
    # ... also after a trip through a checkpoint file.
    save({"format": 1, "rng": state}, tmp_path, step=1)
    _draw()
    set_rng_state(load(tmp_path)["rng"])
    assert _draw() == expected


def test_save_never_prunes_the_checkpoint_it_just_wrote(tmp_path: Path) -> None:
    for step in (10, 12):
        save(_state(step), tmp_path, step=step, keep=2)
    path = save(_state(8), tmp_path, step=8, keep=2)
    assert path.exists()
    assert load(path)["step"] == 8
