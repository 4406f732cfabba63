"""Tests for distrl/replay/{storage,samplers,buffer}.py.

Frames carry their own global frame id in their bytes, so every rebuilt observation
can be checked exactly against the stream it came from, and a frame that was
overwritten shows up as a wrong id rather than as plausible pixels.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from reference import chi2_quantile, importance_weights_naive

from distrl.replay.buffer import ReplayBuffer
from distrl.replay.samplers import PrioritizedSampler, UniformSampler
from distrl.replay.storage import TransitionStorage, gather_rows
from distrl.types import TransitionBatch

FRAME = (2, 2)  # 4 bytes: room for a frame id below 2^32


def _frame(frame_id: int) -> torch.Tensor:
    return torch.tensor(list(frame_id.to_bytes(4, "little")), dtype=torch.uint8).view(FRAME)


def _frame_ids(frames: torch.Tensor) -> torch.Tensor:
    """[..., 2, 2] uint8 frames -> [...] the ids written into them."""
    b = frames.reshape(*frames.shape[:-2], 4).long()
    return b[..., 0] + (b[..., 1] << 8) + (b[..., 2] << 16) + (b[..., 3] << 24)


class Stream:
    """Batches as an actor sends them: each batch's frames are new ids, transitions take
    4 consecutive frames of the batch as s_t and the 4 starting n=3 later as s_{t+n}."""

    def __init__(self, seed: int = 0) -> None:
        self.next_frame = 0
        self.next_action = 0
        self.rng = np.random.default_rng(seed)
        self.expected: dict[int, tuple[list[int], list[int], int]] = {}  # action -> frame ids

    def batch(self, frames: int) -> TransitionBatch:
        ids = list(range(self.next_frame, self.next_frame + frames))
        self.next_frame += frames
        starts = list(range(0, frames - 7))
        obs = torch.tensor([[s, s + 1, s + 2, s + 3] for s in starts])
        nxt = obs + 3
        actions = torch.arange(self.next_action, self.next_action + len(starts))
        self.next_action += len(starts)
        for a, o, x in zip(actions.tolist(), obs.tolist(), nxt.tolist(), strict=True):
            self.expected[a] = ([ids[i] for i in o], [ids[i] for i in x], a)
        return TransitionBatch(
            frames=torch.stack([_frame(f) for f in ids]), observation_frames=obs,
            next_observation_frames=nxt, actions=actions,
            returns=actions.float() * 0.5, discounts=torch.full((len(starts),), 0.97),
        )


def _check_all_live(storage: TransitionStorage, stream: Stream) -> int:
    oldest, end = storage.live_ids()
    ids = torch.arange(oldest, end)
    fields = storage.gather(ids)
    for k, action in enumerate(fields["actions"].tolist()):
        obs, nxt, _ = stream.expected[action]
        assert _frame_ids(fields["observations"][k]).tolist() == obs
        assert _frame_ids(fields["next_observations"][k]).tolist() == nxt
    assert torch.equal(fields["returns"], fields["actions"].float() * 0.5)
    return len(ids)


# 1. Storage: exact observations after both rings wrap, FIFO eviction.


@pytest.mark.parametrize("capacity, frame_capacity", [(50, 80), (50, 40), (64, 1000)])
def test_storage_rebuilds_exact_observations_after_wrap_around(capacity, frame_capacity):
    storage = TransitionStorage(capacity, FRAME, torch.uint8, frame_stack=4,
                                frame_capacity=frame_capacity)
    stream = Stream()
    rng = np.random.default_rng(1)
    total_left = 0
    for _ in range(60):
        before = set(range(*storage.live_ids()))
        ids, left = storage.add(stream.batch(int(rng.integers(9, 30))))
        after = set(range(*storage.live_ids()))
        # what left is exactly the old ids no longer stored, oldest first
        assert left.tolist() == sorted(before - after)
        assert set(ids.tolist()) <= after
        total_left += len(left)
        live = _check_all_live(storage, stream)
        assert live == len(storage) <= capacity
    assert storage.transitions_written == total_left + len(storage)
    assert storage.frames_written > 3 * min(frame_capacity, capacity)  # both rings wrapped


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32, torch.bool])
@pytest.mark.parametrize("ids_shape", [(7,), (3, 5), (2, 6, 4)])
def test_gather_rows_is_advanced_indexing_of_the_frame_ring(dtype, ids_shape):
    g = torch.Generator().manual_seed(3)
    frames = (torch.rand(40, 6, 5, generator=g) * 255).to(dtype)
    before = frames.clone()
    ids = torch.randint(0, 40, ids_shape, generator=g)
    got = gather_rows(frames, ids)
    assert got.shape == (*ids_shape, 6, 5) and got.dtype == dtype
    assert torch.equal(got, frames[ids])
    got.zero_()  # a copy: the ring keeps its frames
    assert torch.equal(frames, before)


def test_storage_frames_are_stored_once_and_evict_whole_batches():
    storage = TransitionStorage(1000, FRAME, torch.uint8, frame_stack=4, frame_capacity=100)
    stream = Stream()
    for _ in range(3):
        storage.add(stream.batch(40))  # 33 transitions, 40 frames each
    # 120 frames written into 100 rows: the first batch lost frames 0..19 -> it left whole.
    assert storage.frames_written == 120
    assert storage.live_ids() == (33, 99)
    _check_all_live(storage, stream)


def test_vector_observations_have_no_stack_dimension():
    storage = TransitionStorage(10, (3,), torch.float32, frame_stack=None)
    batch = TransitionBatch(
        frames=torch.arange(12.0).view(4, 3), observation_frames=torch.tensor([[0], [1]]),
        next_observation_frames=torch.tensor([[2], [3]]), actions=torch.tensor([1, 0]),
        returns=torch.tensor([1.0, 2.0]), discounts=torch.tensor([0.9, 0.0]),
    )
    ids, _ = storage.add(batch)
    fields = storage.gather(ids)
    assert torch.equal(fields["observations"], torch.tensor([[0.0, 1, 2], [3, 4, 5]]))
    assert torch.equal(fields["next_observations"], torch.tensor([[6.0, 7, 8], [9, 10, 11]]))
    assert fields["discounts"].tolist() == pytest.approx([0.9, 0.0])


def test_atari_bytes_per_transition():
    """Ape-X's memory target: <= 1.2 x 84 x 84 bytes per stored Atari transition (the
    allocation is lazy, so a 1M-transition storage costs nothing until written)."""
    capacity = 1_000_000
    storage = TransitionStorage(capacity, (84, 84), torch.uint8, frame_stack=4)
    sampler = PrioritizedSampler(capacity)
    tree_bytes = sampler.tree.tree.numel() * sampler.tree.tree.element_size()
    per_transition = (storage.nbytes() + tree_bytes) / capacity
    assert per_transition <= 1.2 * 84 * 84, per_transition
    assert per_transition < 2 * 4 * 84 * 84 / 6  # naive storage is over 6x that


# 2. Prioritized sampling: frequencies, IS weights, eviction, write-back.


def _buffer(capacity: int, sampler, frame_capacity: int | None = None) -> ReplayBuffer:
    storage = TransitionStorage(capacity, FRAME, torch.uint8, frame_stack=4,
                                frame_capacity=frame_capacity)
    return ReplayBuffer(storage, sampler)


def test_prioritized_frequencies_and_weights_follow_the_formula():
    alpha, beta, capacity = 0.6, 0.4, 40
    buffer = _buffer(capacity, PrioritizedSampler(capacity, alpha=alpha, beta=beta, epsilon=0.0))
    stream = Stream()
    batch = stream.batch(capacity + 7)  # 40 transitions, ids 0..39
    rng = np.random.default_rng(2)
    td = rng.uniform(0.0, 3.0, capacity)
    td[[3, 17]] = 0.0  # zero TD error and epsilon 0: never drawn
    buffer.add(batch, torch.tensor(td))
    generator = torch.Generator().manual_seed(2)
    counts = np.zeros(capacity)
    for _ in range(300):
        sample = buffer.sample(128, generator)
        counts += np.bincount(sample.indices.numpy(), minlength=capacity)
        # P(i) = p_i^alpha / sum_k p_k^alpha (eq. 1); w_i = (N P(i))^-beta / max_j w_j
        want = importance_weights_naive(td ** alpha, sample.indices.numpy(), beta, capacity)
        np.testing.assert_allclose(sample.weights.numpy(), want, rtol=1e-5)
    assert counts[[3, 17]].sum() == 0
    p = td ** alpha / (td ** alpha).sum()
    positive = p > 0
    expected = counts.sum() * p[positive]
    chi2 = (((counts[positive] - expected) ** 2) / expected).sum()
    assert chi2 < chi2_quantile(int(positive.sum()) - 1), chi2


def test_batch_weights_peak_at_one_and_ignore_an_item_of_priority_zero():
    """Weights are normalised by the batch's largest (seed_rl, Acme, Dopamine), so the
    batch's maximum is exactly 1; an item of priority 0 (an R2D2 sequence with no
    trainable step) is never drawn and changes neither the draws nor the weights."""
    alpha, beta, capacity = 0.6, 0.4, 64
    sampler = PrioritizedSampler(capacity, alpha=alpha, beta=beta, epsilon=1e-6)
    td = np.random.default_rng(5).uniform(0.01, 3.0, 40)
    sampler.add(torch.arange(40), torch.tensor(td))
    ids, weights = sampler.sample(32, (0, 40), torch.Generator().manual_seed(3))
    assert float(weights.max()) == 1.0
    want = importance_weights_naive((td + 1e-6) ** alpha, ids.numpy(), beta, 40)
    np.testing.assert_allclose(weights.numpy(), want, rtol=1e-5)
    sampler.add(torch.tensor([40]), torch.tensor([0.0]))
    after_ids, after_weights = sampler.sample(32, (0, 41), torch.Generator().manual_seed(3))
    assert torch.equal(after_ids, ids)
    assert torch.equal(after_weights, weights)
    draws = torch.cat([sampler.sample(64, (0, 41))[0] for _ in range(200)])
    assert int((draws == 40).sum()) == 0


def test_prioritized_never_draws_an_evicted_transition():
    capacity = 60
    buffer = _buffer(capacity, PrioritizedSampler(capacity), frame_capacity=70)
    stream = Stream()
    generator = torch.Generator().manual_seed(3)
    for step in range(80):
        batch = stream.batch(int(np.random.default_rng(step).integers(9, 25)))
        buffer.add(batch, torch.rand(batch.size, generator=generator) * 5)
        sample = buffer.sample(64, generator)
        assert bool(buffer.storage.is_live(sample.indices).all())
        for k, action in enumerate(sample.actions.tolist()):
            assert _frame_ids(sample.observations[k]).tolist() == stream.expected[action][0]


def test_priority_write_back_skips_transitions_that_left():
    capacity = 30
    buffer = _buffer(capacity, PrioritizedSampler(capacity, alpha=1.0, epsilon=0.0),
                     frame_capacity=200)  # only slot reuse evicts here
    stream = Stream()
    buffer.add(stream.batch(37), torch.ones(30))  # ids 0..29
    sample = buffer.sample(16, torch.Generator().manual_seed(4))
    buffer.add(stream.batch(17), torch.full((10,), 2.0))  # ids 30..39 reuse slots 0..9
    kept = buffer.update_priorities(sample.indices, torch.full((16,), 100.0))
    stale = sample.indices < 10
    assert kept == int((~stale).sum())
    priorities = buffer.sampler.tree.priorities()
    assert torch.all(priorities[:10] == 2.0)  # the newcomers keep their own priorities
    for i in sample.indices[~stale].tolist():
        assert priorities[i] == 100.0


def test_beta_anneals_linearly():
    sampler = PrioritizedSampler(10, beta=0.4, beta_final=1.0, beta_steps=100)
    assert sampler.current_beta() == 0.4
    sampler.samples = 25
    assert sampler.current_beta() == pytest.approx(0.55)
    sampler.samples = 1000
    assert sampler.current_beta() == 1.0
    assert PrioritizedSampler(10, beta=0.4).current_beta() == 0.4


def test_each_draw_advances_beta_and_its_weights_use_it():
    """Priorities 1 and 3 (alpha 1): P = 1/4, 3/4, N = 2, so w = (2 P)^-beta is 2^beta and
    (2/3)^beta before the batch's largest divides them. A batch of 8 stratified draws holds
    both items. beta goes 0 -> 1 over 2 draws, each draw's weights taking the beta of the
    draws before it: 0, then 0.5, then 1."""
    sampler = PrioritizedSampler(2, alpha=1.0, beta=0.0, beta_final=1.0, beta_steps=2,
                                 epsilon=0.0)
    sampler.add(torch.arange(2), torch.tensor([1.0, 3.0]))
    for draws, beta in ((0, 0.0), (1, 0.5), (2, 1.0)):
        assert sampler.samples == draws
        ids, weights = sampler.sample(8, (0, 2), torch.Generator().manual_seed(draws))
        assert ids.bincount(minlength=2).tolist() == [2, 6]
        want = {0: 1.0, 1: (1 / 3) ** beta}  # 2^beta / 2^beta and (2/3)^beta / 2^beta
        assert weights.tolist() == pytest.approx([want[i] for i in ids.tolist()])
    assert sampler.samples == 3


def test_epsilon_is_added_to_every_positive_priority_before_the_exponent():
    sampler = PrioritizedSampler(4, alpha=0.5, epsilon=0.5)
    sampler.add(torch.arange(3), torch.tensor([1.5, 0.0, 3.5]))
    # (1.5 + 0.5)^0.5, priority 0 stays 0 (never drawn), (3.5 + 0.5)^0.5
    assert sampler.tree.priorities()[:3].tolist() == pytest.approx([2 ** 0.5, 0.0, 2.0])


def test_uniform_sampler_draws_only_live_ids_evenly():
    capacity = 25
    buffer = _buffer(capacity, UniformSampler(capacity), frame_capacity=200)
    stream = Stream()
    for _ in range(4):
        buffer.add(stream.batch(17))  # 10 transitions each: ids 0..39, live 15..39
    assert buffer.storage.live_ids() == (15, 40)
    counts = np.zeros(40)
    generator = torch.Generator().manual_seed(5)
    for _ in range(200):
        sample = buffer.sample(100, generator)
        assert torch.all(sample.weights == 1)
        counts += np.bincount(sample.indices.numpy(), minlength=40)
    assert counts[:15].sum() == 0
    expected = counts.sum() / 25
    chi2 = (((counts[15:] - expected) ** 2) / expected).sum()
    assert chi2 < 51.2  # chi-square 0.999 quantile, 24 degrees of freedom (exact: 51.18)


# 3. Checkpoint round trip.


@pytest.mark.parametrize("kind", ["prioritized", "uniform"])
def test_buffer_round_trips_through_a_checkpoint_bit_exactly(kind):
    def make() -> ReplayBuffer:
        sampler = PrioritizedSampler(50) if kind == "prioritized" else UniformSampler(50)
        return _buffer(50, sampler, frame_capacity=90)

    buffer = make()
    stream = Stream()
    generator = torch.Generator().manual_seed(6)
    for _ in range(12):
        batch = stream.batch(20)
        buffer.add(batch, torch.rand(batch.size, generator=generator))
    sample = buffer.sample(8, generator)
    buffer.update_priorities(sample.indices, torch.rand(8, generator=generator))
    saved = io.BytesIO()
    torch.save(buffer.state_dict(), saved)
    saved.seek(0)
    restored = make()
    restored.load_state_dict(torch.load(saved))
    written = min(buffer.storage.frames_written, buffer.storage.frame_capacity)
    assert torch.equal(buffer.storage.frames[:written], restored.storage.frames[:written])
    for name in ("observation_ids", "next_observation_ids", "actions", "returns", "discounts"):
        assert torch.equal(getattr(buffer.storage, name), getattr(restored.storage, name))
    for _ in range(3):
        g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
        a, b = buffer.sample(16, g1), restored.sample(16, g2)
        for name in ("indices", "observations", "next_observations", "weights", "returns"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        batch = stream.batch(15)
        buffer.add(batch, torch.ones(batch.size))
        restored.add(batch, torch.ones(batch.size))


def test_state_of_another_size_is_refused():
    state = _buffer(50, UniformSampler(50)).state_dict()
    with pytest.raises(ValueError, match="capacity 50 in the state does not match this "
                                         "storage's 60"):
        _buffer(60, UniformSampler(60)).load_state_dict(state)


# 4. Bad input.


@pytest.mark.parametrize("kwargs, message", [
    ({"alpha": 1.5}, r"alpha must lie in \[0, 1\], got 1.5"),
    ({"beta": -0.1}, r"beta must lie in \[0, 1\], got -0.1"),
    ({"beta_final": 2}, r"beta_final must lie in \[0, 1\], got 2"),
    ({"beta_steps": -1}, "beta_steps must be an int >= 0, got -1"),
])
def test_sampler_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PrioritizedSampler(10, **kwargs)


def test_storage_and_buffer_arguments():
    with pytest.raises(ValueError, match="capacity must be an int >= 1, got 0"):
        TransitionStorage(0, FRAME, torch.uint8, 4)
    with pytest.raises(ValueError, match="frame_stack must be an int >= 1, got 0"):
        TransitionStorage(5, FRAME, torch.uint8, 0)
    with pytest.raises(ValueError, match="sampler capacity 9 must equal the storage capacity 10"):
        _buffer(10, UniformSampler(9))
    buffer = _buffer(10, PrioritizedSampler(10))
    with pytest.raises(ValueError, match="cannot sample from an empty replay buffer"):
        buffer.sample(4)
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        buffer.sample(0)
    stream = Stream()
    with pytest.raises(ValueError, match="does not fit a storage of"):
        buffer.add(stream.batch(25))  # 18 transitions > 10
    bad = stream.batch(12)
    bad.frames = bad.frames.float()
    with pytest.raises(ValueError, match=r"frames must be \[M, 2, 2\] torch.uint8"):
        buffer.add(bad)
    with pytest.raises(ValueError, match=r"priorities must be \[5\]"):
        buffer.add(stream.batch(12), torch.ones(3))
    with pytest.raises(ValueError, match="priorities must be finite and >= 0"):
        buffer.add(stream.batch(12), torch.tensor([1.0, 1, 1, 1, -1]))
