"""CPU seconds and memory of the learner process and of its child processes (actor
processes, SEED's env workers), sampled with psutil, and the cores this process may use.

The throughput diagnosis (:mod:`distrl.telemetry.throughput`) compares the cores both sides keep
busy with the machine's: a run whose sides both compute while the cores are all busy is
CPU-bound, and moving work between the sides will not make it faster.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask, which a container or ``taskset``
    may narrow below ``os.cpu_count()``)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@dataclass(frozen=True)
class Usage:
    """What the processes used between two samples."""

    learner_cpu_s: float  # CPU seconds (user + system, every thread) of the learner process
    children_cpu_s: float  # the same, summed over its child processes (recursively)
    learner_rss: float  # resident bytes of the learner process now
    # resident bytes of the children now, summed; shared memory (slots, weights) that
    # several processes touch counts once per process, so this overstates their sum
    children_rss: float
    # CPU seconds the usable cores were busy, whoever used them (other jobs on the machine
    # included; time a hypervisor took from the core counts as busy too)
    machine_cpu_s: float = 0.0


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def _machine_busy_seconds() -> float:
    """Busy CPU seconds since boot, summed over the cores this process may use."""
    per_cpu = psutil.cpu_times(percpu=True)
    usable = (os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity")
              else range(len(per_cpu)))
    busy = 0.0
    for index in usable:
        if index < len(per_cpu):
            times = per_cpu[index]
            busy += sum(getattr(times, name, 0.0) for name in
                        ("user", "nice", "system", "irq", "softirq", "steal"))
    return busy


class ProcessUsage:
    """Samples the CPU time and memory of a process and its children since the last sample.

    A child's CPU time is followed by pid; one that started since the last sample counts
    in full, one that ended since loses what it used after that sample (its exit status is
    its parent's to reap, so psutil cannot read its final times).
    """

    def __init__(self, pid: int | None = None):
        self.process = psutil.Process(pid if pid is not None else os.getpid())
        self._own = _cpu_seconds(self.process)
        self._machine = _machine_busy_seconds()
        self._children: dict[int, float] = {}
        for child, seconds, _ in self._read_children():
            self._children[child] = seconds

    def _read_children(self) -> list[tuple[int, float, float]]:
        """(pid, CPU seconds, resident bytes) of each live child."""
        out = []
        for child in self.process.children(recursive=True):
            try:
                with child.oneshot():
                    out.append((child.pid, _cpu_seconds(child), float(child.memory_info().rss)))
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue  # ended between the listing and the read
        return out

    def sample(self) -> Usage:
        """CPU seconds used since the previous sample (or construction), and memory now."""
        own = _cpu_seconds(self.process)
        learner_cpu, self._own = own - self._own, own
        children_cpu, children_rss, seen = 0.0, 0.0, {}
        for pid, seconds, rss in self._read_children():
            children_cpu += max(seconds - self._children.get(pid, 0.0), 0.0)
            children_rss += rss
            seen[pid] = seconds
        self._children = seen
        machine = _machine_busy_seconds()
        machine_cpu, self._machine = machine - self._machine, machine
        return Usage(learner_cpu, children_cpu, float(self.process.memory_info().rss),
                     children_rss, machine_cpu)
