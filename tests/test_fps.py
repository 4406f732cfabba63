"""benchmarks/fps.py: the plain run a SEED run is compared with."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from fps import twin_overrides  # noqa: E402


def test_seed_twin_keeps_the_learner_device_and_settings() -> None:
    # agent.device used to be dropped with SEED's other own settings, so on a GPU machine
    # the twin's learner trained on the CPU and the ratio compared a GPU learner with a
    # CPU one (caught before the H200 check's SEED figures were taken).
    seed = ["agent=seed", "agent.learner=r2d2", "env=Pong", "agent.device=cuda",
            "agent.r2d2.learning_starts=64", "agent.inference_batch=32"]
    assert twin_overrides(seed, "r2d2") == [
        "agent=r2d2", "env=Pong", "agent.device=cuda", "agent.learning_starts=64"]


def test_seed_twin_drops_the_other_learner_settings() -> None:
    seed = ["agent=seed", "agent.impala.lr=0.001", "agent.r2d2.lr=0.5",
            "distributed.actors=4"]
    assert twin_overrides(seed, "impala") == [
        "agent=impala", "agent.lr=0.001", "distributed.actors=4"]
