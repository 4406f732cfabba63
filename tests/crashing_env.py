"""A gymnasium env that raises on its 30th step: ``env.imports=[crashing_env]`` registers
``DistrlCrashAfter-v0`` for tests of what a run does when an actor process fails."""

from __future__ import annotations

import gymnasium
import numpy as np


class CrashAfter(gymnasium.Env):
    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t >= 30:
            raise RuntimeError("DistrlCrashAfter-v0 crashed on purpose")
        return np.zeros(4, np.float32), 1.0, False, False, {}


if "DistrlCrashAfter-v0" not in gymnasium.registry:
    gymnasium.register("DistrlCrashAfter-v0", entry_point=CrashAfter)
