"""Tests for distrl.envs: shapes, seeding, raw scores, settings reaching ale-py, errors."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import gymnasium
import numpy as np
import pytest
from recording import record_kwargs

from distrl import envs
from distrl.config import ConfigError, EnvConfig
from distrl.envs import env_seed, is_atari, make_envs


def _random_actions(rng: np.random.Generator, env: envs.VectorEnv) -> np.ndarray:
    return rng.integers(0, env.num_actions, env.num_envs)


@pytest.fixture
def ale_kwargs(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Record the kwargs of every ale-py vector env make_envs builds (and still build it)."""
    return record_kwargs(monkeypatch, envs, "_atari_vector_env")


@pytest.mark.parametrize(
    "env_id, expected",
    [
        ("Pong", True),
        ("ALE/Pong-v5", True),
        ("PongNoFrameskip-v4", True),
        ("MsPacman", True),
        ("ms_pacman", True),
        ("TicTacToe3D", True),
        ("CartPole-v1", False),
        ("Pongg", False),
    ],
)
def test_is_atari(env_id: str, expected: bool) -> None:
    assert is_atari(env_id) is expected


def test_atari_names_map_to_roms(ale_kwargs: list[dict]) -> None:
    for env_id in ("MsPacman", "ms_pacman", "ALE/MsPacman-v5"):
        make_envs(EnvConfig(id=env_id), 1, seed=0).close()
    assert [kw["game"] for kw in ale_kwargs] == ["ms_pacman"] * 3


def test_atari_shapes_and_determinism() -> None:
    cfg = EnvConfig(id="Pong")
    with make_envs(cfg, 2, seed=0) as a, make_envs(cfg, 2, seed=0) as b:
        assert (a.num_actions, a.frames_per_step) == (6, 4)
        assert a.observation_shape == (4, 84, 84) and a.observation_dtype == np.uint8
        obs_a, obs_b = a.reset(), b.reset()
        assert obs_a.shape == (2, 4, 84, 84) and obs_a.dtype == np.uint8
        np.testing.assert_array_equal(obs_a, obs_b)
        rng = np.random.default_rng(0)
        for _ in range(100):
            actions = _random_actions(rng, a)
            a.send(actions)  # split send/recv must equal step
            step_a = a.recv()
            step_b = b.step(actions)
            np.testing.assert_array_equal(step_a.observations, step_b.observations)
            np.testing.assert_array_equal(step_a.rewards, step_b.rewards)
        assert step_a.observations.shape == (2, 4, 84, 84)
        assert step_a.observations.dtype == np.uint8
        assert step_a.rewards.shape == (2,) and step_a.rewards.dtype == np.float32
        assert step_a.terminated.dtype == bool and step_a.truncated.dtype == bool
        assert step_a.episode_returns.dtype == np.float64
        assert step_a.episode_lengths.dtype == np.int64
        # The frames moved, and the seed matters: another seed plays differently.
        assert not np.array_equal(step_a.observations, obs_a)
        with make_envs(cfg, 2, seed=1) as c:
            c.reset()
            rng = np.random.default_rng(0)
            for _ in range(100):
                step_c = c.step(_random_actions(rng, c))
        assert not np.array_equal(step_c.observations, step_a.observations)


def test_atari_rewards_are_raw_and_episode_returns_exact() -> None:
    # Space Invaders scores 5..30 per invader; 2,000 frames = 500 agent steps per episode.
    cfg = EnvConfig(id="SpaceInvaders", max_episode_frames=2000)
    rng = np.random.default_rng(0)
    finished: list[tuple[float, float, int, int]] = []
    with make_envs(cfg, 2, seed=0) as env:
        env.reset()
        running = np.zeros(2)
        steps = np.zeros(2, np.int64)
        max_reward = 0.0
        for _ in range(1100):
            step = env.step(_random_actions(rng, env))
            max_reward = max(max_reward, float(step.rewards.max()))
            running += step.rewards
            steps += 1
            for i in np.flatnonzero(step.dones):
                finished.append((step.episode_returns[i], running[i],
                                 step.episode_lengths[i], steps[i]))
                running[i], steps[i] = 0.0, 0
            assert np.isnan(step.episode_returns[~step.dones]).all()
            assert (step.episode_lengths[~step.dones] == 0).all()
    assert max_reward > 1  # clipping would cap it at 1
    assert len(finished) >= 2
    for reported, seen, reported_len, seen_len in finished:
        assert reported == seen and reported > 1
        assert reported_len == seen_len and 0 < reported_len <= 500


@pytest.mark.parametrize(
    "overrides, sticky, full",
    [
        ({}, 0.0, False),
        ({"protocol": "machado"}, 0.25, True),
        ({"protocol": "machado", "repeat_action_probability": 0.1, "full_action_space": False},
         0.1, False),
    ],
)
def test_settings_reach_ale(ale_kwargs: list[dict], overrides: dict, sticky: float,
                            full: bool) -> None:
    cfg = EnvConfig(id="Breakout", noop_max=7, frame_skip=3, frame_stack=2, image_size=64,
                    max_episode_frames=1234, terminal_on_life_loss=True, fire_reset=True,
                    **overrides)
    with make_envs(cfg, 3, seed=0, num_threads=2) as env:
        assert env.terminal_on_life_loss is True
        assert env.frames_per_step == 3
        assert env.observation_shape == (2, 64, 64)
        assert env.num_actions == (18 if full else 4)
    (kw,) = ale_kwargs
    assert kw["game"] == "breakout" and kw["num_envs"] == 3 and kw["num_threads"] == 2
    assert kw["repeat_action_probability"] == sticky
    assert kw["full_action_space"] is full
    assert kw["noop_max"] == 7 and kw["frameskip"] == 3 and kw["stack_num"] == 2
    assert kw["img_height"] == kw["img_width"] == 64
    assert kw["max_num_frames_per_episode"] == 1234
    assert kw["use_fire_reset"] is True
    # Lives are read from info["lives"]; ale-py never restarts a game at a life loss.
    assert kw["episodic_life"] is False and kw["life_loss_info"] is False
    assert kw["reward_clipping"] is False
    assert kw["autoreset_mode"] == gymnasium.vector.AutoresetMode.SAME_STEP


def test_pong_action_sets() -> None:
    with make_envs(EnvConfig(id="Pong", full_action_space=True), 1, seed=0) as env:
        assert env.num_actions == 18
    with make_envs(EnvConfig(id="Pong"), 1, seed=0) as env:
        assert env.num_actions == 6


def test_cartpole_same_step_autoreset_and_returns() -> None:
    with make_envs(EnvConfig(id="CartPole-v1"), 3, seed=0) as env:
        assert env.observation_shape == (4,) and env.observation_dtype == np.float32
        assert (env.num_actions, env.frames_per_step) == (2, 1)
        obs = env.reset()
        assert obs.shape == (3, 4) and obs.dtype == np.float32
        rng = np.random.default_rng(0)
        done_steps = 0
        for _ in range(200):
            step = env.step(_random_actions(rng, env))
            assert step.observations.dtype == np.float32 and step.rewards.dtype == np.float32
            for i in np.flatnonzero(step.dones):
                done_steps += 1
                # CartPole pays 1 per step, so an episode's return is its length.
                assert step.episode_returns[i] == step.episode_lengths[i] > 0
                # Same-step autoreset: already a fresh start, uniform in [-0.05, 0.05].
                assert np.abs(step.observations[i]).max() <= 0.05
    assert done_steps >= 3


def test_hide_velocity_keeps_cartpole_positions() -> None:
    full = gymnasium.make("CartPole-v1")
    hidden = gymnasium.make("CartPoleNoVelocity-v1")
    space = hidden.observation_space
    assert space.shape == (2,) and space.dtype == np.float32
    np.testing.assert_array_equal(space.low, full.observation_space.low[[0, 2]])
    np.testing.assert_array_equal(space.high, full.observation_space.high[[0, 2]])
    obs_full, _ = full.reset(seed=3)
    obs_hidden, _ = hidden.reset(seed=3)
    np.testing.assert_array_equal(obs_hidden, obs_full[[0, 2]])
    episodes = 1
    for action in np.random.default_rng(0).integers(0, 2, 60):
        obs_full, reward_full, term_full, trunc_full, _ = full.step(action)
        obs_hidden, reward_hidden, term_hidden, trunc_hidden, _ = hidden.step(action)
        assert obs_hidden.dtype == np.float32 and obs_hidden.shape == (2,)
        np.testing.assert_array_equal(obs_hidden, obs_full[[0, 2]])
        assert (reward_hidden, term_hidden, trunc_hidden) == (reward_full, term_full, trunc_full)
        assert np.abs(obs_full[[1, 3]]).min() > 0  # there was velocity to hide
        if term_full:
            # Unseeded resets continue each env's stream; the two streams must stay equal.
            obs_full, _ = full.reset()
            obs_hidden, _ = hidden.reset()
            np.testing.assert_array_equal(obs_hidden, obs_full[[0, 2]])
            episodes += 1
    assert episodes >= 2


def test_cartpole_no_velocity_truncates_at_500() -> None:
    spec = gymnasium.spec("CartPoleNoVelocity-v1")
    assert spec.max_episode_steps == 500
    assert spec.reward_threshold == gymnasium.spec("CartPole-v1").reward_threshold
    env = gymnasium.make("CartPoleNoVelocity-v1")
    env.reset(seed=0)
    for t in range(1, 501):
        # The test may peek at the hidden state: a PD controller that balances indefinitely.
        x, x_dot, theta, theta_dot = env.unwrapped.state
        action = int(theta + 0.5 * theta_dot + 0.01 * x + 0.1 * x_dot > 0)
        _, _, terminated, truncated, _ = env.step(action)
        assert not terminated
        assert truncated is (t == 500)


def test_cartpole_no_velocity_through_make_envs() -> None:
    with make_envs(EnvConfig(id="CartPoleNoVelocity-v1"), 2, seed=0) as env:
        assert env.observation_shape == (2,) and env.observation_dtype == np.float32
        assert (env.num_actions, env.frames_per_step) == (2, 1)
        obs = env.reset()
        assert obs.shape == (2, 2) and obs.dtype == np.float32
        step = env.step(np.array([0, 1]))
        assert step.observations.shape == (2, 2)


def test_cartpole_no_velocity_registration_is_idempotent() -> None:
    # In a fresh interpreter, so reloading cannot swap the classes other tests hold.
    code = textwrap.dedent(
        """
        import importlib
        import gymnasium
        import distrl.envs
        spec = gymnasium.spec("CartPoleNoVelocity-v1")
        importlib.reload(distrl.envs)
        assert gymnasium.spec("CartPoleNoVelocity-v1") is spec
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-W", "error", "-c", code],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok" and "Overriding" not in result.stderr


def test_bad_calls_raise() -> None:
    with make_envs(EnvConfig(id="CartPole-v1"), 2, seed=0) as env:
        with pytest.raises(RuntimeError, match="reset"):
            env.send(np.zeros(2, np.int64))
        env.reset()
        with pytest.raises(ValueError, match=r"\[0, 2\)"):
            env.send(np.array([0, 2]))
        with pytest.raises(ValueError, match="shape"):
            env.send(np.zeros(3, np.int64))
        with pytest.raises(RuntimeError, match="without a send"):
            env.recv()


def test_unknown_id_and_bad_counts() -> None:
    with pytest.raises(ConfigError, match=r"env\.id.*'Pongg'.*did you mean 'Pong'"):
        make_envs(EnvConfig(id="Pongg"), 1, seed=0)
    with pytest.raises(ConfigError, match=r"env\.id.*'NoSuchEnv-v0'"):
        make_envs(EnvConfig(id="NoSuchEnv-v0"), 1, seed=0)
    with pytest.raises(ConfigError, match="num_envs must be positive, got 0"):
        make_envs(EnvConfig(id="CartPole-v1"), 0, seed=0)
    with pytest.raises(ConfigError, match=r"env\.id.*Discrete"):
        make_envs(EnvConfig(id="Pendulum-v1"), 1, seed=0)
    with pytest.raises(ConfigError, match=r"env\.imports.*'no_such_module_xyz'"):
        make_envs(EnvConfig(id="CartPole-v1", imports=["no_such_module_xyz"]), 1, seed=0)


USER_ENV = textwrap.dedent(
    """
    import gymnasium
    import numpy as np


    class Countdown(gymnasium.Env):
        observation_space = gymnasium.spaces.Box(0, 10, (2,), np.int64)
        action_space = gymnasium.spaces.Discrete(3)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return np.array([self.t, 7]), {}

        def step(self, action):
            self.t += 1
            return np.array([self.t, action]), 2.5 + action, self.t == 3, False, {}


    gymnasium.register("DistrlTestCountdown-v0", entry_point=Countdown)
    """
)


def test_user_registered_env(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "distrl_test_user_env.py").write_text(USER_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    env_id = "DistrlTestCountdown-v0"
    cfg = EnvConfig(id=env_id, imports=["distrl_test_user_env"])
    try:
        with make_envs(cfg, 2, seed=0) as env:
            assert env.observation_dtype == np.float32 and env.num_actions == 3
            np.testing.assert_array_equal(env.reset(), np.array([[0, 7], [0, 7]], np.float32))
            steps = [env.step(np.array([0, 2])) for _ in range(3)]
        np.testing.assert_array_equal(steps[1].observations, [[2, 0], [2, 2]])
        assert not steps[1].dones.any()
        last = steps[2]
        np.testing.assert_array_equal(last.terminated, [True, True])
        np.testing.assert_array_equal(last.observations, [[0, 7], [0, 7]])  # reset already
        np.testing.assert_array_equal(last.episode_returns, [7.5, 13.5])
        np.testing.assert_array_equal(last.episode_lengths, [3, 3])
    finally:
        gymnasium.registry.pop(env_id, None)
        sys.modules.pop("distrl_test_user_env", None)


def test_env_seeds_fit_ale_pys_c_ints_for_any_run_seed():
    """seed=3000 once gave Atari envs seeds above 2^31, which ale-py rejects at reset."""
    seed = env_seed(3000, actor_id=5, group=1, groups=2, envs_per_group=16)
    assert 0 <= seed and seed + 16 < 2**31
    assert env_seed(0, 1, 0, 2, 16) == 32  # small seeds are unchanged by the wrap
    # 3000 * 1,000,003 + (5 * 2 + 1) * 16 = 3,000,009,176, less 2^31 - 2^20 once
    assert seed == 3_000_009_176 - (2**31 - 2**20) == 853_574_104
    # 2,147,006,441 lies below 2^31 but above the 2^20 envs' headroom: it wraps too
    assert env_seed(2147, 0, 0, 1, 16) == 2147 * 1_000_003 - (2**31 - 2**20) == 571_369
    with make_envs(EnvConfig(id="Pong"), 2, seed) as envs:
        assert envs.reset().shape == (2, 4, 84, 84)


@pytest.mark.parametrize(("group", "game_id", "rom"), [
    ("Breakout", "Breakout", "breakout"),
    ("MsPacman", "MsPacman", "ms_pacman"),
    ("TicTacToe3D", "TicTacToe3D", "tic_tac_toe_3d"),
])
def test_env_group_of_any_ale_game_is_pongs_with_its_own_id(tmp_path, group, game_id, rom):
    """``env=<Game>`` works for every ALE game, not only Pong's file: the same preprocessing
    and budget as ``env=Pong``, with the game's id, which names its ROM."""
    from presets import compose_run

    pong = compose_run(tmp_path, "pong", "agent=apex", "env=Pong")
    game = compose_run(tmp_path, "game", "agent=apex", f"env={group}")
    assert game.env.id == game_id and envs.atari_rom(game.env.id) == rom
    assert dataclasses.replace(game.env, id="Pong") == pong.env
    assert game.total_frames == pong.total_frames == 200_000_000
    assert len(envs.atari_game_names()) == len(set(envs.atari_game_names())) > 100
