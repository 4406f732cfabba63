"""Tests for distrl.transport.weights: versioned publish / pull_if_newer, buffers carried,
the seqlock (no load while a write is in progress, retry when the buffer changes under a
read), and a store shared with a spawned process."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from distrl.transport.weights import WeightStore


def _model(seed: int) -> nn.Module:
    """Linear -> BatchNorm -> Linear: parameters plus float (and int) buffers."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    with torch.no_grad():
        bn = model[1]
        bn.weight.copy_(torch.rand(4) + 0.5)
        bn.bias.copy_(torch.randn(4))
        bn.running_mean.copy_(torch.randn(4))
        bn.running_var.copy_(torch.rand(4) + 0.5)
    return model


def _float_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {
        k: v.detach().clone() for k, v in model.state_dict().items() if v.dtype.is_floating_point
    }


def _assert_same_floats(model: nn.Module, expected: dict[str, torch.Tensor]) -> None:
    state = _float_state(model)
    assert state.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.equal(state[name], value), name


def _checksum(model: nn.Module) -> list[float]:
    """Position-weighted sums, so a permuted or shifted copy gives other numbers."""
    out = []
    for value in _float_state(model).values():
        flat = value.double().flatten()
        out.append(float((flat * torch.arange(1, flat.numel() + 1, dtype=torch.float64)).sum()))
    return out


def test_models_differ() -> None:
    # The tests below compare copies; they mean something only if the sources differ.
    a, b = _float_state(_model(0)), _float_state(_model(1))
    assert all(not torch.equal(a[k], b[k]) for k in a)


def test_pull_returns_none_unless_newer() -> None:
    source, target = _model(0), _model(1)
    target_before = _float_state(target)
    store = WeightStore(source)
    assert store.version == 0
    assert store.pull_if_newer(target, have_version=0) is None
    _assert_same_floats(target, target_before)  # nothing was loaded

    newer = _model(2)
    store.publish(newer, version=3)
    assert store.version == 3
    for have in (3, 4):
        assert store.pull_if_newer(target, have_version=have) is None
        _assert_same_floats(target, target_before)
    assert store.pull_if_newer(target, have_version=2) == 3
    _assert_same_floats(target, _float_state(newer))


def test_publish_copies_then_later_changes_do_not_leak() -> None:
    source, target = _model(0), _model(1)
    store = WeightStore(source)
    store.publish(source, version=1)
    published = _float_state(source)
    with torch.no_grad():
        source[0].weight.add_(1.0)  # the learner keeps training after publishing
    assert store.pull_if_newer(target, have_version=0) == 1
    _assert_same_floats(target, published)


@pytest.mark.parametrize("version", [0, 2, -1])
def test_publish_requires_an_increasing_version(version: int) -> None:
    store = WeightStore(_model(0))
    store.publish(_model(1), version=2)
    with pytest.raises(ValueError, match=rf"version must increase: {version} <= 2"):
        store.publish(_model(2), version=version)
    assert store.version == 2


def test_a_snapshot_published_flat_into_another_store_carries_the_weights() -> None:
    """A learner's snapshot (version, flat weights) is what an actor-only rank's store
    publishes as it is: pulled from there it gives the learner's weights. The snapshot is a
    copy, None unless newer; the version may stay equal but never go back."""
    learner_store, rank_store = WeightStore(_model(0)), WeightStore(_model(1))
    trained = _model(2)
    learner_store.publish(trained, version=5)
    assert learner_store.snapshot(have_version=5) is None
    version, flat = learner_store.snapshot(have_version=4)
    assert version == 5 and flat.data_ptr() != learner_store.flat.data_ptr()
    rank_store.publish_flat(flat, version)
    target = _model(3)
    assert rank_store.version == 5 and rank_store.pull_if_newer(target, have_version=0) == 5
    _assert_same_floats(target, _float_state(trained))
    rank_store.publish_flat(flat, 5)  # the same version again: allowed
    with pytest.raises(ValueError, match=r"version must not decrease: 4 < 5"):
        rank_store.publish_flat(flat, 4)
    assert rank_store.version == 5


def test_float_buffers_are_carried_and_int_buffers_are_not() -> None:
    source, target = _model(0), _model(1)
    with torch.no_grad():
        source[1].running_mean.copy_(torch.tensor([1.5, -2.0, 3.25, 0.0]))
        source[1].running_var.copy_(torch.tensor([0.5, 2.0, 4.0, 8.0]))
    source[1].num_batches_tracked.fill_(7)
    store = WeightStore(source)
    store.publish(source, version=1)
    assert store.pull_if_newer(target, have_version=0) == 1
    assert torch.equal(target[1].running_mean, torch.tensor([1.5, -2.0, 3.25, 0.0]))
    assert torch.equal(target[1].running_var, torch.tensor([0.5, 2.0, 4.0, 8.0]))
    # Only floating-point tensors live in the store (module docstring).
    assert int(target[1].num_batches_tracked) == 0
    n_float = sum(v.numel() for v in _float_state(source).values())
    # Linear(3, 4): 12 + 4; BatchNorm1d(4): weight, bias, mean, var 4 each; Linear(4, 2): 8 + 2.
    assert store.flat.numel() == n_float == (12 + 4) + 4 * 4 + (8 + 2)


def test_no_load_while_a_write_is_in_progress() -> None:
    store = WeightStore(_model(0))
    store.publish(_model(2), version=1)
    target = _model(1)
    before = _float_state(target)
    store.sequence.fill_(3)  # the writer is half-way through version 2
    with torch.no_grad():
        store.flat.fill_(123.0)  # ... and the buffer holds a torn mixture
    assert store.version == 1  # a write in progress reports the previous version
    assert store.pull_if_newer(target, have_version=0, retries=5) is None
    _assert_same_floats(target, before)


def test_reader_retries_when_the_buffer_changes_during_its_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = WeightStore(_model(0))
    store.publish(_model(2), version=1)
    newer = _model(3)
    target = _model(1)
    real_clone = store.flat.clone
    calls = []

    def clone_during_a_write() -> torch.Tensor:
        calls.append(int(store.sequence.item()))
        snapshot = real_clone()
        if len(calls) == 1:
            # A writer ran while we copied: our snapshot is torn (half old, half garbage)
            # and by now version 2 is complete.
            snapshot[snapshot.numel() // 2 :] = float("nan")
            store.publish(newer, version=2)
        return snapshot

    monkeypatch.setattr(store.flat, "clone", clone_during_a_write)
    assert store.pull_if_newer(target, have_version=0) == 2
    assert calls == [2, 4]  # one torn copy thrown away, one clean copy of version 2
    _assert_same_floats(target, _float_state(newer))


def _pull_in_child(store: WeightStore, results: mp.Queue, go: mp.Event) -> None:
    """Child process: pull, report (version, checksum), wait for the parent, pull again."""
    torch.set_num_threads(1)
    model = _model(10)
    version = store.pull_if_newer(model, have_version=0)
    results.put((version, _checksum(model)))
    if not go.wait(timeout=60):
        return
    results.put((store.pull_if_newer(model, have_version=version), _checksum(model)))


@pytest.mark.dist
def test_a_spawned_process_pulls_what_the_parent_publishes() -> None:
    ctx = mp.get_context("spawn")
    store = WeightStore(_model(0), shared=True)
    assert store.flat.is_shared() and store.sequence.is_shared()
    first, second = _model(1), _model(2)
    store.publish(first, version=3)
    results, go = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_pull_in_child, args=(store, results, go), daemon=True)
    child.start()
    try:
        assert results.get(timeout=60) == (3, _checksum(first))
        # Published after the child started: only shared memory can carry it there.
        store.publish(second, version=4)
        go.set()
        assert results.get(timeout=60) == (4, _checksum(second))
        child.join(timeout=30)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
        child.join(timeout=10)
