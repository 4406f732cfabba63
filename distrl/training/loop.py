"""The training loop every agent runs, written once:
batch -> learner step -> publish -> agree across ranks -> log -> checkpoint -> stop.

What differs between agent families is only where a learner batch comes from, so a
:class:`Feed` hides it: IMPALA's takes B unrolls from the slots its actors (or SEED's
server, or actor-only ranks) fill (:class:`distrl.runners.unroll_family.UnrollFeed`); Ape-X's
and R2D2's insert what arrived into their prioritized replay and sample from it, and
are told each update's new priorities (:class:`distrl.runners.replay_learner.ReplayFeed`).
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import torch

from distrl.acting import remote
from distrl.acting.actor import ActorStats
from distrl.run.run_settings import RunSettings
from distrl.run.supervisor import STOP_SIGNALS, TooManyRestarts
from distrl.telemetry.logging import MetricLogger
from distrl.telemetry.progress import ProgressDisplay, ProgressReport, choose_mode
from distrl.telemetry.throughput_meter import ThroughputMeter
from distrl.training.learner import Learner
from distrl.transport import distributed


class Feed(Protocol):
    """Where a learner rank's batches come from, and how much of the run's frame budget
    is spent."""

    def next_batch(self, stop_requested: Callable[[], bool]
                   ) -> tuple[Any, dict[str, float]] | None:
        """The next batch and the figures of waiting for it, or None when this rank has
        nothing more to learn from (its budget is spent, or a stop came first)."""

    def after_update(self, batch: Any, priorities: torch.Tensor | None) -> None:
        """Book the update: frames learned, new priorities, the replay's credit."""

    def collect(self) -> None:
        """Log the actors' episodes and counters and the source's own figures."""

    def rank_frames(self) -> int:
        """This rank's frames so far; the ranks' sum is the run's."""

    def agreed(self, run_frames: int) -> None:
        """The frames of all ranks, as the ranks just agreed after an update."""

    def budget_spent(self) -> bool:
        """Whether the run's ``total_frames`` is spent, as far as this rank knows."""

    def report(self, span_s: float) -> tuple[dict[str, float], dict[str, float]]:
        """At each report: scalars to log, and figures for the printed line."""

    def throughput(self, span_s: float) -> dict[str, float]:
        """At each report, before :meth:`report`: what the feed knows of the throughput
        since the last call, by :class:`~distrl.telemetry.throughput.Figures` field names
        (``learned_frames``; replay feeds ``sampled``, ``inserted``,
        ``replay_ratio_target``, ``replay_fill``; ``slots_full`` where slots exist)."""


class RankFrameBudget:
    """The one frame convention every Feed keeps (:mod:`distrl.runners.runner`):
    ``counters["frames"]`` counts this rank's frames and the run ends when the frames of all
    ranks reach ``total_frames``; a feed sets both.

    Ranks need not collect at one pace (a replay rank's actors may outrun another's), so a
    rank past its even share learns on until the others make up the rest. A rank hears the
    run's frames at each agreement (:meth:`agreed`); in between it adds its own since, a
    lower bound of the run's, so a rank waiting for data stops waiting once that is spent.
    """

    counters: dict[str, Any]
    total_frames: int
    world: int = 1  # learner ranks
    _agreed: tuple[int, int] = (0, 0)  # the run's and this rank's frames at the agreement

    def rank_frames(self) -> int:
        return self.counters["frames"]

    def agreed(self, run_frames: int) -> None:
        self._agreed = (run_frames, self.counters["frames"])

    def run_frames(self) -> int:
        """The run's frames as far as this rank knows: at least this many."""
        run, own = self._agreed
        return run + self.counters["frames"] - own

    def budget_spent(self) -> bool:
        return self.run_frames() >= self.total_frames

    def episode_frames(self) -> int:
        """The run's frames to write an episode that just ended at: the agreed frames plus
        this rank's since, times the ranks, as if every rank collected at this one's pace.
        Exact at each agreement and, between them, for ranks in step (IMPALA's); an
        estimate, not the lower bound :meth:`run_frames` keeps for the budget."""
        run, own = self._agreed
        return run + (self.counters["frames"] - own) * self.world


_stop_signal: int | None = None  # the signal that stopped this process's latest run


def stop_signal() -> int | None:
    """The signal (:data:`~distrl.run.supervisor.STOP_SIGNALS`: SIGINT, SIGTERM, SIGUSR1)
    that stopped this process's latest run, None if none did (``run.py`` exits
    ``128 + signal``)."""
    return _stop_signal


class StopFlag:
    """Set by SIGINT, SIGTERM or SIGUSR1: the run finishes its update, checkpoints and exits.

    A second signal means "now" (KeyboardInterrupt), except while a checkpoint is being
    written (:meth:`checkpointing`): then it waits until the file is on disk, so the
    checkpoint of the first signal is never lost.

    Args:
        new_run: forget the signal that stopped this process's previous run; False for a
            flag that only guards a checkpoint written after :func:`train` returned.
    """

    def __init__(self, new_run: bool = True) -> None:
        global _stop_signal
        if new_run:
            _stop_signal = None
        self.requested = _stop_signal is not None
        self._previous: dict[int, Any] = {}
        self._writing = 0  # checkpoints being written (nested blocks count)
        self._deferred: int | None = None  # a second signal that came during a write

    def __enter__(self) -> StopFlag:
        for sig in STOP_SIGNALS:
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: the caller stops us instead
                pass
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        global _stop_signal
        if self.requested:  # a second Ctrl-C means now, once no checkpoint is half-written
            if self._writing:
                self._deferred = signum
                print(f"[distrl] received signal {signum} again: stopping once the "
                      "checkpoint is written", flush=True)
                return
            raise KeyboardInterrupt
        self.requested = True
        _stop_signal = signum
        print(f"[distrl] received signal {signum}: checkpointing and stopping", flush=True)

    @contextlib.contextmanager
    def checkpointing(self) -> Iterator[None]:
        """Hold a second signal back until the checkpoint written inside is complete."""
        self._writing += 1
        try:
            yield
        finally:
            self._writing -= 1
        if self._deferred is not None and not self._writing:
            raise KeyboardInterrupt

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def checkpointing() -> Iterator[None]:
    """For a checkpoint written after :func:`train` returned (the final one): the stop
    signals are caught while it is written, so neither can abort it half-way; a first
    signal stops the run after it (exit 128 + signal), a second ends the run as soon as
    the file is on disk."""
    with StopFlag(new_run=False) as flag, flag.checkpointing():
        yield


def recent_mean_20(logger: MetricLogger, settle_games: int = 0) -> float:
    """Mean raw return of the last 20 episodes, NaN before 20 have finished or before this
    process has written ``settle_games`` (:func:`train`)."""
    if len(logger.recent_returns) < 20 or (settle_games
                                           and logger.episodes_here < settle_games):
        return float("nan")
    return logger.mean_recent_return(20)


def log_actor_stats(logger: MetricLogger, stats: ActorStats, frames: int,
                    epsilon_of: Callable[[int], float] | None = None) -> None:
    """Write an actor's finished episodes at ``frames`` and accumulate its timings;
    ``epsilon_of`` (a replay learner's) gives the exploration rate of the actor's env
    ``i`` (``-1``: not known) for each episode's ``episode/epsilon``."""
    for ret, length, env in zip(stats.episode_returns, stats.episode_lengths,
                                stats.envs_of_episodes(), strict=False):
        logger.episode(ret, length, frames, None if epsilon_of is None else epsilon_of(env))
    logger.add("actor/frames", stats.frames)
    logger.add("actor/env_wait_s", stats.env_wait_s)
    logger.add("actor/policy_s", stats.policy_s)
    logger.add("actor/slot_wait_s", stats.sink_wait_s)  # waiting for a free slot
    logger.add("actor/copy_s", stats.copy_s)


def log_remote_actors(logger: MetricLogger, remote_actors: remote.RemoteActors | None,
                      frames: int, epsilon_of: Callable[[int], float] | None = None) -> None:
    """The counters the actor-only ranks sent (raises if one of them failed)."""
    if remote_actors is not None:
        remote_actors.check()
        for stats in remote_actors.drain():
            log_actor_stats(logger, stats, frames, epsilon_of)


def resync_if_due(model: torch.nn.Module, updates: int, settings: RunSettings,
                  ranks: distributed.RankInfo | None, logger: MetricLogger) -> None:
    """Every ``distributed.resync_interval`` updates, rank 0's weights replace every
    learner's; the drift each rank had is logged as ``learner/resync_drift``."""
    interval = settings.distributed.resync_interval
    if ranks is not None and interval > 0 and updates % interval == 0:
        logger.add("learner/resync_drift", distributed.resync_parameters(model, ranks))


def train(learner: Learner, feed: Feed, logger: MetricLogger, settings: RunSettings,
          ranks: distributed.RankInfo | None, counters: dict[str, Any],
          save_checkpoint: Callable[[int], Path], should_stop: Callable[[int], bool] | None,
          progress: Callable[[int, int], None] | None, meter: ThroughputMeter,
          settle_games: int = 0) -> int:
    """Train until the frame budget is spent or a stop is asked (SIGINT, SIGTERM, SIGUSR1,
    ``should_stop(updates)``, ``stop_at_return``); returns the frames of all ranks.

    ``stop_at_return`` reads the ranks' 20-game mean once each rank has written
    ``settle_games`` episodes in this process (the runner asks for one per env after a
    resume): a resume restarts every env's game at once, so the first games to end are the
    shortest, in Pong the most decisive, a window an uninterrupted run never sees.

    Under torchrun every rank runs this loop with its own feed; two small all-reduces per
    update keep them in step: one before the update (every rank updates or none does: a
    rank alone in the gradient all-reduce would wait for the others until the collective
    timeout) and one after it (they stop together, checkpoint at the same update and see
    the same frames and mean return). ``counters["elapsed_s"]`` is kept current for the
    checkpoint; ``save_checkpoint(frames of all ranks)`` runs on every rank when rank 0's
    ``checkpoint.interval_s`` has passed; ``progress(updates, frames)`` after each update.

    Each report measures the run's throughput with ``meter`` (which keeps the figures for
    the run's summary), logs it under ``throughput/`` and
    shows the progress line or bar (``log.progress``) with the side that bounds the run.

    Actors that fail more often than ``distributed.max_actor_restarts`` stop the run like a
    signal, and :class:`~distrl.run.supervisor.TooManyRestarts` is raised once its checkpoint is
    written. A diverged learner (:class:`~distrl.training.learner.Diverged`) raises at once, so the
    newest checkpoint keeps the last good weights.
    """
    run_start = time.monotonic() - counters["elapsed_s"]
    last_checkpoint = time.monotonic()
    world = ranks.learners if ranks is not None else 1
    frames = feed.rank_frames() * world
    last_report = (frames, learner.updates, time.monotonic())
    failure: TooManyRestarts | None = None  # the actors failed too often: stop, checkpoint
    report = Reporter(logger, feed, learner, meter, settings.total_frames, ranks,
                      ProgressDisplay(choose_mode(settings.log.progress, logger.stream),
                                      logger.stream, settings.total_frames))
    with StopFlag() as signals, contextlib.closing(report.display):
        while True:
            try:
                fetched = feed.next_batch(lambda: signals.requested)
            except TooManyRestarts as error:
                fetched, failure = None, error
            before = distributed.agree(fetched is None, False, feed.rank_frames(),
                                       float("nan"), ranks)
            feed.agreed(before.frames)
            if before.stop:
                frames = before.frames
                break
            assert fetched is not None
            batch, waits = fetched
            metrics, priorities = learner.step(batch)
            resync_if_due(learner.model, learner.updates, settings, ranks, logger)
            feed.after_update(batch, priorities)
            counters["elapsed_s"] = time.monotonic() - run_start
            logger.add_many(metrics)
            logger.add_many(waits)
            try:
                feed.collect()
            except TooManyRestarts as error:
                failure = error
            agreement = distributed.agree(
                failure is not None or signals.requested
                or (should_stop is not None and should_stop(learner.updates)),
                time.monotonic() - last_checkpoint >= settings.checkpoint.interval_s,
                feed.rank_frames(), recent_mean_20(logger, settle_games), ranks)
            frames = agreement.frames
            feed.agreed(frames)
            if progress is not None:
                progress(learner.updates, frames)
            report.display.tick(frames)
            target = settings.stop_at_return
            stop_now = (agreement.stop or feed.budget_spent()
                        or (target is not None and agreement.mean_return_20 >= target))
            if logger.due() or stop_now:
                last_report = report(frames, last_report, agreement.mean_return_20)
            if agreement.checkpoint:
                with signals.checkpointing():
                    save_checkpoint(frames)
                last_checkpoint = time.monotonic()
            if stop_now:
                break
    if failure is not None:
        with checkpointing():
            path = save_checkpoint(frames)
        raise TooManyRestarts(f"{failure}; the run stopped after its checkpoint {path}")
    return frames


# The progress line's frames/s spans this many seconds of reports: a replay run's actors,
# held to the replay ratio, insert in bursts a minute or more apart (Ape-X on Pong on 2
# cores: 9,600 transitions about every 100 s), so one report's own figure is mostly 0.
FPS_WINDOW_S = 300.0


class Reporter:
    """Each report: the feed's figures and the throughput diagnosis to tensorboard, and the
    progress line (or bar) to the console."""

    def __init__(self, logger: MetricLogger, feed: Feed, learner: Learner,
                 meter: ThroughputMeter, total_frames: int,
                 ranks: distributed.RankInfo | None, display: ProgressDisplay):
        self.logger, self.feed, self.learner, self.meter = logger, feed, learner, meter
        self.total_frames, self.ranks, self.display = total_frames, ranks, display
        self._start: tuple[int, float] | None = None  # frames and time of the first mark
        self._marks: deque[tuple[int, float]] = deque()  # (frames, time) of recent reports

    def __call__(self, frames: int, last: tuple[int, int, float],
                 mean_20_all_ranks: float) -> tuple[int, int, float]:
        """Write the report at ``frames``; the new (frames, updates, time) mark."""
        logger, learner = self.logger, self.learner
        now = time.monotonic()
        span = max(now - last[2], 1e-9)
        known = self.feed.throughput(span)
        scalars, headline = self.feed.report(span)
        logger.add_many(scalars)
        figures, diagnosis = self.meter.measure(span, logger, known, learner.updates - last[1])
        logger.add_many(figures.as_scalars())
        logger.add_many(diagnosis.scalars())
        fps = (frames - last[0]) / span  # all ranks
        if self._start is None:
            self._start = (last[0], last[2])
            self._marks.append(self._start)
        self._marks.append((frames, now))
        # the base: the newest mark at least FPS_WINDOW_S old, or the process's start
        while len(self._marks) > 2 and now - self._marks[1][1] >= FPS_WINDOW_S:
            self._marks.popleft()
        base = self._marks[0]
        window_fps = (frames - base[0]) / max(now - base[1], 1e-9)
        # the ETA takes the speed since this process started
        average_fps = (frames - self._start[0]) / max(now - self._start[1], 1e-9)
        shown, recent = self.meter.recent()  # the last few reports: steadier
        line = {
            "perf/fps": fps,
            "perf/updates_per_s": (learner.updates - last[1]) / span,  # per rank
            "learner/updates": learner.updates,
            **headline,
            "episode/mean_return_20": logger.mean_recent_return(20),
            **({"episode/mean_return_20_all_ranks": mean_20_all_ranks} if self.ranks else {}),
        }
        logger.write(frames, line)
        self.display.show(ProgressReport(
            frames, self.total_frames, window_fps, recent.figures["cpu_busy"], figures.cores,
            figures.learner_rss + figures.actors_rss,
            {"env": shown.env_s, "forward": shown.forward_s, "learn": shown.step_s,
             "copy": shown.actor_copy_s + shown.learner_copy_s},
            recent.short, {k: v for k, v in line.items() if k != "perf/fps"}, average_fps))
        return frames, learner.updates, now
