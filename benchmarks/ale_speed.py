"""ale-py's own speed on this machine: frames/s of its vector env alone, random actions.

An Atari run's frames/s says as much about the machine as about the agent, and a long run
moves between machines. ``fps.py`` sets its agent's figure beside ale-py's on the same
machine in the same run; ``reproduce.py`` measures ale-py alone on each game before it
starts a grid's runs and keeps the figure, with the machine's name, in each attempt's
record, so a results table can say how fast the emulator itself was where each run ran.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np


def machine_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name and core count, e.g. ``AMD EPYC, 2 cores``."""
    model = ""
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    model = model or platform.processor() or platform.machine() or "unknown CPU"
    return f"{model}, {os.cpu_count() or 1} cores"


def ale_random_fps(
    game: str, num_envs: int, threads: int, frame_skip: int, seconds: float = 10.0
) -> float:
    """Frames/s of ale-py's AtariVectorEnv alone (``game`` a ROM id), random actions,
    DeepMind preprocessing."""
    from ale_py.vector_env import AtariVectorEnv

    env = AtariVectorEnv(game, num_envs, num_threads=threads, frameskip=frame_skip,
                         reward_clipping=False, autoreset_mode="SameStep")
    rng = np.random.default_rng(0)
    n_actions = env.single_action_space.n
    env.reset(seed=0)
    for _ in range(20):
        env.step(rng.integers(0, n_actions, num_envs, dtype=np.int32))
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(rng.integers(0, n_actions, num_envs, dtype=np.int32))
        steps += num_envs
    elapsed = time.perf_counter() - start
    env.close()
    return steps * frame_skip / elapsed


# Cores that other processes kept busy while ale-py was timed, above which its figure is
# not "alone": a grid started beside another run (or a second grid timing at once).
BUSY_ELSEWHERE_LIMIT = 0.25


def busy_seconds() -> tuple[float, float]:
    """CPU seconds spent so far by the whole machine (every core, all but idle and I/O
    wait) and by this process (its threads: ale-py's vector env steps in them)."""
    import psutil

    machine = psutil.cpu_times()
    idle = machine.idle + getattr(machine, "iowait", 0.0)
    own = psutil.Process().cpu_times()
    return sum(machine) - idle, own.user + own.system


def ale_alone(games: list[str], seconds: float) -> dict[str, Any]:
    """ale-py alone on each of ``games`` (ALE names, e.g. ``Pong``) for ``seconds`` each,
    as many envs as sizing gives one actor on 2 cores (two groups), on every core, with
    the env's default frame skip: the record ``reproduce.py`` keeps with each attempt,
    with ``busy_elsewhere``, the cores other processes kept busy meanwhile (a figure
    above :data:`BUSY_ELSEWHERE_LIMIT` was not timed alone)."""
    from distrl.config import EnvConfig
    from distrl.envs import atari_rom
    from distrl.training.sizing import ATARI_ENVS_PER_GROUP

    envs, threads, frame_skip = 2 * ATARI_ENVS_PER_GROUP, os.cpu_count() or 1, \
        EnvConfig().frame_skip
    roms = {game: atari_rom(game) for game in games}
    for game, rom in roms.items():
        if rom is None:
            raise ValueError(f"{game!r} names no ALE ROM")
    figures = {}
    (machine_before, own_before), start = busy_seconds(), time.monotonic()
    for game, rom in roms.items():
        figures[game] = round(ale_random_fps(str(rom), envs, threads, frame_skip, seconds), 1)
    (machine_after, own_after), elapsed = busy_seconds(), time.monotonic() - start
    elsewhere = ((machine_after - machine_before) - (own_after - own_before)) / max(elapsed,
                                                                                    1e-9)
    return {"machine": machine_name(), "measured": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "envs": envs, "threads": threads, "seconds": seconds, "frames_per_s": figures,
            "busy_elsewhere": round(max(elsewhere, 0.0), 2)}
