"""SEED RL's topology as experience sources for the unroll and replay families: env
workers step environments, the inference server in this process acts for all of them
and builds the experience, and the learner trains on it (Espeholt et al. 2020, Fig. 1).

- :class:`SeedSource` (SEED-IMPALA): the server's channels fill unroll slots that the
  V-trace learner takes (:func:`distrl.runners.runner.train_agent` with the unroll family).
- :class:`SeedReplaySource` (SEED-R2D2): the server's channels write sequences, the
  server gives them their initial priorities with the inference model, and the learner
  thread inserts them into its prioritized replay
  (:func:`distrl.runners.runner.train_agent` with the replay family).

With ``distributed.actors == 0`` the envs step in this process and the server runs in
the training loop (serial mode, deterministic); otherwise ``distributed.actors`` env
worker processes each step ``distributed.env_groups`` groups of envs and the server
runs in a thread beside the learner.
"""

from __future__ import annotations

import contextlib
import functools
import queue
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

from distrl.acting.actor import (
    ActorStats,
    ActorStopped,
    EnvGroup,
    Sink,
    TransitionSink,
    UnrollSink,
    timed_forward,
)
from distrl.acting.env_workers import Channels, EnvWorkers, LocalChannels
from distrl.acting.inference import InferenceServer, InferenceStats, InferenceWeights, ServerThread
from distrl.config import DistributedConfig, EnvConfig
from distrl.envs import env_seed, make_envs
from distrl.runners.replay_sources import ReplaySourceContext
from distrl.runners.topology import Topology
from distrl.runners.unroll_sources import UnrollSourceContext, wait_for_slots
from distrl.telemetry.logging import MetricLogger
from distrl.training.agent_parts import ReplayBatch
from distrl.training.learner import to_device


@dataclass
class InferenceSettings:
    """How the inference server batches and watches its workers (agents/seed.py)."""

    max_batch: int  # most envs per inference call; 0 = every env of the run
    batch_timeout_s: float  # wait this long for more requests once one has arrived
    worker_timeout_s: float  # a worker silent this long after its actions is restarted
    max_worker_restarts: int  # more restarts than this fail the run
    torch_threads: int  # torch threads of the server thread; 0 = the learner's count


class _ServerSource:
    """What both SEED sources share: the inference model, the channels and workers, the
    server (and its thread), restarts, and the inference figures."""

    central_inference = True  # the learner's process runs every forward pass (sizing)

    def __init__(self, inference: InferenceSettings, make_model: Any,
                 learner_model: torch.nn.Module, obs_shape: tuple[int, ...], num_actions: int):
        self.settings = inference
        # Inference runs beside the learner's model (agent.device, cuda:LOCAL_RANK under
        # torchrun), so publishing the newest weights is a device-local copy.
        self.device = next(learner_model.parameters()).device
        model = make_model(obs_shape, num_actions)
        model.load_state_dict(learner_model.state_dict())
        self.inference_model = model.to(self.device).eval()
        self.weights = InferenceWeights(self.inference_model)
        self.server: InferenceServer | None = None
        self.thread: ServerThread | None = None
        self.stopping = False  # set on exit, so a server blocked on a full queue gives up
        self._exit = contextlib.ExitStack()
        self._wait_s_seen = 0.0
        self._inference = InferenceStats()  # drained from the server, not yet logged
        self._calls = self._envs_inferred = self._restarts = self._dropped = 0
        self.stats = ActorStats()  # the server's step counters, and its sinks' waits

    def _start(self, env: EnvConfig, dist: DistributedConfig, seed: int, per_group: int,
               obs_shape: tuple[int, ...], obs_dtype: torch.dtype, topology: Topology,
               sinks: list[Sink], policy: Any, frames_per_step: int,
               policy_for: Any = None) -> None:
        """Open the channels (local envs, or worker processes) and the server over them."""
        num_channels = len(sinks)
        env_workers = None
        mp_context = topology.spawn_context
        if topology.in_process:
            channels: Any = LocalChannels([
                make_envs(env, per_group, env_seed(seed, 0, g, dist.env_groups, per_group),
                          num_threads=dist.env_threads)
                for g in range(dist.env_groups)])
            self._exit.callback(channels.close)
        else:
            channels = Channels(mp_context, num_channels, per_group, obs_shape, obs_dtype)
            env_workers = self._exit.enter_context(EnvWorkers(
                mp_context, dist.actors, dist.env_groups, env, dist.env_threads, seed, channels,
                self.settings.max_worker_restarts))
        self.channels = channels
        inf = self.settings
        self.server = InferenceServer(
            channels, [EnvGroup(None, sink) for sink in sinks], policy, self.weights,
            self.stats, max_batch=inf.max_batch or num_channels * per_group,
            batch_timeout_s=inf.batch_timeout_s, device=self.device, workers=env_workers,
            worker_timeout_s=inf.worker_timeout_s, start_timeout_s=dist.start_timeout_s,
            frames_per_step=frames_per_step,
            policy_for=policy_for)
        if env_workers is not None:
            self.thread = self._exit.enter_context(
                ServerThread(self.server, torch_threads=inf.torch_threads))
            # Registered last so it runs first: a server blocked on a full sink gives up.
            self._exit.callback(lambda: setattr(self, "stopping", True))

    def should_stop(self) -> bool:
        return self.stopping

    def _drain_server(self) -> ActorStats:
        assert self.server is not None
        if self.thread is not None:
            self.thread.check()
        stats, inference = self.server.drain()
        self._inference.batch_sizes += inference.batch_sizes
        self._inference.latency_s += inference.latency_s
        self._inference.restarts += inference.restarts
        self._inference.dropped_unrolls += inference.dropped_unrolls
        return stats

    def check(self) -> None:
        """Raise if the server thread failed (too many restarts, an error in inference)."""
        if self.thread is not None:
            self.thread.check()

    def log(self, logger: MetricLogger) -> None:
        """Inference figures: batch size (mean and histogram), latency, worker wait."""
        inference = self._inference.drain()
        self._calls += len(inference.batch_sizes)
        self._envs_inferred += sum(inference.batch_sizes)
        if inference.batch_sizes:
            logger.add("inference/batch_size", statistics.fmean(inference.batch_sizes))
            logger.add_histogram("inference/batch_size_hist", inference.batch_sizes)
            logger.add("inference/latency_ms", 1e3 * statistics.fmean(inference.latency_s))
            logger.add("inference/calls_per_update", len(inference.batch_sizes))
        if isinstance(self.channels, Channels):
            wait_s = float(self.channels.wait_s.sum())
            logger.add("workers/action_wait_s", wait_s - self._wait_s_seen)
            self._wait_s_seen = wait_s
        self._restarts += inference.restarts
        self._dropped += inference.dropped_unrolls
        logger.add("workers/restarts", inference.restarts)
        logger.add("workers/dropped_unrolls", inference.dropped_unrolls)

    def summary(self) -> dict[str, Any]:
        """Mean envs per inference call over the run, inference calls made, worker restarts
        and the partial unrolls or sequence batches they dropped."""
        return {"inference_batch_mean": self._envs_inferred / max(self._calls, 1),
                "inference_calls": self._calls, "worker_restarts": self._restarts,
                "dropped_unrolls": self._dropped}

    def __exit__(self, *exc: Any) -> None:
        self._exit.close()


class SeedSource(_ServerSource):
    """Unrolls built by SEED's inference server, for the V-trace learner (SEED-IMPALA)."""

    def __init__(self, ctx: UnrollSourceContext, inference: InferenceSettings):
        super().__init__(inference, ctx.parts.make_model, ctx.model, ctx.obs_shape,
                         ctx.num_actions)
        self.ctx = ctx

    def __enter__(self) -> SeedSource:
        c = self.ctx
        dist = c.settings.distributed
        num_channels = max(dist.actors, 1) * dist.env_groups
        sinks: list[Sink] = [UnrollSink(c.pool, c.parts.unroll_length, self.stats,
                                        self.should_stop) for _ in range(num_channels)]
        self._start(c.settings.env, dist, c.settings.seed, c.per_group, c.obs_shape,
                    c.pool.specs["observations"].dtype, c.topology, sinks,
                    c.parts.make_policy(self.inference_model), c.frames_per_step)
        return self

    def next_batch(self, count: int, first: bool, on_wait: Any) -> tuple[list[int], float]:
        pool = self.ctx.pool
        assert self.server is not None
        if self.thread is None:
            while pool.full_count() < count:
                self.server.step()
            return pool.take(count)
        return wait_for_slots(pool, count, self.ctx.settings.distributed.start_timeout_s
                              if first else None, "the env workers",
                              lambda: (on_wait(), self.check()))

    def drain(self) -> list[ActorStats]:
        return [self._drain_server()]


class SeedReplaySource(_ServerSource):
    """Sequences (or n-step transitions) built by SEED's inference server for a replay
    learner (SEED-R2D2). Every env acts with its own epsilon of the ladder, in whatever
    batch it lands; new items get their priorities from the inference model, i.e. the
    newest weights (the learner's ``weight_sync_steps`` does not apply)."""

    def __init__(self, ctx: ReplaySourceContext, inference: InferenceSettings):
        super().__init__(inference, ctx.parts.make_model, ctx.model, ctx.layout.obs_shape,
                         ctx.layout.num_actions)
        self.ctx = ctx
        self.serial = ctx.topology.in_process
        self.local_sinks: list[TransitionSink] = []
        self.arrived: queue.Queue = queue.Queue(maxsize=4 * max(1, self._num_channels()))

    def _num_channels(self) -> int:
        dist = self.ctx.settings.distributed
        return max(dist.actors, 1) * dist.env_groups

    def __enter__(self) -> SeedReplaySource:
        c = self.ctx
        parts, dist = c.parts, c.settings.distributed
        sinks = []
        for channel in range(self._num_channels()):
            writer = parts.experience.make_writer(c.per_group, c.layout.frame_stack,
                                                  stream=channel)
            sinks.append(TransitionSink(writer, parts.actor_buffer,
                                        functools.partial(self._prioritise_and_emit, writer),
                                        parts.transform_rewards))
        if self.serial:
            self.local_sinks = sinks
        epsilons = c.layout.epsilons  # env e of channel k is env k * per_group + e

        def policy_for(channels: list[int]) -> Any:
            mine = torch.cat([epsilons[k * c.per_group:(k + 1) * c.per_group]
                              for k in channels])
            # The epsilons stay on the CPU with the exploration draws (epsilon_greedy),
            # whatever device the model runs on.
            return parts.make_policy(self.inference_model, mine)

        self._start(c.settings.env, dist, c.settings.seed, c.per_group, c.layout.obs_shape,
                    c.frame_dtype, c.topology, sinks,
                    parts.make_policy(self.inference_model, epsilons[:1]),
                    c.frames_per_step, policy_for=policy_for)
        return self

    def _prioritise_and_emit(self, writer: Any, batch: ReplayBatch) -> None:
        """Runs in the server: initial priorities with the inference model, then to the
        learner (directly in serial mode, else through a bounded queue)."""
        parts = self.ctx.parts
        acting = parts.experience.acting_values(writer)
        if parts.acting_priorities is not None and acting is not None:
            with timed_forward(self.stats):  # from the inference outputs, as seed_rl does
                priorities = parts.acting_priorities(acting, batch).float()
        else:
            sample = to_device(parts.experience.as_sample(writer, batch), self.device)
            with self.weights.lock, timed_forward(self.stats):
                priorities = parts.initial_priorities(self.inference_model, sample).float()
        if self.serial:
            self.ctx.insert(batch, priorities.cpu())
            return
        started = time.perf_counter()
        try:
            while True:
                try:
                    self.arrived.put((batch, priorities.cpu()), timeout=0.5)
                    return
                except queue.Full:
                    if self.stopping:
                        raise ActorStopped from None
        finally:  # a full queue: the learner has not taken the earlier batches yet
            self.stats.sink_wait_s += time.perf_counter() - started

    def step_local(self) -> None:
        assert self.server is not None
        self.server.step()

    def occupancy(self) -> float:
        """Sequence batches waiting to be inserted / the queue's room (NaN in serial mode)."""
        return float("nan") if self.serial else self.arrived.qsize() / self.arrived.maxsize

    def receive(self, timeout: float) -> int:
        """Insert every batch the server made; wait up to ``timeout`` for one."""
        received = 0
        while not self.serial:
            try:
                item = self.arrived.get(timeout=timeout) if received == 0 and timeout > 0 \
                    else self.arrived.get_nowait()
            except queue.Empty:
                break
            self.ctx.insert(*item)
            received += 1
        return received

    def drain(self) -> list[tuple[int, ActorStats]]:
        return [(0, self._drain_server())]
