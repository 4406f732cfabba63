"""Small deterministic fake environments for unit tests: every number is a closed form.

:class:`CounterEnv` is a :class:`distrl.envs.VectorEnv` whose observation tells a test
which env and which step of its episode it is looking at, and whose reward is the
action plus one, so a test can check that rewards, actions and observations land in
the right column and at the right time index.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from distrl.envs import VectorEnv


class CounterEnv(VectorEnv):
    """``len(episode_lengths)`` envs; env ``i``'s episodes last ``episode_lengths[i]`` steps.

    Observation of env ``i``: ``[env_offset + i, step_in_episode]`` float32, where
    ``step_in_episode`` is 0 on the first observation of every episode. Reward: the
    action taken plus one. At the step that ends an episode the env autoresets in the
    same step (as :class:`VectorEnv` promises), so the observation returned there is
    already ``[env_offset + i, 0]``. Episodes end by termination, or by truncation for
    the envs flagged in ``truncate``.

    Args:
        episode_lengths: agent steps per episode, one per env (each >= 1).
        num_actions: discrete actions ``0 .. num_actions - 1``.
        env_offset: added to the env index in the observation (tells env groups apart).
        truncate: per env, report episode ends as truncation instead of termination.
        seed: passed to :class:`VectorEnv` (unused: the env is deterministic).
    """

    def __init__(
        self,
        episode_lengths: Sequence[int],
        num_actions: int = 3,
        env_offset: int = 0,
        truncate: Sequence[bool] | None = None,
        seed: int = 0,
    ) -> None:
        lengths = np.asarray(episode_lengths, np.int64)
        if lengths.ndim != 1 or lengths.size == 0 or (lengths < 1).any():
            raise ValueError(f"episode_lengths must be >= 1 per env, got {episode_lengths!r}")
        super().__init__(
            num_envs=int(lengths.size),
            observation_shape=(2,),
            observation_dtype=np.float32,
            num_actions=num_actions,
            frames_per_step=1,
            seed=seed,
        )
        self.episode_lengths = lengths
        self.env_offset = env_offset
        self.truncate = np.zeros(lengths.size, bool) if truncate is None else np.asarray(
            truncate, bool
        )
        self._step_in_episode = np.zeros(lengths.size, np.int64)
        self._actions: np.ndarray | None = None
        self.sent: list[np.ndarray] = []  # every action batch received, in order
        self.close_calls = 0

    def _observations(self) -> np.ndarray:
        env_index = self.env_offset + np.arange(self.num_envs)
        return np.stack([env_index, self._step_in_episode], axis=1).astype(np.float32)

    def _reset(self, seed: int | None) -> np.ndarray:
        self._step_in_episode[:] = 0
        return self._observations()

    def _send(self, actions: np.ndarray) -> None:
        self._actions = actions.copy()
        self.sent.append(actions.copy())

    def _recv(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        assert self._actions is not None
        rewards = (self._actions + 1).astype(np.float32)
        self._actions = None
        self._step_in_episode += 1
        ended = self._step_in_episode >= self.episode_lengths
        self._step_in_episode[ended] = 0
        return self._observations(), rewards, ended & ~self.truncate, ended & self.truncate

    def _close(self) -> None:
        self.close_calls += 1


def counter_action(env_index: int, step_in_episode: int, num_actions: int) -> int:
    """The action the tests' stub policies take on observation ``[env_index, step]``."""
    return (env_index + step_in_episode) % num_actions
