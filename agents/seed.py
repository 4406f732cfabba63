"""SEED RL: scalable and efficient deep RL with accelerated central inference
(Espeholt et al. 2020).

Actors only step environments; one inference server on the learner batches every
actor's observations, runs the newest model once per batch (on the learner's GPU
when there is one), keeps each environment's recurrent state, and assembles the
unrolls, which reach the learner without leaving its process. The learner is
IMPALA's V-trace learner by default (SEED-IMPALA, Section 3), or R2D2's
(``agent.learner=r2d2``, SEED-R2D2, the paper's Atari agent): the same networks,
losses and hyperparameters, taken from ``agents/impala.py`` and ``agents/r2d2.py``
rather than written twice. Read top to bottom: config -> run.

Where the rest of it lives (the paper's system, rather than its algorithm):
- ``distrl/acting/inference.py``: the inference server (Section 2): batching the workers'
  requests, one forward pass per batch, each env's recurrent state, the unrolls or
  sequences built on the server's side.
- ``distrl/acting/env_workers.py``: the env worker processes and their shared-memory
  request/answer channels.
- ``distrl/runners/seed_sources.py``: the server and workers as the learner's source of
  unrolls (IMPALA's family, ``distrl/runners/unroll_family.py``) or of sequences (R2D2's,
  ``distrl/runners/replay_family.py``); ``distrl/runners/runner.py``: the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agents import impala, r2d2
from distrl.config import (
    ConfigError,
    check_choice,
    check_device,
    check_non_negative,
    check_positive,
)
from distrl.run.run_settings import Conventions

if TYPE_CHECKING:
    from distrl.config import RunConfig
    from distrl.runners.runner import ProgressHook, RunSummary, StopCheck

LEARNERS = ("impala", "r2d2")
LEARNER_AGENTS = {"impala": impala, "r2d2": r2d2}  # CONVENTIONS: as each learner's paper


@dataclass
class SeedConfig:
    """SEED settings: the learner's own config plus the inference server's.

    ``agent.impala`` holds IMPALA's Table G.1 defaults and ``agent.r2d2`` R2D2's Table 2
    (Kapturowski et al. 2019); only the one ``agent.learner`` names is used, so SEED against
    the plain agent compares the topology alone. That is a choice: seed_rl's own Atari
    R2D2 (``seed_rl/atari/config.py`` flags) differs from Table 2 in Adam's lr (4.8e-4,
    here 1e-4), its unrolls (100 trained steps after a 40-step burn-in, a new one every
    100 steps; here 80 after 40, a new one every 40) and a replay ratio of 1.5 (here the
    learner runs free). It agrees on TF's Adam rule with eps 1e-3, gradient norm 40, target
    updates every 2,500 steps, the full 18 actions and evaluation epsilon 0.001 (the last
    two through R2D2's CONVENTIONS). seed_rl's settings are ``agent.r2d2.optimizer.lr=
    0.00048 agent.r2d2.trace_length=100 agent.r2d2.overlap=0 agent.r2d2.replay_ratio=1.5``.
    Actors never pull weights under SEED (inference runs on the server), so
    ``agent.r2d2.weight_sync_steps`` does not apply.
    """

    name: str = "seed"
    learner: str = "impala"  # which learner trains on the server's unrolls
    impala: impala.ImpalaConfig = field(default_factory=impala.ImpalaConfig)
    r2d2: r2d2.R2D2Config = field(default_factory=r2d2.R2D2Config)
    max_inference_batch: int = 0  # most envs per inference call; 0 = all envs of the run
    inference_timeout_ms: float = 1.0  # dynamic batching: wait this long for more requests
    worker_timeout_s: float = 60.0  # an env worker silent this long after its actions is hung
    max_worker_restarts: int = 10  # a run whose workers fail more often than this stops
    # Torch threads of the inference server's thread, which runs beside the learner's own
    # threads in one process; 0 = as many as the learner's. 1: on Pong with 2 cores the two
    # thread teams no longer contend, 1.04-1.16x the frames/s of sharing the learner's 2
    # (docs/notes/2026-11-25.md); raise it where inference has cores to spare.
    inference_threads: int = 1
    # Where inference and training run (the learner's own agent.impala/r2d2.device is not
    # used): auto = the GPU when there is one, cpu, cuda or cuda:N.
    device: str = "auto"

    def __post_init__(self) -> None:
        if self.name != "seed":
            raise ConfigError(f"agent.name must be 'seed' for SeedConfig, got {self.name!r}")
        check_choice("agent.learner", self.learner, LEARNERS)
        check_non_negative("agent.max_inference_batch", self.max_inference_batch)
        check_non_negative("agent.inference_timeout_ms", self.inference_timeout_ms)
        check_positive("agent.worker_timeout_s", self.worker_timeout_s)
        check_non_negative("agent.inference_threads", self.inference_threads)
        check_non_negative("agent.max_worker_restarts", self.max_worker_restarts)
        check_device("agent.device", self.device)


def conventions(agent: SeedConfig) -> Conventions:
    """Life loss, action set and evaluation as the learner's paper has them: seed_rl's
    Atari agents follow their learners (R2D2's full 18 actions, evaluation epsilon 0.001;
    IMPALA's minimal sets, sampling)."""
    return LEARNER_AGENTS[agent.learner].CONVENTIONS


def run(cfg: RunConfig, should_stop: StopCheck | None = None,
        progress: ProgressHook | None = None) -> RunSummary:
    """Train SEED with a :class:`distrl.config.RunConfig` whose ``agent`` is SeedConfig:
    SEED-IMPALA with the unroll family, SEED-R2D2 with the replay family; only the
    inference source differs from the plain agents. ``progress(updates, frames)`` is
    called after each update of a replay learner (benchmarks time it)."""
    import dataclasses
    import functools

    from distrl.run.run_settings import RunSettings
    from distrl.runners.runner import train_agent

    agent: SeedConfig = cfg.agent
    settings = RunSettings.from_config(cfg, conventions(agent))
    inference = dict(inference=_inference_settings(agent))
    if agent.learner == "r2d2":
        from distrl.runners.replay_family import REPLAY
        from distrl.runners.seed_sources import SeedReplaySource

        # R2D2's parts under SEED's name, on SEED's device (inference and training share it)
        parts = dataclasses.replace(r2d2.parts(agent.r2d2, cfg.kernel), name="seed",
                                    device=agent.device, settings_path="agent.r2d2")
        return train_agent(REPLAY, parts, settings, should_stop=should_stop, progress=progress,
                           source=functools.partial(SeedReplaySource, **inference))
    from distrl.runners.seed_sources import SeedSource
    from distrl.runners.unroll_family import UNROLL

    parts = dataclasses.replace(impala.parts(agent.impala, cfg.kernel), name="seed",
                                device=agent.device, settings_path="agent.impala")
    return train_agent(UNROLL, parts, settings, should_stop=should_stop,
                       source=functools.partial(SeedSource, **inference))


def _inference_settings(agent: SeedConfig) -> Any:
    from distrl.runners.seed_sources import InferenceSettings

    return InferenceSettings(
        max_batch=agent.max_inference_batch, batch_timeout_s=agent.inference_timeout_ms / 1e3,
        worker_timeout_s=agent.worker_timeout_s,
        max_worker_restarts=agent.max_worker_restarts,
        torch_threads=agent.inference_threads)
