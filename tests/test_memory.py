"""distrl.run.memory and the replay's size check: MemAvailable read from /proc/meminfo, the
bytes a replay holds when full (every preallocated tensor), a replay that cannot fit
refused with the largest capacity that does, and allocation failures turned into one
error that names the setting."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agents import apex, r2d2
from distrl.config import ConfigError
from distrl.replay.sum_tree import empty_tree, tree_nbytes
from distrl.run import memory
from distrl.runners.replay_learner import make_replay, replay_nbytes
from distrl.runners.replay_sources import recurrent_state_size


def test_available_bytes_is_memavailable_not_memfree(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16000 kB\nMemFree:          300 kB\n"
                       "MemAvailable:    2048 kB\nBuffers:           10 kB\n")
    assert memory.available_bytes(meminfo) == 2048 * 1024
    meminfo.write_text("MemTotal:       16000 kB\n")
    assert memory.available_bytes(meminfo) is None
    assert memory.available_bytes(tmp_path / "missing") is None


def test_round_down_keeps_three_significant_digits() -> None:
    assert [memory.round_down(v) for v in (1_537_412, 999, 1_000, 12_345, 7)] == \
        [1_530_000, 999, 1_000, 12_300, 7]


def test_largest_that_fits_is_the_last_value_within_budget() -> None:
    def nbytes(n: int) -> int:
        return 10 * n + 7

    assert memory.largest_that_fits(nbytes, 10**9, 1_000) == 99  # 997 fits, 1,007 does not
    assert memory.largest_that_fits(nbytes, 50, 1_000) == 50  # never above the value asked
    assert memory.largest_that_fits(nbytes, 10**9, 5) == 0


def test_check_fits_names_the_setting_and_the_largest_value_that_fits() -> None:
    memory.check_fits("agent.replay_capacity", 1_000, lambda n: 16 * n, available=16_000)
    with pytest.raises(ConfigError) as error:
        memory.check_fits("agent.replay_capacity", 2_000_000, lambda n: 16 * n,
                          available=20 * 2**20)
    # 32,000,000 bytes; 20 MiB / 16 = 1,310,720 transitions, rounded down
    assert str(error.value) == (
        "agent.replay_capacity=2000000 needs 30.5 MiB when full but this machine has "
        "20.0 MiB available; the largest capacity that fits is 1310000")
    memory.check_fits("agent.replay_capacity", 10**12, lambda n: 16 * n, available=None)


def test_tree_nbytes_is_what_empty_tree_allocates() -> None:
    for capacity in (1, 8, 9, 1_000, 4_097):
        for dtype in (torch.float32, torch.float64):
            tree = empty_tree(capacity, dtype)
            assert tree_nbytes(capacity, dtype) == tree.numel() * tree.element_size()
    # 1,000 leaves: levels of 8, 8, 16, 128 and 1,000 columns, two rows of float64
    assert tree_nbytes(1_000, torch.float64) == 2 * 1_160 * 8


def _apex_parts(capacity: int) -> object:
    return apex.parts(apex.ApexConfig(replay_capacity=capacity, batch_size=32,
                                      learning_starts=100, device="cpu"), "reference")


def test_replay_nbytes_of_transitions_by_hand() -> None:
    """1,000 CartPole transitions: 1,126 frames of 4 float32 (18,016 B), two frame ids,
    an action (int64), a return and a discount (float32) each (32,000 B), and the
    float64 sum tree (18,560 B)."""
    nbytes = replay_nbytes(_apex_parts(1_000), 1_000, (4,), torch.float32, None, 16, 0)
    assert nbytes == 18_016 + 32_000 + 18_560


@pytest.mark.parametrize("agent", ["apex", "r2d2"])
def test_replay_nbytes_counts_every_tensor_the_replay_allocates(agent: str) -> None:
    """The estimate (made on the meta device) equals the bytes of the replay built for
    real, the recurrent states of R2D2's sequences included."""
    if agent == "apex":
        parts, state_size = _apex_parts(500), 0
    else:
        cfg = r2d2.R2D2Config(replay_capacity=200, batch_size=8, learning_starts=50,
                              device="cpu")
        parts = r2d2.parts(cfg, "reference")
        state_size = recurrent_state_size(parts, parts.make_model((4,), 2))
        assert state_size == 2 * cfg.model.lstm_size  # h and c
    capacity = parts.replay.capacity
    replay = make_replay(parts, (4,), torch.float32, None, "reference", 8, state_size)
    tree = replay.sampler.tree.tree
    # Every tensor the storage holds, found by looking, not by its own nbytes() list.
    held = [t for t in vars(replay.storage).values() if isinstance(t, torch.Tensor)]
    stored = sum(t.numel() * t.element_size() for t in held)
    assert replay.storage.nbytes() == stored
    assert replay_nbytes(parts, capacity, (4,), torch.float32, None, 8, state_size) == (
        stored + tree.numel() * tree.element_size())
    if agent == "r2d2":
        assert replay.storage.stored_state.shape == (capacity, state_size)


def test_a_replay_that_cannot_fit_is_refused_before_allocating(
        monkeypatch: pytest.MonkeyPatch) -> None:
    parts = _apex_parts(1_000)
    monkeypatch.setattr(memory, "available_bytes", lambda: 50_000)
    with pytest.raises(ConfigError) as error:
        make_replay(parts, (4,), torch.float32, None, "reference", 16, 0)
    message = str(error.value)
    assert message.startswith("agent.replay_capacity=1000 needs 67.0 KiB when full but this "
                              "machine has 48.8 KiB available; the largest capacity that fits "
                              "is "), message
    fits = int(message.rsplit(" ", 1)[1])

    def nbytes(capacity: int) -> int:
        return replay_nbytes(parts, capacity, (4,), torch.float32, None, 16, 0)

    assert nbytes(fits) <= 50_000 < nbytes(fits + 1)


def test_allocation_failure_becomes_one_error_naming_the_setting() -> None:
    with pytest.raises(ConfigError) as error, memory.allocating(
            "the replay", "agent.replay_capacity=5", 3 * 2**30, "lower agent.replay_capacity"):
        torch.empty(2**60, dtype=torch.uint8)  # more than any machine can reserve
    assert str(error.value) == ("out of memory allocating the replay (agent.replay_capacity=5 "
                                "= 3.0 GiB); lower agent.replay_capacity")
    assert "can't allocate memory" in str(error.value.__cause__)
    with pytest.raises(ConfigError, match=r"^out of memory allocating the slots \(x = 10 B\)"), \
            memory.allocating("the slots", "x", 10, "lower x"):
        raise MemoryError()


def test_other_errors_pass_through_allocating() -> None:
    with pytest.raises(RuntimeError, match="^shape mismatch$"), \
            memory.allocating("the slots", "x", 10, "lower x"):
        raise RuntimeError("shape mismatch")


def test_allocating_more_than_is_available_is_refused_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "available_bytes", lambda: 1_000)
    ran = False
    with pytest.raises(ConfigError) as error, memory.allocating(
            "the unroll slots", "4 slots (distributed.slots)", 2_048, "lower distributed.slots"):
        ran = True
    assert not ran
    assert str(error.value) == (
        "out of memory allocating the unroll slots (4 slots (distributed.slots) = 2.0 KiB, but "
        "this machine has 1000 B available); lower distributed.slots")
