"""A clock a test moves, for counters of seconds waited or spent.

``install(monkeypatch, module, ...)`` gives each module a ``time`` whose ``perf_counter``
reads the fake clock (every other attribute is the real ``time`` module's), so a test can
say "this took 100 s" and assert where those seconds were counted, with no dependence on
the machine's speed or load. The clock either stands still between the test's
``advance`` calls, or (``on_real_clock=True``, for code that also waits on deadlines
read from it) runs with the real clock plus everything advanced.
"""

from __future__ import annotations

import threading
import time
from types import ModuleType
from typing import Any


class FakeClock:
    def __init__(self, start: float = 0.0, on_real_clock: bool = False) -> None:
        self.now = start
        self.on_real_clock = on_real_clock
        self.read = threading.Event()  # set once code under test has read the clock
        self._lock = threading.Lock()

    def perf_counter(self) -> float:
        self.read.set()
        with self._lock:
            return self.now + (time.perf_counter() if self.on_real_clock else 0.0)

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds


class _TimeWith:
    """The ``time`` module with ``perf_counter`` replaced."""

    def __init__(self, clock: FakeClock) -> None:
        self.perf_counter = clock.perf_counter

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def install(monkeypatch: Any, *modules: ModuleType, start: float = 0.0,
            on_real_clock: bool = False) -> FakeClock:
    clock = FakeClock(start, on_real_clock)
    for module in modules:
        monkeypatch.setattr(module, "time", _TimeWith(clock))
    return clock
