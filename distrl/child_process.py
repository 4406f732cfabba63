"""What every child process of a run (actor, env worker) does about stopping.

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
