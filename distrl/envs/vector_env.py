"""The one batched env interface every actor and env worker steps: :class:`VectorEnv`.

``N`` environments stepped as one batch (``send`` actions, ``recv`` the step), autoreset
in the same step, with each finished episode's raw score and length summed from
unclipped rewards and, with ``terminal_on_life_loss``, a lost life reported as
``terminated`` while the game goes on. The games themselves are in :mod:`distrl.envs`.
"""

from __future__ import annotations

import numpy as np

from distrl.types import EnvStep


class VectorEnv:
    """``num_envs`` environments stepped as one batch, autoresetting in the same step.

    Subclasses implement ``_reset``, ``_send``, ``_recv`` and ``_close`` (and ``_lives``
    where the game has lives); this class checks the call order and the actions, keeps
    each env's running raw return and length per game, and, with
    ``terminal_on_life_loss``, turns a lost life into ``terminated``.
    """

    num_envs: int
    observation_shape: tuple[int, ...]
    observation_dtype: np.dtype  # uint8 for Atari, float32 otherwise
    num_actions: int  # discrete actions 0 .. num_actions - 1
    frames_per_step: int  # env frames per agent step: the frame skip for Atari, 1 otherwise

    def __init__(
        self,
        num_envs: int,
        observation_shape: tuple[int, ...],
        observation_dtype: np.dtype,
        num_actions: int,
        frames_per_step: int,
        seed: int,
        terminal_on_life_loss: bool = False,
    ) -> None:
        self.num_envs = num_envs
        self.observation_shape = tuple(observation_shape)
        self.observation_dtype = np.dtype(observation_dtype)
        self.num_actions = num_actions
        self.frames_per_step = frames_per_step
        self._seed = int(seed)
        self._seeded = False
        self._started = False
        self._pending = False
        self._closed = False
        self.terminal_on_life_loss = bool(terminal_on_life_loss)
        self._returns = np.zeros(num_envs, np.float64)
        self._lengths = np.zeros(num_envs, np.int64)
        self._last_lives: np.ndarray | None = None  # [N] lives before the pending step

    def reset(self) -> np.ndarray:
        """Start a new episode in every env; returns observations ``[N, *obs_shape]``.

        The first reset seeds env ``i`` with ``seed + i``; later resets continue each env's
        random stream, so a run is reproducible from its seed without replaying one episode.
        """
        self._check_open()
        seed = None if self._seeded else self._seed
        self._seeded = True
        self._returns[:] = 0.0
        self._lengths[:] = 0
        self._pending = False
        self._started = True
        observations = self._reset(seed)
        lives = self._lives()
        self._last_lives = None if lives is None else np.array(lives, np.int64)
        return observations

    def send(self, actions: np.ndarray) -> None:
        """Start a step with ``actions`` ``[N]`` ints in ``[0, num_actions)``; recv() ends it."""
        self._check_open()
        if not self._started:
            raise RuntimeError("call reset() before send()")
        if self._pending:
            raise RuntimeError("send() called twice without a recv() in between")
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs,) or not np.issubdtype(actions.dtype, np.integer):
            raise ValueError(
                f"actions must be an integer array of shape ({self.num_envs},), "
                f"got {actions.dtype} {actions.shape}"
            )
        if actions.min() < 0 or actions.max() >= self.num_actions:
            raise ValueError(
                f"actions must lie in [0, {self.num_actions}), got {actions.min()}..{actions.max()}"
            )
        self._send(actions.astype(np.int64, copy=False))
        self._pending = True

    def recv(self) -> EnvStep:
        """Finish the step started by send; see :class:`distrl.types.EnvStep`."""
        self._check_open()
        if not self._pending:
            raise RuntimeError("recv() called without a send() before it")
        self._pending = False
        observations, rewards, terminated, truncated = self._recv()
        # Sum the rewards as the env gave them, in float64, before the float32 cast.
        self._returns += np.asarray(rewards, np.float64)
        self._lengths += 1
        terminated = np.asarray(terminated, bool)
        truncated = np.asarray(truncated, bool)
        game_over = terminated | truncated
        episode_returns = np.where(game_over, self._returns, np.nan)
        episode_lengths = np.where(game_over, self._lengths, 0)
        self._returns[game_over] = 0.0
        self._lengths[game_over] = 0
        lives = self._lives()
        if lives is not None:
            lives = np.array(lives, np.int64)
            # Where the game ended, ``lives`` is already the next game's (same-step
            # autoreset), so only a decrease within one game is a lost life.
            life_lost = (lives < self._last_lives) & ~game_over
            self._last_lives = lives
            if self.terminal_on_life_loss:
                terminated = terminated | life_lost
        return EnvStep(
            observations=observations,
            rewards=np.asarray(rewards, np.float32),
            terminated=terminated,
            truncated=truncated,
            episode_returns=episode_returns,
            episode_lengths=episode_lengths,
            lives=lives,
        )

    def step(self, actions: np.ndarray) -> EnvStep:
        """send(actions) then recv()."""
        self.send(actions)
        return self.recv()

    def close(self) -> None:
        """Release the environments (and ale-py's threads); calling it twice is harmless."""
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> VectorEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the environments are closed")

    def _reset(self, seed: int | None) -> np.ndarray:
        raise NotImplementedError

    def _send(self, actions: np.ndarray) -> None:
        raise NotImplementedError

    def _recv(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError

    def _lives(self) -> np.ndarray | None:
        """[N] lives left after the last ``_reset``/``_recv``, or None: the env has none."""
        return None
