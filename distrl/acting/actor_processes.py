"""Actor processes under supervision: each builds its actor (with its own policy copy and
envs) and steps it until the run ends. A supervisor thread in the learner process
notices an actor that died or went silent within about a second, whatever the learner
is doing, hands back the slot it was writing (never committed, so the learner never
sees half an unroll or batch), and restarts it with fresh env seeds and the same
actor id, hence the same epsilons. Counters come back through one pipe per actor, never
a shared queue: an actor killed while writing could otherwise jam every other actor's
reports.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from distrl.acting.actor import Actor, ActorStats, ActorStopped
from distrl.run.run_settings import seed_everything
from distrl.run.supervisor import ChildProcesses, ignore_stop_signals, stop_requested
from distrl.transport.queues import SlotPool

# (id, stats, stop, generation) -> Actor; generation > 0: a restarted actor seeds its envs anew
BuildActor = Callable[[int, ActorStats, Callable[[], bool], int], Actor]


def _actor_process(
    actor_id: int, generation: int, build: BuildActor, threads: int, seed: int, reports: Any,
    heartbeat: torch.Tensor, stop: Any, parent_pid: int,
) -> None:
    """Entry point of one actor process: act until told to stop or the parent is gone;
    every call of its stop check marks it alive in ``heartbeat``."""
    ignore_stop_signals()
    torch.set_num_threads(threads)
    actor = None
    stopped = stop_requested(stop, parent_pid)

    def should_stop() -> bool:
        heartbeat[actor_id] = time.monotonic()
        return stopped()

    try:  # a failure prints its traceback and exits 1: the supervisor restarts the actor
        seed_everything(seed * 1_000_003 + actor_id + 1 + 7_919 * generation)
        stats = ActorStats()
        actor = build(actor_id, stats, should_stop, generation)
        last_report = time.monotonic()
        while not should_stop():
            actor.step()
            if time.monotonic() - last_report > 1.0:
                reports.send(stats.drain())
                last_report = time.monotonic()
    except ActorStopped:
        pass
    except BrokenPipeError:
        # The learner closed its end of the report pipe: the run is over, not a failure
        # to print and restart (seen at the end of runs with 8 actors).
        pass
    except BaseException:
        traceback.print_exc()
        raise SystemExit(1) from None
    finally:
        if actor is not None:
            actor.close()


class ActorProcesses:
    """Spawned, supervised actor processes that end with the run, also when it fails.

    Each runs ``build(actor_id, stats, should_stop, generation)`` (picklable: a
    module-level function or a ``functools.partial`` of one) and steps the actor it
    returns. An actor that exits, or does not call its stop check for ``timeout_s``
    (``start_timeout_s`` after a start), is restarted with the next generation; its
    half-written slot in ``pool`` is reclaimed. More than ``max_restarts`` restarts end
    the run: :meth:`check` (called by :meth:`drain`) raises
    :class:`~distrl.run.supervisor.TooManyRestarts` in the learner thread.
    Use as a context manager (:class:`distrl.run.supervisor.ChildProcesses`).
    """

    def __init__(self, ctx: Any, count: int, build: BuildActor, threads: int, seed: int,
                 pool: SlotPool, max_restarts: int, timeout_s: float, start_timeout_s: float,
                 check_interval_s: float = 0.5):
        self.ctx, self.pool = ctx, pool
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self.check_interval_s = check_interval_s
        self.generations = [0] * count
        self.heartbeat = torch.zeros(count, dtype=torch.float64).share_memory_()
        self.readers: list[Any] = [None] * count
        self._pending: list[tuple[int, ActorStats]] = []  # read from actors that died
        self._writers: list[Any] = [None] * count
        self.dropped = 0  # half-written unrolls or batches of dead actors, this run
        self.error: BaseException | None = None
        self._lock = threading.Lock()  # the supervisor thread and the learner's drain
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._supervise, name="distrl-actor-supervisor",
                                        daemon=True)
        self.children = ChildProcesses(
            ctx, count, "distrl-actor", _actor_process,
            lambda i: (i, self.generations[i], build, threads, seed, self._new_pipe(i),
                       self.heartbeat),
            label="actor", max_restarts=max_restarts,
            limit_setting="distributed.max_actor_restarts",
            before_restart=self._hand_back, after_start=self._close_writer)

    def _new_pipe(self, actor_id: int) -> Any:
        self.readers[actor_id], self._writers[actor_id] = self.ctx.Pipe(duplex=False)
        return self._writers[actor_id]

    def _close_writer(self, actor_id: int) -> None:
        # Only the child may hold the write end: its death then reads as end-of-file.
        self._writers[actor_id].close()

    def _hand_back(self, actor_id: int) -> None:
        """The dead actor's last counters, its half-written slot, and a new generation."""
        self._pending += [(actor_id, stats) for stats in self._read(actor_id)]
        self.readers[actor_id].close()
        self.dropped += self.pool.reclaim(actor_id)
        self.generations[actor_id] += 1

    def __enter__(self) -> ActorProcesses:
        self.children.__enter__()
        self._thread.start()
        return self

    def failures(self) -> list[tuple[int, str]]:
        """(actor id, cause) of each actor that exited or went silent."""
        now = time.monotonic()
        dead = set(self.children.dead())
        failed = []
        for actor_id, started in enumerate(self.children.started_at):
            if actor_id in dead:
                failed.append((actor_id, self.children.exit_cause(actor_id)))
                continue
            beat = float(self.heartbeat[actor_id])
            limit = self.timeout_s if beat >= started else self.start_timeout_s
            if now - max(beat, started) > limit:
                failed.append((actor_id, f"was silent for more than {limit:g} s"))
        return failed

    def _supervise(self) -> None:
        try:
            while not self._stop.wait(self.check_interval_s):
                for actor_id, cause in self.failures():
                    with self._lock:
                        self.children.restart(actor_id, cause)
        except BaseException as error:  # noqa: BLE001 - handed to the learner thread
            self.error = error

    def check(self) -> None:
        """Re-raise, in the learner thread, why supervision ended the run."""
        if self.error is not None:
            raise self.error

    def _read(self, actor_id: int) -> list[ActorStats]:
        got = []
        reader = self.readers[actor_id]
        try:
            while reader.poll():
                got.append(reader.recv())
        except (EOFError, OSError):  # the actor is gone; a torn last report is dropped
            pass
        return got

    def drain(self) -> list[tuple[int, ActorStats]]:
        """The counters reported since the last call; raises if supervision ended the run."""
        self.check()
        with self._lock:
            drained, self._pending = self._pending, []
            return drained + [(actor_id, stats) for actor_id in range(len(self.readers))
                              for stats in self._read(actor_id)]

    def log(self, logger: Any) -> None:
        """``workers/restarts`` and ``workers/dropped_unrolls`` so far in this run."""
        logger.add("workers/restarts", self.children.restarts)
        logger.add("workers/dropped_unrolls", self.dropped)

    def summary(self) -> dict[str, Any]:
        return {"actor_restarts": self.children.restarts, "dropped_unrolls": self.dropped}

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.children.__exit__(*exc)
        for reader in self.readers:
            if reader is not None:
                reader.close()


def restart_seed(seed: int, generation: int) -> int:
    """The seed a restarted actor (``generation`` > 0) derives its env seeds from: other
    episodes than its predecessors', and than another rank's actors (``seed + 7_919 k``)."""
    return seed + 104_729 * generation


def supervised_actors(ctx: Any, settings: Any, build: BuildActor, pool: SlotPool
                      ) -> ActorProcesses:
    """``distributed.actors`` actor processes writing into ``pool``, supervised with the
    run's ``distributed`` restart settings."""
    dist = settings.distributed
    return ActorProcesses(ctx, dist.actors, build, dist.actor_threads, settings.seed, pool,
                          dist.max_actor_restarts, dist.actor_timeout_s, dist.start_timeout_s)
