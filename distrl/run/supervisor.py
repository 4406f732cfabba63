"""The child processes of a run (actors, SEED env workers): how they stop, and one
supervisor that starts them, restarts one, and ends them all with the run.

The learner process decides when a run stops. A Ctrl-C, a scheduler's SIGTERM or Slurm's
warning signal (SIGUSR1, ``--signal=USR1@120``) may reach every process of the job; a
child that died of it would take its envs or slots away from a learner that is still
finishing its update and checkpointing. So children ignore these signals
(:data:`STOP_SIGNALS`) and end when told, when their parent is gone, or by SIGKILL at
shutdown.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

# The signals that stop a run after its checkpoint: Ctrl-C, a scheduler's or torchrun's
# SIGTERM, and SIGUSR1, which Slurm sends ahead of a time limit or a preemption.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def ignore_stop_signals() -> None:
    """Ignore :data:`STOP_SIGNALS` in this (child) process."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def stop_requested(stop: Any, parent_pid: int) -> Callable[[], bool]:
    """``() -> bool``: the run set ``stop`` (a multiprocessing Event), or the parent that
    started this process is gone (it was re-parented)."""
    return lambda: stop.is_set() or os.getppid() != parent_pid


class TooManyRestarts(RuntimeError):
    """Children failed more often than the run allows; the message names the setting."""


class ChildProcesses:
    """``count`` spawned processes that end with the run, also when it fails, and are
    restarted when one dies or hangs.

    Process ``i`` runs ``target(*args_for(i), stop_event, parent_pid)``; ``args_for`` is
    called at each (re)start, so a restarted child can get new arguments (a new seed).
    ``target`` and the arguments must be picklable. :meth:`restart` is the one restart
    policy of a run's children (actors and SEED env workers alike): it counts, names the
    cause, and past ``max_restarts`` raises :class:`TooManyRestarts` instead of starting
    a child again. Use as a context manager: leaving it sets the stop event, gives every
    child 10 s to end and kills the rest.

    Args:
        label: what a child is called in messages ("actor", "env worker").
        max_restarts, limit_setting: the most restarts of the run, and the setting it
            comes from (named when the run ends for it).
        before_restart: called with the index once the failed child is gone and before its
            successor starts (hand back what it held).
        after_start: called with the index right after a child started (the parent closes
            its copy of the child's pipe ends).
    """

    def __init__(self, ctx: Any, count: int, name: str, target: Callable[..., None],
                 args_for: Callable[[int], tuple[Any, ...]], label: str = "child",
                 max_restarts: int = 0, limit_setting: str = "distributed.max_actor_restarts",
                 before_restart: Callable[[int], None] | None = None,
                 after_start: Callable[[int], None] | None = None):
        self.ctx, self.name, self.target, self.args_for = ctx, name, target, args_for
        self.label, self.max_restarts, self.limit_setting = label, max_restarts, limit_setting
        self.before_restart, self.after_start = before_restart, after_start
        self.stop_event = ctx.Event()
        self.processes: list[Any] = [None] * count
        self.started_at = [0.0] * count  # time.monotonic() of each child's latest start
        self.restarts = 0

    def start(self, index: int) -> None:
        """Start child ``index`` (again)."""
        process = self.ctx.Process(target=self.target, name=f"{self.name}-{index}", daemon=True,
                                   args=(*self.args_for(index), self.stop_event, os.getpid()))
        self.started_at[index] = time.monotonic()
        process.start()
        self.processes[index] = process
        if self.after_start is not None:
            self.after_start(index)

    def __enter__(self) -> ChildProcesses:
        for index in range(len(self.processes)):
            self.start(index)
        return self

    def dead(self) -> list[int]:
        """Children whose process has exited."""
        return [i for i, p in enumerate(self.processes) if p is not None and not p.is_alive()]

    def exitcode(self, index: int) -> int | None:
        return self.processes[index].exitcode

    def exit_cause(self, index: int) -> str:
        """How child ``index`` ended, for messages: "exited with code 1", "was killed by
        SIGKILL"."""
        code = self.exitcode(index)
        if code is not None and code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                pass
        return f"exited with code {code}"

    def restart(self, index: int, cause: str) -> None:
        """Replace child ``index``, which ``cause`` ("exited with code 1", "was silent for
        60 s"): kill it if it still runs, run ``before_restart``, start its successor.
        Raises :class:`TooManyRestarts` (and starts nothing) past ``max_restarts``."""
        if self.restarts + 1 > self.max_restarts:
            raise TooManyRestarts(
                f"{self.label} {index} {cause}: {self.label}s would be restarted "
                f"{self.restarts + 1} times, more than {self.limit_setting}={self.max_restarts}")
        self.restarts += 1  # restarts done (the refused one above is not counted)
        print(f"[distrl] {self.label} {index} {cause}: restarting it, its partial experience "
              f"dropped ({self.restarts} restarts so far, at most {self.max_restarts})",
              flush=True)
        self.kill(index)
        if self.before_restart is not None:
            self.before_restart(index)
        self.start(index)

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
