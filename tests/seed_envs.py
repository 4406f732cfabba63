"""Gymnasium envs for the SEED tests; ``env.imports=[seed_envs]`` registers them in every
env worker process.

- ``DistrlCounter-v0``: observation ``[env, step_in_episode]`` (``env`` = seed mod 1000),
  reward = action + 1, episodes of ``3 + seed % 5`` steps: deterministic, and every
  number says where it came from.
- ``DistrlMatch-v0``: observation ``[k, step]`` with ``k`` drawn from the env's seeded
  generator; reward 1 when the action equals ``k``, else 0: an action given to the wrong
  env scores 0.
- ``DistrlHang-v0``: DistrlCounter, but the envs of a worker's first generation (seeds
  below 10^6) sleep for an hour on their 5th step.
- ``DistrlMarked-v0``: DistrlCounter whose first step writes the file ``stepped-<pid>``
  into the folder ``$DISTRL_TEST_MARKER_DIR``: a test sees which worker processes have
  had an action answered (so their unroll is open).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import gymnasium
import numpy as np

NUM_ACTIONS = 3


class Counter(gymnasium.Env):
    observation_space = gymnasium.spaces.Box(0.0, 1e6, (2,), np.float32)
    action_space = gymnasium.spaces.Discrete(NUM_ACTIONS)
    hang = False

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.env = seed % 1000
            self.length = 3 + seed % 5
            self.slow = self.hang and seed < 1_000_000
            self.steps_taken = 0
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        return np.array([self.env, self.t], np.float32)

    def step(self, action):
        self.t += 1
        self.steps_taken += 1
        if self.slow and self.steps_taken == 5:
            time.sleep(3600)
        return self._obs(), float(action) + 1.0, self.t >= self.length, False, {}


class Hang(Counter):
    hang = True


MARKER_DIR = "DISTRL_TEST_MARKER_DIR"


class Marked(Counter):
    def step(self, action):
        if not getattr(self, "marked", False):
            Path(os.environ[MARKER_DIR], f"stepped-{os.getpid()}").touch()
            self.marked = True
        return super().step(action)


class Match(gymnasium.Env):
    observation_space = gymnasium.spaces.Box(0.0, 1e6, (2,), np.float32)
    action_space = gymnasium.spaces.Discrete(NUM_ACTIONS)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.k = int(self.np_random.integers(NUM_ACTIONS))
        return np.array([self.k, self.t], np.float32), {}

    def step(self, action):
        reward = 1.0 if int(action) == self.k else 0.0
        self.t += 1
        self.k = int(self.np_random.integers(NUM_ACTIONS))
        return np.array([self.k, self.t], np.float32), reward, self.t >= 7, False, {}


for name, entry in (("DistrlCounter-v0", Counter), ("DistrlMatch-v0", Match),
                    ("DistrlHang-v0", Hang), ("DistrlMarked-v0", Marked)):
    if name not in gymnasium.registry:
        gymnasium.register(name, entry_point=entry)
