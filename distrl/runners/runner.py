"""The run, written once for every agent: size it, join torchrun's ranks, decide the
topology, start the learner rank (run directory, model, device), let the agent's family
build its experience path, resume, train with :func:`distrl.training.loop.train`, write
the final checkpoint, evaluate and sum up.

A family is what differs between experience paths (:class:`Family`): IMPALA's unrolls in
slots (:mod:`distrl.runners.unroll_family`) and the replay agents' prioritized replay
(:mod:`distrl.runners.replay_family`). It supplies its sizing, its checks, its actor-only
rank, and per learner rank a :class:`FamilyRun`: the Feed, the slots or replay and the
source behind it, the learner, its checkpoint and its summary. A new experience path
costs a family, not another copy of this lifecycle.

One convention holds for both families: ``counters["frames"]`` counts this rank's frames,
the run's frames are the sum over the learner ranks
(:func:`distrl.transport.distributed.agree`), and the run ends when that sum reaches
``total_frames`` (:class:`distrl.training.loop.RankFrameBudget`); a rank's even share,
``ceil(total_frames / learner ranks)``, plans its learning-rate schedule.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypedDict

import torch

from distrl.acting import remote
from distrl.acting.evaluation import evaluate_final_policy
from distrl.run.malloc import apply as apply_malloc_setting
from distrl.run.resume_settings import launcher_restarts
from distrl.run.run_settings import RunSettings
from distrl.runners import topology as topologies
from distrl.runners.topology import Topology
from distrl.telemetry.logging import MetricLogger
from distrl.training import loop, sizing
from distrl.training.learner import Learner, resolve_device
from distrl.training.learner_rank import LearnerRank, check_kernel, start_learner_rank
from distrl.training.run_dir import final_checkpoint
from distrl.transport import distributed
from distrl.transport.queues import SlotPool

StopCheck = Callable[[int], bool]  # updates -> stop now?
ProgressHook = Callable[[int, int], None]  # (updates, frames of all ranks) after each update


class RunSummary(TypedDict, total=False):
    """What a run returns (``agents.<name>.run``, :func:`train_agent`). Every learner rank
    gives the first group; the rest come from the family, the source and the evaluation."""

    frames: int  # env frames of all learner ranks
    updates: int
    mean_return_20: float  # of the last 20 training episodes, averaged over the ranks
    run_dir: str
    checkpoint: str  # the final checkpoint (rank 0; "" elsewhere)
    returns: list[float]  # this rank's recent training returns
    throughput: dict[str, Any]  # :meth:`distrl.telemetry.throughput.Diagnosis.to_dict`
    eval_return: float  # mean of eval.episodes games of the final policy (rank 0)
    eval_returns: list[float]
    lr: float  # the unroll family: the learning rate at the end
    replay_size: int  # the replay family: its replay and its learner's seconds
    inserted: int
    sampled: int
    learner_s: float
    replay_wait_s: float
    actor_restarts: int  # actor processes: restarts and the slots they dropped
    dropped_unrolls: int
    inference_batch_mean: float  # SEED's server
    inference_calls: int
    worker_restarts: int
    slots_sent: int  # an actor-only rank (it learns nothing: frames and updates are 0)


@dataclass(frozen=True)
class SizingRequest:
    """What :func:`distrl.training.sizing.resolve` needs to know of a family's learner."""

    batch_size: int | None  # unrolls per batch (slots to fill), None for a replay
    learner_batch: int  # steps the learner trains on per update
    passes: float  # learner passes over each step of experience


class FamilyRun(Protocol):
    """A learner rank's experience path, built by :meth:`Family.build` (not yet resumed)."""

    experience: Any  # the source: ``weights``, a context manager, ``summary()``
    feed: loop.Feed
    learner: Learner
    counters: dict[str, Any]  # ``frames`` (this rank's) and ``elapsed_s``, checkpointed
    announce: str  # added to the start-up line

    def restore(self, resumed: dict[str, Any]) -> None:
        """Load the checkpoint being resumed into the learner, counters and replay."""

    def frames_all_ranks(self, resumed: dict[str, Any]) -> int:
        """The run's frames at the checkpoint (tensorboard drops what came after)."""

    def remote_pool(self) -> SlotPool:
        """Where actor-only ranks' slots land."""

    def start(self, cleanup: contextlib.ExitStack, logger: MetricLogger,
              remote_actors: remote.RemoteActors | None) -> None:
        """The source is running: register what must close with the run, start the feed."""

    def save_checkpoint(self, frames_all_ranks: int) -> Path:
        """Write this rank's checkpoint (rank 0's file; shards under torchrun)."""

    def summary(self) -> dict[str, Any]:
        """The family's figures for the run's result."""


class Family(Protocol):
    """An experience path: what the runner asks of it (see the module docstring)."""

    default_source: Callable[[Any], Any]  # the source with actors holding a policy copy

    def sizing(self, parts: Any) -> SizingRequest:
        """The learner's batch and passes, for auto sizing."""

    def check(self, parts: Any, settings: RunSettings) -> None:
        """Refuse settings this family cannot run, naming the field (after sizing)."""

    def serve_actor_rank(self, parts: Any, settings: RunSettings, topology: Topology,
                         ranks: distributed.RankInfo) -> RunSummary:
        """An actor-only rank: act and send slots to the learner rank until it stops us."""

    def build(self, parts: Any, settings: RunSettings, rank: LearnerRank, topology: Topology,
              source: Callable[[Any], Any]) -> FamilyRun:
        """The Feed and everything behind it on a learner rank."""

    def evaluation_policy(self, parts: Any, model: torch.nn.Module, settings: RunSettings
                          ) -> tuple[Callable[[], Any], float | None]:
        """A factory of the final policy as the paper evaluates it, and its epsilon."""


def train_agent(family: Family, parts: Any, settings: RunSettings,
                should_stop: StopCheck | None = None, progress: ProgressHook | None = None,
                source: Callable[[Any], Any] | None = None) -> RunSummary:
    """Train ``parts`` until ``total_frames`` env frames were learned from (or a stop was
    asked), in one process, with actor processes or as one rank under torchrun.

    Args:
        family: the experience path (unrolls in slots, or a prioritized replay).
        parts: the agent's network, policy and loss (:mod:`distrl.training.agent_parts`).
        settings: topology, logging, checkpoints.
        should_stop: optional ``updates -> bool`` polled after each update (stops like SIGINT).
        progress: optional ``(updates, frames) -> None`` after each update (benchmarks).
        source: where experience comes from; the family's actors with a policy copy if
            None, or SEED's inference server (:mod:`distrl.runners.seed_sources`).

    Returns:
        A summary: frames, updates, mean return of the last 20 episodes, run_dir, the final
        checkpoint, the evaluation, ``throughput`` (which side bounded the run,
        :meth:`distrl.telemetry.throughput.Diagnosis.to_dict`) and the family's figures.
    """
    source = source or family.default_source
    # Before sizing, so that its measurement of the learner sees the run's memory reuse.
    apply_malloc_setting(settings.distributed.keep_freed_memory)
    device = resolve_device(parts.device, distributed.local_rank_from_env())
    request = family.sizing(parts)
    settings = sizing.resolve(
        settings, parts.make_model, batch_size=request.batch_size,
        learner_batch=request.learner_batch, passes=request.passes,
        central_inference=sizing.runs_inference(source), device=device,
        precision=parts.precision)
    family.check(parts, settings)
    kernel_line = check_kernel(settings)
    ranks = distributed.init_from_env(learner_ranks=settings.distributed.learner_ranks)
    try:
        topology = topologies.decide(settings, ranks, sizing.runs_inference(source), parts.name)
        if topology.actor_only:
            assert ranks is not None
            return family.serve_actor_rank(parts, settings, topology, ranks)
        with contextlib.ExitStack() as run_scope:  # holds the run directory's lock
            rank = start_learner_rank(settings, ranks, parts.name, device, parts.make_model,
                                      run_scope)
            return _learn(family, parts, rank, topology, source, kernel_line, should_stop,
                          progress)
    finally:
        if ranks is not None:
            distributed.shutdown()


def envs_feeding(settings: RunSettings, topology: Topology) -> int:
    """The envs whose episodes a learner rank logs: its own actors' and those of the
    actor-only ranks that send to it (each with this rank's actors and envs)."""
    return (1 + len(topology.remote_ranks)) * settings.local_envs


def _learn(family: Family, parts: Any, rank: LearnerRank, topology: Topology,
           source: Callable[[Any], Any], kernel_line: str, should_stop: StopCheck | None,
           progress: ProgressHook | None) -> RunSummary:
    """A learner rank: the family's path, resume, the loop, the final checkpoint,
    evaluation and the summary."""
    settings, ranks, resumed = rank.settings, rank.ranks, rank.resumed
    run = family.build(parts, settings, rank, topology, source)
    if resumed is not None:
        run.restore(resumed)
        # the ranks' frames at the checkpoint, so that episodes stamp on from there
        run.feed.agreed(run.frames_all_ranks(resumed))
        run.experience.weights.publish(rank.model, run.learner.updates)
    logger = rank.make_logger(run.frames_all_ranks(resumed) if resumed is not None else None)
    # The last 100 returns go on from the checkpoint, so the 20-game mean (and
    # stop_at_return, which reads it) is over the run's last 20 games through a restart, as
    # without one, not undefined until 20 new games have ended. (Under torchrun an IMPALA
    # checkpoint holds rank 0's counters, which every rank restores.)
    logger.recent_returns = [float(r) for r in run.counters.get("recent_returns", [])]

    def save_checkpoint(frames: int) -> Path:
        run.counters["recent_returns"] = list(logger.recent_returns)
        return run.save_checkpoint(frames)

    rank.announce(kernel_line, run.announce)
    restarts = launcher_restarts(dict(os.environ))
    if restarts:
        logger.add("run/restarts", restarts)
        if rank.main:
            print(f"[distrl] restart {restarts} by the launcher: "
                  + (f"continuing from {resumed.path}" if resumed is not None
                     else "no checkpoint yet, starting over"), flush=True)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(logger.close)
        cleanup.enter_context(run.experience)
        remote_actors = cleanup.enter_context(remote.RemoteActors(
            ranks, run.remote_pool(), run.experience.weights)) if topology.remote_ranks else None
        run.start(cleanup, logger, remote_actors)
        meter = rank.make_meter(serial=topology.serial)
        frames = loop.train(run.learner, run.feed, logger, settings, ranks, run.counters,
                            save_checkpoint, should_stop, progress, meter=meter,
                            settle_games=0 if resumed is None else envs_feeding(settings,
                                                                                topology))
        throughput = meter.finish(logger.stream)
        with loop.checkpointing():
            final = final_checkpoint(resumed, run.learner.updates,
                                     lambda: save_checkpoint(frames), announce=rank.main)
        evaluation: dict[str, Any] = {}
        stopped_by = loop.stop_signal()
        if rank.main and stopped_by is not None and settings.evaluation.episodes:
            # "stopped, resume me": a preempted job's grace period is for the checkpoint,
            # and the policy to score is the finished run's
            print(f"[distrl] eval: skipped, the run was stopped by signal {int(stopped_by)} "
                  "before its budget; it evaluates when it finishes", flush=True)
        elif rank.main:
            make_policy, epsilon = family.evaluation_policy(parts, rank.model, settings)
            evaluation = evaluate_final_policy(settings.evaluation, settings.env, settings.seed,
                                               make_policy, logger, frames, epsilon)
        return {
            **evaluation, "frames": frames, "updates": run.learner.updates,
            "mean_return_20": distributed.mean_over_ranks(logger.mean_recent_return(20), ranks),
            "run_dir": str(rank.run_dir), "checkpoint": str(final) if rank.main else "",
            "returns": list(logger.recent_returns), "throughput": throughput,
            **run.summary(), **run.experience.summary(),
        }


def frame_share(total_frames: int, world: int) -> int:
    """A learner rank's even share of ``total_frames``: what its schedules plan for."""
    return math.ceil(total_frames / world)
