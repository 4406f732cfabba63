"""The learner's side of the prioritized replay: building it, drawing the next batch in a
thread while the current update runs (so the learner does not wait on the replay),
loading a rank's replay from its checkpoint shard, and :class:`ReplayFeed`, the batches a
replay learner's training loop (:func:`distrl.training.loop.train`) takes."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Optional

import torch

from distrl.acting import remote
from distrl.replay.buffer import ReplayBuffer
from distrl.replay.samplers import PRIORITY_DTYPE, PrioritizedSampler
from distrl.replay.sum_tree import tree_nbytes
from distrl.run import checkpoint, memory
from distrl.runners.replay_sources import ActorLayout
from distrl.telemetry.logging import MetricLogger
from distrl.training import loop
from distrl.training.agent_parts import ReplayAgentParts, ReplayBatch
from distrl.training.learner import pin_for
from distrl.types import SampleBatch, SequenceSample


class Prefetcher:
    """Draws the next batch in a thread while the learner trains on the current one.

    The replay is only changed (inserts, priority write-backs) after :meth:`settle`, which
    waits for the draw in flight; so draw ``t + 1`` always sees the replay as it was after
    update ``t - 1``'s write-back, the same in every run, whatever the thread timing.
    """

    def __init__(self, buffer: ReplayBuffer, batch_size: int, generator: torch.Generator,
                 device: torch.device | None = None):
        self.buffer = buffer
        self.batch_size = batch_size
        self.generator = generator
        self.device = device or torch.device("cpu")  # a GPU learner's batches are pinned
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="distrl-replay-prefetch")
        self._pending: Future | None = None
        self.ready: SampleBatch | SequenceSample | None = None  # drawn, not yet trained on

    def _draw(self) -> SampleBatch | SequenceSample:
        # Pinned here, in the thread, so the learner's copy to its GPU is asynchronous.
        return pin_for(self.buffer.sample(self.batch_size, self.generator), self.device)

    def next(self) -> tuple[SampleBatch | SequenceSample, float]:
        """The batch to train on now (and start drawing the following one)."""
        start = time.perf_counter()
        self.settle()
        if self.ready is None:
            self.ready = self._draw()
        batch, self.ready = self.ready, None
        waited = time.perf_counter() - start
        self._pending = self._executor.submit(self._draw)
        return batch, waited

    def settle(self) -> None:
        """Wait for the draw in flight; afterwards the replay may be changed."""
        if self._pending is not None:
            self.ready = self._pending.result()
            self._pending = None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.settle()
        self._executor.shutdown(wait=True)


def replay_nbytes(parts: ReplayAgentParts, capacity: int, frame_shape: tuple[int, ...],
                  frame_dtype: torch.dtype, frame_stack: Optional[int], envs_per_writer: int,
                  state_size: int) -> int:
    """Bytes the replay holds when full: every tensor its storage preallocates, counted by
    building the storage on the meta device (which allocates nothing), and the sum tree."""
    with torch.device("meta"):
        storage = parts.experience.make_storage(capacity, frame_shape, frame_dtype,
                                                frame_stack, envs_per_writer, parts.actor_buffer,
                                                state_size)
    return storage.nbytes() + tree_nbytes(capacity, PRIORITY_DTYPE)


def make_replay(parts: ReplayAgentParts, frame_shape: tuple[int, ...], frame_dtype: torch.dtype,
                frame_stack: Optional[int], kernel: str, envs_per_writer: int,
                state_size: int = 0) -> ReplayBuffer:
    """The prioritized replay: frames stored once, priorities in the sum tree.

    Refused (ConfigError naming the capacity setting and the largest capacity that fits)
    when it would not fit in the machine's available memory once full: torch commits the
    pages of a large ring only as it fills, so without this check such a run starts and
    is killed hours later. An allocation that fails anyway is one ConfigError too.
    """
    r = parts.replay
    setting = f"{parts.settings_path}.replay_capacity"

    def nbytes_for(capacity: int) -> int:
        return replay_nbytes(parts, capacity, frame_shape, frame_dtype, frame_stack,
                             envs_per_writer, state_size)

    available = memory.available_bytes()
    if available is None:
        print(f"[distrl] {memory.MEMINFO} gives no MemAvailable: the replay's size is not "
              "checked against this machine's memory", flush=True)
    memory.check_fits(setting, r.capacity, nbytes_for, available)
    with memory.allocating("the replay", f"{setting}={r.capacity}", nbytes_for(r.capacity),
                           f"lower {setting}"):
        storage = parts.experience.make_storage(r.capacity, frame_shape, frame_dtype,
                                                frame_stack, envs_per_writer, parts.actor_buffer,
                                                state_size)
        sampler = PrioritizedSampler(r.capacity, alpha=r.alpha, beta=r.beta,
                                     beta_final=r.beta_final, beta_steps=r.beta_steps,
                                     epsilon=r.epsilon, kernel=kernel)
    return ReplayBuffer(storage, sampler)


def load_shard_replay(replay: ReplayBuffer, shard: dict[str, Any]) -> None:
    """Load a rank's replay from its shard, naming the setting to fix on a mismatch."""
    try:
        replay.load_state_dict(shard["replay"])
    except (RuntimeError, KeyError, ValueError) as error:
        raise checkpoint.CheckpointError(
            "resume: replay shard does not fit this run (the replay settings must match "
            f"the checkpoint's config): {error}") from None


def frames_learned(sampled: int, replay_ratio: float, frames: int, inserted: int) -> float:
    """The env frames that ``sampled`` items drawn from the replay stand for when the run
    holds ``replay_ratio`` items sampled per item inserted: ``sampled / replay_ratio`` items
    inserted, each carrying the run's ``frames / inserted`` frames. Counting the frames as
    they arrive instead swings far from this over a short window: actors insert a slot at a
    time, and the slots filled while the replay filled drain at the start."""
    return sampled / replay_ratio * frames / max(inserted, 1)


class ReplayInserts:
    """What an experience source calls with each new batch: into the replay (learner
    thread only, between draws), with this rank's frames and the replay ratio's credit.

    A separate object from :class:`ReplayFeed` so that the source, which holds this, and
    the feed, which holds the source, do not refer to each other: such a cycle outlives
    the run until a garbage collection, and with it the process group's gloo threads.
    """

    def __init__(self, parts: ReplayAgentParts, replay: ReplayBuffer, prefetcher: Prefetcher,
                 counters: dict[str, Any], replay_ratio: float, frames_per_step: int):
        self.parts, self.replay, self.prefetcher = parts, replay, prefetcher
        self.counters, self.replay_ratio = counters, replay_ratio
        self.frames_per_step = frames_per_step
        self.logger: MetricLogger | None = None  # set when the run starts
        self.seconds = 0.0  # spent inserting, this run
        self.credited = 0  # items inserted, this run, once the replay held learning_starts

    def __call__(self, batch: ReplayBatch, priorities: torch.Tensor) -> None:
        start = time.perf_counter()
        self.prefetcher.settle()
        self.replay.add(batch, priorities)
        self.counters["frames"] += batch.env_steps * self.frames_per_step
        if len(self.replay) >= self.parts.replay.learning_starts:
            self.credited += batch.size
            if self.replay_ratio > 0:
                self.counters["update_credit"] += (self.replay_ratio * batch.size
                                                   / self.parts.batch_size)
        self.logger.add("replay/inserted_per_batch", batch.size)
        self.seconds += time.perf_counter() - start


class ReplayFeed(loop.RankFrameBudget):
    """A replay learner's batches (:class:`distrl.training.loop.Feed`): what the source sent is
    inserted (by :class:`ReplayInserts`), updates wait for ``learning_starts`` items and,
    with a replay ratio, for credit (``replay_ratio * inserted / batch_size`` updates); each
    update's sample was drawn by the :class:`Prefetcher`, and its new priorities are
    written back. ``counters["frames"]`` counts this rank's frames
    (:class:`~distrl.training.loop.RankFrameBudget`)."""

    def __init__(self, parts: ReplayAgentParts, replay: ReplayBuffer, prefetcher: Prefetcher,
                 counters: dict[str, Any], replay_ratio: float, total_frames: int,
                 frames_per_step: int, start_timeout_s: float, world: int,
                 layout: ActorLayout, envs_per_actor: int):
        self.parts, self.replay, self.prefetcher = parts, replay, prefetcher
        self.counters = counters
        self.replay_ratio = replay_ratio
        self.total_frames = total_frames  # of all ranks
        self.start_timeout_s = start_timeout_s
        self.world = world
        self.layout, self.envs_per_actor = layout, envs_per_actor
        # what the source is given to insert with (see ReplayInserts)
        self.inserts = ReplayInserts(parts, replay, prefetcher, counters, replay_ratio,
                                     frames_per_step)
        self.experience: Any = None
        self.logger: MetricLogger | None = None
        self.remote_actors: remote.RemoteActors | None = None
        self._loop_start = self._data_wait = 0.0
        self.replay_wait_s = self.learner_s = 0.0  # since the last report
        self.total_replay_wait_s = self.total_learner_s = 0.0
        self._last = (0, 0)  # the replay's inserted and sampled counts at the last report
        self._start = self._marks = (0, 0, 0)  # frames, inserted, sampled: start, last call

    def start(self, experience: Any, logger: MetricLogger,
              remote_actors: remote.RemoteActors | None) -> None:
        self.experience, self.logger, self.remote_actors = experience, logger, remote_actors
        self.inserts.logger = logger
        self._last = (self.replay.inserted, self.replay.sampled)
        self._start = self._marks = (self.counters["frames"], self.replay.inserted,
                                     self.replay.sampled)

    def _can_update(self) -> bool:
        if len(self.replay) < self.parts.replay.learning_starts or len(self.replay) == 0:
            return False
        return self.replay_ratio == 0 or self.counters["update_credit"] >= 1.0

    def _wait_for_data(self, stop_requested: Callable[[], bool]) -> float | None:
        """Step the local actor or wait for actor batches until an update may run.
        Returns the seconds waited, or None when the run should end first (a stop was
        asked, or this rank's frame budget ran out before learning could start)."""
        start = time.perf_counter()
        deadline = time.monotonic() + self.start_timeout_s
        while not self._can_update():
            if stop_requested() or self.budget_spent():
                return None
            if self.experience.serial:
                self.experience.step_local()
                continue
            if self.experience.receive(timeout=1.0):
                deadline = time.monotonic() + self.start_timeout_s
                continue
            self._collect_actor_stats()
            self.experience.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"no transitions from the actors within "
                                   f"distributed.start_timeout_s={self.start_timeout_s}s")
        return time.perf_counter() - start

    def next_batch(self, stop_requested: Callable[[], bool]
                   ) -> tuple[SampleBatch | SequenceSample, dict[str, float]] | None:
        self._loop_start = time.perf_counter()
        inserting = self.inserts.seconds
        if self.replay_ratio == 0:  # free running: take whatever arrived
            self.experience.receive(timeout=0.0)
        data_wait = None if self.budget_spent() else self._wait_for_data(stop_requested)
        if data_wait is None:
            return None
        self._data_wait = data_wait
        batch, waited = self.prefetcher.next()
        self.replay_wait_s += waited
        self.total_replay_wait_s += waited
        # Inserting what actor processes sent is the learner's copying; in one process the
        # actor's own turn inserts (counted in its copy time), and is data_wait_s here.
        inserted = 0.0 if self.experience.serial else self.inserts.seconds - inserting
        return batch, {"learner/replay_wait_s": waited, "learner/data_wait_s": data_wait,
                       "learner/insert_s": inserted}

    def after_update(self, batch: SampleBatch | SequenceSample,
                     priorities: torch.Tensor | None) -> None:
        drawing = time.perf_counter()
        self.prefetcher.settle()
        # The next batch was being drawn during the update; where its draw takes longer
        # (32 R2D2 sequences of stacked frames beside a GPU update), the learner waits here,
        # and that wait is building its batches, as the one in Prefetcher.next is.
        waited = time.perf_counter() - drawing
        self.replay_wait_s += waited
        self.total_replay_wait_s += waited
        if self.logger is not None:
            self.logger.add("learner/draw_wait_s", waited)
        if priorities is not None:  # None: the update was skipped (divergence guard)
            self.replay.update_priorities(batch.indices, priorities)
        if self.replay_ratio > 0:
            self.counters["update_credit"] -= 1.0
        busy = time.perf_counter() - self._loop_start - self._data_wait
        self.learner_s += busy
        self.total_learner_s += busy

    def _epsilon_range(self, actor_id: int) -> tuple[float, float]:
        n = self.envs_per_actor
        mine = self.layout.epsilons[actor_id * n:(actor_id + 1) * n]
        return float(mine.min()), float(mine.max())

    def _episode_epsilon(self, actor_id: int, env: int) -> float:
        """The epsilon of actor ``actor_id``'s env ``env`` (NaN for -1, an env not known)."""
        index = actor_id * self.envs_per_actor + env
        epsilons = self.layout.epsilons
        return float(epsilons[index]) if env >= 0 and index < len(epsilons) else float("nan")

    def _collect_actor_stats(self) -> None:
        logger, frames = self.logger, self.episode_frames()
        for actor_id, stats in self.experience.drain():
            for ret in stats.episode_returns:
                logger.add(f"actor{actor_id}/episode_return", ret)
            low, high = self._epsilon_range(actor_id)
            logger.add(f"actor{actor_id}/epsilon_min", low)
            logger.add(f"actor{actor_id}/epsilon_max", high)
            loop.log_actor_stats(logger, stats, frames,
                                 functools.partial(self._episode_epsilon, actor_id))
        # an actor-only rank's envs are not in this rank's ladder: their epsilon is NaN
        loop.log_remote_actors(logger, self.remote_actors, frames,
                               functools.partial(self._episode_epsilon, 0))

    def collect(self) -> None:
        self._collect_actor_stats()
        self.experience.log(self.logger)

    def report(self, span_s: float) -> tuple[dict[str, float], dict[str, float]]:
        replay = self.replay
        inserted, sampled = replay.inserted - self._last[0], replay.sampled - self._last[1]
        self._last = (replay.inserted, replay.sampled)
        scalars = {
            "replay/insert_per_s": inserted / span_s,
            "replay/sample_per_s": sampled / span_s,
            # mean of (|TD| + epsilon)^alpha over the stored transitions
            "replay/priority_alpha_mean": replay.sampler.tree.total() / max(len(replay), 1),
            "replay/priority_max": replay.sampler.max_priority,
            "learner/replay_wait_fraction": self.replay_wait_s / max(self.learner_s, 1e-9),
        }
        self.replay_wait_s = self.learner_s = 0.0
        # The ratio held so far, not this report's: actors insert in bursts (a slot of
        # envs x actor_buffer items at a time), so a report without an insert would read
        # as its whole sample count.
        held = (replay.sampled - self._start[2]) / max(self.inserts.credited, 1)
        return scalars, {"replay/size": len(replay), "replay/ratio": held}

    def throughput(self, span_s: float) -> dict[str, float]:
        """Items sampled and inserted since the last call, and the frames' worth the learner
        consumed: the items it sampled, in frames, over the replay ratio asked (uncapped:
        the frames that arrived, all of which it trains on at whatever ratio results)."""
        replay, frames = self.replay, self.counters["frames"]
        marks = (frames, replay.inserted, replay.sampled)
        arrived, inserted, sampled = (now - then for now, then in zip(marks, self._marks,
                                                                       strict=True))
        self._marks = marks
        start_frames, start_inserted, _ = self._start
        learned = (frames_learned(sampled, self.replay_ratio, frames - start_frames,
                                  replay.inserted - start_inserted)
                   if self.replay_ratio > 0 else arrived)
        return {"learned_frames": learned, "sampled": sampled, "inserted": inserted,
                "replay_ratio_target": self.replay_ratio,
                "replay_fill": len(replay) / self.parts.replay.capacity,
                "slots_full": self.experience.occupancy()}
