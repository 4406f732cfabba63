"""A CPU learner's no-grad forward passes, run in a worker thread beside its main work.

A CPU learner runs one intra-op thread: on MinAtar-sized networks a second one made R2D2's
and Ape-X's runs slower, because the actors need that core too and small ops gain less
from it than its synchronisation costs (docs/notes/2026-11-26.md). Yet the actors of a
learner-bound run leave part of the second core idle. The target network's forward pass
(Ape-X's ``q_target(s_{t+n})``, R2D2's unroll over the whole sequence) does not depend on
the online network's, so the learner step (:class:`distrl.training.learner.Learner`, with
``target_beside``) runs a loss's target pass (``TargetPassLoss.target_pass``) through a
:class:`SideThread`: one worker thread, while the learner's own thread computes the online
pass; ATen releases the GIL inside each op, so the
two use two cores. Each op runs with the same single-thread kernels in either thread, so
the numbers are bit for bit those of running the two passes one after the other.

It is for a one-thread CPU learner only. On a GPU the kernels queue on one stream anyway,
and a learner given several intra-op threads (Atari's convolutions) already spreads each op
over the cores, where a second caller's ops would only contend for them; in both cases the
pass runs at once in the caller's thread.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import torch

T = TypeVar("T")


def computed_now(fn: Callable[[], T], device: torch.device) -> Future[T]:
    """``fn()`` computed at once in this thread, as :meth:`SideThread.submit` would."""
    return SideThread("", enabled=False).submit(fn, device)


class SideThread:
    """Runs no-grad computations in one worker thread (started at the first use).

    Args:
        name: the worker thread's name prefix (seen in profilers and thread dumps).
        enabled: False runs every computation at once in the caller's thread.
    """

    def __init__(self, name: str, enabled: bool = True) -> None:
        self.name = name
        self.enabled = enabled
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, fn: Callable[[], T], device: torch.device) -> Future[T]:
        """``fn()`` under ``torch.no_grad()`` and the caller's CPU autocast, pending: in the
        worker thread when enabled, ``device`` is the CPU and torch runs one intra-op thread
        (where ``result()`` re-raises its error), else computed now (where the error is
        raised at once)."""
        # Grad and autocast modes are per thread: the caller's are set where fn runs.
        autocast = torch.is_autocast_enabled("cpu")
        autocast_dtype = torch.get_autocast_dtype("cpu")

        def no_grad_fn() -> T:
            with torch.no_grad(), torch.autocast("cpu", dtype=autocast_dtype,
                                                 enabled=autocast):
                return fn()
        if not self.enabled or device.type != "cpu" or torch.get_num_threads() != 1:
            done: Future[T] = Future()
            done.set_result(no_grad_fn())
            return done
        if self._pool is None:
            # torch's thread count reaches MKL per thread: unset, the worker's matmuls would
            # run on every core (and sum in another order than the caller's).
            self._pool = ThreadPoolExecutor(1, thread_name_prefix=self.name,
                                            initializer=torch.set_num_threads, initargs=(1,))
        return self._pool.submit(no_grad_fn)
