"""Trains an unroll agent (IMPALA, SEED-IMPALA): B unrolls per update from slots that its
experience source fills, in one process or with actor processes (and under torchrun).

With ``distributed.actors == 0`` the actor and learner take turns in one loop
(debuggable, deterministic, used by the tests); otherwise actor processes (spawned)
fill shared slots while this process learns. Actors end with the run, also when it
fails or is interrupted. The loop itself is :func:`distrl.training.loop.train`.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from distrl.acting import remote
from distrl.acting.evaluation import evaluate_final_policy, frozen_cpu_copy
from distrl.run import checkpoint, memory
from distrl.run.malloc import apply as apply_malloc_setting
from distrl.run.run_settings import RunSettings, settings_for_rank
from distrl.runners.actor_ranks import serve_unroll_actor_rank
from distrl.runners.unroll_sources import (
    UnrollActorSource,
    UnrollSourceContext,
    UnrollSourceFactory,
    to_unroll,
    unroll_specs,
)
from distrl.telemetry.logging import MetricLogger
from distrl.training import loop, sizing
from distrl.training.agent_parts import UnrollAgentParts
from distrl.training.learner import Learner, resolve_device
from distrl.training.learner_rank import check_kernel, start_learner_rank
from distrl.training.run_dir import CHECKPOINT_FORMAT, final_checkpoint, restore_learner
from distrl.transport import distributed
from distrl.transport.queues import SlotPool
from distrl.types import Unroll
from distrl.validation import ConfigError


class UnrollFeed:
    """IMPALA's learner batches (:class:`distrl.training.loop.Feed`): ``batch_size / per_group``
    full slots from the source, gathered into one ``[T, B]`` unroll. ``counters["frames"]``
    counts every rank's frames: all ranks learn from a batch each update."""

    def __init__(self, experience: Any, pool: SlotPool, learner: Learner,
                 counters: dict[str, Any], slots_per_batch: int, frames_per_update: int,
                 total_frames: int, world: int):
        self.experience, self.pool, self.learner = experience, pool, learner
        self.counters = counters
        self.slots_per_batch = slots_per_batch
        self.frames_per_update = frames_per_update  # of all ranks
        self.total_frames = total_frames
        self.world = world
        self.logger: MetricLogger | None = None
        self.remote_actors: remote.RemoteActors | None = None
        self._learned = counters["frames"]  # the frame count at the last throughput report

    def start(self, logger: MetricLogger, remote_actors: remote.RemoteActors | None) -> None:
        self.logger, self.remote_actors = logger, remote_actors
        self._learned = self.counters["frames"]

    def next_batch(self, stop_requested: Callable[[], bool]
                   ) -> tuple[Unroll, dict[str, float]] | None:
        if self.budget_spent():
            return None
        indices, waited = self.experience.next_batch(
            self.slots_per_batch, self.counters["frames"] == 0, self._collect_actor_stats)
        start = time.perf_counter()
        unroll = to_unroll(self.pool.gather(indices))
        self.pool.release(indices)
        copied = time.perf_counter() - start
        lag = self.learner.version - unroll.policy_versions.double().mean().item()
        return unroll, {"learner/policy_lag": lag, "learner/batch_wait_s": waited,
                        "learner/copy_s": copied}

    def after_update(self, batch: Unroll, priorities: torch.Tensor | None) -> None:
        self.counters["frames"] += self.frames_per_update

    def _collect_actor_stats(self) -> None:
        assert self.logger is not None
        for stats in self.experience.drain():
            loop.log_actor_stats(self.logger, stats, self.counters["frames"])
        loop.log_remote_actors(self.logger, self.remote_actors, self.counters["frames"])

    def collect(self) -> None:
        self._collect_actor_stats()
        self.experience.log(self.logger)

    def rank_frames(self) -> int:
        return self.counters["frames"] // self.world

    def budget_spent(self) -> bool:
        return self.counters["frames"] >= self.total_frames

    def report(self, span_s: float) -> tuple[dict[str, float], dict[str, float]]:
        return {}, {}

    def throughput(self, span_s: float) -> dict[str, float]:
        """Frames this rank learned from since the last call, and the slots now full."""
        learned, self._learned = self.counters["frames"] - self._learned, self.counters["frames"]
        return {"learned_frames": learned / self.world,
                "slots_full": self.pool.full_count() / self.pool.num_slots}


def train_unroll_agent(
    parts: UnrollAgentParts,
    settings: RunSettings,
    should_stop: Callable[[int], bool] | None = None,
    source: UnrollSourceFactory = UnrollActorSource,
) -> dict[str, Any]:
    """Train until ``total_frames`` env frames were learned from (or a stop was asked).

    Args:
        parts: the agent's model, policy and loss.
        settings: topology, logging, checkpoints.
        should_stop: optional ``updates -> bool`` polled after each update (stops like SIGINT).
        source: builds where unrolls come from: actors with policy copies (IMPALA) or
            SEED's inference server (:mod:`distrl.runners.seed_sources`).

    Returns:
        A summary: frames, updates, lr, mean return of the last 20 episodes, run_dir, and
        ``throughput``: which side bounded the run
        (:meth:`distrl.telemetry.throughput.Diagnosis.to_dict`).
    """
    # Before sizing, so that its measurement of the learner sees the run's memory reuse.
    apply_malloc_setting(settings.distributed.keep_freed_memory)
    settings = sizing.resolve(
        settings, parts.make_model, batch_size=parts.batch_size,
        learner_batch=parts.unroll_length * parts.batch_size,
        passes=sizing.learner_passes(None) * parts.passes,
        central_inference=sizing.runs_inference(source),
        device=resolve_device(parts.device), precision=parts.precision)
    per_group = settings.envs_per_group
    if parts.batch_size % per_group:
        raise ConfigError(
            f"agent.batch_size ({parts.batch_size}) must be a multiple of the envs per group, "
            f"distributed.envs_per_actor / distributed.env_groups = {per_group}"
        )
    if settings.evaluation.epsilon not in (None, 0):
        raise ConfigError(f"eval.epsilon applies to the Q-learning agents (apex, r2d2); "
                          f"{parts.name} is evaluated sampling its own policy, so leave it "
                          f"unset, got {settings.evaluation.epsilon}")
    kernel_line = check_kernel(settings)
    ranks = distributed.init_from_env(learner_ranks=settings.distributed.learner_ranks)
    try:
        if ranks is not None and not ranks.is_learner:
            return serve_unroll_actor_rank(parts, settings, source, ranks)
        with contextlib.ExitStack() as run_scope:  # holds the run directory's lock
            return _train(parts, settings, should_stop, source, kernel_line, ranks, run_scope)
    finally:
        if ranks is not None:
            distributed.shutdown()


def _train(parts: UnrollAgentParts, settings: RunSettings,
           should_stop: Callable[[int], bool] | None, source: UnrollSourceFactory,
           kernel_line: str, ranks: distributed.RankInfo | None,
           run_scope: contextlib.ExitStack) -> dict[str, Any]:
    """A learner rank: build the slots, source and learner, resume, run the loop, evaluate."""
    dist = settings.distributed
    per_group = settings.envs_per_group
    rank = start_learner_rank(settings, ranks, parts.name, parts.device, parts.make_model,
                              settings.seed, run_scope)
    env, model, resumed = rank.env, rank.model, rank.resumed
    # Every rank trains on its own batch each update: the frames of all ranks' batches.
    frames_per_update = parts.unroll_length * parts.batch_size * env.frames_per_step * rank.world
    slots_per_batch = parts.batch_size // per_group
    remote_ranks = ranks.actor_ranks_of(ranks.rank) if ranks is not None else []
    producers = (max(dist.actors, 1) + len(remote_ranks)) * dist.env_groups
    num_slots = dist.slots or (2 * slots_per_batch + producers)
    if num_slots < slots_per_batch + producers:
        raise ConfigError(
            f"distributed.slots ({num_slots}) must be at least one batch ({slots_per_batch}) "
            f"plus one per env group ({producers})"
        )
    ctx = mp.get_context("spawn") if dist.actors > 0 else None
    specs = unroll_specs(parts, model, env.obs_shape, env.obs_dtype, env.num_actions, per_group)
    with memory.allocating(
            "the unroll slots", f"{num_slots} slots (distributed.slots) of "
            f"agent.unroll_length={parts.unroll_length} steps x {per_group} envs",
            memory.slots_nbytes(specs, num_slots),
            "lower distributed.slots, agent.unroll_length or distributed.envs_per_actor"):
        pool = SlotPool(specs, num_slots, mp_context=ctx)
    experience = source(UnrollSourceContext(parts, settings_for_rank(settings, ranks), model,
                                            env.obs_shape, env.num_actions,
                                            env.frames_per_step, pool, per_group))
    opt = parts.optimizer
    learner = rank.make_learner(parts.loss_fn, opt,
                                math.ceil(settings.total_frames / frames_per_update) * parts.passes,
                                experience.weights, f"{parts.settings_path}.optimizer",
                                parts.passes, parts.precision)
    counters = {"frames": 0, "elapsed_s": 0.0}
    if resumed is not None:
        restore_learner(learner, resumed, opt)
        counters.update(resumed["counters"])
        checkpoint.set_rng_state(resumed["rng"])
        experience.weights.publish(model, learner.updates)
    feed = UnrollFeed(experience, pool, learner, counters, slots_per_batch, frames_per_update,
                      settings.total_frames, rank.world)

    def save_checkpoint(frames_all_ranks: int = 0) -> Path:
        """Rank 0 writes the model and optimizer (the other ranks hold the same); the
        frames are in ``counters``."""
        if not rank.main:
            return Path()
        state = {
            "format": CHECKPOINT_FORMAT, "agent": parts.name, "optimizer_name": opt.name,
            "learner": learner.state_dict(), "world_size": rank.world,
            "counters": dict(counters), "rng": checkpoint.rng_state(),
            "config": settings.config_text,
        }
        return checkpoint.save(state, rank.run_dir / "checkpoints", learner.updates,
                               keep=settings.checkpoint.keep)

    logger = rank.make_logger(counters["frames"] if resumed else None)
    rank.announce(kernel_line)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(logger.close)
        cleanup.enter_context(experience)
        remote_actors = cleanup.enter_context(
            remote.RemoteActors(ranks, pool, experience.weights)) if remote_ranks else None
        feed.start(logger, remote_actors)
        meter = rank.make_meter(serial=dist.actors == 0 and not remote_ranks)
        loop.train(learner, feed, logger, settings, ranks, counters, save_checkpoint,
                   should_stop, meter=meter)
        throughput = meter.finish(logger.stream)
        with loop.checkpointing():
            final = (final_checkpoint(resumed, learner.updates, save_checkpoint)
                     if rank.main else "")
        evaluation = evaluate_final_policy(
            settings.evaluation, settings.env, settings.seed,
            lambda: parts.make_policy(frozen_cpu_copy(model)), logger, counters["frames"],
            epsilon=None) if rank.main else {}
        return {
            **evaluation,
            "frames": counters["frames"], "updates": learner.updates,
            "lr": learner.optimizer.param_groups[0]["lr"],
            "mean_return_20": distributed.mean_over_ranks(logger.mean_recent_return(20), ranks),
            "run_dir": str(rank.run_dir),
            "checkpoint": str(final), "returns": list(logger.recent_returns),
            "throughput": throughput, **experience.summary(),
        }
