"""Tests for distrl/replay/writers.py: n-step transitions (Ape-X, Horgan et al. 2018).

A hand-computed episode pins the formula and the episode-end rule; multi-env streams with
flushes in between are checked against ``n_step_transitions_naive`` in tests/reference.py;
stacked Atari-like frames are rebuilt exactly and stored once; a checkpoint continues
exactly; bad arguments raise named errors.
"""

from __future__ import annotations

import io
import re

import pytest
import torch
from reference import n_step_transitions_naive

from distrl.replay.frames import rebuild_observations
from distrl.replay.writers import NStepWriter
from distrl.types import TransitionBatch


def _add(writer: NStepWriter, actions, rewards, observations, terminated, truncated=None) -> None:
    """One batched step from Python lists (observations may already be a tensor)."""
    num_envs = len(actions)
    writer.add(
        torch.tensor(actions, dtype=torch.int64),
        torch.tensor(rewards, dtype=torch.float32),
        torch.as_tensor(observations),
        torch.tensor(terminated, dtype=torch.bool),
        torch.tensor([False] * num_envs if truncated is None else truncated, dtype=torch.bool),
    )


def _check_batch(batch: TransitionBatch, stack: int) -> None:
    """Dtypes and shapes of TransitionBatch; every frame row in range and referenced."""
    k = batch.size
    assert batch.observation_frames.dtype == torch.int64
    assert batch.next_observation_frames.dtype == torch.int64
    assert batch.observation_frames.shape == batch.next_observation_frames.shape == (k, stack)
    assert batch.actions.dtype == torch.int64 and batch.actions.shape == (k,)
    assert batch.returns.dtype == torch.float32 and batch.returns.shape == (k,)
    assert batch.discounts.dtype == torch.float32 and batch.discounts.shape == (k,)
    used = torch.cat([batch.observation_frames, batch.next_observation_frames]).unique()
    assert used.tolist() == list(range(batch.frames.shape[0]))  # self-contained, no extra rows


def _f32(x: float) -> float:
    return torch.tensor(x, dtype=torch.float32).item()


# ------------------------------------------------------------------ 1. hand-computed


def test_hand_computed_episode_that_ends_mid_window() -> None:
    # n = 3, gamma = 1/2, one env; s_t = [t, 10t]; rewards 1..5; step 4 (the fifth) ends
    # the episode and returns the next episode's first observation [100, 1000].
    def obs(t: int) -> list[float]:
        return [float(t), 10.0 * t]

    writer = NStepWriter(num_envs=1, n=3, discount=0.5, frame_stack=None)
    writer.begin(torch.tensor([obs(0)]))
    pending = []
    for t in range(5):
        ended = t == 4
        _add(writer, [10 + t], [float(t + 1)], [[100.0, 1000.0] if ended else obs(t + 1)],
             [ended])
        pending.append(writer.pending())
    assert pending == [1, 2, 2, 2, 0]

    batch = writer.flush()
    _check_batch(batch, 1)
    # t=0: 1 + 0.5*2 + 0.25*3 = 2.75, full window, gamma^3 = 0.125, next s_3
    # t=1: 2 + 0.5*3 + 0.25*4 = 4.5,  full window, 0.125, next s_4
    # t=2: 3 + 0.5*4 + 0.25*5 = 6.25, a full window whose third step ended the episode: 0
    # t=3: 4 + 0.5*5 = 6.5, 0;  t=4: 5, 0; the next observation of a discount-0 one is s_t
    assert batch.returns.tolist() == [2.75, 4.5, 6.25, 6.5, 5.0]
    assert batch.discounts.tolist() == [0.125, 0.125, 0.0, 0.0, 0.0]
    assert batch.actions.tolist() == [10, 11, 12, 13, 14]
    observations, next_observations = rebuild_observations(batch, None)
    assert observations.tolist() == [obs(0), obs(1), obs(2), obs(3), obs(4)]
    assert next_observations.tolist() == [obs(3), obs(4), obs(2), obs(3), obs(4)]
    assert observations.dtype == torch.float32
    # s_0 .. s_4 once each; the next episode's first observation is not referenced yet.
    assert batch.frames.tolist() == [obs(0), obs(1), obs(2), obs(3), obs(4)]
    assert writer.flush() is None


# ------------------------------------------------------------------ 2. against the naive


def _keyed(batches: list[TransitionBatch], frame_stack: int | None, key_of) -> list:
    """(key, observation, action, return, discount, next_observation) in flush order."""
    out = []
    for batch in batches:
        observations, next_observations = rebuild_observations(batch, frame_stack)
        for i in range(batch.size):
            out.append((key_of(observations[i]), observations[i], int(batch.actions[i]),
                        float(batch.returns[i]), float(batch.discounts[i]),
                        next_observations[i]))
    return out


def _ended(kind: str | None) -> bool | str:
    """The naive reference's ``ended``: True (termination), "trunc" or False."""
    return {"term": True, "trunc": "trunc", None: False}[kind]


def _assert_matches_naive(transitions: list, naive: dict) -> None:
    keys = [t[0] for t in transitions]
    # Emission order: by step, then env, then time.
    assert keys == sorted(naive, key=lambda key: (naive[key][5], key[0], key[1]))
    for key, observation, action, return_, discount, next_observation in transitions:
        n_obs, n_action, n_return, n_discount, n_next, _ = naive[key]
        assert torch.equal(observation, torch.as_tensor(n_obs)), key
        assert action == n_action, key
        assert return_ == _f32(n_return), key
        assert discount == _f32(n_discount), key
        assert torch.equal(next_observation, torch.as_tensor(n_next)), key


def test_two_envs_with_interleaved_flushes_match_the_naive_transitions() -> None:
    # Env 0: episodes of 2, 4, 1, 3 steps; env 1: 5, 2 (truncated), 3. s = [env, step].
    ends = {0: {1: "term", 5: "term", 6: "term", 9: "term"},
            1: {4: "term", 6: "trunc", 9: "term"}}
    n, gamma, num_steps = 3, 0.9, 10
    writer = NStepWriter(num_envs=2, n=n, discount=gamma, frame_stack=None)
    writer.begin(torch.tensor([[0.0, 0.0], [1.0, 0.0]]))
    episodes: list[list] = [[], []]
    batches = []
    for t in range(num_steps):
        actions = [(t + env) % 4 for env in range(2)]
        rewards = [(t + 1) * (env + 2) - 0.3 for env in range(2)]
        for env in range(2):
            episodes[env].append(((float(env), float(t)), actions[env], _f32(rewards[env]),
                                  _ended(ends[env].get(t))))
        _add(writer, actions, rewards, [[float(env), t + 1.0] for env in range(2)],
             [ends[env].get(t) == "term" for env in range(2)],
             [ends[env].get(t) == "trunc" for env in range(2)])
        if t in (2, 3, 7, 9):
            batch = writer.flush()
            _check_batch(batch, 1)
            # One frame per distinct observation.
            assert batch.frames.shape[0] == len({tuple(f) for f in batch.frames.tolist()})
            batches.append(batch)
    assert writer.pending() == 0

    naive = n_step_transitions_naive(episodes, n, gamma)
    assert len(naive) == 2 * num_steps - 2  # env 1's truncated 2-step episode is dropped
    transitions = _keyed(batches, None, lambda o: (int(o[0]), int(o[1])))
    _assert_matches_naive(transitions, naive)


# ------------------------------------------------------------------ 3. stacked frames


def _frame(j: int) -> torch.Tensor:
    """Frame number ``j`` (< 256): [3, 3] uint8, ``j`` at [0, 0], every frame different."""
    return ((torch.arange(9) * 31 + j) % 256).to(torch.uint8).reshape(3, 3)


def _frame_number(frame: torch.Tensor) -> int:
    return int(frame[0, 0])


class FakeStacks:
    """Atari-like observations for ``num_envs`` envs: [4, 3, 3] uint8 stacks, oldest first.

    Within an episode a step shifts the stack and appends a new frame; an episode starts
    with its first frame repeated in all four slots. ``buffer`` is reused in place for
    every step, as a vector env reuses its output buffer.
    """

    def __init__(self, num_envs: int, k: int = 4) -> None:
        self.k = k
        self.count = 0
        self.stacks: list[list[torch.Tensor]] = [[] for _ in range(num_envs)]
        self.buffer = torch.zeros(num_envs, k, 3, 3, dtype=torch.uint8)
        for env in range(num_envs):
            self.restart(env)

    def _new_frame(self) -> torch.Tensor:
        self.count += 1
        return _frame(self.count - 1)

    def restart(self, env: int) -> None:
        self.stacks[env] = [self._new_frame()] * self.k

    def push(self, env: int) -> None:
        self.stacks[env] = self.stacks[env][1:] + [self._new_frame()]

    def observations(self) -> torch.Tensor:
        self.buffer.copy_(torch.stack([torch.stack(stack) for stack in self.stacks]))
        return self.buffer

    def stack(self, env: int) -> torch.Tensor:
        return torch.stack(self.stacks[env])


def test_stacked_frames_are_rebuilt_exactly_and_stored_once() -> None:
    fake = FakeStacks(num_envs=1)
    writer = NStepWriter(num_envs=1, n=3, discount=0.5, frame_stack=4)
    expected = [fake.stack(0)]  # s_0, s_1, ...
    writer.begin(fake.observations())

    def step(t: int, ended: bool) -> None:
        fake.restart(0) if ended else fake.push(0)
        _add(writer, [t], [1.0], fake.observations(), [ended])
        expected.append(fake.stack(0))

    for t in range(6):  # L = 6 steps within one episode
        step(t, ended=False)
    first = writer.flush()
    _check_batch(first, 4)
    assert first.size == 4  # t = 0..3
    assert first.frames.shape == (4 + 6, 3, 3)  # 4 initial frames + 1 per step, not 4 * 7
    assert first.frames.dtype == torch.uint8
    assert [_frame_number(f) for f in first.frames] == [0, 0, 0, 0, 1, 2, 3, 4, 5, 6]
    observations, next_observations = rebuild_observations(first, 4)
    assert torch.equal(observations, torch.stack(expected[0:4]))
    assert torch.equal(next_observations, torch.stack(expected[3:7]))

    step(6, ended=True)  # ends the episode: t = 4, 5, 6 with discount 0
    for t in range(7, 10):  # three steps of the next episode: t = 7 completes, next s_10
        step(t, ended=False)
    second = writer.flush()
    _check_batch(second, 4)
    assert second.actions.tolist() == [4, 5, 6, 7]
    assert second.discounts.tolist() == [0.0, 0.0, 0.0, 0.125]
    observations, next_observations = rebuild_observations(second, 4)
    assert torch.equal(observations, torch.stack(expected[4:8]))
    assert torch.equal(next_observations,
                       torch.stack([expected[4], expected[5], expected[6], expected[10]]))
    # 6 frames carried over (those of s_4..s_6), 4 of the new episode's first observation
    # (the same frame, stored in each slot), 3 new ones; the carried ones were in `first`.
    assert second.frames.shape[0] == 6 + 4 + 3
    assert torch.equal(second.frames[:6], first.frames[4:10])
    assert [_frame_number(f) for f in second.frames[6:]] == [7, 7, 7, 7, 8, 9, 10]


def test_stacked_frames_over_two_envs_match_the_naive_transitions() -> None:
    # Env 0 ends at steps 2 and 8 (both terminations); env 1 at 1 (truncation), 5 and 8.
    ends = {0: {2: "term", 8: "term"}, 1: {1: "trunc", 5: "term", 8: "term"}}
    n, gamma = 2, 0.75
    fake = FakeStacks(num_envs=2)
    writer = NStepWriter(num_envs=2, n=n, discount=gamma, frame_stack=4)
    writer.begin(fake.observations())
    episodes: list[list] = [[], []]
    key_by_newest = {}
    batches = []
    for t in range(9):
        for env in range(2):
            key_by_newest[_frame_number(fake.stacks[env][-1])] = (env, t)
            episodes[env].append((fake.stack(env), t + 3 * env, 0.5 * t - env,
                                  _ended(ends[env].get(t))))
            fake.restart(env) if t in ends[env] else fake.push(env)
        _add(writer, [t, t + 3], [0.5 * t, 0.5 * t - 1], fake.observations(),
             [ends[env].get(t) == "term" for env in range(2)],
             [ends[env].get(t) == "trunc" for env in range(2)])
        if t in (1, 3, 4, 8):
            batch = writer.flush()
            _check_batch(batch, 4)
            batches.append(batch)
    assert writer.pending() == 0
    naive = n_step_transitions_naive(episodes, n, gamma)
    transitions = _keyed(batches, 4, lambda o: key_by_newest[_frame_number(o[-1])])
    _assert_matches_naive(transitions, naive)


# ------------------------------------------------------------------ 4. edge settings


def test_one_step_transitions() -> None:
    writer = NStepWriter(num_envs=1, n=1, discount=0.9, frame_stack=None)
    writer.begin(torch.tensor([[0.0]]))
    out = []
    for t in range(3):
        _add(writer, [t], [t + 1.0], [[t + 1.0]], [t == 2])
        assert writer.pending() == 0
        batch = writer.flush()
        observation, next_observation = rebuild_observations(batch, None)
        out.append((batch.returns.tolist(), batch.discounts.tolist(), observation.tolist(),
                    next_observation.tolist()))
    assert out == [
        ([1.0], [_f32(0.9)], [[0.0]], [[1.0]]),
        ([2.0], [_f32(0.9)], [[1.0]], [[2.0]]),
        ([3.0], [0.0], [[2.0]], [[2.0]]),  # the episode ended: discount 0, next is s_t
    ]


def test_zero_discount_keeps_only_the_first_reward() -> None:
    writer = NStepWriter(num_envs=1, n=3, discount=0.0, frame_stack=None)
    writer.begin(torch.tensor([[0.0]]))
    for t in range(6):  # terminated at the last step
        _add(writer, [t], [t + 1.0], [[t + 1.0]], [t == 5])
        if t == 4:
            batch = writer.flush()
            assert batch.returns.tolist() == [1.0, 2.0, 3.0]
            assert batch.discounts.tolist() == [0.0, 0.0, 0.0]  # 0^3
            assert rebuild_observations(batch, None)[1].tolist() == [[3.0], [4.0], [5.0]]
            assert writer.pending() == 2
    batch = writer.flush()
    assert batch.returns.tolist() == [4.0, 5.0, 6.0]
    assert batch.discounts.tolist() == [0.0, 0.0, 0.0]
    assert writer.pending() == 0


def test_truncation_drops_the_steps_that_have_no_bootstrap_observation() -> None:
    # n = 3 over one env: steps 0..4, truncated at step 4, then terminated at step 6.
    writer = NStepWriter(num_envs=1, n=3, discount=0.5, frame_stack=None)
    writer.begin(torch.tensor([[0.0]]))
    for t in range(5):
        _add(writer, [t], [1.0], [[t + 1.0 if t < 4 else 100.0]], [False], [t == 4])
    batch = writer.flush()
    # Steps 0, 1 have full windows inside the episode; 2, 3, 4 would bootstrap from the
    # lost observation after the time limit, so they are gone.
    assert batch.actions.tolist() == [0, 1]
    assert batch.discounts.tolist() == [0.125, 0.125]
    assert rebuild_observations(batch, None)[1].tolist() == [[3.0], [4.0]]
    assert writer.pending() == 0
    # Terminated and truncated in the same step: termination wins (discount 0, kept).
    _add(writer, [5], [2.0], [[101.0]], [False])
    _add(writer, [6], [4.0], [[200.0]], [True], [True])
    batch = writer.flush()
    assert batch.actions.tolist() == [5, 6]
    assert batch.returns.tolist() == [4.0, 4.0]
    assert batch.discounts.tolist() == [0.0, 0.0]


def test_a_second_begin_ends_the_episodes_like_a_truncation() -> None:
    writer = NStepWriter(num_envs=2, n=3, discount=0.5, frame_stack=None)
    writer.begin(torch.tensor([[0.0], [10.0]]))
    _add(writer, [1, 2], [1.0, 2.0], [[1.0], [11.0]], [False, False])
    _add(writer, [3, 4], [3.0, 4.0], [[2.0], [12.0]], [False, False])
    writer.begin(torch.tensor([[20.0], [30.0]]))
    assert writer.pending() == 0
    assert writer.flush() is None  # the pending steps had no bootstrap observation
    _add(writer, [5, 6], [1.0, 1.0], [[21.0], [31.0]], [True, True])
    observations, _ = rebuild_observations(writer.flush(), None)
    assert observations.tolist() == [[20.0], [30.0]]


# ------------------------------------------------------------------ 5. checkpoint


def _random_steps(fake: FakeStacks, num_steps: int, seed: int) -> list[tuple]:
    """Inputs for ``add`` from a seeded schedule; the observations are copies."""
    gen = torch.Generator().manual_seed(seed)
    num_envs = len(fake.stacks)
    steps = []
    for _ in range(num_steps):
        ended = torch.rand(num_envs, generator=gen) < 0.25
        truncated = ended & (torch.rand(num_envs, generator=gen) < 0.5)
        for env in range(num_envs):
            fake.restart(env) if ended[env] else fake.push(env)
        steps.append((torch.randint(0, 6, (num_envs,), generator=gen),
                      torch.randn(num_envs, generator=gen), fake.observations().clone(),
                      ended & ~truncated, truncated))
    return steps


def _batches_equal(a: TransitionBatch, b: TransitionBatch) -> bool:
    return all(torch.equal(getattr(a, f), getattr(b, f))
               for f in ("frames", "observation_frames", "next_observation_frames", "actions",
                         "returns", "discounts"))


def test_state_dict_round_trip_continues_exactly() -> None:
    fake = FakeStacks(num_envs=3)
    writer = NStepWriter(num_envs=3, n=3, discount=0.9, frame_stack=4)
    writer.begin(fake.observations())
    for step in _random_steps(fake, 7, seed=0):
        writer.add(*step)
    writer.flush()
    for step in _random_steps(fake, 4, seed=1):
        writer.add(*step)
    assert writer.pending() > 0 and writer._emitted  # both kinds of state are in play

    buffer = io.BytesIO()
    torch.save(writer.state_dict(), buffer)
    later = _random_steps(fake, 9, seed=2)
    outputs = []
    for i, step in enumerate(later):
        writer.add(*step)
        if i in (3, 8):
            outputs.append(writer.flush())

    # Loaded after the original went on: the snapshot must not share its state.
    buffer.seek(0)
    restored = NStepWriter(num_envs=3, n=3, discount=0.9, frame_stack=4)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    restored_outputs = []
    for i, step in enumerate(later):
        restored.add(*step)
        if i in (3, 8):
            restored_outputs.append(restored.flush())
    assert len(outputs) == 2
    for a, b in zip(outputs, restored_outputs, strict=True):
        assert _batches_equal(a, b)
    assert restored.pending() == writer.pending()


def test_load_state_dict_refuses_other_settings() -> None:
    state = NStepWriter(num_envs=2, n=3, discount=0.9, frame_stack=None).state_dict()
    other = NStepWriter(num_envs=2, n=5, discount=0.9, frame_stack=None)
    with pytest.raises(ValueError, match=re.escape("the state was saved with n=3, "
                                                   "this writer has n=5")):
        other.load_state_dict(state)


# ------------------------------------------------------------------ 6. bad arguments


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_envs=2, n=0, discount=0.9, frame_stack=None), "n must be an int >= 1, got 0"),
        (dict(num_envs=2, n=3, discount=1.5, frame_stack=None),
         "discount must be a float in [0, 1], got 1.5"),
        (dict(num_envs=0, n=3, discount=0.9, frame_stack=None),
         "num_envs must be an int >= 1, got 0"),
        (dict(num_envs=2, n=3, discount=0.9, frame_stack=0),
         "frame_stack must be None or an int >= 1, got 0"),
        (dict(num_envs=2, n=True, discount=0.9, frame_stack=None),
         "n must be an int >= 1, got True"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        NStepWriter(**kwargs)


def test_add_before_begin() -> None:
    writer = NStepWriter(num_envs=1, n=3, discount=0.9, frame_stack=None)
    with pytest.raises(RuntimeError, match=re.escape("NStepWriter.add before begin")):
        _add(writer, [0], [0.0], [[0.0]], [False])


def test_add_rejects_wrong_shapes() -> None:
    writer = NStepWriter(num_envs=2, n=3, discount=0.9, frame_stack=None)
    writer.begin(torch.zeros(2, 4))
    with pytest.raises(ValueError, match=re.escape("actions must have shape [2] (one per env), "
                                                   "got [3]")):
        _add(writer, [0, 0, 0], [0.0, 0.0], torch.zeros(2, 4), [False, False])
    with pytest.raises(ValueError, match=re.escape("observations must have shape [2, 4] "
                                                   "(as in begin), got [2, 5]")):
        _add(writer, [0, 0], [0.0, 0.0], torch.zeros(2, 5), [False, False])
    with pytest.raises(ValueError, match=re.escape("observations must be torch.float32 "
                                                   "(as in begin), got torch.float64")):
        _add(writer, [0, 0], [0.0, 0.0], torch.zeros(2, 4, dtype=torch.float64),
             [False, False])
    assert writer.pending() == 0  # a rejected step records nothing

    stacked = NStepWriter(num_envs=2, n=3, discount=0.9, frame_stack=4)
    with pytest.raises(ValueError, match=re.escape("observations must have shape [2, 4, "
                                                   "*frame_shape] (frame_stack=4), "
                                                   "got [2, 3, 84, 84]")):
        stacked.begin(torch.zeros(2, 3, 84, 84, dtype=torch.uint8))
