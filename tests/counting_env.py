"""Gymnasium envs for fault tests: ``env.imports=[counting_env]`` registers them.

``DistrlCount-v0``: the observation is ``[t, 1, 0, 0]`` at step ``t`` of an episode of 40
steps, so a test can tell whether consecutive observations of one env belong together:
an unroll or transition stitched from two actors' pieces, or cut short, shows at once.
``DistrlHangAfter-v0``: the same, but its 30th step never returns (a hung env).
``DistrlSlowCount-v0``: the same, but every step takes ``SLOW_STEP_S`` (a slow env, which
makes a run actor-bound on purpose).
``DistrlBigRewards-v0``: the same, but step ``t`` pays ``BIG_REWARDS[t % 3]``, rewards
outside [-1, 1] for reward-clipping tests.
"""

from __future__ import annotations

import time

import gymnasium
import numpy as np

EPISODE_STEPS = 40
SLOW_STEP_S = 0.002
BIG_REWARDS = (-7.0, 0.5, 3.0)


class Count(gymnasium.Env):
    observation_space = gymnasium.spaces.Box(-1.0, 1e6, (4,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)
    hang_at: int | None = None
    step_s = 0.0

    def _obs(self) -> np.ndarray:
        return np.array([self.t, 1.0, 0.0, 0.0], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        if self.step_s:
            time.sleep(self.step_s)
        if self.hang_at is not None and self.t >= self.hang_at:
            time.sleep(3600)
        return self._obs(), float(action), self.t >= EPISODE_STEPS, False, {}


class HangAfter(Count):
    hang_at = 30


class SlowCount(Count):
    step_s = SLOW_STEP_S


class BigRewards(Count):
    def step(self, action):
        obs, _, terminated, truncated, info = super().step(action)
        return obs, BIG_REWARDS[self.t % 3], terminated, truncated, info


for _name, _entry in (("DistrlCount-v0", Count), ("DistrlHangAfter-v0", HangAfter),
                      ("DistrlSlowCount-v0", SlowCount), ("DistrlBigRewards-v0", BigRewards)):
    if _name not in gymnasium.registry:
        gymnasium.register(_name, entry_point=_entry)
