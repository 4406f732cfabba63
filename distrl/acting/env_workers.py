"""SEED env workers: processes that only step environments, talking to the inference
server through shared-memory request/answer channels (Espeholt et al. 2020, Section 2).

A *channel* is one env group of one worker: ``E`` environments stepped as one batch.
A worker writes a channel's step (observations, rewards, episode ends) into shared
buffers, raises the channel's ``ready`` flag and wakes the server; the server writes
the actions back and releases the channel's answer semaphore. Only flags and
semaphores cross processes, never a queue: a worker killed mid-write leaves its flag
down (the server never reads a half-written request) and cannot corrupt a pipe others
share. Each worker has a *generation*, raised on every restart, so the server can
tell a fresh worker's first request from a stale one.

With ``G`` channels per worker, a worker sends one channel's actions to its envs
(ale-py steps them in its own threads) before waiting for the next channel's: the
server infers for one group while the other steps.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from distrl.config import EnvConfig
from distrl.envs import VectorEnv, env_seed, make_envs
from distrl.run.supervisor import ChildProcesses, ignore_stop_signals, stop_requested
from distrl.types import EnvStep

NO_REQUEST, STEP, FIRST = 0, 1, 2  # values of Channels.ready


class Channels:
    """Shared request/answer buffers for ``num_channels`` groups of ``envs`` envs each.

    Requests (worker -> server): ``observations [C, E, ...]``, ``rewards``,
    ``terminated``, ``truncated``, ``episode_returns``, ``episode_lengths`` ``[C, E]``
    and ``ready [C]`` (NO_REQUEST, STEP, or FIRST for observations after a reset).
    Answers (server -> worker): ``actions [C, E]`` and one semaphore per channel.
    ``wait_s [C]`` accumulates the seconds each channel's worker waited for actions.
    """

    def __init__(self, ctx: Any, num_channels: int, envs: int, obs_shape: Sequence[int],
                 obs_dtype: torch.dtype):
        c, e = num_channels, envs
        self.num_channels, self.envs = c, e
        self.observations = torch.zeros((c, e, *obs_shape), dtype=obs_dtype)
        self.rewards = torch.zeros((c, e), dtype=torch.float32)
        self.terminated = torch.zeros((c, e), dtype=torch.bool)
        self.truncated = torch.zeros((c, e), dtype=torch.bool)
        self.episode_returns = torch.zeros((c, e), dtype=torch.float64)
        self.episode_lengths = torch.zeros((c, e), dtype=torch.int64)
        self.actions = torch.zeros((c, e), dtype=torch.int64)
        self.ready = torch.zeros(c, dtype=torch.int32)
        self.wait_s = torch.zeros(c, dtype=torch.float64)
        for tensor in self._tensors():
            tensor.share_memory_()
        self.wakeup = ctx.Semaphore(0)
        self.answered = [ctx.Semaphore(0) for _ in range(c)]

    def _tensors(self) -> list[torch.Tensor]:
        return [self.observations, self.rewards, self.terminated, self.truncated,
                self.episode_returns, self.episode_lengths, self.actions, self.ready,
                self.wait_s]

    # ---------------------------------------------------------------- worker side

    def post_first(self, channel: int, observations: np.ndarray) -> None:
        """A channel's envs were reset: ``observations [E, ...]`` start new episodes."""
        self.observations[channel].copy_(torch.from_numpy(observations))
        self._raise(channel, FIRST)

    def post_step(self, channel: int, step: EnvStep) -> None:
        """A channel's envs stepped; ``step`` is what they returned."""
        self.observations[channel].copy_(torch.from_numpy(step.observations))
        self.rewards[channel].copy_(torch.from_numpy(step.rewards))
        self.terminated[channel].copy_(torch.from_numpy(step.terminated))
        self.truncated[channel].copy_(torch.from_numpy(step.truncated))
        self.episode_returns[channel].copy_(torch.from_numpy(step.episode_returns))
        self.episode_lengths[channel].copy_(torch.from_numpy(step.episode_lengths))
        self._raise(channel, STEP)

    def _raise(self, channel: int, kind: int) -> None:
        # The flag goes up only after every field is written: a worker killed before
        # this line leaves no request behind.
        self.ready[channel] = kind
        self.wakeup.release()

    def wait_actions(self, channel: int, timeout: float) -> np.ndarray | None:
        """The actions the server answered for ``channel``, or None after ``timeout`` s."""
        start = time.perf_counter()
        got = self.answered[channel].acquire(timeout=timeout)
        self.wait_s[channel] += time.perf_counter() - start
        return self.actions[channel].numpy().copy() if got else None

    # ---------------------------------------------------------------- server side

    def wait_request(self, timeout: float) -> None:
        """Sleep until a worker posts a request or ``timeout`` seconds pass."""
        self.wakeup.acquire(timeout=max(timeout, 0.0))

    def pending(self) -> list[int]:
        """Channels whose request waits, in channel order."""
        return torch.nonzero(self.ready != NO_REQUEST).flatten().tolist()

    def take(self, channel: int) -> tuple[bool, EnvStep]:
        """Read a channel's request and lower its flag. Returns (first, step): ``first``
        means the observations follow a reset, and only ``step.observations`` is set."""
        first = int(self.ready[channel]) == FIRST
        step = EnvStep(
            observations=self.observations[channel].numpy().copy(),
            rewards=self.rewards[channel].numpy().copy(),
            terminated=self.terminated[channel].numpy().copy(),
            truncated=self.truncated[channel].numpy().copy(),
            episode_returns=self.episode_returns[channel].numpy().copy(),
            episode_lengths=self.episode_lengths[channel].numpy().copy(),
        )
        self.ready[channel] = NO_REQUEST
        return first, step

    def answer(self, channel: int, actions: torch.Tensor) -> None:
        """Write a channel's actions ``[E]`` and wake its worker."""
        self.actions[channel].copy_(actions)
        self.answered[channel].release()

    def clear(self, channel: int) -> None:
        """Forget a channel's request and any answer its (dead) worker did not collect."""
        self.ready[channel] = NO_REQUEST
        while self.answered[channel].acquire(block=False):
            pass


def worker_seeds(seed: int, worker: int, groups: int, envs: int, generation: int) -> list[int]:
    """Env seeds of a worker's groups: generation 0 seeds them as an IMPALA actor with the
    same id seeds its groups; a restarted worker (generation > 0) plays new episodes."""
    return [env_seed(seed + generation * 7_919, worker, g, groups, envs) for g in range(groups)]


def _env_worker(
    worker: int, channel_ids: list[int], env_cfg: EnvConfig, env_threads: int,
    seeds: list[int], channels: Channels, stop: Any, parent_pid: int,
) -> None:
    """Entry point of one env worker process: step its channels' envs until told to stop,
    the server process is gone, or an env raises (then exit 1 with the traceback)."""
    ignore_stop_signals()
    torch.set_num_threads(1)
    envs: list[VectorEnv] = []
    stopped = stop_requested(stop, parent_pid)

    try:
        for channel, seed in zip(channel_ids, seeds, strict=True):
            envs.append(make_envs(env_cfg, channels.envs, seed, num_threads=env_threads))
            channels.post_first(channel, envs[-1].reset())
        while not stopped():
            for channel, env in zip(channel_ids, envs, strict=True):
                actions = None
                while actions is None:
                    if stopped():
                        return
                    actions = channels.wait_actions(channel, timeout=0.5)
                env.send(actions)
            for channel, env in zip(channel_ids, envs, strict=True):
                channels.post_step(channel, env.recv())
    except BaseException:  # noqa: BLE001 - any failure ends the worker; the server restarts it
        traceback.print_exc()
        raise SystemExit(1) from None
    finally:
        for env in envs:
            env.close()


class EnvWorkers:
    """The env worker processes of a SEED run, under a :class:`ChildProcesses` supervisor:
    they end with the run, also when it fails.

    Worker ``w`` owns channels ``w * G .. w * G + G - 1``. :meth:`restart` kills a worker
    (if still running), clears its channels and starts a fresh one with the next
    generation's seed, under the supervisor's restart limit.

    Args:
        ctx: a ``torch.multiprocessing`` spawn context.
        count: worker processes.
        groups: channels (env groups) per worker.
        env_cfg, env_threads: what each worker builds with ``make_envs``.
        seed: the run's seed.
        channels: the shared channels (``count * groups`` of them).
        max_restarts: restarts the run allows (``agent.max_worker_restarts``).
    """

    def __init__(self, ctx: Any, count: int, groups: int, env_cfg: EnvConfig,
                 env_threads: int, seed: int, channels: Channels, max_restarts: int = 0):
        if channels.num_channels != count * groups:
            raise ValueError(f"need {count * groups} channels, got {channels.num_channels}")
        self.count, self.groups = count, groups
        self.env_cfg, self.env_threads, self.seed = env_cfg, env_threads, seed
        self.channels = channels
        self.generations = [0] * count
        self.children = ChildProcesses(ctx, count, "distrl-env-worker", _env_worker,
                                       self._args_for, label="env worker",
                                       max_restarts=max_restarts,
                                       limit_setting="agent.max_worker_restarts",
                                       before_restart=self._next_generation)
        self.started_at = self.children.started_at

    def _args_for(self, worker: int) -> tuple[Any, ...]:
        seeds = worker_seeds(self.seed, worker, self.groups, self.channels.envs,
                             self.generations[worker])
        return (worker, self.channels_of(worker), self.env_cfg, self.env_threads, seeds,
                self.channels)

    def channels_of(self, worker: int) -> list[int]:
        return list(range(worker * self.groups, (worker + 1) * self.groups))

    def worker_of(self, channel: int) -> int:
        return channel // self.groups

    def __enter__(self) -> EnvWorkers:
        self.children.__enter__()
        return self

    def dead(self) -> list[int]:
        """Workers whose process has exited."""
        return self.children.dead()

    def exitcode(self, worker: int) -> int | None:
        return self.children.exitcode(worker)

    def restart(self, worker: int, cause: str) -> None:
        """Replace ``worker``, which ``cause``, by its next generation (see
        :meth:`ChildProcesses.restart`; raises past the restart limit)."""
        self.children.restart(worker, cause)

    def exit_cause(self, worker: int) -> str:
        return self.children.exit_cause(worker)

    def _next_generation(self, worker: int) -> None:
        for channel in self.channels_of(worker):
            self.channels.clear(channel)
        self.generations[worker] += 1

    def pids(self) -> list[int]:
        return self.children.pids()

    def __exit__(self, *exc: Any) -> None:
        self.children.__exit__(*exc)


class LocalChannels:
    """Serial mode's stand-in for :class:`Channels` + :class:`EnvWorkers`: the envs live in
    this process and step when the server answers, so every request is ready at once.
    """

    def __init__(self, envs: list[VectorEnv]):
        self.env_groups = envs
        self.num_channels = len(envs)
        self.envs = envs[0].num_envs  # envs per channel, as in Channels
        self._first = [True] * len(envs)
        self._observations = [env.reset() for env in envs]

    def wait_request(self, timeout: float) -> None:
        return None

    def pending(self) -> list[int]:
        return list(range(self.num_channels))

    def take(self, channel: int) -> tuple[bool, EnvStep]:
        if self._first[channel]:
            self._first[channel] = False
            n = self.env_groups[channel].num_envs
            obs = self._observations[channel]
            return True, EnvStep(obs, np.zeros(n, np.float32), np.zeros(n, bool),
                                 np.zeros(n, bool), np.full(n, np.nan), np.zeros(n, np.int64))
        step = self.env_groups[channel].recv()
        return False, step

    def answer(self, channel: int, actions: torch.Tensor) -> None:
        self.env_groups[channel].send(actions.numpy())

    def close(self) -> None:
        for env in self.env_groups:
            env.close()
