"""Where an unroll agent's experience comes from: unroll slots and the actors that fill
them. :class:`UnrollActorSource` is IMPALA's topology (actors with their own policy copy,
in this process or in actor processes); SEED's inference server is the other source
(:class:`distrl.runners.seed_sources.SeedSource`), and actor-only ranks send slots over
torch.distributed (:mod:`distrl.acting.remote`)."""

from __future__ import annotations

import contextlib
import functools
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from distrl.acting.actor import Actor, ActorStats, EnvGroup, UnrollSink
from distrl.acting.actor_processes import ActorProcesses, restart_seed, supervised_actors
from distrl.envs import env_seed, make_envs
from distrl.run.run_settings import RunSettings
from distrl.runners.topology import Topology
from distrl.telemetry.logging import MetricLogger
from distrl.training.agent_parts import UnrollAgentParts
from distrl.transport.queues import FieldSpec, SlotPool
from distrl.transport.weights import WeightStore
from distrl.types import Unroll


def unroll_specs(
    parts: UnrollAgentParts, model: nn.Module, obs_shape: tuple[int, ...], obs_dtype: torch.dtype,
    num_actions: int, columns: int,
) -> dict[str, FieldSpec]:
    """Slot layout of one env group's unroll: ``[T(+1), columns, ...]`` per field."""
    t = parts.unroll_length
    specs = {
        "observations": FieldSpec((t + 1, columns, *obs_shape), obs_dtype),
        "actions": FieldSpec((t, columns), torch.int64),
        "rewards": FieldSpec((t, columns), torch.float32),
        "dones": FieldSpec((t, columns), torch.bool),
        "policy_versions": FieldSpec((t, columns), torch.int64),
    }
    for name, spec in parts.policy_extras(num_actions).items():
        specs[name] = FieldSpec((t, columns, *spec.shape), spec.dtype)
    for i, state in enumerate(model.initial_state(columns)):
        specs[f"core_state_{i}"] = FieldSpec(tuple(state.shape), state.dtype, time_major=False)
    return specs


def to_unroll(batch: dict[str, torch.Tensor]) -> Unroll:
    """The gathered slot fields as an :class:`Unroll`."""
    states = sorted(k for k in batch if k.startswith("core_state_"))
    return Unroll(
        observations=batch["observations"],
        actions=batch["actions"],
        rewards=batch["rewards"],
        dones=batch["dones"],
        behaviour_logits=batch["behaviour_logits"],
        policy_versions=batch["policy_versions"],
        core_state=tuple(batch[k] for k in states),
    )


def build_unroll_actor(
    parts: UnrollAgentParts, settings: RunSettings, model: nn.Module, store: WeightStore,
    pool: SlotPool, actor_id: int, stats: ActorStats, should_stop: Callable[[], bool],
    generation: int = 0,
) -> Actor:
    """An actor with its env groups, each writing unrolls into ``pool``; a restarted actor
    (``generation`` > 0) plays other episodes than its predecessor."""
    dist = settings.distributed
    per_group = settings.envs_per_group
    groups = []
    for g in range(dist.env_groups):
        seed = env_seed(restart_seed(settings.seed, generation), actor_id, g, dist.env_groups,
                        per_group)
        env = make_envs(settings.env, per_group, seed, num_threads=dist.env_threads)
        groups.append(EnvGroup(env, UnrollSink(pool, parts.unroll_length, stats, should_stop,
                                                actor_id)))
    version = -1  # -1: the first call loads the learner's weights (version 0)

    def pull_weights() -> int:
        nonlocal version
        newer = store.pull_if_newer(model, version)
        if newer is not None:
            version = newer
        return version

    model.eval()
    return Actor(groups, parts.make_policy(model), pull_weights, stats)


def _unroll_actor(
    parts: UnrollAgentParts, settings: RunSettings, obs_shape: tuple[int, ...],
    num_actions: int, pool: SlotPool, store: WeightStore, actor_id: int, stats: ActorStats,
    should_stop: Callable[[], bool], generation: int,
) -> Actor:
    """An actor process's unroll actor with its own model copy (see :class:`ActorProcesses`)."""
    model = parts.make_model(obs_shape, num_actions)
    return build_unroll_actor(parts, settings, model, store, pool, actor_id, stats, should_stop,
                              generation)


@dataclass
class UnrollSourceContext:
    """What an unroll experience source is built from (see :class:`UnrollActorSource`)."""

    parts: UnrollAgentParts
    settings: RunSettings
    model: nn.Module  # the learner's model (its architecture and initial weights)
    obs_shape: tuple[int, ...]
    num_actions: int
    frames_per_step: int
    pool: SlotPool  # unrolls of ``per_group`` columns go here
    per_group: int
    topology: Topology  # where the actors run


class UnrollActorSource:
    """Unrolls from actors that act with their own policy copy (IMPALA's topology): in
    this process when the topology has them there, else in spawned actor processes that
    pull weights from a :class:`WeightStore`.

    An unroll source has ``weights`` (what the learner publishes to), is entered once the
    learner is ready, and offers ``next_batch(count, first, on_wait)``, ``drain()`` (the
    actors' counters), ``log(logger)`` (its own figures) and ``summary()`` (figures for
    the run's result).
    """

    def __init__(self, ctx: UnrollSourceContext):
        self.ctx = ctx
        self.weights = WeightStore(ctx.model, shared=not ctx.topology.in_process)
        self.local_actor: Actor | None = None
        self.local_stats = ActorStats()
        self.actors: ActorProcesses | None = None
        self._exit = contextlib.ExitStack()

    def __enter__(self) -> UnrollActorSource:
        c = self.ctx
        if c.topology.in_process:
            policy_model = c.parts.make_model(c.obs_shape, c.num_actions)
            self.local_actor = build_unroll_actor(c.parts, c.settings, policy_model,
                                                  self.weights, c.pool, 0, self.local_stats,
                                                  lambda: False)
            self._exit.callback(self.local_actor.close)
        else:
            build = functools.partial(_unroll_actor, c.parts, c.settings, c.obs_shape,
                                      c.num_actions, c.pool, self.weights)
            self.actors = self._exit.enter_context(supervised_actors(
                c.topology.spawn_context, c.settings, build, c.pool))
        return self

    def drain(self) -> list[ActorStats]:
        drained = [self.local_stats.drain()] if self.local_actor is not None else []
        if self.actors is not None:
            drained += [stats for _, stats in self.actors.drain()]
        return drained

    def log(self, logger: MetricLogger) -> None:
        """Actor restarts and the unrolls they dropped (SEED's source logs its inference)."""
        if self.actors is not None:
            self.actors.log(logger)

    def summary(self) -> dict[str, Any]:
        """Figures for the run's returned summary: actor restarts, dropped unrolls."""
        return self.actors.summary() if self.actors is not None else {}

    def next_batch(self, count: int, first: bool,
                   on_wait: Callable[[], None]) -> tuple[list[int], float]:
        """``count`` full slots and the seconds waited; ``first``: nothing learned yet, so
        wait at most ``distributed.start_timeout_s``; ``on_wait`` runs every idle second."""
        pool = self.ctx.pool
        if self.local_actor is not None:
            while pool.full_count() < count:
                self.local_actor.step()
            return pool.take(count)
        assert self.actors is not None
        return wait_for_slots(pool, count, self.ctx.settings.distributed.start_timeout_s
                              if first else None, "the actors",
                              lambda: (on_wait(), self.actors.check()))

    def __exit__(self, *exc: Any) -> None:
        self._exit.close()


UnrollSourceFactory = Callable[[UnrollSourceContext], Any]


def wait_for_slots(pool: SlotPool, count: int, timeout_s: float | None, producers: str,
                   check: Callable[[], None]) -> tuple[list[int], float]:
    """Take ``count`` full slots, calling ``check`` (raises if producers failed) every
    second of waiting; raises if ``timeout_s`` passes first."""
    waited = 0.0
    deadline = time.monotonic() + (timeout_s if timeout_s is not None else 1e9)
    taken: list[int] = []
    while len(taken) < count:
        try:
            more, w = pool.take(1, timeout=1.0)
            taken += more
            waited += w
        except queue.Empty:
            waited += 1.0
            check()
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"no unroll from {producers} within distributed.start_timeout_s="
                    f"{timeout_s}s") from None
    return taken, waited
