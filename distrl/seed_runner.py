"""SEED RL's topology as an experience source for the unroll runner: env workers step
environments, the inference server in this process acts for all of them and builds
the unrolls, and the learner trains on them (Espeholt et al. 2020, Figure 1).

With ``distributed.actors == 0`` the envs step in this process and the server runs in
the training loop (serial mode, deterministic); otherwise ``distributed.actors`` env
worker processes each step ``distributed.env_groups`` groups of envs and the server
runs in a thread beside the learner.
"""

from __future__ import annotations

import contextlib
import statistics
from dataclasses import dataclass
from typing import Any

import torch

from distrl.actor import ActorStats, EnvGroup, UnrollSink
from distrl.config import ConfigError
from distrl.env_workers import Channels, EnvWorkers, LocalChannels
from distrl.envs import env_seed, make_envs
from distrl.inference import InferenceServer, InferenceStats, InferenceWeights, ServerThread
from distrl.logging import MetricLogger
from distrl.runner import SourceContext, wait_for_slots


@dataclass
class InferenceSettings:
    """How the inference server batches and watches its workers (agents/seed.py)."""

    max_batch: int  # most envs per inference call; 0 = every env of the run
    batch_timeout_s: float  # wait this long for more requests once one has arrived
    worker_timeout_s: float  # a worker silent this long after its actions is restarted
    max_worker_restarts: int  # more restarts than this fail the run
    device: str  # auto (cuda when available) | cpu | cuda


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu; ``cuda`` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("agent.device is 'cuda' but torch sees no CUDA device; use auto or cpu")
    return torch.device(name)


class SeedSource:
    """Unrolls built by SEED's inference server (see the module docstring)."""

    def __init__(self, ctx: SourceContext, inference: InferenceSettings):
        self.ctx = ctx
        self.settings = inference
        self.device = resolve_device(inference.device)
        model = ctx.parts.make_model(ctx.obs_shape, ctx.num_actions)
        model.load_state_dict(ctx.model.state_dict())
        self.inference_model = model.to(self.device).eval()
        self.weights = InferenceWeights(self.inference_model)
        self.server: InferenceServer | None = None
        self.thread: ServerThread | None = None
        self._exit = contextlib.ExitStack()
        self._wait_s_seen = 0.0
        self._inference = InferenceStats()  # drained from the server, not yet logged
        self._calls, self._envs_inferred = 0, 0  # over the whole run, for summary()
        self._restarts, self._dropped = 0, 0

    def __enter__(self) -> SeedSource:
        c, inf = self.ctx, self.settings
        dist = c.settings.distributed
        workers = max(dist.actors, 1)
        num_channels = workers * dist.env_groups
        stats = ActorStats()
        stopping = {"now": False}
        groups = [EnvGroup(None, UnrollSink(c.pool, c.parts.unroll_length, stats,
                                            lambda: stopping["now"]))
                  for _ in range(num_channels)]
        env_workers = None
        if dist.actors == 0:
            channels: Any = LocalChannels([
                make_envs(c.settings.env, c.per_group,
                          env_seed(c.settings.seed, 0, g, dist.env_groups, c.per_group),
                          num_threads=dist.env_threads)
                for g in range(dist.env_groups)])
            self._exit.callback(channels.close)
        else:
            obs_dtype = c.pool.specs["observations"].dtype
            channels = Channels(c.pool.mp_context, num_channels, c.per_group, c.obs_shape,
                                obs_dtype)
            env_workers = self._exit.enter_context(EnvWorkers(
                c.pool.mp_context, dist.actors, dist.env_groups, c.settings.env,
                dist.env_threads, c.settings.seed, channels))
        self.channels = channels
        self.server = InferenceServer(
            channels, groups, c.parts.make_policy(self.inference_model), self.weights, stats,
            max_batch=inf.max_batch or num_channels * c.per_group,
            batch_timeout_s=inf.batch_timeout_s, device=self.device, workers=env_workers,
            worker_timeout_s=inf.worker_timeout_s, start_timeout_s=dist.start_timeout_s,
            frames_per_step=c.frames_per_step, on_restart=self._on_restart)
        if env_workers is not None:
            self.thread = self._exit.enter_context(ServerThread(self.server))
            # Registered last so it runs first: a server blocked on a free slot gives up.
            self._exit.callback(lambda: stopping.update(now=True))
        return self

    def _on_restart(self, worker: int, exitcode: int | None) -> None:
        assert self.server is not None
        restarts = sum(self.server.workers.generations) if self.server.workers else 0
        how = f"exited with code {exitcode}" if exitcode is not None else "hung"
        print(f"[distrl] env worker {worker} {how}: restarted, its partial unrolls dropped "
              f"({restarts} restarts so far)", flush=True)
        if restarts > self.settings.max_worker_restarts:
            raise RuntimeError(
                f"env workers were restarted {restarts} times, more than "
                f"agent.max_worker_restarts={self.settings.max_worker_restarts}; see the "
                "worker tracebacks above")

    def next_batch(self, count: int, first: bool,
                   on_wait: Any) -> tuple[list[int], float]:
        pool = self.ctx.pool
        assert self.server is not None
        if self.thread is None:
            while pool.full.qsize() < count:
                self.server.step()
            return pool.take(count)
        thread = self.thread
        return wait_for_slots(pool, count, self.ctx.settings.distributed.start_timeout_s
                              if first else None, "the env workers",
                              lambda: (on_wait(), thread.check()))

    def drain(self) -> list[ActorStats]:
        assert self.server is not None
        if self.thread is not None:
            self.thread.check()
        stats, inference = self.server.drain()
        self._inference.batch_sizes += inference.batch_sizes
        self._inference.latency_s += inference.latency_s
        self._inference.restarts += inference.restarts
        self._inference.dropped_unrolls += inference.dropped_unrolls
        return [stats]

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
        and the partial unrolls they dropped."""
        return {"inference_batch_mean": self._envs_inferred / max(self._calls, 1),
                "inference_calls": self._calls, "worker_restarts": self._restarts,
                "dropped_unrolls": self._dropped}

    def __exit__(self, *exc: Any) -> None:
        self._exit.close()
