"""Environments: one batched interface, :class:`VectorEnv`, over Atari, MinAtar and any
gymnasium env.

``make_envs(cfg, num_envs, seed)`` returns ``N`` environments stepped as one batch.
Atari games run in ale-py's C++ threaded vector env (``send`` returns at once, ``recv``
waits); MinAtar's games ("MinAtar-Breakout", :mod:`distrl.envs.minatar_envs`) in a Python loop
in this process; any other registered gymnasium id with a Discrete action space runs in a
``SyncVectorEnv`` in this process. Both autoreset in the same step and report each
finished episode's raw score and length, summed here from unclipped rewards, so the
numbers logged are the game's own scores whatever a loss later does to the rewards.

Lives. With ``terminal_on_life_loss`` an Atari step that loses a life is reported as
``terminated`` (the learner's episode ends: discount 0, recurrent state reset, n-step and
sequence cuts) while the game goes on, as in DQN (Mnih et al. 2015), Ape-X and IMPALA
(Espeholt et al. 2018, Table G.1, "end of episode when life lost"). The episode returns
and lengths stay per game. ale-py's own ``episodic_life`` is never used: it restarts the
whole game at every life loss, so later stages of a game would never be seen.

Importing this module also registers ``CartPoleNoVelocity-v1``: CartPole-v1 with the
velocities hidden, a task a feed-forward agent cannot solve but a recurrent one can.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import re
from typing import Any

import gymnasium
import numpy as np
from ale_py import roms
from ale_py.vector_env import AtariVectorEnv

from distrl.config import EnvConfig, atari_game_names
from distrl.envs.minatar_envs import MinAtarGames, is_minatar, make_minatar_games
from distrl.envs.vector_env import VectorEnv
from distrl.validation import ConfigError

# "ALE/Pong-v5", "PongNoFrameskip-v4", "PongDeterministic-v4" all name the ROM "pong".
_GYM_ATARI_SUFFIX = re.compile(r"(NoFrameskip|Deterministic)?-v\d+$")


@functools.cache
def _roms_by_key() -> dict[str, str]:
    """ALE ROM ids keyed by their name without underscores, lower case."""
    return {rom.replace("_", ""): rom for rom in roms.get_all_rom_ids()}


def _rom_key(env_id: str) -> str:
    name = _GYM_ATARI_SUFFIX.sub("", env_id.removeprefix("ALE/"))
    # Dropping underscores and case makes "MsPacman", "ms_pacman" and "TicTacToe3D"
    # ("tic_tac_toe_3d") meet without a CamelCase splitter that digits would trip.
    return name.replace("_", "").lower()


def atari_rom(env_id: str) -> str | None:
    """The ALE ROM id (e.g. ``"ms_pacman"``) that ``env_id`` names, or None if it names none."""
    return _roms_by_key().get(_rom_key(env_id))


def is_atari(env_id: str) -> bool:
    """True if ``env_id`` names an ALE ROM: "Pong", "ms_pacman", "ALE/MsPacman-v5", ..."""
    return atari_rom(env_id) is not None


def _atari_vector_env(**kwargs: Any) -> AtariVectorEnv:
    """Build ale-py's vector env; one seam so tests can see exactly what reaches ale-py."""
    return AtariVectorEnv(**kwargs)


class AtariEnvs(VectorEnv):
    """Atari games in ale-py's C++ vector env: threaded, preprocessed, uint8 frame stacks.

    ``terminal_on_life_loss``: a step that loses a life is ``terminated`` for the learner
    while the game goes on (read from ale-py's ``info["lives"]``); see the module docstring.
    """

    def __init__(self, env: AtariVectorEnv, frames_per_step: int, seed: int,
                 terminal_on_life_loss: bool = False) -> None:
        super().__init__(
            num_envs=env.num_envs,
            observation_shape=env.single_observation_space.shape,
            observation_dtype=np.uint8,
            num_actions=int(env.single_action_space.n),
            frames_per_step=frames_per_step,
            seed=seed,
            terminal_on_life_loss=terminal_on_life_loss,
        )
        self._env = env
        self._env_ids = np.arange(env.num_envs)
        self._info_lives: np.ndarray | None = None

    def _in_env_order(self, info: dict[str, Any], *arrays: np.ndarray) -> list[np.ndarray]:
        # With batch_size == num_envs ale-py answers in env order; if it ever does not,
        # sort rather than credit one env's reward to another.
        env_ids = info["env_id"]
        if np.array_equal(env_ids, self._env_ids):
            return list(arrays)
        order = np.argsort(env_ids)
        return [a[order] for a in arrays]

    def _reset(self, seed: int | None) -> np.ndarray:
        observations, info = self._env.reset(seed=seed)
        observations, self._info_lives = self._in_env_order(info, observations, info["lives"])
        return observations

    def _send(self, actions: np.ndarray) -> None:
        self._env.send(actions)

    def _recv(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        observations, rewards, terminated, truncated, info = self._env.recv()
        *step, self._info_lives = self._in_env_order(
            info, observations, rewards, terminated, truncated, info["lives"])
        return tuple(step)

    def _lives(self) -> np.ndarray | None:
        return self._info_lives

    def _close(self) -> None:
        self._env.close()
        del self._env  # the C++ object owns the worker threads; drop it now, not at exit


class GymEnvs(VectorEnv):
    """Any registered gymnasium env with a Discrete action space, stepped in this process."""

    def __init__(self, env_id: str, num_envs: int, seed: int) -> None:
        env = gymnasium.vector.SyncVectorEnv(
            [functools.partial(gymnasium.make, env_id)] * num_envs,
            autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP,
        )
        action_space = env.single_action_space
        observation_shape = env.single_observation_space.shape
        if not isinstance(action_space, gymnasium.spaces.Discrete) or observation_shape is None:
            env.close()
            raise ConfigError(
                f"env.id: {env_id!r} has action space {action_space} and observation space "
                f"{env.single_observation_space}; only Discrete actions and array "
                "observations are supported"
            )
        super().__init__(
            num_envs=num_envs,
            observation_shape=observation_shape,
            observation_dtype=np.float32,
            num_actions=int(action_space.n),
            frames_per_step=1,
            seed=seed,
        )
        self._env = env
        self._action_start = int(action_space.start)  # Discrete(n, start=k) acts in k .. k+n-1
        self._actions: np.ndarray | None = None

    def _reset(self, seed: int | None) -> np.ndarray:
        observations, _ = self._env.reset(seed=seed)
        return np.asarray(observations, np.float32)

    def _send(self, actions: np.ndarray) -> None:
        self._actions = actions + self._action_start

    def _recv(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        observations, rewards, terminated, truncated, _ = self._env.step(self._actions)
        self._actions = None
        return np.asarray(observations, np.float32), rewards, terminated, truncated

    def _close(self) -> None:
        self._env.close()


class MinAtarEnvs(VectorEnv):
    """MinAtar games (Young & Tian 2019) as a :class:`VectorEnv`: uint8 ``[N, C, 10, 10]``
    observations of 0/1 channels, one frame per step (MinAtar counts steps as frames), no
    lives. The games step in :meth:`recv`, in this process."""

    def __init__(self, games: MinAtarGames, seed: int) -> None:
        super().__init__(
            num_envs=games.num_envs,
            observation_shape=games.observation_shape,
            observation_dtype=np.uint8,
            num_actions=len(games.action_set),
            frames_per_step=1,
            seed=seed,
        )
        self.games = games
        self._actions: np.ndarray | None = None

    def _reset(self, seed: int | None) -> np.ndarray:
        return self.games.reset(seed)

    def _send(self, actions: np.ndarray) -> None:
        self._actions = actions

    def _recv(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        actions, self._actions = self._actions, None
        return self.games.step(actions)

    def _close(self) -> None:
        self.games.games.clear()


class HideVelocity(gymnasium.ObservationWrapper):
    """CartPole with only positions observed: a POMDP that needs memory to infer velocity.

    CartPole's observation is [cart position, cart velocity, pole angle, pole angular
    velocity]; this keeps indices 0 and 2 in a float32 ``Box`` of shape ``(2,)``, its
    bounds those of the wrapped space at the same indices.
    """

    kept_indices = (0, 2)

    def __init__(self, env: gymnasium.Env) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gymnasium.spaces.Box) or space.shape != (4,):
            raise ValueError(f"HideVelocity wraps CartPole's Box of shape (4,), got {space}")
        kept = list(self.kept_indices)
        self.observation_space = gymnasium.spaces.Box(
            low=space.low[kept], high=space.high[kept], dtype=np.float32
        )

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.asarray(observation, np.float32)[list(self.kept_indices)]


def _cartpole_no_velocity(**kwargs: Any) -> HideVelocity:
    """Entry point of ``CartPoleNoVelocity-v1``; gymnasium.make adds the 500-step TimeLimit."""
    cartpole = gymnasium.envs.registration.load_env_creator(
        gymnasium.spec("CartPole-v1").entry_point
    )
    return HideVelocity(cartpole(**kwargs))


# gymnasium warns when an id is registered again (a reload, a second import path); each
# spawned process imports this module afresh and so registers it once there.
if "CartPoleNoVelocity-v1" not in gymnasium.registry:
    gymnasium.register(
        "CartPoleNoVelocity-v1",
        # A string, as in gymnasium's own specs: EnvSpec.to_json cannot serialise a callable.
        entry_point=f"{__name__}:_cartpole_no_velocity",
        max_episode_steps=500,
        reward_threshold=gymnasium.spec("CartPole-v1").reward_threshold,
    )


def _import_user_modules(modules: list[str]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:
            raise ConfigError(f"env.imports: cannot import {name!r}: {e}") from e


def _unknown_env(env_id: str) -> ConfigError:
    # Compare case-insensitively so "pongg" still finds "Pong".
    names = [*atari_game_names(), *gymnasium.registry]
    by_lower = {name.lower(): name for name in names}
    close = difflib.get_close_matches(env_id.lower(), list(by_lower), n=1, cutoff=0.75)
    hint = f"; did you mean {by_lower[close[0]]!r}?" if close else ""
    return ConfigError(
        f"env.id: unknown environment {env_id!r}; expected an Atari game name "
        f"(e.g. Pong, Breakout), a MinAtar game (e.g. MinAtar-Breakout) or a registered "
        f"gymnasium id (e.g. CartPole-v1){hint}"
    )


def _gym_id(env_id: str) -> str:
    """``env_id`` if gymnasium knows it (importing ``module`` of "module:Id" first)."""
    if ":" in env_id:  # gymnasium.make's "module:EnvId" form; spec() does not import
        module, env_id = env_id.split(":", 1)
        _import_user_modules([module])
    try:
        gymnasium.spec(env_id)
    except gymnasium.error.Error:
        raise _unknown_env(env_id) from None
    return env_id


def _check_count(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ConfigError(f"{name} must be positive, got {value!r}")


ENV_SEED_LIMIT = 2**31 - 2**20  # ale-py takes C ints; room for 2^20 envs above a group's seed


def env_seed(seed: int, actor_id: int, group: int, groups: int, envs_per_group: int) -> int:
    """Seed of env 0 of a group; env i gets this + i, so no two envs of a run share a seed
    (for run seeds below 2,147; larger ones wrap into ale-py's 31-bit range)."""
    return (seed * 1_000_003 + (actor_id * groups + group) * envs_per_group) % ENV_SEED_LIMIT


def make_envs(cfg: EnvConfig, num_envs: int, seed: int, num_threads: int = 1) -> VectorEnv:
    """``num_envs`` environments of ``cfg.id`` as one :class:`VectorEnv`.

    Args:
        cfg: which env and its preprocessing. An Atari name ("Pong", "ms_pacman",
            "ALE/MsPacman-v5") runs in ale-py with every preprocessing field of ``cfg``
            (the protocol defaults applied), a lost life terminal where
            ``cfg.terminal_on_life_loss`` (None counts as False here: the agent resolves
            it). A MinAtar id ("MinAtar-Breakout") reads ``repeat_action_probability``
            (None: 0.1), ``full_action_space`` (None: all 6), ``difficulty_ramping`` and
            ``max_episode_frames`` (= steps), and ignores the Atari preprocessing and the
            protocol. Any other id must be registered with gymnasium, after importing
            ``cfg.imports``. Neither has lives.
        num_envs: batch size ``N``.
        seed: env ``i`` is seeded with ``seed + i`` on the first reset.
        num_threads: ale-py worker threads (Atari only).

    Returns:
        The environments, not yet reset. Rewards are never clipped.

    Raises:
        ConfigError: unknown id, unsupported spaces, a failed import, or a count <= 0.
    """
    _check_count("num_envs", num_envs)
    _check_count("num_threads", num_threads)
    _import_user_modules(cfg.imports)
    if is_minatar(cfg.id):
        games = make_minatar_games(
            cfg.id, int(num_envs),
            sticky_action_probability=cfg.repeat_action_probability,
            difficulty_ramping=cfg.difficulty_ramping,
            full_action_space=cfg.full_action_space,
            max_episode_steps=cfg.max_episode_frames,
        )
        return MinAtarEnvs(games, seed)
    rom = atari_rom(cfg.id)
    if rom is None:
        return GymEnvs(_gym_id(cfg.id), int(num_envs), seed)
    env = _atari_vector_env(
        game=rom,
        num_envs=int(num_envs),
        num_threads=min(int(num_threads), int(num_envs)),
        autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP,
        frameskip=cfg.frame_skip,
        stack_num=cfg.frame_stack,
        img_height=cfg.image_size,
        img_width=cfg.image_size,
        grayscale=cfg.grayscale,
        maxpool=cfg.max_pool,
        noop_max=cfg.noop_max,
        max_num_frames_per_episode=cfg.max_episode_frames,
        repeat_action_probability=cfg.sticky_action_probability,
        full_action_space=cfg.use_full_action_space,
        # Never ale-py's life handling: episodic_life restarts the game at a life loss, and
        # life_loss_info sets the same terminated flag as a game over. AtariEnvs reads
        # info["lives"] instead, so it knows which of the two ended the learner's episode.
        episodic_life=False,
        life_loss_info=False,
        use_fire_reset=cfg.fire_reset,
        reward_clipping=False,
    )
    return AtariEnvs(env, frames_per_step=cfg.frame_skip, seed=seed,
                     terminal_on_life_loss=bool(cfg.terminal_on_life_loss))
