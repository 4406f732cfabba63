"""IMPALA's loss, slowed: a learner made the slow side of a run on purpose.

A class at module level, so the agent's parts that hold it still pickle for actor
processes (which never call the loss).
"""

from __future__ import annotations

import time

from agents import impala

IMPALA_LOSS = impala.loss_fn  # the real one, kept before a test replaces impala.loss_fn


class SlowImpalaLoss:
    """``impala.loss_fn`` after sleeping ``seconds``."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __call__(self, *args, **kwargs):
        time.sleep(self.seconds)
        return IMPALA_LOSS(*args, **kwargs)
