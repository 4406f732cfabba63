"""Trains a replay agent (Ape-X, R2D2, SEED-R2D2): its actors' (or SEED's server's)
prioritized batches go into the one replay in the learner process; the learner trains on
prioritized samples and writes the new priorities back, the next sample drawn in a thread
while the current update runs (Horgan et al. 2018, Section 3).

With ``distributed.actors == 0`` actor and learner take turns in one loop; with actor
processes, batches travel through shared-memory slots (only slot indices go through
queues). ``agent.replay_ratio`` > 0 holds the transitions sampled per transition inserted
at that value in both modes, as a rate limiter: the learner takes new batches only when
it has used up the last ones, and actors wait for free slots meanwhile (Reverb's
sample-to-insert ratio). 0 lets the learner run freely on whatever arrived, as in the
paper, where the ratio is whatever the hardware gives.
No algorithm lives here: the agent supplies the network, policy, loss and priorities;
the loop itself is :func:`distrl.training.loop.train`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from distrl.acting import remote
from distrl.acting.evaluation import evaluate_final_policy, frozen_cpu_copy
from distrl.config import OptimizerConfig
from distrl.replay.buffer import ReplayBuffer
from distrl.run import checkpoint
from distrl.run.malloc import apply as apply_malloc_setting
from distrl.run.run_settings import RunSettings, settings_for_rank
from distrl.runners.actor_ranks import refuse_actor_ranks_for, serve_replay_actor_rank
from distrl.runners.replay_learner import Prefetcher, ReplayFeed, load_shard_replay, make_replay
from distrl.runners.replay_sources import (
    ReplayActorSource,
    ReplaySourceContext,
    ReplaySourceFactory,
    recurrent_state_size,
    replay_topology,
)
from distrl.telemetry.logging import MetricLogger
from distrl.training import loop, sizing
from distrl.training.agent_parts import ReplayAgentParts
from distrl.training.learner import Learner, resolve_device
from distrl.training.learner_rank import LearnerRank, check_kernel, start_learner_rank
from distrl.training.run_dir import CHECKPOINT_FORMAT, final_checkpoint, restore_learner
from distrl.transport import distributed


def train_replay_agent(
    parts: ReplayAgentParts,
    settings: RunSettings,
    should_stop: Callable[[int], bool] | None = None,
    progress: Callable[[int, int], None] | None = None,
    source: ReplaySourceFactory = ReplayActorSource,
) -> dict[str, Any]:
    """Train until actors generated ``total_frames`` env frames (or a stop was asked).

    Under torchrun every learner rank runs this with its own actors and its own replay
    shard; gradients are averaged every update, so parameters stay identical, and the ranks
    share the frame budget (``total_frames`` counts all of them).

    Args:
        parts: the agent's network, exploring policy, loss and priorities.
        settings: topology, logging, checkpoints.
        should_stop: optional ``updates -> bool`` polled after each update (stops like SIGINT).
        progress: optional ``(updates, frames) -> None`` called after each update
            (benchmarks time the learner with it).
        source: builds where batches come from: actors with policy copies (Ape-X, R2D2)
            or SEED's inference server (:mod:`distrl.runners.seed_sources`).

    Returns:
        A summary: frames, updates, replay size and counters, mean return of the last 20
        episodes, seconds the learner spent in its loop and waiting on replay, run_dir, and
        ``throughput``: which side bounded the run
        (:meth:`distrl.telemetry.throughput.Diagnosis.to_dict`).
    """
    fmt = parts.experience
    # Before sizing, so that its measurement of the learner sees the run's memory reuse.
    apply_malloc_setting(settings.distributed.keep_freed_memory)
    settings = sizing.resolve(
        settings, parts.make_model, batch_size=None,
        learner_batch=parts.batch_size * fmt.trained_steps,
        passes=sizing.learner_passes(parts.replay_ratio, fmt.steps_per_item,
                                     fmt.trained_steps, fmt.forward_only_steps),
        central_inference=sizing.runs_inference(source),
        device=resolve_device(parts.device), precision=parts.precision)
    kernel_line = check_kernel(settings)
    ranks = distributed.init_from_env(learner_ranks=settings.distributed.learner_ranks)
    try:
        if ranks is not None and not ranks.is_learner:
            return serve_replay_actor_rank(parts, settings, source, ranks)
        with contextlib.ExitStack() as run_scope:  # holds the run directory's lock
            return _train(parts, settings, should_stop, progress, source, kernel_line, ranks,
                          run_scope)
    finally:
        if ranks is not None:
            distributed.shutdown()


def _train(parts: ReplayAgentParts, settings: RunSettings,
           should_stop: Callable[[int], bool] | None,
           progress: Callable[[int, int], None] | None, source: ReplaySourceFactory,
           kernel_line: str, ranks: distributed.RankInfo | None,
           run_scope: contextlib.ExitStack) -> dict[str, Any]:
    """A learner rank: build the replay, source and learner, resume, run the loop, evaluate."""
    dist = settings.distributed
    replay_ratio = parts.replay_ratio or (1.0 if dist.actors == 0 else 0.0)
    rank_settings = settings_for_rank(settings, ranks)
    rank = start_learner_rank(settings, ranks, parts.name, parts.device, parts.make_model,
                              rank_settings.seed, run_scope)
    env, model, resumed, world = rank.env, rank.model, rank.resumed, rank.world
    # Under torchrun each rank keeps its replay, counters and random streams in its own
    # shard file beside rank 0's checkpoint; alone, they are part of the checkpoint.
    sharded = ranks is not None
    own = (checkpoint.load_shard(settings.resume, resumed["step"], ranks.rank)
           if sharded and resumed is not None else resumed)
    topology = replay_topology(parts, settings, env, ranks)
    frame_budget = math.ceil(settings.total_frames / world)  # this rank's share
    loss = parts.make_loss(model)
    replay = make_replay(parts, topology.frame_shape, env.obs_dtype, topology.frame_stack,
                         settings.kernel, settings.envs_per_group,
                         recurrent_state_size(parts, model))
    generator = torch.Generator().manual_seed(rank_settings.seed)
    prefetcher = Prefetcher(replay, parts.batch_size, generator, rank.device)
    counters = {"frames": 0, "elapsed_s": 0.0, "update_credit": 0.0}
    feed = ReplayFeed(parts, replay, prefetcher, counters, replay_ratio, frame_budget,
                      env.frames_per_step, dist.start_timeout_s, world, topology,
                      dist.envs_per_actor)
    ctx = mp.get_context("spawn") if dist.actors > 0 else None
    remote_ranks = ranks.actor_ranks_of(ranks.rank) if ranks is not None else []
    if remote_ranks:
        refuse_actor_ranks_for(source, ReplayActorSource, parts.name)
    experience = source(ReplaySourceContext(parts, rank_settings, topology, model, feed.inserts,
                                            topology.frame_shape, env.obs_dtype,
                                            settings.envs_per_group, env.frames_per_step, ctx,
                                            len(remote_ranks)))
    opt = parts.optimizer
    # A linear schedule decays over the updates the frame budget allows at the replay ratio.
    planned_updates = math.ceil(frame_budget / env.frames_per_step
                                / parts.experience.steps_per_item
                                * max(replay_ratio, 1.0) / parts.batch_size)
    learner = rank.make_learner(loss, opt, planned_updates, experience.weights,
                                f"{parts.settings_path}.optimizer", precision=parts.precision)
    local_writer_states = (_resume(resumed, own, learner, loss, replay, prefetcher, generator,
                                   counters, opt, sharded)
                           if resumed is not None else None)
    if resumed is not None:
        experience.weights.publish(model, learner.updates)
    logger = rank.make_logger(resumed.get("frames_all_ranks", counters["frames"])
                              if resumed else None)
    rank.announce(kernel_line, f" replay_ratio={replay_ratio if replay_ratio else 'uncapped'}")
    save_checkpoint = ReplayCheckpointer(parts.name, opt.name, rank, learner, loss, replay,
                                         prefetcher, generator, counters, experience)

    with contextlib.ExitStack() as cleanup:
        cleanup.callback(logger.close)
        cleanup.callback(prefetcher.close)
        cleanup.enter_context(experience)
        remote_actors = cleanup.enter_context(remote.RemoteActors(
            ranks, experience.slots.pool, experience.weights)) if remote_ranks else None
        if local_writer_states:
            for sink, state in zip(experience.local_sinks, local_writer_states, strict=True):
                sink.writer.load_state_dict(state)
        feed.start(experience, logger, remote_actors)
        meter = rank.make_meter(serial=dist.actors == 0 and not remote_ranks)
        frames = loop.train(learner, feed, logger, settings, ranks, counters, save_checkpoint,
                            should_stop, progress, meter=meter)
        throughput = meter.finish(logger.stream)
        with loop.checkpointing():
            final = final_checkpoint(resumed, learner.updates,
                                     lambda: save_checkpoint(frames), announce=rank.main)
        return {
            **_evaluate(parts, rank, logger, frames), "frames": frames,
            "updates": learner.updates, "replay_size": len(replay),
            "inserted": replay.inserted, "sampled": replay.sampled,
            "mean_return_20": distributed.mean_over_ranks(logger.mean_recent_return(20), ranks),
            "run_dir": str(rank.run_dir), "checkpoint": str(final) if rank.main else "",
            "returns": list(logger.recent_returns), "learner_s": feed.total_learner_s,
            "replay_wait_s": feed.total_replay_wait_s, "throughput": throughput,
            **experience.summary(),
        }


def _resume(resumed: dict[str, Any], own: dict[str, Any], learner: Learner, loss: Any,
            replay: ReplayBuffer, prefetcher: Prefetcher, generator: torch.Generator,
            counters: dict[str, Any], opt: OptimizerConfig, sharded: bool
            ) -> list[dict[str, Any]] | None:
    """Load the learner, the loss (its target network), this rank's replay (from the
    checkpoint, or from its shard under torchrun), the sampling stream, the draw in
    flight, counters and RNG; returns the local writers' states to load once they exist."""
    restore_learner(learner, resumed, opt, (loss, "loss"),
                    *([(replay, "replay")] if "replay" in own and not sharded else []))
    writer_states = None
    if "replay" in own:
        if sharded:
            load_shard_replay(replay, own)
        generator.set_state(own["sample_generator"])
        prefetcher.ready = own["prefetched"]
        writer_states = own["writers"]
    counters.update(own["counters"])
    checkpoint.set_rng_state(own["rng"])
    return writer_states


class ReplayCheckpointer:
    """Writes a replay learner's checkpoint: the learner, the loss and, with
    ``checkpoint.replay``, the replay, its sampling stream and the writers' partial
    sequences. Alone: one file. Under torchrun: every rank writes its shard, then (once all
    are on disk) rank 0 the checkpoint that names them, so a checkpoint file is only ever
    there with all its shards."""

    def __init__(self, agent: str, optimizer_name: str, rank: LearnerRank, learner: Learner,
                 loss: Any, replay: ReplayBuffer, prefetcher: Prefetcher,
                 generator: torch.Generator, counters: dict[str, Any], experience: Any):
        self.agent, self.optimizer_name, self.rank = agent, optimizer_name, rank
        self.learner, self.loss, self.replay = learner, loss, replay
        self.prefetcher, self.generator = prefetcher, generator
        self.counters, self.experience = counters, experience

    def replay_state(self) -> dict[str, Any]:
        """This rank's replay, counters and random streams."""
        state: dict[str, Any] = {"counters": dict(self.counters), "rng": checkpoint.rng_state()}
        if self.rank.settings.checkpoint.replay:
            self.prefetcher.settle()
            state["replay"] = self.replay.state_dict()
            state["sample_generator"] = self.generator.get_state()
            state["prefetched"] = self.prefetcher.ready
            state["writers"] = [sink.writer.state_dict()
                                for sink in self.experience.local_sinks] or None
        return state

    def __call__(self, frames_all_ranks: int) -> Path:
        rank, settings, updates = self.rank, self.rank.settings, self.learner.updates
        keep = settings.checkpoint.keep
        state: dict[str, Any] = {
            "format": CHECKPOINT_FORMAT, "agent": self.agent,
            "optimizer_name": self.optimizer_name, "learner": self.learner.state_dict(),
            "loss": self.loss.state_dict(), "config": settings.config_text,
            "world_size": rank.world, "step": updates, "frames_all_ranks": frames_all_ranks,
        }
        directory = rank.run_dir / "checkpoints"
        if rank.ranks is None:
            state.update(self.replay_state())
            return checkpoint.save(state, directory, updates, keep=keep)
        checkpoint.save({"format": CHECKPOINT_FORMAT, **self.replay_state()}, directory,
                        updates, keep=keep, prefix=checkpoint.shard_prefix(rank.ranks.rank))
        distributed.barrier(rank.ranks)
        path = checkpoint.checkpoint_path(directory, updates)
        if rank.main:
            state["counters"] = dict(self.counters)  # rank 0's, for final_checkpoint and readers
            path = checkpoint.save(state, directory, updates, keep=keep)
        distributed.barrier(rank.ranks)
        return path


def _evaluate(parts: ReplayAgentParts, rank: LearnerRank, logger: MetricLogger,
              frames: int) -> dict[str, Any]:
    """Rank 0 plays the final greedy (or ``eval.epsilon``-greedy) policy."""
    if not rank.main:
        return {}
    settings = rank.settings
    episodes, epsilon = settings.evaluation.episodes, settings.evaluation.epsilon
    return evaluate_final_policy(
        settings.evaluation, settings.env, settings.seed,
        lambda: parts.make_policy(frozen_cpu_copy(rank.model), torch.full((episodes,), epsilon)),
        logger, frames, epsilon)
