"""benchmarks/fps.py: the plain run a SEED run is compared with, and the frames a replay
agent's timed updates are credited with."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from fps import twin_overrides  # noqa: E402

from distrl.runners.replay_learner import frames_learned  # noqa: E402


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


def test_replay_frames_are_what_the_updates_consume_at_the_held_ratio() -> None:
    # Ape-X on Atari: batch 128 at 4 samples per inserted transition, 4 frames a
    # transition: an update consumes 32 transitions, 128 frames; 40 updates 5,120.
    assert frames_learned(40 * 128, 4.0, frames=400_000, inserted=100_000) == 5_120
    # R2D2: batch 4 at ratio 2, sequences adding 40 agent steps (160 frames) each.
    assert frames_learned(10 * 4, 2.0, frames=160_000, inserted=1_000) == 3_200
