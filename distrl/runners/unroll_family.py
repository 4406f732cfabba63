"""The unroll family (IMPALA, SEED-IMPALA) for the runner (:mod:`distrl.runners.runner`):
slots of T-step unrolls that its source fills (actors with a policy copy, SEED's server,
actor-only ranks), and :class:`UnrollFeed`, which hands the learner B of them per update.
The run itself (sizing, ranks, resume, loop, evaluation) is the runner's."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from distrl.acting import remote
from distrl.acting.evaluation import frozen_cpu_copy
from distrl.run import checkpoint, memory
from distrl.run.run_settings import RunSettings, settings_for_rank
from distrl.runners.actor_ranks import serve_unroll_actor_rank
from distrl.runners.runner import SizingRequest, frame_share, train_agent
from distrl.runners.topology import Topology
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
from distrl.training.learner import Learner
from distrl.training.learner_rank import LearnerRank
from distrl.training.run_dir import CHECKPOINT_FORMAT, restore_learner
from distrl.transport import distributed
from distrl.transport.queues import SlotPool
from distrl.types import Unroll
from distrl.validation import ConfigError


class UnrollFeed(loop.RankFrameBudget):
    """IMPALA's learner batches (:class:`distrl.training.loop.Feed`): ``batch_size / per_group``
    full slots from the source, gathered into one ``[T, B]`` unroll. ``counters["frames"]``
    counts this rank's frames; every rank learns from one batch each update."""

    def __init__(self, experience: Any, pool: SlotPool, learner: Learner,
                 counters: dict[str, Any], slots_per_batch: int, frames_per_update: int,
                 total_frames: int, world: int):
        self.experience, self.pool, self.learner = experience, pool, learner
        self.counters = counters
        self.slots_per_batch = slots_per_batch
        self.frames_per_update = frames_per_update  # of this rank
        self.total_frames = total_frames  # of all ranks
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
        frames = self.episode_frames()
        for stats in self.experience.drain():
            loop.log_actor_stats(self.logger, stats, frames)
        loop.log_remote_actors(self.logger, self.remote_actors, frames)

    def collect(self) -> None:
        self._collect_actor_stats()
        self.experience.log(self.logger)

    def report(self, span_s: float) -> tuple[dict[str, float], dict[str, float]]:
        return {}, {}

    def throughput(self, span_s: float) -> dict[str, float]:
        """Frames this rank learned from since the last call, and the slots now full."""
        learned, self._learned = self.counters["frames"] - self._learned, self.counters["frames"]
        return {"learned_frames": learned,
                "slots_full": self.pool.full_count() / self.pool.num_slots}


class UnrollRun:
    """A learner rank's unroll path (:class:`distrl.runners.runner.FamilyRun`)."""

    announce = ""

    def __init__(self, parts: UnrollAgentParts, settings: RunSettings, rank: LearnerRank,
                 topology: Topology, source: UnrollSourceFactory):
        per_group = settings.envs_per_group
        env, model, self.rank = rank.env, rank.model, rank
        frames_per_update = parts.unroll_length * parts.batch_size * env.frames_per_step
        frame_budget = frame_share(settings.total_frames, rank.world)
        slots_per_batch = parts.batch_size // per_group
        producers = ((max(settings.distributed.actors, 1) + len(topology.remote_ranks))
                     * settings.distributed.env_groups)
        num_slots = settings.distributed.slots or (2 * slots_per_batch + producers)
        if num_slots < slots_per_batch + producers:
            raise ConfigError(
                f"distributed.slots ({num_slots}) must be at least one batch ({slots_per_batch}) "
                f"plus one per env group ({producers})"
            )
        specs = unroll_specs(parts, model, env.obs_shape, env.obs_dtype, env.num_actions,
                             per_group)
        with memory.allocating(
                "the unroll slots", f"{num_slots} slots (distributed.slots) of "
                f"agent.unroll_length={parts.unroll_length} steps x {per_group} envs",
                memory.slots_nbytes(specs, num_slots),
                "lower distributed.slots, agent.unroll_length or distributed.envs_per_actor"):
            self.pool = SlotPool(specs, num_slots, mp_context=topology.spawn_context)
        self.experience = source(UnrollSourceContext(
            parts, settings_for_rank(settings, rank.ranks), model, env.obs_shape,
            env.num_actions, env.frames_per_step, self.pool, per_group, topology))
        self.opt = parts.optimizer
        self.learner = rank.make_learner(
            parts.loss_fn, self.opt, math.ceil(frame_budget / frames_per_update) * parts.passes,
            self.experience.weights, f"{parts.settings_path}.optimizer", parts.passes,
            parts.precision)
        self.counters: dict[str, Any] = {"frames": 0, "elapsed_s": 0.0}
        self.feed = UnrollFeed(self.experience, self.pool, self.learner, self.counters,
                               slots_per_batch, frames_per_update, settings.total_frames,
                               rank.world)
        self.name = parts.name

    def restore(self, resumed: dict[str, Any]) -> None:
        restore_learner(self.learner, resumed, self.opt)
        self.counters.update(resumed["counters"])
        if "frames_all_ranks" not in resumed:  # an IMPALA checkpoint that counted all ranks
            self.counters["frames"] //= resumed.get("world_size", 1)
        checkpoint.set_rng_state(resumed["rng"])

    def frames_all_ranks(self, resumed: dict[str, Any]) -> int:
        return self.counters["frames"] * self.rank.world

    def remote_pool(self) -> SlotPool:
        return self.pool

    def start(self, cleanup: contextlib.ExitStack, logger: MetricLogger,
              remote_actors: remote.RemoteActors | None) -> None:
        self.feed.start(logger, remote_actors)

    def save_checkpoint(self, frames_all_ranks: int) -> Path:
        """Rank 0 writes the model and optimizer (the other ranks hold the same)."""
        rank = self.rank
        if not rank.main:
            return Path()
        state = {
            "format": CHECKPOINT_FORMAT, "agent": self.name, "optimizer_name": self.opt.name,
            "learner": self.learner.state_dict(), "world_size": rank.world,
            "counters": dict(self.counters), "rng": checkpoint.rng_state(),
            "config": rank.settings.config_text,
        }
        if rank.world > 1:
            state["frames_all_ranks"] = frames_all_ranks
        return checkpoint.save(state, rank.run_dir / "checkpoints", self.learner.updates,
                               keep=rank.settings.checkpoint.keep)

    def summary(self) -> dict[str, Any]:
        return {"lr": self.learner.optimizer.param_groups[0]["lr"]}


class UnrollFamily:
    """IMPALA's experience path (:class:`distrl.runners.runner.Family`)."""

    default_source = UnrollActorSource

    def sizing(self, parts: UnrollAgentParts) -> SizingRequest:
        return SizingRequest(parts.batch_size, parts.unroll_length * parts.batch_size,
                             sizing.learner_passes(None) * parts.passes)

    def check(self, parts: UnrollAgentParts, settings: RunSettings) -> None:
        per_group = settings.envs_per_group
        if parts.batch_size % per_group:
            raise ConfigError(
                f"agent.batch_size ({parts.batch_size}) must be a multiple of the envs per "
                f"group, distributed.envs_per_actor / distributed.env_groups = {per_group}"
            )
        if settings.evaluation.epsilon not in (None, 0):
            raise ConfigError(f"eval.epsilon applies to the Q-learning agents (apex, r2d2); "
                              f"{parts.name} is evaluated sampling its own policy, so leave it "
                              f"unset, got {settings.evaluation.epsilon}")

    def serve_actor_rank(self, parts: UnrollAgentParts, settings: RunSettings,
                         topology: Topology, ranks: distributed.RankInfo) -> dict[str, Any]:
        return serve_unroll_actor_rank(parts, settings, topology, ranks)

    def build(self, parts: UnrollAgentParts, settings: RunSettings, rank: LearnerRank,
              topology: Topology, source: UnrollSourceFactory) -> UnrollRun:
        return UnrollRun(parts, settings, rank, topology, source)

    def evaluation_policy(self, parts: UnrollAgentParts, model: torch.nn.Module,
                          settings: RunSettings) -> tuple[Callable[[], Any], float | None]:
        """IMPALA's agents are scored sampling their own policy."""
        return lambda: parts.make_policy(frozen_cpu_copy(model)), None


UNROLL = UnrollFamily()


def train_unroll_agent(parts: UnrollAgentParts, settings: RunSettings,
                       should_stop: Callable[[int], bool] | None = None,
                       source: UnrollSourceFactory = UnrollActorSource) -> dict[str, Any]:
    """:func:`distrl.runners.runner.train_agent` with the unroll family; the summary adds
    the final ``lr``."""
    return train_agent(UNROLL, parts, settings, should_stop=should_stop, source=source)
