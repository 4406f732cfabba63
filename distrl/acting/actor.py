"""The generic acting loop: vector envs + a policy function -> a sink. No algorithm here.

An actor splits its environments into groups. While the policy runs on one group's
observations, the other groups' environments are stepping in ale-py's threads
(``send``/``recv``), so env time and network time overlap. Each group writes to
its own sink; :class:`UnrollSink` fills fixed-length unrolls into shared slots.
"""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from distrl.envs import VectorEnv
from distrl.replay.sequence_writer import SequenceWriter
from distrl.replay.writers import NStepWriter
from distrl.transport.queues import SlotPool
from distrl.types import EnvStep, SequenceBatch, TransitionBatch


class ActorStopped(Exception):
    """Raised inside the loop when the run asked the actor to stop."""


@dataclass
class PolicyOutput:
    """What a policy returns for N observations."""

    actions: torch.Tensor  # [N] int64
    extras: dict[str, torch.Tensor]  # per-step fields the sink stores, each [N, ...]
    core_state: tuple[torch.Tensor, ...]  # recurrent state after this step, each [N, H]


class Policy(Protocol):
    """Maps observations to actions. ``last_actions`` [N] int64 (-1 at an episode's first
    step) and ``last_rewards`` [N] float32 (0 there) are what preceded each observation;
    R2D2 feeds them to its LSTM (Kapturowski et al. 2019, Section 3)."""

    def initial_state(self, batch_size: int) -> tuple[torch.Tensor, ...]: ...

    def __call__(
        self,
        observations: torch.Tensor,
        core_state: tuple[torch.Tensor, ...],
        last_actions: torch.Tensor | None = None,
        last_rewards: torch.Tensor | None = None,
    ) -> PolicyOutput: ...


class Sink(Protocol):
    def begin(self, observations: torch.Tensor, core_state: tuple[torch.Tensor, ...]) -> None: ...

    def act(self, output: PolicyOutput, version: int) -> None: ...

    def observe(self, step: EnvStep, core_state: tuple[torch.Tensor, ...]) -> None: ...

    def abort(self) -> None:
        """The envs are gone mid-episode (their worker died); the next call is ``begin``."""
        ...


def reset_core_state(
    core_state: tuple[torch.Tensor, ...], dones: np.ndarray
) -> tuple[torch.Tensor, ...]:
    """Zero the recurrent state of the columns whose episode just ended."""
    if not core_state or not dones.any():
        return core_state
    done = torch.from_numpy(dones).unsqueeze(-1)
    return tuple(torch.where(done, torch.zeros_like(s), s) for s in core_state)


@dataclass
class ActorStats:
    """Counters an actor accumulates between reports."""

    frames: int = 0
    steps: int = 0
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    # which of the actor's envs (its groups' envs in order) played each episode; -1 where
    # not known (an actor-only rank's): a replay learner gives each its epsilon
    episode_envs: list[int] = field(default_factory=list)
    env_wait_s: float = 0.0
    policy_s: float = 0.0
    sink_wait_s: float = 0.0
    # handing steps to the sinks (slot copies, n-step writing) and pulling weights; waits
    # for a free slot are in sink_wait_s, a replay actor's initial-priority forward in
    # policy_s (it is network time, not copying)
    copy_s: float = 0.0
    policy_version: int = 0

    def absorb(self, other: ActorStats) -> None:
        """Add ``other``'s frames and finished episodes to these counters."""
        self.frames += other.frames
        self.episode_returns += other.episode_returns
        self.episode_lengths += other.episode_lengths
        self.episode_envs += other.envs_of_episodes()

    def envs_of_episodes(self) -> list[int]:
        """The env index of each finished episode; -1 for each where none was recorded
        (stats built without env indices)."""
        return self.episode_envs or [-1] * len(self.episode_returns)

    def counted_elsewhere_s(self) -> float:
        """Seconds counted as waiting for a slot or as network forwards: a block timed as
        copying subtracts what this grew by while it ran."""
        return self.sink_wait_s + self.policy_s

    def drain(self) -> ActorStats:
        """Return the counters so far and start new ones."""
        out = ActorStats(**vars(self))
        self.frames = self.steps = 0
        self.episode_returns, self.episode_lengths, self.episode_envs = [], [], []
        self.env_wait_s = self.policy_s = self.sink_wait_s = self.copy_s = 0.0
        return out


def acquire_slot(pool: SlotPool, should_stop: Callable[[], bool], stats: ActorStats,
                 producer: int = -1) -> int:
    """A free slot of ``pool`` for ``producer`` (see :meth:`SlotPool.acquire`), the wait
    counted in ``stats.sink_wait_s``; raises :class:`ActorStopped` if the run asks the
    actor to stop while every slot is taken."""
    while True:
        try:
            index, waited = pool.acquire(timeout=0.5, producer=producer)
            stats.sink_wait_s += waited
            return index
        except queue.Empty:
            stats.sink_wait_s += 0.5
            if should_stop():
                raise ActorStopped from None


@contextlib.contextmanager
def timed_forward(stats: ActorStats) -> Iterator[None]:
    """Count the block's time in ``stats.policy_s`` (the console's "forward"): for network
    forwards that run inside a sink, such as a replay actor's initial priorities."""
    start = time.perf_counter()
    try:
        yield
    finally:
        stats.policy_s += time.perf_counter() - start


def count_step(stats: ActorStats, env_step: EnvStep, frames_per_step: int,
               first_env: int = 0) -> None:
    """Add one batched step's steps, frames and finished games to ``stats`` (a lost life
    that ended only the learner's episode is not a finished game); the step's envs are the
    actor's envs ``first_env`` onwards."""
    n = env_step.rewards.shape[0]
    stats.steps += n
    stats.frames += n * frames_per_step
    over = env_step.game_over
    if over.any():
        stats.episode_returns.extend(env_step.episode_returns[over].tolist())
        stats.episode_lengths.extend(env_step.episode_lengths[over].tolist())
        stats.episode_envs.extend((np.flatnonzero(over) + first_env).tolist())


class UnrollSink:
    """Writes T-step unrolls of one env group into slots of a :class:`SlotPool`.

    Slot fields: ``observations [T+1, E, ...]``, ``actions``, ``rewards``, ``dones``,
    ``policy_versions`` ``[T, E]``, one ``[T, E, ...]`` field per policy extra (e.g.
    ``behaviour_logits``) and ``core_state_<i> [E, H]``. The last observation of an
    unroll is the first of the next one, with the recurrent state at that point.
    """

    def __init__(
        self,
        pool: SlotPool,
        unroll_length: int,
        stats: ActorStats,
        should_stop: Callable[[], bool] = lambda: False,
        producer: int = -1,
    ):
        self.pool = pool
        self.producer = producer  # the actor process's id, so a dead one's slot is reclaimed
        self.unroll_length = unroll_length
        self.stats = stats
        self.should_stop = should_stop
        self.buffers = pool.buffers
        self.index = -1
        self.t = 0

    def begin(self, observations: torch.Tensor, core_state: tuple[torch.Tensor, ...]) -> None:
        self.index = acquire_slot(self.pool, self.should_stop, self.stats, self.producer)
        self.t = 0
        self.buffers["observations"][self.index, 0].copy_(observations)
        for i, state in enumerate(core_state):
            self.buffers[f"core_state_{i}"][self.index].copy_(state)

    def act(self, output: PolicyOutput, version: int) -> None:
        i, t = self.index, self.t
        self.buffers["actions"][i, t].copy_(output.actions)
        self.buffers["policy_versions"][i, t].fill_(version)
        for name, value in output.extras.items():
            self.buffers[name][i, t].copy_(value)

    def observe(self, step: EnvStep, core_state: tuple[torch.Tensor, ...]) -> None:
        i, t = self.index, self.t
        self.buffers["rewards"][i, t].copy_(torch.from_numpy(step.rewards))
        self.buffers["dones"][i, t].copy_(torch.from_numpy(step.dones))
        observations = torch.from_numpy(step.observations)
        self.buffers["observations"][i, t + 1].copy_(observations)
        self.t += 1
        if self.t == self.unroll_length:
            self.pool.commit(i)
            self.begin(observations, core_state)

    def abort(self) -> None:
        """Drop the unroll being written (its envs are gone): the slot goes back to the
        free list uncommitted, so the learner never sees a half-written unroll."""
        if self.index >= 0:
            self.pool.release([self.index])
        self.index = -1
        self.t = 0


class TransitionSink:
    """Feeds one env group's steps to a replay writer and emits what it completed every
    ``flush_steps`` steps: an Ape-X actor's local buffer (Horgan et al. 2018, Algorithm 1),
    or an R2D2 actor's sequences with their stored recurrent state.

    Args:
        writer: turns the group's steps into n-step transitions
            (:class:`~distrl.replay.writers.NStepWriter`) or sequences
            (:class:`~distrl.replay.sequence_writer.SequenceWriter`).
        flush_steps: group steps between two emits (the paper's local buffer size B).
        emit: receives each flushed batch (computes priorities and sends it to the replay).
        transform_rewards: applied to the raw rewards before the writer sums them
            (reward clipping); the episode statistics keep the raw returns.
    """

    def __init__(
        self,
        writer: NStepWriter | SequenceWriter,
        flush_steps: int,
        emit: Callable[[TransitionBatch | SequenceBatch], None],
        transform_rewards: Callable[[torch.Tensor], torch.Tensor] = lambda r: r,
    ):
        self.writer = writer
        self.flush_steps = flush_steps
        self.emit = emit
        self.transform_rewards = transform_rewards
        self.actions = torch.zeros(0, dtype=torch.int64)
        self.q_values: torch.Tensor | None = None  # the policy's, for acting-time priorities
        self.steps = 0

    def begin(self, observations: torch.Tensor, core_state: tuple[torch.Tensor, ...]) -> None:
        self.writer.begin(observations, core_state)

    def act(self, output: PolicyOutput, version: int) -> None:
        self.actions = output.actions
        self.q_values = output.extras.get("q")

    def observe(self, step: EnvStep, core_state: tuple[torch.Tensor, ...]) -> None:
        # A policy that reports its Q values (R2D2's) hands them to the writer with the step.
        kept = {} if self.q_values is None else {"q_values": self.q_values}
        self.writer.add(self.actions, self.transform_rewards(torch.from_numpy(step.rewards)),
                        torch.from_numpy(step.observations), torch.from_numpy(step.terminated),
                        torch.from_numpy(step.truncated), core_state, **kept)
        self.steps += 1
        if self.steps % self.flush_steps == 0:
            self.flush()

    def abort(self) -> None:
        """The group's envs are gone (SEED: their worker died or hung). Nothing is half
        written here: every step the writer holds was observed, and the :meth:`begin` of
        the envs that replace them ends each env's episode as a truncation first (an
        n-step window short of n dropped, an open sequence emitted padded), so no
        transition joins the two generations."""

    def flush(self) -> None:
        """Emit every transition completed so far (steps still short of n stay pending)."""
        batch = self.writer.flush()
        if batch is not None:
            self.emit(batch)


@dataclass
class EnvGroup:
    """One batch of environments stepped together, its sink and its acting state.

    ``policy`` overrides the actor's policy for this group (Ape-X: each group acts with
    its own slice of the exploration-rate ladder). ``env`` is None where the envs step in
    another process and only their steps arrive here (SEED's inference server).
    """

    env: VectorEnv | None
    sink: Sink
    core_state: tuple[torch.Tensor, ...] = ()
    policy: Policy | None = None
    last_actions: torch.Tensor | None = None  # [N] before the current observations; -1: none
    last_rewards: torch.Tensor | None = None  # [N] before the current observations

    def begin(self, observations: torch.Tensor, core_state: tuple[torch.Tensor, ...]) -> None:
        """Episodes start in every env: initial state, no previous action or reward."""
        n = observations.shape[0]
        self.core_state = core_state
        self.last_actions = torch.full((n,), -1, dtype=torch.int64)
        self.last_rewards = torch.zeros(n)
        self.sink.begin(observations, core_state)

    def observe(self, env_step: EnvStep) -> None:
        """Record a step's outcome: the state of ended episodes is zeroed before the sink
        stores it, and the next observation's previous action/reward become -1/0 there.
        The learner's episodes (``dones``): a lost life made terminal counts."""
        self.core_state = reset_core_state(self.core_state, env_step.dones)
        dones = torch.from_numpy(env_step.dones)
        self.last_actions = self.last_actions.masked_fill(dones, -1)
        self.last_rewards = torch.from_numpy(env_step.rewards).float().masked_fill(dones, 0.0)
        self.sink.observe(env_step, self.core_state)

    def acted(self, output: PolicyOutput, version: int) -> None:
        """Keep the policy's new state and actions and hand them to the sink."""
        self.core_state = output.core_state
        self.last_actions = output.actions
        self.sink.act(output, version)


class Actor:
    """Steps env groups with a policy, feeding each group's sink.

    Args:
        groups: the env groups (each with its own sink).
        policy: maps observations and recurrent state to actions and extras.
        pull_weights: called once per group step; returns the policy version now in use.
        stats: where counters accumulate.
    """

    def __init__(
        self,
        groups: list[EnvGroup],
        policy: Policy,
        pull_weights: Callable[[], int],
        stats: ActorStats,
    ):
        self.groups = groups
        self.policy = policy
        self.pull_weights = pull_weights
        self.stats = stats
        self._started = False
        # each group's first env among the actor's envs (a replay actor's epsilons follow
        # this order)
        self._first_env = np.cumsum([0] + [g.env.num_envs for g in groups[:-1]]).tolist()

    def start(self) -> None:
        """Reset every env, open each sink and send the first actions."""
        for group in self.groups:
            observations = torch.from_numpy(group.env.reset())
            group.begin(observations,
                        (group.policy or self.policy).initial_state(group.env.num_envs))
            self._act(group, observations)
        self._started = True

    def step(self) -> None:
        """Receive one step from every group in turn and send its next actions."""
        if not self._started:
            self.start()
        for group, first_env in zip(self.groups, self._first_env, strict=True):
            start = time.perf_counter()
            env_step = group.env.recv()
            self.stats.env_wait_s += time.perf_counter() - start
            with self._copying():
                group.observe(env_step)
            count_step(self.stats, env_step, group.env.frames_per_step, first_env)
            self._act(group, torch.from_numpy(env_step.observations))

    def _act(self, group: EnvGroup, observations: torch.Tensor) -> None:
        with self._copying():
            version = self.pull_weights()
        start = time.perf_counter()
        output = (group.policy or self.policy)(observations, group.core_state,
                                               group.last_actions, group.last_rewards)
        self.stats.policy_s += time.perf_counter() - start
        self.stats.policy_version = version
        with self._copying():
            group.acted(output, version)
        group.env.send(output.actions.numpy())

    @contextlib.contextmanager
    def _copying(self) -> Iterator[None]:
        """Count the block's time in ``stats.copy_s``, less what it waited for a free slot
        or spent in a sink's network forward (already in ``stats.sink_wait_s`` and
        ``stats.policy_s``)."""
        start, elsewhere = time.perf_counter(), self.stats.counted_elsewhere_s()
        yield
        self.stats.copy_s += (time.perf_counter() - start
                              - (self.stats.counted_elsewhere_s() - elsewhere))

    def close(self) -> None:
        for group in self.groups:
            group.env.close()
