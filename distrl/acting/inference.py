"""SEED RL's central inference server (Espeholt et al. 2020, Section 2): it batches the
env workers' observations, runs the newest model once per batch on the learner's
device, answers each worker with its own actions, and keeps every environment's
recurrent state and partial unroll here, so completed unrolls reach the learner
without leaving the process.

Dynamic batching: the server takes whatever requests are ready, then waits up to
``batch_timeout_s`` for more while the batch holds fewer than ``max_batch`` envs.
Each channel (one env group of a worker) is an :class:`~distrl.acting.actor.EnvGroup`
without an env: its steps arrive through :class:`~distrl.acting.env_workers.Channels`, and
its sink builds unrolls exactly as an IMPALA actor's would.

Failure handling: a worker whose process exited, or that has not answered within
``worker_timeout_s`` of being sent the last of its channels' actions, is restarted;
the unrolls its channels were writing are dropped (their slots go back uncommitted), so
the learner never sees a half-written unroll.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from distrl.acting.actor import ActorStats, ActorStopped, EnvGroup, Policy, count_step
from distrl.acting.env_workers import EnvWorkers


class InferenceWeights:
    """The inference copy of the learner's model. :class:`~distrl.training.learner.Learner`
    publishes each update into it under a lock, and the server infers under the same
    lock, so inference always uses the newest complete weights (SEED's point: policy
    lag comes only from the unroll in flight)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.lock = threading.Lock()
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    def publish(self, model: nn.Module, version: int) -> None:
        with self.lock, torch.no_grad():
            for target, source in zip(self.model.state_dict().values(),
                                      model.state_dict().values(), strict=True):
                target.copy_(source)
            self._version = version


@dataclass
class InferenceStats:
    """What the server measured since the last :meth:`drain`."""

    batch_sizes: list[int] = field(default_factory=list)  # envs per inference call
    latency_s: list[float] = field(default_factory=list)  # first request to answers sent
    restarts: int = 0  # workers restarted
    dropped_unrolls: int = 0  # partial unrolls dropped with a failed worker

    def drain(self) -> InferenceStats:
        out = InferenceStats(list(self.batch_sizes), list(self.latency_s), self.restarts,
                             self.dropped_unrolls)
        self.batch_sizes.clear()
        self.latency_s.clear()
        self.restarts = self.dropped_unrolls = 0
        return out


class InferenceServer:
    """Batched inference for ``channels``; one :class:`EnvGroup` (with its sink) per channel.

    Args:
        channels: :class:`~distrl.acting.env_workers.Channels` (worker processes) or
            :class:`~distrl.acting.env_workers.LocalChannels` (serial mode).
        groups: one per channel; ``env`` is None, ``sink`` builds the channel's unrolls.
        policy: the acting policy over the inference model (e.g. IMPALA's softmax sampler).
        weights: the inference model's lock and version.
        stats: episode and step counters (as an actor's).
        max_batch: most envs per inference call.
        batch_timeout_s: how long to wait for more requests once one has arrived.
        device: where the model runs; inputs move there, outputs come back to the CPU.
        workers: the worker processes, to restart failed ones (None in serial mode).
        worker_timeout_s: a worker silent this long after its actions counts as hung.
        start_timeout_s: the same, for a worker's first request after it started.
        frames_per_step: env frames per agent step (Atari's frame skip), for the counters.
        policy_for: the policy for one call's channels, when it depends on them (an
            epsilon per env for Ape-X/R2D2 learners); ``policy`` otherwise.
    """

    def __init__(
        self,
        channels: Any,
        groups: list[EnvGroup],
        policy: Policy,
        weights: InferenceWeights,
        stats: ActorStats,
        max_batch: int,
        batch_timeout_s: float,
        device: torch.device | str = "cpu",
        workers: EnvWorkers | None = None,
        worker_timeout_s: float = 60.0,
        start_timeout_s: float = 120.0,
        frames_per_step: int = 1,
        policy_for: Callable[[list[int]], Policy] | None = None,
    ):
        if len(groups) != channels.num_channels:
            raise ValueError(f"need one group per channel ({channels.num_channels}), "
                             f"got {len(groups)}")
        self.channels = channels
        self.groups = groups
        self.policy = policy
        self.weights = weights
        self.stats = stats
        self.max_batch = max_batch
        self.batch_timeout_s = batch_timeout_s
        self.device = torch.device(device)
        self.workers = workers
        self.worker_timeout_s = worker_timeout_s
        self.start_timeout_s = start_timeout_s
        self.frames_per_step = frames_per_step
        self.policy_for = policy_for
        self.inference = InferenceStats()
        self.stats_lock = threading.Lock()  # the learner thread drains what this one counts
        self.open = [False] * len(groups)  # the channel's envs have begun (post_first seen)
        now = time.monotonic()
        self.answered_at = [now] * len(groups)  # when the channel was last sent actions

    # ---------------------------------------------------------------- batching

    def _gather(self, wait_s: float) -> tuple[list[int], float]:
        """Channels for one inference call (dynamic batching) and when the first arrived."""
        self.channels.wait_request(wait_s)
        ready = self.channels.pending()
        if not ready:
            return [], 0.0
        first_at = time.perf_counter()
        deadline = first_at + self.batch_timeout_s
        per_channel = self.channels.envs
        while (len(ready) * per_channel < self.max_batch
               and len(ready) < self.channels.num_channels
               and time.perf_counter() < deadline):
            self.channels.wait_request(deadline - time.perf_counter())
            ready = self.channels.pending()
        # Up to max_batch envs (at least one channel), the longest-waiting channels first;
        # the rest wait for the next call.
        ready.sort(key=lambda channel: self.answered_at[channel])
        return ready[:max(1, self.max_batch // per_channel)], first_at

    # ---------------------------------------------------------------- one call

    def step(self, wait_s: float = 0.1) -> int:
        """Serve one batch of requests (waiting up to ``wait_s`` for the first).
        Returns how many envs were served (0 if none asked)."""
        started = time.perf_counter()
        batch, first_at = self._gather(wait_s)
        self.stats.env_wait_s += time.perf_counter() - started  # the env workers' turn
        if not batch:
            return 0
        observations, served = [], []
        for channel in batch:
            started = time.perf_counter()
            first, env_step = self.channels.take(channel)  # serial mode: the envs step here
            self.stats.env_wait_s += time.perf_counter() - started
            started, elsewhere = time.perf_counter(), self.stats.counted_elsewhere_s()
            group = self.groups[channel]
            obs = torch.from_numpy(env_step.observations)
            if first:
                if self.open[channel]:  # a new generation's envs: drop the old unroll
                    group.sink.abort()
                # Recurrent state lives on the CPU between calls, as every later state
                # does (below): it goes into replayed sequences, which the CPU stores.
                group.begin(obs, tuple(s.cpu() for s in self.policy.initial_state(obs.shape[0])))
                self.open[channel] = True
            elif not self.open[channel]:
                continue  # a step of a worker generation already replaced: never answered
            else:
                group.observe(env_step)
                with self.stats_lock:  # channels are equal: channel k's envs follow k's
                    count_step(self.stats, env_step, self.frames_per_step,
                               channel * len(env_step.rewards))
            observations.append(obs)
            served.append(channel)
            self._copied(started, elsewhere)
        if not served:
            return 0
        batch = served

        sizes = [o.shape[0] for o in observations]
        groups = [self.groups[c] for c in batch]
        started = time.perf_counter()
        policy = self.policy_for(batch) if self.policy_for is not None else self.policy
        with self.weights.lock:
            version = self.weights.version
            output = policy(
                torch.cat(observations).to(self.device),
                tuple(torch.cat([g.core_state[i] for g in groups]).to(self.device)
                      for i in range(len(groups[0].core_state))),
                torch.cat([g.last_actions for g in groups]).to(self.device),
                torch.cat([g.last_rewards for g in groups]).to(self.device),
            )
        actions = output.actions.cpu().split(sizes)
        extras = {k: v.cpu().split(sizes) for k, v in output.extras.items()}
        states = [s.cpu().split(sizes) for s in output.core_state]
        self.stats.policy_s += time.perf_counter() - started
        started, elsewhere = time.perf_counter(), self.stats.counted_elsewhere_s()
        self.stats.policy_version = version
        now = time.monotonic()
        for k, (channel, group) in enumerate(zip(batch, groups, strict=True)):
            own = type(output)(actions[k], {n: v[k] for n, v in extras.items()},
                               tuple(s[k] for s in states))
            group.acted(own, version)
            self.channels.answer(channel, actions[k])
            self.answered_at[channel] = now
        self._copied(started, elsewhere)
        with self.stats_lock:
            self.inference.batch_sizes.append(sum(sizes))
            self.inference.latency_s.append(time.perf_counter() - first_at)
        return sum(sizes)

    def _copied(self, started: float, elsewhere_before: float) -> None:
        """Count the time since ``started`` as copying (into unroll slots, sequence
        writers, answers), less what the sinks waited for a free slot or spent in a network
        forward (initial priorities) meanwhile."""
        # max: the learner thread may have drained (zeroed) the counters meanwhile
        elsewhere = max(self.stats.counted_elsewhere_s() - elsewhere_before, 0.0)
        self.stats.copy_s += time.perf_counter() - started - elsewhere

    def drain(self) -> tuple[ActorStats, InferenceStats]:
        """The step counters and the inference figures since the last call."""
        with self.stats_lock:
            return self.stats.drain(), self.inference.drain()

    # ---------------------------------------------------------------- health

    def check_workers(self) -> list[int]:
        """Restart workers that died or hung; returns the restarted ones."""
        if self.workers is None:
            return []
        now = time.monotonic()
        dead = set(self.workers.dead())
        failed = set(dead)
        for worker in range(self.workers.count):
            mine = self.workers.channels_of(worker)
            if any(int(self.channels.ready[channel]) for channel in mine):
                continue  # a request of its waits here: the server's turn, not the worker's
            # A worker steps its groups only once every one of them has its actions, so it
            # owes an answer from the last of them on: a server that waited (a full queue
            # to the learner) between answering two of its channels has not lost it time.
            last_answer = max(self.answered_at[channel] for channel in mine)
            for channel in mine:
                if not self.open[channel]:
                    silent = now - self.workers.started_at[worker] > self.start_timeout_s
                else:
                    silent = now - max(last_answer, self.workers.started_at[worker]) \
                        > self.worker_timeout_s
                if silent:
                    failed.add(worker)
        for worker in sorted(failed):
            cause = (self.workers.exit_cause(worker) if worker in dead
                     else f"was silent for more than {self.worker_timeout_s:g} s")
            for channel in self.workers.channels_of(worker):
                if self.open[channel]:
                    self.groups[channel].sink.abort()
                    with self.stats_lock:
                        self.inference.dropped_unrolls += 1
                self.open[channel] = False
            self.workers.restart(worker, cause)  # raises past the limit: the run ends
            with self.stats_lock:
                self.inference.restarts += 1
        return sorted(failed)


class ServerThread:
    """Runs :meth:`InferenceServer.step` and its health checks in a thread of the learner
    process until stopped; an exception there is kept and re-raised by :meth:`check`.
    ``torch_threads`` > 0 gives the thread its own torch (OpenMP) thread count."""

    def __init__(self, server: InferenceServer, check_interval_s: float = 1.0,
                 torch_threads: int = 0):
        self.server = server
        self.check_interval_s = check_interval_s
        self.torch_threads = torch_threads  # 0: the learner's own count
        self._stop = threading.Event()
        self._threads_set = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="distrl-inference", daemon=True)

    def _run(self) -> None:
        if self.torch_threads > 0:
            # OpenMP keeps a thread count per thread: the first call fixes this thread's to
            # the process's, the second changes only this thread's (and the process default
            # that __enter__ restores), so inference and the learner do not each run a team
            # as wide as the machine on the same cores.
            torch.get_num_threads()
            torch.set_num_threads(self.torch_threads)
        self._threads_set.set()
        last_check = time.monotonic()
        try:
            while not self._stop.is_set():
                self.server.step(wait_s=0.05)
                if time.monotonic() - last_check > self.check_interval_s:
                    self.server.check_workers()
                    last_check = time.monotonic()
        except ActorStopped:  # asked to stop while waiting for a free slot
            pass
        except BaseException as error:  # noqa: BLE001 - handed to the learner thread
            self.error = error

    def check(self) -> None:
        """Re-raise a failure of the server thread in the caller."""
        if self.error is not None:
            raise RuntimeError(f"inference server failed: {self.error!r}") from self.error

    def __enter__(self) -> ServerThread:
        learner_threads = torch.get_num_threads()
        self._thread.start()
        self._threads_set.wait()
        torch.set_num_threads(learner_threads)  # the process default, for later threads
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
