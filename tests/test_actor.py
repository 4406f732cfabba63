"""Tests for distrl.acting.actor: the acting loop and UnrollSink on the fake CounterEnv.

Every slot field is compared with a closed form: env ``e`` (episode length ``L_e``) at
group step ``g`` shows ``[e, g % L_e]``, the stub policy takes ``(e + g % L_e) % A``, the
reward is that action + 1, and the episode ends after step ``g`` when ``(g + 1) % L_e == 0``.
"""

from __future__ import annotations

import collections
import itertools
import multiprocessing
import os
import threading
import time

import numpy as np
import pytest
import torch
from fake_envs import CounterEnv, counter_action

from distrl.acting import actor_processes
from distrl.acting.actor import (
    Actor,
    ActorStats,
    ActorStopped,
    EnvGroup,
    PolicyOutput,
    UnrollSink,
    reset_core_state,
)
from distrl.transport.queues import FieldSpec, SlotPool

A, H = 3, 2  # actions, recurrent state width


def _specs(unroll_length: int, columns: int) -> dict[str, FieldSpec]:
    t, e = unroll_length, columns
    return {
        "observations": FieldSpec((t + 1, e, 2), torch.float32),
        "actions": FieldSpec((t, e), torch.int64),
        "rewards": FieldSpec((t, e), torch.float32),
        "dones": FieldSpec((t, e), torch.bool),
        "policy_versions": FieldSpec((t, e), torch.int64),
        "behaviour_logits": FieldSpec((t, e, A), torch.float32),
        "core_state_0": FieldSpec((e, H), torch.float32, time_major=False),
        "core_state_1": FieldSpec((e, H), torch.float32, time_major=False),
    }


def _logits(env_index: int, step: int) -> list[float]:
    """The stub policy's extra: distinct for every (action slot, env, step in episode)."""
    return [1000.0 * a + 100.0 * env_index + step for a in range(A)]


class StubPolicy:
    """Acts with :func:`counter_action`; its state (h, c) counts steps since the last reset."""

    def __init__(self) -> None:
        self.seen: list[tuple[torch.Tensor, tuple[torch.Tensor, ...]]] = []
        self.previous: list[tuple[torch.Tensor, torch.Tensor]] = []  # last actions, rewards

    def initial_state(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        return torch.zeros(batch_size, H), torch.zeros(batch_size, H)

    def __call__(
        self,
        observations: torch.Tensor,
        core_state: tuple[torch.Tensor, ...],
        last_actions: torch.Tensor | None = None,
        last_rewards: torch.Tensor | None = None,
    ) -> PolicyOutput:
        self.seen.append((observations.clone(), tuple(s.clone() for s in core_state)))
        self.previous.append((last_actions.clone(), last_rewards.clone()))
        env_index, step = observations[:, 0].long(), observations[:, 1].long()
        actions = (env_index + step) % A
        logits = torch.tensor([_logits(e, s) for e, s in zip(env_index.tolist(), step.tolist(),
                                                             strict=True)])
        h, c = core_state
        return PolicyOutput(actions, {"behaviour_logits": logits}, (h + 1, c + 2))


class Versions:
    """pull_weights stub: every call returns a new number, 100, 101, ..., and records it."""

    def __init__(self) -> None:
        self.returned: list[int] = []

    def __call__(self) -> int:
        self.returned.append(100 + len(self.returned))
        return self.returned[-1]


def _expected_unroll(
    k: int, unroll_length: int, lengths: list[int], offset: int, version_of
) -> dict[str, torch.Tensor]:
    """Unroll ``k`` of a group, written out from the closed form (see the module docstring)."""
    t_len, e_len = unroll_length, len(lengths)
    out = {name: torch.zeros(spec.shape, dtype=spec.dtype)
           for name, spec in _specs(t_len, e_len).items()}
    for e, length in enumerate(lengths):
        env_index = offset + e
        for t in range(t_len + 1):
            g = k * t_len + t
            out["observations"][t, e] = torch.tensor([env_index, g % length])
            if t == t_len:
                continue
            action = counter_action(env_index, g % length, A)
            out["actions"][t, e] = action
            out["rewards"][t, e] = action + 1
            out["dones"][t, e] = (g + 1) % length == 0
            out["policy_versions"][t, e] = version_of(g)
            out["behaviour_logits"][t, e] = torch.tensor(_logits(env_index, g % length))
        out["core_state_0"][e] = (k * t_len) % length
        out["core_state_1"][e] = 2 * ((k * t_len) % length)
    return out


def _assert_unroll(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        assert actual[name].dtype == value.dtype, name
        assert torch.equal(actual[name], value), f"{name}:\n{actual[name]}\n!=\n{value}"


def _assert_unroll_invariants(slots: list[dict[str, torch.Tensor]]) -> None:
    """What must hold whatever the env: continuity, rewards follow actions, resets."""
    for prev, nxt in itertools.pairwise(slots):
        assert torch.equal(nxt["observations"][0], prev["observations"][-1])
    for s in slots:
        assert torch.equal(s["rewards"], (s["actions"] + 1).float())
        step, next_step = s["observations"][:-1, :, 1], s["observations"][1:, :, 1]
        dones = s["dones"]
        assert (next_step[dones] == 0).all()  # a done: the next observation starts anew
        assert torch.equal(next_step[~dones], step[~dones] + 1)
        assert not any(torch.isnan(v).any() for v in s.values() if v.is_floating_point())


def test_counter_env() -> None:
    env = CounterEnv([2, 3], num_actions=A, env_offset=5, truncate=[False, True])
    assert env.reset().tolist() == [[5, 0], [6, 0]]
    first = env.step(np.array([2, 0]))
    assert first.observations.tolist() == [[5, 1], [6, 1]]
    assert first.rewards.tolist() == [3.0, 1.0]
    second = env.step(np.array([1, 1]))
    assert second.observations.tolist() == [[5, 0], [6, 2]]  # env 0 autoreset
    assert second.terminated.tolist() == [True, False] and not second.truncated.any()
    assert second.episode_returns[0] == 5.0 and second.episode_lengths.tolist() == [2, 0]
    third = env.step(np.array([0, 2]))
    assert third.truncated.tolist() == [False, True] and not third.terminated.any()
    assert third.episode_returns[1] == 1.0 + 2.0 + 3.0
    with pytest.raises(ValueError, match="actions must lie in"):
        env.step(np.array([0, A]))


def test_one_group_unrolls_match_the_closed_form() -> None:
    unroll_length, lengths, n_unrolls = 4, [2, 3, 5], 3
    env = CounterEnv(lengths, num_actions=A)
    pool = SlotPool(_specs(unroll_length, len(lengths)), num_slots=n_unrolls + 1)
    stats = ActorStats()
    policy, versions = StubPolicy(), Versions()
    actor = Actor([EnvGroup(env, UnrollSink(pool, unroll_length, stats))], policy, versions,
                  stats)
    for _ in range(n_unrolls * unroll_length):
        actor.step()

    indices, _ = pool.take(n_unrolls, timeout=1.0)
    slots = [pool.gather([i]) for i in indices]
    _assert_unroll_invariants(slots)
    for k, slot in enumerate(slots):
        _assert_unroll(slot, _expected_unroll(k, unroll_length, lengths, 0, lambda g: 100 + g))

    # pull_weights ran once per step (plus once at start) and each answer landed at its step.
    assert versions.returned == list(range(100, 100 + n_unrolls * unroll_length + 1))
    # The env got exactly the actions the slots recorded, and one more for the open unroll.
    sent = torch.from_numpy(np.stack(env.sent))
    recorded = torch.cat([s["actions"] for s in slots])
    assert torch.equal(sent[:-1], recorded)
    # The policy always saw state h = step in episode: zeroed exactly where episodes ended.
    for observations, (h, c) in policy.seen:
        assert torch.equal(h, observations[:, 1:].expand(-1, H))
        assert torch.equal(c, 2 * h)
    # The policy saw the action and reward before each observation, -1 and 0 at an
    # episode's first step (the counter env's reward is the action plus one).
    for (observations, _), (last_actions, last_rewards) in zip(policy.seen, policy.previous,
                                                                strict=True):
        env_index, step = observations[:, 0].long(), observations[:, 1].long()
        first = step == 0
        expected = counter_action(env_index, step - 1, A)
        assert torch.equal(last_actions, torch.where(first, -1, expected))
        assert torch.equal(last_rewards, torch.where(first, 0.0, expected + 1.0))

    # The open slot: observation 0, the state and step 0's action are in; the rest is sentinel.
    (open_slot,) = set(range(n_unrolls + 1)) - set(indices)
    b = pool.buffers
    assert torch.equal(b["observations"][open_slot, 0], slots[-1]["observations"][-1])
    assert torch.equal(b["core_state_0"][open_slot], slots[-1]["observations"][-1][:, 1:].expand(
        -1, H))
    assert torch.equal(b["actions"][open_slot, 0], sent[-1])
    assert (b["actions"][open_slot, 1:] == -1).all()
    assert torch.isnan(b["rewards"][open_slot]).all()
    assert torch.isnan(b["observations"][open_slot, 1:]).all()

    # Stats: steps, frames and every finished episode's length and raw return, in order.
    steps = n_unrolls * unroll_length
    assert stats.steps == stats.frames == steps * len(lengths)
    ended = [(g, e) for g in range(steps) for e, length in enumerate(lengths)
             if (g + 1) % length == 0]
    assert stats.episode_lengths == [lengths[e] for _, e in ended]
    assert stats.episode_returns == [
        float(sum(counter_action(e, s, A) + 1 for s in range(lengths[e]))) for _, e in ended
    ]
    assert stats.policy_version == versions.returned[-1]

    actor.close()
    actor.close()
    assert env.close_calls == 1


def test_two_groups_fill_their_own_slots() -> None:
    unroll_length, n_unrolls = 3, 3
    groups = {0: ([2, 3], 0, None), 1: ([4, 1], 10, [False, True])}  # lengths, offset, truncate
    pool = SlotPool(_specs(unroll_length, 2), num_slots=2 * n_unrolls + 2)
    stats = ActorStats()
    envs = {g: CounterEnv(lengths, num_actions=A, env_offset=offset, truncate=truncate)
            for g, (lengths, offset, truncate) in groups.items()}
    versions = Versions()
    actor = Actor([EnvGroup(envs[g], UnrollSink(pool, unroll_length, stats)) for g in (0, 1)],
                  StubPolicy(), versions, stats)
    for _ in range(n_unrolls * unroll_length):
        actor.step()

    indices, _ = pool.take(2 * n_unrolls, timeout=1.0)
    slots = [pool.gather([i]) for i in indices]
    # Group 0 observes (and commits) before group 1 within a step, so the slots alternate.
    owner = [{0: 0, 10: 1}[int(s["observations"][0, 0, 0])] for s in slots]
    assert owner == [0, 1] * n_unrolls
    for g, (lengths, offset, _) in groups.items():
        mine = [s for s, o in zip(slots, owner, strict=True) if o == g]
        _assert_unroll_invariants(mine)
        # Calls to pull_weights alternate between the groups: group g's step j got 100 + 2j + g.
        for k, slot in enumerate(mine):
            _assert_unroll(slot, _expected_unroll(k, unroll_length, lengths, offset,
                                                  lambda j, g=g: 100 + 2 * j + g))
    # The truncated env (length 1) is done at every step: dones include truncation.
    assert all(s["dones"][:, 1].all() for s, o in zip(slots, owner, strict=True) if o == 1)
    assert stats.steps == n_unrolls * unroll_length * 4
    # Each finished game names the actor's env that played it, group 1's envs after group
    # 0's (a replay actor's epsilons follow that order): in 9 steps, episodes of 2, 3, 4
    # and 1 steps end 4, 3, 2 and 9 times.
    assert collections.Counter(stats.episode_envs) == {0: 4, 1: 3, 2: 2, 3: 9}
    assert len(stats.episode_envs) == len(stats.episode_returns)


def test_episodes_without_env_indices_are_written_and_absorbed_with_env_minus_1() -> None:
    """Stats built without env indices (an actor-only rank's, or by hand) still give every
    finished episode: absorbed after an actor's own, and logged with the epsilon of env -1."""
    from distrl.training.loop import log_actor_stats

    unknown = ActorStats(episode_returns=[1.0, 2.0], episode_lengths=[10, 20])
    assert unknown.envs_of_episodes() == [-1, -1]
    total = ActorStats(episode_returns=[3.0], episode_lengths=[5], episode_envs=[4])
    total.absorb(unknown)
    assert total.episode_envs == [4, -1, -1] and total.episode_returns == [3.0, 1.0, 2.0]

    class Written:
        def __init__(self) -> None:
            self.episodes: list[tuple[float, int, int, float | None]] = []

        def episode(self, ret: float, length: int, frames: int,
                    epsilon: float | None = None) -> None:
            self.episodes.append((ret, length, frames, epsilon))

        def add(self, name: str, value: float) -> None:
            pass

    logger = Written()
    log_actor_stats(logger, unknown, 99, epsilon_of={-1: float("nan"), 4: 0.4}.get)
    log_actor_stats(logger, total, 100, epsilon_of={-1: -1.0, 4: 0.4}.get)
    assert [e[:3] for e in logger.episodes] == [(1.0, 10, 99), (2.0, 20, 99), (3.0, 5, 100),
                                                (1.0, 10, 100), (2.0, 20, 100)]
    assert [e[3] for e in logger.episodes[2:]] == [0.4, -1.0, -1.0]


def test_the_sink_stops_when_no_slot_frees_up_and_stop_was_asked() -> None:
    unroll_length = 2
    pool = SlotPool(_specs(unroll_length, 1), num_slots=1)
    stats = ActorStats()
    asked = []

    def should_stop() -> bool:
        asked.append(True)
        return True

    sink = UnrollSink(pool, unroll_length, stats, should_stop)
    actor = Actor([EnvGroup(CounterEnv([5], num_actions=A), sink)], StubPolicy(), Versions(),
                  stats)
    actor.step()
    assert not asked  # a slot was free: no acquire timed out
    before = stats.sink_wait_s
    with pytest.raises(ActorStopped):
        actor.step()  # commits the only slot, then waits for a free one
    assert len(asked) == 1
    assert stats.sink_wait_s == before + 0.5  # the one 0.5 s acquire timeout was counted
    indices, _ = pool.take(1, timeout=1.0)
    assert pool.gather(indices)["observations"][:, 0, 1].tolist() == [0.0, 1.0, 2.0]


def test_reset_core_state_zeroes_exactly_the_done_columns() -> None:
    h = torch.arange(1.0, 13.0).view(4, 3)
    c = -h
    dones = np.array([False, True, False, True])
    new_h, new_c = reset_core_state((h, c), dones)
    assert torch.equal(new_h[[1, 3]], torch.zeros(2, 3))
    assert torch.equal(new_c[[1, 3]], torch.zeros(2, 3))
    assert torch.equal(new_h[[0, 2]], h[[0, 2]]) and torch.equal(new_c[[0, 2]], c[[0, 2]])
    assert torch.equal(h, torch.arange(1.0, 13.0).view(4, 3))  # the input is not modified
    # Nothing done or no state: the same objects come back.
    state = (h, c)
    assert reset_core_state(state, np.zeros(4, bool)) is state
    assert reset_core_state((), dones) == ()


def test_reset_core_state_clears_non_finite_done_columns() -> None:
    h = torch.tensor([[1.0, 2.0], [float("nan"), float("inf")]])
    (new_h,) = reset_core_state((h,), np.array([False, True]))
    assert torch.equal(new_h, torch.tensor([[1.0, 2.0], [0.0, 0.0]]))


# ---------------------------------------------------------------- actor process ending


class _SteppingActor:
    """Each step takes a little time, so the process loop comes to send a report."""

    def __init__(self) -> None:
        self.closed = False

    def step(self) -> None:
        time.sleep(0.05)

    def close(self) -> None:
        self.closed = True


def test_actor_process_ends_quietly_when_the_learner_closed_the_report_pipe(monkeypatch,
                                                                           capsys):
    """At a run's end the learner closes its end of the report pipe before every actor has
    seen the stop: the actor's next report meets a broken pipe. That ends the actor without
    a traceback or a failing exit (the GPU check printed one per actor)."""
    monkeypatch.setattr(actor_processes, "ignore_stop_signals", lambda: None)
    receive, send = multiprocessing.Pipe(duplex=False)
    receive.close()
    actor = _SteppingActor()
    actor_processes._actor_process(
        0, 0, lambda *args: actor, torch.get_num_threads(), 0, send, torch.zeros(1),
        threading.Event(), os.getppid())
    assert actor.closed
    assert "Traceback" not in capsys.readouterr().err
