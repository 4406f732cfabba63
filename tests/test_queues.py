"""Tests for distrl.transport.queues: sentinel-filled slots, the free/full index round trip,
gather's column order and copy semantics, and slots shared with a spawned process."""

from __future__ import annotations

import itertools
import queue
import threading

import fake_clock
import pytest
import torch
import torch.multiprocessing as mp

from distrl.transport import queues
from distrl.transport.queues import FieldSpec, SlotPool, sentinel_for

# T and E differ so a transpose of the wrong axes changes shapes, not just values.
T, E, F, H = 3, 2, 4, 5


def _specs() -> dict[str, FieldSpec]:
    return {
        "obs": FieldSpec((T + 1, E, F), torch.float32),
        "actions": FieldSpec((T, E), torch.int64),
        "frames": FieldSpec((T, E, F), torch.uint8),
        "dones": FieldSpec((T, E), torch.bool),
        "versions": FieldSpec((T, E), torch.int32),
        "state": FieldSpec((E, H), torch.float64, time_major=False),
    }


def _code(slot: int, *index: int) -> int:
    """A value that names where it was written: slot, then each index as a digit."""
    value = slot + 1
    for i in index:
        value = value * 10 + i
    return value


def _fill(pool: SlotPool, slot: int) -> None:
    """Write ``_code(slot, t, e, f)`` into every element of ``slot`` (mod 256 for uint8)."""
    for buffer in pool.buffers.values():
        view = buffer[slot]
        for idx in itertools.product(*map(range, view.shape)):
            value = _code(slot, *idx)
            view[idx] = value % 256 if view.dtype == torch.uint8 else value


def test_sentinel_values() -> None:
    assert torch.isnan(torch.tensor(sentinel_for(torch.float32)))
    assert sentinel_for(torch.int64) == -1
    assert sentinel_for(torch.int32) == -1
    assert sentinel_for(torch.uint8) == 255
    assert sentinel_for(torch.bool) is False


def test_fresh_buffers_are_sentinel_filled() -> None:
    pool = SlotPool(_specs(), num_slots=3)
    b = pool.buffers
    assert b["obs"].shape == (3, T + 1, E, F) and b["state"].shape == (3, E, H)
    assert b["obs"].dtype == torch.float32 and b["state"].dtype == torch.float64
    assert torch.isnan(b["obs"]).all() and torch.isnan(b["state"]).all()
    assert (b["actions"] == -1).all() and (b["versions"] == -1).all()
    assert b["frames"].dtype == torch.uint8 and (b["frames"] == 255).all()
    assert not b["dones"].any()


def test_num_slots_must_be_positive() -> None:
    with pytest.raises(ValueError, match="num_slots must be positive, got 0"):
        SlotPool(_specs(), num_slots=0)


def test_acquire_commit_take_release_round_trip() -> None:
    pool = SlotPool(_specs(), num_slots=3)
    acquired = [pool.acquire(timeout=1.0)[0] for _ in range(3)]
    assert sorted(acquired) == [0, 1, 2]
    with pytest.raises(queue.Empty):
        pool.acquire(timeout=0.01)  # every slot is out
    # The learner sees full slots in commit order, not index order.
    for index in (acquired[2], acquired[0], acquired[1]):
        pool.commit(index)
    taken, _ = pool.take(2, timeout=1.0)
    assert taken == [acquired[2], acquired[0]]
    pool.release(taken)
    assert sorted(pool.acquire(timeout=1.0)[0] for _ in range(2)) == sorted(taken)
    assert pool.take(1, timeout=1.0)[0] == [acquired[1]]
    with pytest.raises(queue.Empty):
        pool.take(1, timeout=0.01)


def test_acquire_and_take_report_the_seconds_they_waited_on_their_clock(monkeypatch) -> None:
    """The learner's and actors' wait counters are what the pool's clock read between
    the call and its return: 0 when a slot was there, the time until a commit otherwise."""
    clock = fake_clock.install(monkeypatch, queues, start=10.0)
    pool = SlotPool(_specs(), num_slots=1)
    index, waited = pool.acquire(timeout=1.0)
    assert waited == 0.0  # a free slot was there
    clock.read.clear()

    def commit_later() -> None:
        clock.read.wait()  # take() has started and read its clock
        clock.advance(2.5)
        pool.commit(index)

    committer = threading.Thread(target=commit_later)
    committer.start()
    try:
        taken, waited = pool.take(1, timeout=5.0)
    finally:
        committer.join()
    assert taken == [index]
    assert waited == 2.5


@pytest.mark.parametrize("order", [[1, 3], [3, 1]])
def test_gather_concatenates_slots_column_wise(order: list[int]) -> None:
    pool = SlotPool(_specs(), num_slots=4)
    for slot in range(4):
        _fill(pool, slot)
    batch = pool.gather(order)
    k = len(order)
    assert batch["obs"].shape == (T + 1, k * E, F)
    assert batch["actions"].shape == (T, k * E)
    assert batch["frames"].shape == (T, k * E, F)
    assert batch["state"].shape == (k * E, H)
    assert {name: t.dtype for name, t in batch.items()} == {
        name: spec.dtype for name, spec in _specs().items()
    }
    # Column j of the batch is column j % E of slot order[j // E]: slot a's, then slot b's.
    for j in range(k * E):
        slot, e = order[j // E], j % E
        for t in range(T + 1):
            for f in range(F):
                assert batch["obs"][t, j, f] == _code(slot, t, e, f)
        for t in range(T):
            assert batch["actions"][t, j] == _code(slot, t, e)
            assert batch["versions"][t, j] == _code(slot, t, e)
            for f in range(F):
                assert batch["frames"][t, j, f] == _code(slot, t, e, f) % 256
        for h in range(H):
            assert batch["state"][j, h] == _code(slot, e, h)


def test_gather_returns_a_copy() -> None:
    pool = SlotPool(_specs(), num_slots=2)
    for slot in range(2):
        _fill(pool, slot)
    batch = pool.gather([0, 1])
    before = {name: t.clone() for name, t in batch.items()}
    for buffer in pool.buffers.values():
        buffer.fill_(0)  # the slot is released and an actor overwrites it
    for name, t in batch.items():
        assert torch.equal(t, before[name]), name
    single = pool.gather([1])
    pool.buffers["actions"][1].fill_(7)
    assert (single["actions"] == 0).all()


def _write_pattern(pool: SlotPool, report: mp.Queue) -> None:
    """Child process: check the slot is fresh, write a known pattern, commit it."""
    index, _ = pool.acquire(timeout=30)
    fresh = bool(torch.isnan(pool.buffers["obs"][index]).all()) and bool(
        (pool.buffers["actions"][index] == -1).all()
    )
    _fill(pool, index)
    pool.commit(index)
    report.put((index, fresh))


@pytest.mark.dist
def test_slots_are_shared_with_a_spawned_process() -> None:
    ctx = mp.get_context("spawn")
    pool = SlotPool(_specs(), num_slots=2, mp_context=ctx)
    assert all(buffer.is_shared() for buffer in pool.buffers.values())
    assert not any(b.is_shared() for b in SlotPool(_specs(), num_slots=2).buffers.values())
    report = ctx.Queue()
    child = ctx.Process(target=_write_pattern, args=(pool, report), daemon=True)
    child.start()
    try:
        taken, _ = pool.take(1, timeout=60)
        index, fresh = report.get(timeout=60)
        assert fresh, "the child saw a slot that was not sentinel-filled"
        assert taken == [index]
        expected = SlotPool(_specs(), num_slots=2)
        _fill(expected, index)
        for name, buffer in pool.buffers.items():
            assert torch.equal(buffer[index], expected.buffers[name][index]), name
        # The other slot was never touched by anyone.
        assert torch.isnan(pool.buffers["obs"][1 - index]).all()
        child.join(timeout=30)
        assert child.exitcode == 0
    finally:
        if child.is_alive():
            child.kill()
        child.join(timeout=10)
