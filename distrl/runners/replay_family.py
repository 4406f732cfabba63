"""The replay family (Ape-X, R2D2, SEED-R2D2) for the runner (:mod:`distrl.runners.runner`):
its actors' (or SEED's server's) prioritized batches go into the one replay in the learner
process; the learner trains on prioritized samples and writes the new priorities back, the
next sample drawn in a thread while the current update runs (Horgan et al. 2018, Section 3).

With actors in this process, actor and learner take turns; with actor processes, batches
travel through shared-memory slots (only slot indices go through queues).
``agent.replay_ratio`` > 0 holds the transitions sampled per transition inserted at that
value in both modes, as a rate limiter: the learner takes new batches only when it has used
up the last ones, and actors wait for free slots meanwhile (Reverb's sample-to-insert
ratio). 0 lets the learner run freely on whatever arrived, as in the paper, where the ratio
is whatever the hardware gives. The feed, prefetcher and replay are in
:mod:`distrl.runners.replay_learner`; no algorithm lives here: the agent supplies the
network, policy, loss and priorities.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from distrl.acting import remote
from distrl.acting.evaluation import frozen_cpu_copy
from distrl.replay.buffer import ReplayBuffer
from distrl.run import checkpoint
from distrl.run.run_settings import RunSettings, settings_for_rank
from distrl.runners.actor_ranks import serve_replay_actor_rank
from distrl.runners.replay_learner import Prefetcher, ReplayFeed, load_shard_replay, make_replay
from distrl.runners.replay_sources import (
    ReplayActorSource,
    ReplaySourceContext,
    ReplaySourceFactory,
    actor_layout,
    recurrent_state_size,
)
from distrl.runners.runner import SizingRequest, frame_share, train_agent
from distrl.runners.topology import Topology
from distrl.telemetry.logging import MetricLogger
from distrl.training import sizing
from distrl.training.agent_parts import ReplayAgentParts
from distrl.training.learner import Learner
from distrl.training.learner_rank import LearnerRank
from distrl.training.run_dir import CHECKPOINT_FORMAT, restore_learner
from distrl.transport import distributed
from distrl.transport.queues import SlotPool


class ReplayRun:
    """A learner rank's replay path (:class:`distrl.runners.runner.FamilyRun`): the replay
    (this rank's shard under torchrun), its prefetcher, the source and the learner."""

    def __init__(self, parts: ReplayAgentParts, settings: RunSettings, rank: LearnerRank,
                 topology: Topology, source: ReplaySourceFactory):
        self.parts, self.rank = parts, rank
        dist = settings.distributed
        self.replay_ratio = parts.replay_ratio or (1.0 if topology.in_process else 0.0)
        rank_settings = settings_for_rank(settings, rank.ranks)
        env, model, world = rank.env, rank.model, rank.world
        layout = actor_layout(parts, settings, env, rank.ranks)
        frame_budget = frame_share(settings.total_frames, world)
        self.loss = parts.make_loss(model)
        self.replay = make_replay(parts, layout.frame_shape, env.obs_dtype, layout.frame_stack,
                                  settings.kernel, settings.envs_per_group,
                                  recurrent_state_size(parts, model))
        self.generator = torch.Generator().manual_seed(rank_settings.seed)
        self.prefetcher = Prefetcher(self.replay, parts.batch_size, self.generator, rank.device)
        self.counters: dict[str, Any] = {"frames": 0, "elapsed_s": 0.0, "update_credit": 0.0}
        self.feed = ReplayFeed(parts, self.replay, self.prefetcher, self.counters,
                               self.replay_ratio, settings.total_frames, env.frames_per_step,
                               dist.start_timeout_s, world, layout, dist.envs_per_actor)
        self.experience = source(ReplaySourceContext(
            parts, rank_settings, layout, model, self.feed.inserts, layout.frame_shape,
            env.obs_dtype, settings.envs_per_group, env.frames_per_step, topology))
        self.opt = parts.optimizer
        # A linear schedule decays over the updates the frame budget allows at the ratio.
        planned_updates = math.ceil(frame_budget / env.frames_per_step
                                    / parts.experience.steps_per_item
                                    * max(self.replay_ratio, 1.0) / parts.batch_size)
        self.learner: Learner = rank.make_learner(
            self.loss, self.opt, planned_updates, self.experience.weights,
            f"{parts.settings_path}.optimizer", precision=parts.precision)
        self.announce = (f" replay_ratio="
                         f"{self.replay_ratio if self.replay_ratio else 'uncapped'}")
        self.writer_states: list[dict[str, Any]] | None = None  # loaded once the source runs

    def restore(self, resumed: dict[str, Any]) -> None:
        """Load the learner, the loss (its target network), this rank's replay (from the
        checkpoint, or from its shard under torchrun), the sampling stream, the draw in
        flight, counters and RNG; the local writers' states wait for :meth:`start`."""
        sharded = self.rank.ranks is not None
        own = (checkpoint.load_shard(self.rank.settings.resume, resumed["step"],
                                     self.rank.ranks.rank) if self.rank.ranks is not None
               else resumed)
        restore_learner(self.learner, resumed, self.opt, (self.loss, "loss"),
                        *([(self.replay, "replay")] if "replay" in own and not sharded else []))
        if "replay" in own:
            if sharded:
                load_shard_replay(self.replay, own)
            who = f"rank {self.rank.ranks.rank}'s" if self.rank.ranks is not None else "the"
            print(f"[distrl] resume: {who} replay is back with {len(self.replay)} items "
                  f"({self.replay.inserted} inserted since the run began)", flush=True)
            self.generator.set_state(own["sample_generator"])
            self.prefetcher.ready = own["prefetched"]
            self.writer_states = own["writers"]
        self.counters.update(own["counters"])
        checkpoint.set_rng_state(own["rng"])

    def frames_all_ranks(self, resumed: dict[str, Any]) -> int:
        return resumed.get("frames_all_ranks", self.counters["frames"])

    def remote_pool(self) -> SlotPool:
        return self.experience.slots.pool

    def start(self, cleanup: contextlib.ExitStack, logger: MetricLogger,
              remote_actors: remote.RemoteActors | None) -> None:
        cleanup.callback(self.prefetcher.close)
        if self.writer_states:
            for sink, state in zip(self.experience.local_sinks, self.writer_states,
                                   strict=True):
                sink.writer.load_state_dict(state)
        self.feed.start(self.experience, logger, remote_actors)

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

    def save_checkpoint(self, frames_all_ranks: int) -> Path:
        """The learner, the loss and, with ``checkpoint.replay``, the replay, its sampling
        stream and the writers' partial sequences. Alone: one file. Under torchrun: every
        rank writes its shard, then (once all are on disk) rank 0 the checkpoint that names
        them, so a checkpoint file is only ever there with all its shards."""
        rank, settings, updates = self.rank, self.rank.settings, self.learner.updates
        keep = settings.checkpoint.keep
        state: dict[str, Any] = {
            "format": CHECKPOINT_FORMAT, "agent": self.parts.name,
            "optimizer_name": self.opt.name, "learner": self.learner.state_dict(),
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
            state["counters"] = dict(self.counters)  # rank 0's, for readers
            path = checkpoint.save(state, directory, updates, keep=keep)
        distributed.barrier(rank.ranks)
        return path

    def summary(self) -> dict[str, Any]:
        replay: ReplayBuffer = self.replay
        return {"replay_size": len(replay), "inserted": replay.inserted,
                "sampled": replay.sampled, "learner_s": self.feed.total_learner_s,
                "replay_wait_s": self.feed.total_replay_wait_s}


class ReplayFamily:
    """The replay agents' experience path (:class:`distrl.runners.runner.Family`)."""

    default_source = ReplayActorSource

    def sizing(self, parts: ReplayAgentParts) -> SizingRequest:
        fmt = parts.experience
        return SizingRequest(None, parts.batch_size * fmt.trained_steps,
                             sizing.learner_passes(parts.replay_ratio, fmt.steps_per_item,
                                                   fmt.trained_steps, fmt.forward_only_steps))

    def check(self, parts: ReplayAgentParts, settings: RunSettings) -> None:
        """Every replay setting is checked where the replay is built (make_replay)."""

    def serve_actor_rank(self, parts: ReplayAgentParts, settings: RunSettings,
                         topology: Topology, ranks: distributed.RankInfo) -> dict[str, Any]:
        return serve_replay_actor_rank(parts, settings, topology, ranks)

    def build(self, parts: ReplayAgentParts, settings: RunSettings, rank: LearnerRank,
              topology: Topology, source: ReplaySourceFactory) -> ReplayRun:
        return ReplayRun(parts, settings, rank, topology, source)

    def evaluation_policy(self, parts: ReplayAgentParts, model: torch.nn.Module,
                          settings: RunSettings) -> tuple[Callable[[], Any], float | None]:
        """The final greedy (or ``eval.epsilon``-greedy) policy."""
        episodes, epsilon = settings.evaluation.episodes, settings.evaluation.epsilon
        return (lambda: parts.make_policy(frozen_cpu_copy(model),
                                          torch.full((episodes,), epsilon)), epsilon)


REPLAY = ReplayFamily()


def train_replay_agent(parts: ReplayAgentParts, settings: RunSettings,
                       should_stop: Callable[[int], bool] | None = None,
                       progress: Callable[[int, int], None] | None = None,
                       source: ReplaySourceFactory = ReplayActorSource) -> dict[str, Any]:
    """:func:`distrl.runners.runner.train_agent` with the replay family; the summary adds
    the replay's size and counters and the learner's seconds in its loop and waiting on
    the replay."""
    return train_agent(REPLAY, parts, settings, should_stop=should_stop, progress=progress,
                       source=source)
