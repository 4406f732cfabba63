"""The child processes of a run (actors, SEED env workers): how they stop, and one
supervisor that starts them, restarts one, and ends them all with the run.

The learner process decides when a run stops. A Ctrl-C or a scheduler's SIGTERM goes to
the whole process group; a child that died of it would take its envs or slots away from
a learner that is still finishing its update and checkpointing. So children ignore both
signals and end when told, when their parent is gone, or by SIGKILL at shutdown.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any


def ignore_stop_signals() -> None:
    """Ignore SIGINT and SIGTERM in this (child) process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def stop_requested(stop: Any, parent_pid: int) -> Callable[[], bool]:
    """``() -> bool``: the run set ``stop`` (a multiprocessing Event), or the parent that
    started this process is gone (it was re-parented)."""
    return lambda: stop.is_set() or os.getppid() != parent_pid


class ChildProcesses:
    """``count`` spawned processes that end with the run, also when it fails.

    Process ``i`` runs ``target(*args_for(i), stop_event, parent_pid)``; ``args_for`` is
    called at each (re)start, so a restarted child can get new arguments (a new seed).
    ``target`` and the arguments must be picklable. Use as a context manager: leaving it
    sets the stop event, gives every child 10 s to end and kills the rest.
    """

    def __init__(self, ctx: Any, count: int, name: str, target: Callable[..., None],
                 args_for: Callable[[int], tuple[Any, ...]]):
        self.ctx, self.name, self.target, self.args_for = ctx, name, target, args_for
        self.stop_event = ctx.Event()
        self.processes: list[Any] = [None] * count

    def start(self, index: int) -> None:
        """Start child ``index`` (again)."""
        process = self.ctx.Process(target=self.target, name=f"{self.name}-{index}", daemon=True,
                                   args=(*self.args_for(index), self.stop_event, os.getpid()))
        process.start()
        self.processes[index] = process

    def __enter__(self) -> ChildProcesses:
        for index in range(len(self.processes)):
            self.start(index)
        return self

    def dead(self) -> list[int]:
        """Children whose process has exited."""
        return [i for i, p in enumerate(self.processes) if p is not None and not p.is_alive()]

    def exitcode(self, index: int) -> int | None:
        return self.processes[index].exitcode

    def kill(self, index: int) -> None:
        """Kill child ``index`` if it still runs and wait for it (before a restart)."""
        process = self.processes[index]
        if process.is_alive():
            process.kill()
        process.join(timeout=10)

    def names(self, indices: list[int]) -> list[str]:
        return [self.processes[i].name for i in indices]

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def __exit__(self, *exc: Any) -> None:
        self.stop_event.set()
        for p in self.processes:
            if p is not None and p.pid is not None:
                p.join(timeout=10)
        for p in self.processes:
            if p is not None and p.is_alive():
                p.kill()
                p.join(timeout=5)
