"""A lost life as the end of the learner's episode while the game goes on (DQN, Ape-X,
IMPALA Table G.1 "end of episode when life lost"): the env's flags and per-game scores,
the actor's resets and counts, evaluation per game, and the replay writers' cuts.

A small fake with lives gives hand-computed cases; Breakout (ale-py, 2 envs, random
actions, no no-op starts) is recorded once per setting and checked step by step.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from reference import n_step_transitions_naive

from distrl.acting.actor import Actor, ActorStats, EnvGroup, PolicyOutput
from distrl.acting.evaluation import evaluate_policy
from distrl.config import ConfigError, EnvConfig
from distrl.envs import VectorEnv, make_envs
from distrl.replay.frames import rebuild_observations
from distrl.replay.sequence_writer import SequenceWriter
from distrl.replay.writers import NStepWriter
from distrl.types import EnvStep


class LivesEnv(VectorEnv):
    """Games of 3 lives; env ``i`` loses a life every ``life_steps[i]`` steps and is paid 1
    per step, so a game lasts and scores ``3 * life_steps[i]``. Observation:
    ``[lives, step_in_game]``, continuing across a lost life."""

    lives_per_game = 3

    def __init__(self, life_steps: list[int], terminal_on_life_loss: bool) -> None:
        super().__init__(num_envs=len(life_steps), observation_shape=(2,),
                         observation_dtype=np.float32, num_actions=2, frames_per_step=1,
                         seed=0, terminal_on_life_loss=terminal_on_life_loss)
        self.life_steps = np.asarray(life_steps)
        self._lives_left = np.full(self.num_envs, self.lives_per_game)
        self._step = np.zeros(self.num_envs, np.int64)

    def _observations(self) -> np.ndarray:
        return np.stack([self._lives_left, self._step], axis=1).astype(np.float32)

    def _reset(self, seed: int | None) -> np.ndarray:
        self._lives_left[:] = self.lives_per_game
        self._step[:] = 0
        return self._observations()

    def _send(self, actions: np.ndarray) -> None:
        pass

    def _recv(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        self._step += 1
        self._lives_left -= self._step % self.life_steps == 0
        over = self._lives_left == 0
        self._lives_left[over] = self.lives_per_game
        self._step[over] = 0
        return self._observations(), np.ones(self.num_envs), over, np.zeros_like(over)

    def _lives(self) -> np.ndarray | None:
        return self._lives_left

    def _close(self) -> None:
        pass


def _flags(steps: list[EnvStep], name: str) -> list[list[int]]:
    """Per env, the step numbers (1-based) where ``name`` is set."""
    values = np.stack([getattr(s, name) for s in steps])
    return [(np.flatnonzero(values[:, i]) + 1).tolist() for i in range(values.shape[1])]


@pytest.mark.parametrize("terminal_on_life_loss", [True, False])
def test_fake_lives_terminal_at_each_lost_life_and_scored_per_game(terminal_on_life_loss):
    with LivesEnv([2, 3], terminal_on_life_loss) as env:
        env.reset()
        steps = [env.step(np.zeros(2, np.int64)) for _ in range(12)]
    assert _flags(steps, "game_over") == [[6, 12], [9]]
    if terminal_on_life_loss:
        assert _flags(steps, "terminated") == [[2, 4, 6, 8, 10, 12], [3, 6, 9, 12]]
    else:
        assert _flags(steps, "terminated") == [[6, 12], [9]]
    assert [s.lives.tolist() for s in steps[:4]] == [[3, 3], [2, 3], [2, 2], [1, 2]]
    assert steps[5].episode_returns[0] == 6.0 and steps[5].episode_lengths[0] == 6
    assert steps[8].episode_returns[1] == 9.0 and steps[8].episode_lengths[1] == 9
    assert np.isnan(steps[3].episode_returns).all()  # a lost life reports no score
    assert steps[3].episode_lengths.tolist() == [0, 0]


class StepCountingPolicy:
    """Recurrent state ``[N, 1]``: steps since the learner's episode began; records the
    state and previous actions it was called with."""

    def __init__(self) -> None:
        self.seen: list[tuple[list[float], list[int]]] = []

    def initial_state(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        return (torch.zeros(batch_size, 1),)

    def __call__(self, observations, core_state, last_actions=None, last_rewards=None):
        self.seen.append((core_state[0][:, 0].tolist(), last_actions.tolist()))
        actions = torch.ones(observations.shape[0], dtype=torch.int64)
        return PolicyOutput(actions, {}, (core_state[0] + 1,))


class RecordingSink:
    def __init__(self) -> None:
        self.steps: list[EnvStep] = []

    def begin(self, observations, core_state) -> None:
        pass

    def act(self, output, version) -> None:
        pass

    def observe(self, step, core_state) -> None:
        self.steps.append(step)


def test_actor_resets_state_at_a_lost_life_and_counts_whole_games():
    policy, sink, stats = StepCountingPolicy(), RecordingSink(), ActorStats()
    env = LivesEnv([2], terminal_on_life_loss=True)
    actor = Actor([EnvGroup(env, sink)], policy, pull_weights=lambda: 0, stats=stats)
    for _ in range(13):
        actor.step()
    # Call k acts on the observation after step k: the state restarts after steps 2, 4, 6, ...
    states = [seen[0][0] for seen in policy.seen]
    assert states == [0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1]
    last_actions = [seen[1][0] for seen in policy.seen]
    assert last_actions == [-1, 1] * 7
    # Two whole games of 3 lives x 2 steps, not six lives with NaN scores.
    assert stats.episode_returns == [6.0, 6.0] and stats.episode_lengths == [6, 6]


def test_evaluation_scores_the_first_whole_game_not_the_first_life():
    with LivesEnv([2, 5], terminal_on_life_loss=True) as env:
        result = evaluate_policy(StepCountingPolicy(), env)
    assert result.returns == [6.0, 15.0] and result.lengths == [6, 15]


def test_envs_without_lives_ignore_the_setting():
    with make_envs(EnvConfig(id="CartPole-v1", terminal_on_life_loss=True), 2, seed=0) as env:
        env.reset()
        step = env.step(np.zeros(2, np.int64))
    assert step.lives is None and not step.dones.any()


def test_unresolved_setting_is_off_at_the_env_layer():
    with make_envs(EnvConfig(id="Breakout", terminal_on_life_loss=None), 1, seed=0) as env:
        assert env.terminal_on_life_loss is False


# ---------------------------------------------------------------------------- Breakout

STEPS = 500
NUM_ENVS = 2
BREAKOUT_LIVES = 5


@dataclass
class Recording:
    """Breakout played with a fixed seed and fixed random actions."""

    observations: np.ndarray  # [T+1, N, 4, 84, 84]: observations[t] is acted on at step t
    actions: np.ndarray  # [T, N]
    steps: list[EnvStep]  # [T]

    def stacked(self, name: str) -> np.ndarray:
        return np.stack([getattr(step, name) for step in self.steps])  # [T, N]

    def lives_before(self) -> np.ndarray:
        """[T, N] lives before each step (a game starts with 5)."""
        lives = self.stacked("lives")
        return np.concatenate([np.full((1, NUM_ENVS), BREAKOUT_LIVES), lives[:-1]])

    def life_lost(self) -> np.ndarray:
        """[T, N] bool: lives fell within one game, told from the lives alone."""
        return (self.stacked("lives") < self.lives_before()) & ~self.stacked("game_over")

    def learner_ends(self) -> np.ndarray:
        """[T, N] bool: where the learner's episode must end with the setting on."""
        return self.life_lost() | self.stacked("game_over")


def _record(terminal_on_life_loss: bool) -> Recording:
    cfg = EnvConfig(id="Breakout", noop_max=0, terminal_on_life_loss=terminal_on_life_loss)
    rng = np.random.default_rng(0)
    with make_envs(cfg, NUM_ENVS, seed=0) as env:
        observations, actions, steps = [env.reset()], [], []
        for _ in range(STEPS):
            actions.append(rng.integers(0, env.num_actions, NUM_ENVS))
            steps.append(env.step(actions[-1]))
            observations.append(steps[-1].observations)
    return Recording(np.stack(observations), np.stack(actions), steps)


@pytest.fixture(scope="module")
def breakout() -> Recording:
    return _record(terminal_on_life_loss=True)


@pytest.fixture(scope="module")
def breakout_off() -> Recording:
    return _record(terminal_on_life_loss=False)


def test_breakout_lost_lives_are_terminal_and_the_game_goes_on(breakout):
    terminated, truncated = breakout.stacked("terminated"), breakout.stacked("truncated")
    game_over, lives = breakout.stacked("game_over"), breakout.stacked("lives")
    life_lost = breakout.life_lost()
    assert not truncated.any()
    np.testing.assert_array_equal(terminated, life_lost | game_over)
    # Lives only rise when a new game starts; the new game starts with all 5.
    assert (game_over == (lives > breakout.lives_before())).all()
    assert (lives[game_over] == BREAKOUT_LIVES).all()
    # Not restarted: after a lost life the frame stack continues the same game.
    for t, env in zip(*np.nonzero(life_lost), strict=True):
        np.testing.assert_array_equal(breakout.observations[t + 1, env, :-1],
                                      breakout.observations[t, env, 1:])
    rewards = breakout.stacked("rewards").astype(np.float64)
    games = 0
    for env in range(NUM_ENVS):
        start = 0
        for end in np.flatnonzero(game_over[:, env]):
            games += 1
            game = slice(start, end + 1)
            # One learner episode per life: 5 -> 4 -> 3 -> 2 -> 1, then game over.
            assert lives[game, env][life_lost[game, env]].tolist() == [4, 3, 2, 1]
            assert terminated[game, env].sum() == BREAKOUT_LIVES
            # Scored over the whole game, every life.
            step = breakout.steps[end]
            assert step.episode_returns[env] == rewards[game, env].sum()
            assert step.episode_lengths[env] == end + 1 - start
            start = end + 1
    assert games >= 2


def test_breakout_setting_off_ends_only_games_and_plays_the_same_game(breakout, breakout_off):
    np.testing.assert_array_equal(breakout_off.observations, breakout.observations)
    for name in ("rewards", "lives", "episode_lengths"):
        np.testing.assert_array_equal(breakout_off.stacked(name), breakout.stacked(name))
    np.testing.assert_array_equal(breakout_off.stacked("terminated"),
                                  breakout.stacked("game_over"))
    assert breakout.life_lost().sum() >= 8  # the setting made a difference to compare


def _digest(observation: torch.Tensor | np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(observation).tobytes()).hexdigest()


def test_breakout_n_step_returns_stop_at_a_lost_life(breakout):
    n, gamma = 3, 0.5
    writer = NStepWriter(NUM_ENVS, n=n, discount=gamma, frame_stack=4)
    writer.begin(torch.from_numpy(breakout.observations[0]))
    got: Counter = Counter()
    for t, step in enumerate(breakout.steps):
        writer.add(torch.from_numpy(breakout.actions[t]), torch.from_numpy(step.rewards),
                   torch.from_numpy(step.observations), torch.from_numpy(step.terminated),
                   torch.from_numpy(step.truncated))
        if t % 50 == 49:
            batch = writer.flush()
            observations, next_observations = rebuild_observations(batch, 4)
            for k in range(batch.size):
                got[(_digest(observations[k]), batch.actions[k].item(),
                     batch.returns[k].item(), batch.discounts[k].item(),
                     _digest(next_observations[k]))] += 1

    # Ground truth from the lives alone: each env's steps up to its last learner episode
    # end go to the naive formula; after it, only full n-step windows are known yet.
    ends, rewards = breakout.learner_ends(), breakout.stacked("rewards")
    expected: Counter = Counter()
    zero_discounts = 0
    for env in range(NUM_ENVS):
        last_end = int(np.flatnonzero(ends[:, env])[-1])
        episodes = [[(_digest(breakout.observations[t, env]), int(breakout.actions[t, env]),
                      float(rewards[t, env]), bool(ends[t, env])) for t in range(last_end + 1)]]
        for obs, action, return_, discount, next_obs, _ in \
                n_step_transitions_naive(episodes, n, gamma).values():
            expected[(obs, action, float(np.float32(return_)), float(np.float32(discount)),
                      next_obs)] += 1
            zero_discounts += discount == 0.0
        for t in range(last_end + 1, STEPS - n + 1):
            return_ = sum(gamma**k * float(rewards[t + k, env]) for k in range(n))
            expected[(_digest(breakout.observations[t, env]), int(breakout.actions[t, env]),
                      float(np.float32(return_)), gamma**n,
                      _digest(breakout.observations[t + n, env]))] += 1
    assert got == expected
    # n zero-discount transitions at every lost life and game over (no life here is
    # shorter than n steps), and none of them bootstraps across the end.
    assert zero_discounts == n * ends.sum() and ends.sum() >= 10


def test_breakout_sequences_end_at_a_lost_life(breakout):
    burn_in, trace, period, bootstrap = 2, 6, 3, 2
    length = burn_in + trace + bootstrap
    writer = SequenceWriter(NUM_ENVS, burn_in=burn_in, trace_length=trace, period=period,
                            bootstrap=bootstrap, frame_stack=4)
    writer.begin(torch.from_numpy(breakout.observations[0]))
    for t, step in enumerate(breakout.steps):
        writer.add(torch.from_numpy(breakout.actions[t]), torch.from_numpy(step.rewards),
                   torch.from_numpy(step.observations), torch.from_numpy(step.terminated),
                   torch.from_numpy(step.truncated))
    batch = writer.flush()
    sample = writer.as_sample(batch)  # [L, K, ...]
    got = Counter(
        (tuple(_digest(sample.observations[j, k]) for j in range(length)),
         tuple(sample.prev_actions[:, k].tolist()), tuple(sample.prev_rewards[:, k].tolist()),
         tuple(sample.actions[:, k].tolist()), tuple(sample.rewards[:, k].tolist()),
         tuple(sample.terminated[:, k].tolist()), tuple(sample.valid[:, k].tolist()))
        for k in range(batch.size))

    # Ground truth: each learner episode (a life) is cut from the lives alone; slot j of
    # the sequence starting at s is that episode's step s - burn_in + j.
    ends, rewards = breakout.learner_ends(), breakout.stacked("rewards").tolist()
    expected: Counter = Counter()
    for env in range(NUM_ENVS):
        bounds = np.flatnonzero(ends[:, env]).tolist()
        starts = [0] + [b + 1 for b in bounds]
        for first, stop in zip(starts, bounds + [STEPS - 1], strict=True):
            ended = stop in bounds
            last = stop - first  # the episode's last step taken (so far)
            for s in range(0, last + 1, period):
                if not ended and s - burn_in + length - 1 > last:
                    continue  # still open when the recording stopped
                slots = [s - burn_in + j for j in range(length)]
                real = [0 <= i <= last for i in slots]
                at = [first + min(max(i, 0), last) for i in slots]
                expected[(
                    tuple(_digest(breakout.observations[t, env]) for t in at),
                    tuple(int(breakout.actions[t - 1, env]) if r and t > first else -1
                          for t, r in zip(at, real, strict=True)),
                    tuple(rewards[t - 1][env] if r and t > first else 0.0
                          for t, r in zip(at, real, strict=True)),
                    tuple(int(breakout.actions[t, env]) if r else 0
                          for t, r in zip(at, real, strict=True)),
                    tuple(rewards[t][env] if r else 0.0 for t, r in zip(at, real, strict=True)),
                    tuple(r and ended and i == last for i, r in zip(slots, real, strict=True)),
                    tuple(real),
                )] += 1
    assert got == expected
    # Every lost life closed a sequence with a terminal step.
    assert sample.terminated.any(0).sum() >= breakout.life_lost().sum()


def test_each_agent_takes_its_papers_life_loss_choice_unless_the_user_sets_one():
    """RunSettings takes the agent's paper's choice (IMPALA, Ape-X: terminal; R2D2: not)
    only where env.terminal_on_life_loss is None, in each agent's run."""
    import agents
    from agents.impala import ImpalaConfig
    from distrl.config import RunConfig
    from distrl.run.run_settings import Conventions, RunSettings

    assert {name: agents.get(name).CONVENTIONS.terminal_on_life_loss
            for name in ("impala", "apex", "r2d2")} == {"impala": True, "apex": True,
                                                        "r2d2": False}
    unset = RunConfig(agent=ImpalaConfig(), env=EnvConfig(id="Breakout"))
    terminal, not_terminal = Conventions(terminal_on_life_loss=True), Conventions()
    assert RunSettings.from_config(unset, terminal).env.terminal_on_life_loss is True
    assert RunSettings.from_config(unset, not_terminal).env.terminal_on_life_loss is False
    chosen = RunConfig(agent=ImpalaConfig(),
                       env=EnvConfig(id="Breakout", terminal_on_life_loss=False))
    assert RunSettings.from_config(chosen, terminal).env.terminal_on_life_loss is False


def test_episodic_life_is_refused_naming_the_setting_to_use():
    with pytest.raises(ConfigError, match=re.escape(
            "env.episodic_life=true is refused: ale-py restarts the whole game at every "
            "life loss")) as error:
        EnvConfig(id="Breakout", episodic_life=True)
    assert "env.terminal_on_life_loss=true" in str(error.value)
