"""Actor processes: each builds its actor (with its own policy copy and envs) and steps
it until the run ends; counters and failures come back to the learner through a queue."""

from __future__ import annotations

import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from distrl.actor import Actor, ActorStats, ActorStopped
from distrl.run_settings import seed_everything
from distrl.supervisor import ChildProcesses, ignore_stop_signals, stop_requested

BuildActor = Callable[[int, ActorStats, Callable[[], bool]], Actor]  # (id, stats, stop) -> Actor


def _actor_process(
    actor_id: int, build: BuildActor, threads: int, seed: int, stats_queue: Any, stop: Any,
    parent_pid: int,
) -> None:
    """Entry point of one actor process: act until told to stop or the parent is gone."""
    ignore_stop_signals()
    torch.set_num_threads(threads)
    actor = None
    try:  # everything that can fail reports its traceback to the learner
        seed_everything(seed * 1_000_003 + actor_id + 1)
        stats = ActorStats()
        should_stop = stop_requested(stop, parent_pid)
        actor = build(actor_id, stats, should_stop)
        last_report = time.monotonic()
        while not should_stop():
            actor.step()
            if time.monotonic() - last_report > 1.0:
                stats_queue.put(("stats", actor_id, stats.drain()))
                last_report = time.monotonic()
    except ActorStopped:
        pass
    except BaseException:
        stats_queue.put(("error", actor_id, traceback.format_exc()))
        raise SystemExit(1) from None
    finally:
        if actor is not None:
            actor.close()


class ActorProcesses:
    """Spawned actor processes that end with the run, also when it fails.

    Each runs ``build(actor_id, stats, should_stop)`` (picklable: a module-level function
    or a ``functools.partial`` of one) and steps the actor it returns; counters come back
    once a second through a queue, and an actor's exception comes back as its traceback.
    Use as a context manager: leaving it stops, joins and, if needed, kills them all
    (:class:`distrl.supervisor.ChildProcesses`).
    """

    def __init__(self, ctx: Any, count: int, build: BuildActor, threads: int, seed: int):
        self.stats_queue = ctx.Queue()
        self.children = ChildProcesses(
            ctx, count, "distrl-actor", _actor_process,
            lambda actor_id: (actor_id, build, threads, seed, self.stats_queue))

    def __enter__(self) -> ActorProcesses:
        self.children.__enter__()
        return self

    def drain(self) -> list[tuple[int, ActorStats]]:
        """The counters reported since the last call; raises if an actor failed."""
        drained = []
        while True:
            try:
                kind, actor_id, payload = self.stats_queue.get_nowait()
            except queue.Empty:
                return drained
            if kind == "error":
                raise RuntimeError(f"actor {actor_id} failed:\n{payload}")
            drained.append((actor_id, payload))

    def check_alive(self) -> None:
        """Raise if an actor process has exited (after reporting its error, if any)."""
        dead = self.children.dead()
        if dead:
            self.drain()
            raise RuntimeError(f"actor processes exited unexpectedly: "
                               f"{self.children.names(dead)}")

    def __exit__(self, *exc: Any) -> None:
        self.children.__exit__(*exc)
