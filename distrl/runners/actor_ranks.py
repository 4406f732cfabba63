"""Actor-only ranks (``distributed.learner_ranks`` > 0 under torchrun): a rank that
learns nothing, runs actors with a policy copy and sends what they fill, one slot at a
time, to its learner rank, which sends weights back (:mod:`distrl.acting.remote`). One
function per agent family: unroll slots for IMPALA, prioritised replay batches for
Ape-X and R2D2."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Any

import torch

from distrl.acting import remote
from distrl.acting.actor import ActorStats
from distrl.run.run_settings import RunSettings, seed_everything, settings_for_rank
from distrl.runners.replay_sources import ReplayActorSource, ReplaySourceContext, actor_layout
from distrl.runners.topology import Topology
from distrl.runners.unroll_sources import UnrollActorSource, UnrollSourceContext, unroll_specs
from distrl.training.agent_parts import ReplayAgentParts, ReplayBatch, UnrollAgentParts
from distrl.training.learner_rank import EnvProbe, learner_thread_count, probe_env
from distrl.transport import distributed
from distrl.transport.queues import SlotPool


def prepare_actor_rank(settings: RunSettings, ranks: distributed.RankInfo
                       ) -> tuple[RunSettings, EnvProbe]:
    """An actor-only rank's own seeds and threads, and its env's shape."""
    rank_settings = settings_for_rank(settings, ranks)
    seed_everything(rank_settings.seed)
    env = probe_env(settings)
    torch.set_num_threads(learner_thread_count(settings.distributed.learner_threads,
                                               env.obs_shape, torch.device("cpu")))
    return rank_settings, env


def actor_rank_summary(sent: int) -> dict[str, Any]:
    """What an actor-only rank returns: it learns nothing and writes nothing."""
    return {"frames": 0, "updates": 0, "slots_sent": sent, "mean_return_20": float("nan"),
            "run_dir": "", "checkpoint": "", "returns": []}


def serve_unroll_actor_rank(parts: UnrollAgentParts, settings: RunSettings,
                            topology: Topology, ranks: distributed.RankInfo
                            ) -> dict[str, Any]:
    """An actor-only rank of an unroll agent: its actors fill unroll slots that go, one
    by one, to its learner rank."""
    dist = settings.distributed
    per_group = settings.envs_per_group
    rank_settings, env = prepare_actor_rank(settings, ranks)
    model = parts.make_model(env.obs_shape, env.num_actions)
    specs = unroll_specs(parts, model, env.obs_shape, env.obs_dtype, env.num_actions,
                         per_group)
    pool = SlotPool(specs, dist.slots or 2 * max(dist.actors, 1) * dist.env_groups,
                    mp_context=topology.spawn_context)
    experience = UnrollActorSource(UnrollSourceContext(
        parts, rank_settings, model, env.obs_shape, env.num_actions, env.frames_per_step,
        pool, per_group, topology))
    connection = remote.LearnerConnection(ranks, experience.weights.flat.numel())
    connection.first_weights(experience.weights)

    def filled_slots() -> Iterator[tuple[dict[str, torch.Tensor], int]]:
        while True:
            indices, _ = experience.next_batch(1, False, lambda: None)
            yield pool.buffers, indices[0]

    with experience:
        sent = remote.serve_actor_rank(connection, experience.weights, filled_slots(),
                                       lambda index: pool.release([index]), experience.drain)
    return actor_rank_summary(sent)


def serve_replay_actor_rank(parts: ReplayAgentParts, settings: RunSettings,
                            topology: Topology, ranks: distributed.RankInfo
                            ) -> dict[str, Any]:
    """An actor-only rank of a replay agent: its actors' prioritised batches go, one slot
    at a time, to its learner rank's replay."""
    rank_settings, env = prepare_actor_rank(settings, ranks)
    layout = actor_layout(parts, settings, env, ranks)
    model = parts.make_model(env.obs_shape, env.num_actions)
    stats = ActorStats()

    def insert(batch: ReplayBatch, priorities: torch.Tensor) -> None:
        """Serial mode: the local actor's batches go into the slots that are sent."""
        assert experience.slots is not None
        experience.slots.write(batch, priorities, lambda: False, stats)

    experience = ReplayActorSource(ReplaySourceContext(
        parts, rank_settings, layout, model, insert, layout.frame_shape, env.obs_dtype,
        settings.envs_per_group, env.frames_per_step, topology))
    assert experience.slots is not None
    pool = experience.slots.pool
    connection = remote.LearnerConnection(ranks, experience.weights.flat.numel())
    connection.first_weights(experience.weights)

    def filled_slots() -> Iterator[tuple[dict[str, torch.Tensor], int]]:
        while True:
            if experience.serial and not pool.full_count():
                experience.local_actor.step()  # its batches land in the slots
                continue
            try:
                (index,), _ = pool.take(1, timeout=1.0)
            except queue.Empty:
                experience.check()
                continue
            yield pool.buffers, index

    with experience:
        sent = remote.serve_actor_rank(connection, experience.weights, filled_slots(),
                                       lambda index: pool.release([index]),
                                       lambda: [s for _, s in experience.drain()])
    return actor_rank_summary(sent)
