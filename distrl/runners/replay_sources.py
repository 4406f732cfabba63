"""Where a replay agent's experience comes from: actors that step envs with an exploring
policy copy, turn the steps into n-step transitions or sequences
(:class:`distrl.acting.actor.TransitionSink` and the agent's :mod:`distrl.replay.formats`), give
each its initial priority with their own network copy and send them to the learner's
replay (Horgan et al. 2018, Section 3). :class:`ReplayActorSource` is that topology, in
this process or in actor processes that send through :class:`BatchSlots`; SEED's
inference server is the other source (:class:`distrl.runners.seed_sources.SeedReplaySource`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import queue
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from distrl.acting.actor import (
    Actor,
    ActorStats,
    EnvGroup,
    TransitionSink,
    acquire_slot,
    timed_forward,
)
from distrl.acting.actor_processes import ActorProcesses, restart_seed, supervised_actors
from distrl.envs import env_seed, is_atari, make_envs
from distrl.replay.formats import ExperienceFormat
from distrl.replay.sequence_writer import flatten_state
from distrl.run import memory
from distrl.run.run_settings import RunSettings
from distrl.runners.topology import Topology
from distrl.telemetry.logging import MetricLogger
from distrl.training.agent_parts import ReplayAgentParts, ReplayBatch
from distrl.transport import distributed
from distrl.transport.queues import FieldSpec, SlotPool
from distrl.transport.weights import WeightStore


class BatchSlots:
    """Shared-memory slots that carry one writer batch (items, new frames, priorities).

    Every tensor field of the batch has one row per item, except ``frames``; int fields
    (a sequence batch's stream, first frame id and step count) travel in ``scalars``.
    A slot is sized for the largest batch an env group can flush
    (:meth:`~distrl.replay.formats.NStepFormat.max_batch`); a larger one is an error,
    never truncated.
    """

    def __init__(self, num_slots: int, experience: ExperienceFormat, num_envs: int,
                 flush_steps: int, frame_shape: tuple[int, ...], frame_dtype: torch.dtype,
                 stack: int, state_size: int, mp_context: Any = None) -> None:
        self.batch_type = experience.batch_type
        self.max_items, self.max_frames = experience.max_batch(num_envs, flush_steps, stack)
        self.item_fields = experience.item_fields(stack, state_size)
        self.int_fields = [f.name for f in dataclasses.fields(self.batch_type)
                           if f.name != "frames" and f.name not in self.item_fields]
        specs = {name: FieldSpec((self.max_items, *shape), dtype)
                 for name, (shape, dtype) in self.item_fields.items()}
        specs["frames"] = FieldSpec((self.max_frames, *frame_shape), frame_dtype)
        specs["priorities"] = FieldSpec((self.max_items,), torch.float32)
        specs["scalars"] = FieldSpec((2 + len(self.int_fields),), torch.int64)  # K, M, ints
        with memory.allocating(
                "the actors' batch slots", f"{num_slots} slots (distributed.slots) of "
                f"{self.max_items} items and {self.max_frames} frames: agent.actor_buffer="
                f"{flush_steps} steps x {num_envs} envs", memory.slots_nbytes(specs, num_slots),
                "lower distributed.slots, agent.actor_buffer or distributed.envs_per_actor"):
            self.pool = SlotPool(specs, num_slots, mp_context=mp_context)

    def write(self, batch: ReplayBatch, priorities: torch.Tensor,
              should_stop: Callable[[], bool], stats: ActorStats, producer: int = -1) -> None:
        """Actor side: copy a batch into a free slot and hand it over (the wait for a free
        slot is counted in ``stats``; ``producer``: the actor process's id)."""
        k, m = batch.size, batch.frames.shape[0]
        if k > self.max_items or m > self.max_frames:
            raise RuntimeError(f"an actor batch of {k} items / {m} frames exceeds the "
                               f"slot size {self.max_items} / {self.max_frames}")
        index = acquire_slot(self.pool, should_stop, stats, producer)
        b = self.pool.buffers
        b["frames"][index, :m].copy_(batch.frames)
        for name in self.item_fields:
            b[name][index, :k].copy_(getattr(batch, name))
        b["priorities"][index, :k].copy_(priorities)
        ints = [getattr(batch, name) for name in self.int_fields]
        b["scalars"][index].copy_(torch.tensor([k, m, *ints]))
        self.pool.commit(index)

    def read(self, timeout: float) -> tuple[ReplayBatch, torch.Tensor] | None:
        """Learner side: the next full slot's batch and priorities (copied), or None."""
        try:
            (index,), _ = self.pool.take(1, timeout=max(timeout, 0.0))
        except queue.Empty:
            return None
        b = self.pool.buffers
        k, m, *ints = b["scalars"][index].tolist()
        fields = {name: b[name][index, :k].clone() for name in self.item_fields}
        batch = self.batch_type(frames=b["frames"][index, :m].clone(), **fields,
                                **dict(zip(self.int_fields, ints, strict=True)))
        priorities = b["priorities"][index, :k].clone()
        self.pool.release([index])
        return batch, priorities


@dataclass
class ActorLayout:
    """What an actor needs to know about the run's shape (picklable)."""

    obs_shape: tuple[int, ...]
    num_actions: int
    frame_stack: Optional[int]  # None: observations are vectors, not frame stacks
    epsilons: torch.Tensor  # [actors x envs_per_actor] the ladder over every env of the run
    # Writer stream ids start here: an actor-only rank's streams must not collide with
    # those of the learner's own actors (or another actor rank's) in the one replay.
    stream_base: int = 0

    @property
    def frame_shape(self) -> tuple[int, ...]:
        """One stored frame: a stack's single frame, or the whole vector observation."""
        return self.obs_shape[1:] if self.frame_stack is not None else self.obs_shape


def recurrent_state_size(parts: ReplayAgentParts, model: nn.Module) -> int:
    """Values of one flattened recurrent state of the agent's policy (0: feed-forward)."""
    policy = parts.make_policy(model, torch.zeros(1))
    return flatten_state(policy.initial_state(1), 1).shape[1]


def build_replay_actor(
    parts: ReplayAgentParts, settings: RunSettings, layout: ActorLayout, model: nn.Module,
    store: WeightStore, emit: Callable[[ReplayBatch, torch.Tensor], None], actor_id: int,
    stats: ActorStats, generation: int = 0,
) -> Actor:
    """An actor whose env groups write transitions or sequences, prioritised by ``model``;
    a restarted actor (``generation`` > 0) plays other episodes with the same epsilons and
    starts its writer streams over."""
    dist = settings.distributed
    per_group = dist.envs_per_actor // dist.env_groups
    experience = parts.experience

    def prioritise_and_emit(writer: Any, batch: ReplayBatch) -> None:
        acting = experience.acting_values(writer)
        if parts.acting_priorities is not None and acting is not None:
            with timed_forward(stats):  # no forward: the Q values came with the steps
                priorities = parts.acting_priorities(acting, batch)
        else:
            sample = experience.as_sample(writer, batch)
            with timed_forward(stats):
                priorities = parts.initial_priorities(model, sample)
        emit(batch, priorities.float())

    groups = []
    for g in range(dist.env_groups):
        seed = env_seed(restart_seed(settings.seed, generation), actor_id, g, dist.env_groups,
                        per_group)
        env = make_envs(settings.env, per_group, seed, num_threads=dist.env_threads)
        first = actor_id * dist.envs_per_actor + g * per_group
        writer = experience.make_writer(per_group, layout.frame_stack,
                                        stream=layout.stream_base + actor_id * dist.env_groups
                                        + g)
        sink = TransitionSink(writer, parts.actor_buffer,
                              functools.partial(prioritise_and_emit, writer),
                              parts.transform_rewards)
        policy = parts.make_policy(model, layout.epsilons[first:first + per_group])
        groups.append(EnvGroup(env, sink, policy=policy))

    version, calls = -1, 0  # -1: the first call loads the learner's weights
    pull_every = parts.weight_sync_steps * dist.env_groups  # pull_weights runs once per group

    def pull_weights() -> int:
        nonlocal version, calls
        if calls % pull_every == 0:
            newer = store.pull_if_newer(model, version)
            if newer is not None:
                version = newer
        calls += 1
        return version

    model.eval()
    return Actor(groups, groups[0].policy, pull_weights, stats)


def _replay_actor(
    parts: ReplayAgentParts, settings: RunSettings, layout: ActorLayout,
    slots: BatchSlots, store: WeightStore, actor_id: int, stats: ActorStats,
    should_stop: Callable[[], bool], generation: int,
) -> Actor:
    """An actor process's actor: it sends its batches through ``slots``."""
    model = parts.make_model(layout.obs_shape, layout.num_actions)

    def emit(batch: ReplayBatch, priorities: torch.Tensor) -> None:
        slots.write(batch, priorities, should_stop, stats, actor_id)

    return build_replay_actor(parts, settings, layout, model, store, emit, actor_id, stats,
                              generation)


@dataclass
class ReplaySourceContext:
    """What a replay experience source is built from (see :class:`ReplayActorSource`)."""

    parts: ReplayAgentParts
    settings: RunSettings
    layout: ActorLayout
    model: nn.Module  # the learner's model (architecture and initial weights)
    insert: Callable[[ReplayBatch, torch.Tensor], None]  # into the replay, learner thread only
    frame_shape: tuple[int, ...]
    frame_dtype: torch.dtype
    per_group: int
    frames_per_step: int
    topology: Topology  # where the actors run


class ReplayActorSource:
    """Batches from actors that act with their own policy copy (Ape-X's topology): one
    local actor stepped by the learner loop when the topology has it in process, else actor
    processes that send through :class:`BatchSlots`.

    A replay source has ``weights`` (what the learner publishes to), ``serial`` (the
    learner must call :meth:`step_local` to make data), :meth:`receive`, :meth:`drain`
    (``(actor id, counters)`` pairs), :meth:`check`, ``local_sinks`` (checkpointed
    writers), :meth:`occupancy` (of what waits to be inserted), :meth:`log` and
    :meth:`summary`.
    """

    def __init__(self, ctx: ReplaySourceContext):
        self.ctx = ctx
        dist = ctx.settings.distributed
        self.serial = ctx.topology.in_process
        self.weights = WeightStore(ctx.model, shared=not self.serial)
        self.slots: BatchSlots | None = None
        if not self.serial or ctx.topology.senders:
            parts = ctx.parts
            state_size = recurrent_state_size(parts, ctx.model)
            self.slots = BatchSlots(
                dist.slots or 2 * (dist.actors + ctx.topology.senders) * dist.env_groups,
                parts.experience,
                ctx.per_group, parts.actor_buffer, ctx.frame_shape, ctx.frame_dtype,
                ctx.layout.frame_stack or 1, state_size, ctx.topology.spawn_context)
        self.local_actor: Actor | None = None
        self.local_stats = ActorStats()
        self.local_sinks: list[TransitionSink] = []
        self.actors: ActorProcesses | None = None
        self._exit = contextlib.ExitStack()

    def __enter__(self) -> ReplayActorSource:
        c = self.ctx
        if self.serial:
            policy_model = c.parts.make_model(c.layout.obs_shape, c.layout.num_actions)
            self.local_actor = build_replay_actor(c.parts, c.settings, c.layout, policy_model,
                                                  self.weights, c.insert, 0, self.local_stats)
            self._exit.callback(self.local_actor.close)
            self.local_sinks = [group.sink for group in self.local_actor.groups]
        else:
            build = functools.partial(_replay_actor, c.parts, c.settings, c.layout,
                                      self.slots, self.weights)
            assert self.slots is not None
            self.actors = self._exit.enter_context(supervised_actors(
                c.topology.spawn_context, c.settings, build, self.slots.pool))
        return self

    def step_local(self) -> None:
        """Serial mode: one step of every local env group (completed batches are inserted),
        then whatever actor-only ranks sent."""
        assert self.local_actor is not None
        self.local_actor.step()
        self.receive(0.0)

    def receive(self, timeout: float) -> int:
        """Insert every batch the actor processes sent; wait up to ``timeout`` for one."""
        received = 0
        while self.slots is not None:
            item = self.slots.read(timeout if received == 0 else 0.0)
            if item is None:
                break
            self.ctx.insert(*item)
            received += 1
        return received

    def occupancy(self) -> float:
        """Full batch slots / slots (NaN in one process, which has none)."""
        if self.slots is None:
            return float("nan")
        return self.slots.pool.full_count() / self.slots.pool.num_slots

    def drain(self) -> list[tuple[int, ActorStats]]:
        drained = [(0, self.local_stats.drain())] if self.local_actor is not None else []
        if self.actors is not None:
            drained += self.actors.drain()
        return drained

    def check(self) -> None:
        """Raise if an actor process failed."""
        if self.actors is not None:
            self.actors.check()

    def log(self, logger: MetricLogger) -> None:
        """Actor restarts and the batches they dropped."""
        if self.actors is not None:
            self.actors.log(logger)

    def summary(self) -> dict[str, Any]:
        """Actor restarts and dropped batches (none in one process)."""
        return self.actors.summary() if self.actors is not None else {}

    def __exit__(self, *exc: Any) -> None:
        self._exit.close()


ReplaySourceFactory = Callable[[ReplaySourceContext], Any]


def rank_epsilons(ladder: torch.Tensor, ranks: distributed.RankInfo | None) -> torch.Tensor:
    """This rank's share of the epsilon ladder over every env of every rank: every
    ``world_size``-th rate, so each replay shard gets the same mix of exploration."""
    if ranks is None:
        return ladder
    return ladder[ranks.rank::ranks.world_size].clone()


def actor_layout(parts: ReplayAgentParts, settings: RunSettings, env: Any,
                    ranks: distributed.RankInfo | None) -> ActorLayout:
    """Observation layout and this rank's share of the epsilon ladder over every env of
    every rank (learners and actor-only ranks alike)."""
    dist = settings.distributed
    frame_stack = settings.env.frame_stack if is_atari(settings.env.id) else None
    local_envs = settings.local_envs
    world = ranks.world_size if ranks is not None else 1
    stream_base = 0
    if ranks is not None and not ranks.is_learner:
        position = ranks.actor_ranks_of(ranks.learner_of(ranks.rank)).index(ranks.rank)
        stream_base = (position + 1) * max(dist.actors, 1) * dist.env_groups
    return ActorLayout(env.obs_shape, env.num_actions, frame_stack,
                          rank_epsilons(parts.exploration(local_envs * world), ranks),
                          stream_base)
