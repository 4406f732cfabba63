"""Tests for distrl.run.checkpoint: atomic save (no temp file, old checkpoints untouched when a
write fails), pruning, resolve, clear CheckpointError messages, the RNG round trip, and
self-verification: the checksum record, damaged and truncated files refused, resume of a
run directory falling back to the newest intact checkpoint without touching any file,
non-finite learner weights refused; and one IMPALA run resumed past a damaged checkpoint."""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

from distrl.run import checkpoint
from distrl.run.checkpoint import (
    CHECKPOINT_PATTERN,
    RECORD_BYTES,
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


# ---------------------------------------------------------------- self-verification


def _flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _learner_state(step: int, weight: torch.Tensor | None = None) -> dict:
    """A checkpoint laid out as the runners write it (Learner.state_dict under "learner")."""
    model = OrderedDict(
        [("torso.0.weight", torch.ones(2, 3) * step),
         ("head.bias", torch.zeros(2) if weight is None else weight),
         ("steps", torch.tensor([7]))])
    optimizer = {"state": {0: {"square_avg": torch.ones(2, 3)}}, "param_groups": [{"lr": 0.1}]}
    return {"format": 1, "step": step,
            "learner": {"model": model, "optimizer": optimizer, "scheduler": {}, "updates": step}}


def test_save_ends_the_file_with_the_sha256_and_length_of_the_torch_payload(
    tmp_path: Path
) -> None:
    path = save(_state(3), tmp_path, step=3)
    data = path.read_bytes()
    payload, record = data[:-RECORD_BYTES], data[-RECORD_BYTES:]
    assert record == (b"\ndistrl-sha256 " + hashlib.sha256(payload).hexdigest().encode()
                      + b" bytes " + b"%020d" % len(payload) + b"\n")
    assert payload[-22:-18] == b"PK\x05\x06"  # the payload is the whole torch zip archive
    # torch.load itself reads past the record: a checkpoint is still a plain torch file.
    assert torch.equal(torch.load(path, weights_only=False)["weights"], torch.arange(6.0) * 3)
    assert checkpoint.verify(path) is True


def test_flipped_bytes_are_refused_by_the_checksum(tmp_path: Path) -> None:
    path = save(_state(4), tmp_path, step=4)
    _flip_middle_byte(path)
    with pytest.raises(CheckpointError) as info:
        load(path)
    assert str(info.value) == (
        f"resume: cannot read checkpoint '{path}': checksum mismatch: the file is damaged")


# Cut exactly before its record (-RECORD_BYTES), a file is a complete torch archive, as a
# checkpoint written before checksums: it loads unverified, its payload whole.
@pytest.mark.parametrize("keep_bytes", [0, 100, -RECORD_BYTES - 1, -1])
def test_a_truncated_checkpoint_is_refused_with_its_length(tmp_path: Path,
                                                             keep_bytes: int) -> None:
    path = save(_state(4), tmp_path, step=4)
    data = path.read_bytes()
    path.write_bytes(data[:keep_bytes])
    n = len(data[:keep_bytes])
    with pytest.raises(CheckpointError) as info:
        load(path)
    assert str(info.value) == (
        f"resume: cannot read checkpoint '{path}': truncated or damaged: {n} bytes and no "
        "checksum record at its end")


def test_a_record_that_does_not_match_the_length_is_refused(tmp_path: Path) -> None:
    path = save(_state(4), tmp_path, step=4)
    data = path.read_bytes()
    path.write_bytes(data[:10] + data[11:])  # one byte lost inside the payload
    n = len(data) - 1 - RECORD_BYTES
    with pytest.raises(CheckpointError) as info:
        load(path)
    assert str(info.value) == (
        f"resume: cannot read checkpoint '{path}': damaged: {n} bytes before its checksum "
        f"record, which says {n + 1}")


def test_a_checkpoint_written_before_checksums_still_loads(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "checkpoint-000000000002.pt"
    torch.save(_state(2), path)  # what save wrote before the checksum record
    assert checkpoint.verify(path) is False
    assert load(tmp_path)["step"] == 2
    assert capsys.readouterr().out == (
        f"[distrl] resume: {path} has no checksum (written before distrl wrote them); "
        "loading it unverified\n")


def test_resume_of_a_run_directory_skips_a_damaged_newest_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    directory = tmp_path / "run" / "checkpoints"
    for step in (1, 2, 3, 4):
        save(_state(step), directory, step=step, keep=4)
    newest, truncated = directory / "checkpoint-000000000004.pt", directory / (
        "checkpoint-000000000003.pt")
    _flip_middle_byte(newest)
    truncated.write_bytes(truncated.read_bytes()[:1000])
    before = _contents(directory)
    mtimes = {p.name: p.stat().st_mtime_ns for p in directory.iterdir()}

    state = load(tmp_path / "run")
    assert state["step"] == 2 and state.path == directory / "checkpoint-000000000002.pt"
    assert capsys.readouterr().out == (
        f"[distrl] resume: skipped {newest}: checksum mismatch: the file is damaged\n"
        f"[distrl] resume: skipped {truncated}: truncated or damaged: 1000 bytes and no "
        "checksum record at its end\n"
        f"[distrl] resume: resuming from {state.path}, the newest intact checkpoint\n")
    # Verifying only reads: every file byte-identical, none renamed, touched or deleted.
    assert _contents(directory) == before
    assert {p.name: p.stat().st_mtime_ns for p in directory.iterdir()} == mtimes
    # resolve still names the newest by name (the run directory is its parent's parent).
    assert resolve(tmp_path / "run") == newest


def test_resume_of_a_damaged_file_is_one_error_without_fallback(tmp_path: Path) -> None:
    save(_state(1), tmp_path, step=1)
    damaged = save(_state(2), tmp_path, step=2)
    _flip_middle_byte(damaged)
    before = _contents(tmp_path)
    with pytest.raises(CheckpointError) as info:
        load(damaged)  # the user named this file: no other is taken instead
    assert str(info.value) == (
        f"resume: cannot read checkpoint '{damaged}': checksum mismatch: the file is damaged")
    assert _contents(tmp_path) == before


def test_a_run_directory_with_no_intact_checkpoint_lists_every_refusal(tmp_path: Path) -> None:
    first = save(_state(1), tmp_path, step=1)
    second = save(_state(2), tmp_path, step=2)
    first.write_bytes(b"")
    _flip_middle_byte(second)
    before = _contents(tmp_path)
    with pytest.raises(CheckpointError) as info:
        load(tmp_path)
    assert str(info.value) == (
        f"resume: no intact checkpoint in '{tmp_path}': checkpoint-000000000002.pt: checksum "
        "mismatch: the file is damaged; checkpoint-000000000001.pt: truncated or damaged: 0 "
        "bytes and no checksum record at its end")
    assert _contents(tmp_path) == before


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_learner_weights_are_refused_naming_the_parameter(
    tmp_path: Path, capsys: pytest.CaptureFixture, bad: float
) -> None:
    save(_learner_state(1), tmp_path, step=1)
    diverged = save(_learner_state(2, torch.tensor([0.5, bad])), tmp_path, step=2)
    assert checkpoint.verify(diverged)  # written by save: its checksum is valid
    with pytest.raises(CheckpointError) as info:
        load(diverged)
    assert str(info.value) == (
        f"resume: checkpoint '{diverged}' holds non-finite weights: learner.model.head.bias "
        "has NaN or inf (its run had diverged; resume from an earlier checkpoint)")
    # A run directory skips it like a damaged file.
    assert load(tmp_path)["step"] == 1
    assert capsys.readouterr().out.splitlines()[0] == (
        f"[distrl] resume: skipped {diverged}: non-finite weights in learner.model.head.bias")


def test_non_finite_optimizer_state_or_target_network_is_refused(tmp_path: Path) -> None:
    state = _learner_state(1)
    state["learner"]["optimizer"]["state"][0]["square_avg"][1, 2] = float("nan")
    path = save(state, tmp_path, step=1)
    with pytest.raises(CheckpointError, match=r"learner\.optimizer\.state\.0\.square_avg has"):
        load(path)
    state = {**_learner_state(2), "loss": {"target": OrderedDict(w=torch.tensor([float("inf")]))}}
    path = save(state, tmp_path, step=2)
    with pytest.raises(CheckpointError, match=r"loss\.target\.w has NaN or inf"):
        load(path)


def test_first_non_finite_walks_nested_state_in_order() -> None:
    tree = {"a": [torch.ones(2), (torch.tensor([1, 2]), torch.tensor([float("nan")]))],
            "b": torch.tensor([float("inf")])}
    assert checkpoint.first_non_finite(tree, "x") == "x.a.1.1"
    assert checkpoint.first_non_finite({"n": torch.tensor([3]), "f": 1.5}, "x") is None


def test_a_resumed_run_prunes_the_abandoned_newer_checkpoint_first(tmp_path: Path) -> None:
    """A run resumed from 20 because 30 was damaged: its next save keeps 20 and itself,
    not the damaged 30 (which a later resume would skip anyway)."""
    for step in (10, 20, 30):
        save(_state(step), tmp_path, step=step, keep=2)
    assert [_step_of(p) for p in list_checkpoints(tmp_path)] == [20, 30]
    save(_state(21), tmp_path, step=21, keep=2)
    assert [_step_of(p) for p in list_checkpoints(tmp_path)] == [20, 21]
    save(_state(22), tmp_path, step=22, keep=2)
    assert [_step_of(p) for p in list_checkpoints(tmp_path)] == [21, 22]
    # Two abandoned ones and room for one of them: the highest goes.
    for step in (40, 50):
        save(_state(step), tmp_path, step=step, keep=3)
    assert [_step_of(p) for p in list_checkpoints(tmp_path)] == [22, 40, 50]
    save(_state(23), tmp_path, step=23, keep=3)
    assert [_step_of(p) for p in list_checkpoints(tmp_path)] == [22, 23, 40]


def test_each_prefix_keeps_its_own_newest(tmp_path: Path) -> None:
    """A learner rank's replay shards and the checkpoints share a folder; saving one
    prunes only its own kind, each to its newest ``keep``."""
    for step in (1, 2):
        save(_state(step), tmp_path, step=step, keep=2)
    for step in (1, 2, 3):
        save({"format": 1, "counters": {}}, tmp_path, step=step, keep=2,
             prefix=checkpoint.shard_prefix(1))
    assert [_step_of(p) for p in list_checkpoints(tmp_path)] == [1, 2]
    shards = list_checkpoints(tmp_path, checkpoint.shard_prefix(1))
    assert [p.name for p in shards] == [f"{checkpoint.shard_prefix(1)}-{step:012d}.pt"
                                        for step in (2, 3)]
    save(_state(3), tmp_path, step=3, keep=2)
    assert [_step_of(p) for p in list_checkpoints(tmp_path)] == [2, 3]
    assert list_checkpoints(tmp_path, checkpoint.shard_prefix(1)) == shards


def test_a_damaged_replay_shard_is_named(tmp_path: Path) -> None:
    save(_state(5), tmp_path, step=5)
    shard = save({"format": 1, "counters": {}}, tmp_path, step=5,
                 prefix=checkpoint.shard_prefix(1))
    assert checkpoint.load_shard(tmp_path, 5, 1)["counters"] == {}
    _flip_middle_byte(shard)
    with pytest.raises(CheckpointError) as info:
        checkpoint.load_shard(tmp_path, 5, 1)
    assert str(info.value) == (f"resume: learner rank 1's replay shard '{shard}' cannot be "
                               "read: checksum mismatch: the file is damaged")


def test_impala_resumes_past_a_damaged_newest_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """End to end: a short IMPALA run checkpoints after every update, its newest
    checkpoint is damaged, ``resume=<run dir>`` says it skipped it, resumes from the
    one before and finishes the frame budget."""
    from presets import compose_run

    from agents import impala

    def config() -> object:
        cfg = compose_run(tmp_path, "run", "agent=impala", "env=CartPole", "total_frames=2560",
                          "distributed.actors=0", "agent.batch_size=32",
                          "agent.unroll_length=20", "distributed.envs_per_actor=32",
                          "distributed.env_groups=1")
        cfg.checkpoint.interval_s = 1e-6  # after every update
        return cfg

    first = impala.run(config())
    directory = Path(first["run_dir"]) / "checkpoints"
    assert first["updates"] == 4
    assert [_step_of(p) for p in list_checkpoints(directory)] == [3, 4]  # keep=2
    newest = directory / "checkpoint-000000000004.pt"
    _flip_middle_byte(newest)
    capsys.readouterr()

    cfg = config()
    cfg.resume = first["run_dir"]  # the same run directory: its lock was released
    resumed = impala.run(cfg)
    out = capsys.readouterr().out
    assert (f"[distrl] resume: skipped {newest}: checksum mismatch: the file is damaged\n"
            f"[distrl] resume: resuming from {directory / 'checkpoint-000000000003.pt'}, "
            "the newest intact checkpoint\n") in out
    assert resumed["updates"] == 4 and resumed["frames"] == 2560  # one more update
    assert load(resumed["checkpoint"])["learner"]["updates"] == 4  # rewritten, intact
    assert not (Path(first["run_dir"]) / "distrl.lock").exists()
