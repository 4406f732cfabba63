"""benchmarks/ale_speed.py: ale-py's own frames/s and the machine's name, as reproduce.py
keeps them with each attempt of an Atari run."""

from __future__ import annotations

import sys
from collections import namedtuple
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import ale_speed  # noqa: E402


def test_machine_name_is_the_cpus_model_and_core_count(tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\n"
                       "model name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx2\n")
    monkeypatch.setattr(ale_speed.os, "cpu_count", lambda: 2)
    assert ale_speed.machine_name(cpuinfo) == "AMD EPYC 7B13, 2 cores"


def test_frames_per_s_counts_every_env_step_times_the_frame_skip(monkeypatch):
    """Each step of the vector env moves num_envs envs by frame_skip frames: 3 steps of
    4 envs in a timed window of 2 s (a fake clock) are 3 * 4 * 4 / 2 = 24 frames/s."""
    ticks = iter([0.0, 0.5, 1.0, 1.5, 2.0, 2.0])  # start, 3 loop checks, the stop, elapsed
    made, actions = [], []

    class FakeVectorEnv:
        def __init__(self, game, num_envs, **kwargs):
            made.append((game, num_envs, kwargs))
            self.single_action_space = type("Space", (), {"n": 6})()

        def reset(self, seed):
            pass

        def step(self, chosen):
            assert len(chosen) == 4
            actions.extend(chosen.tolist())

        def close(self):
            pass

    import ale_py.vector_env

    monkeypatch.setattr(ale_py.vector_env, "AtariVectorEnv", FakeVectorEnv)
    monkeypatch.setattr(ale_speed.time, "perf_counter", lambda: next(ticks))
    assert ale_speed.ale_random_fps("pong", 4, threads=2, frame_skip=4, seconds=2.0) == 24.0
    # the game, its envs and threads, the emulator's own frame skip, raw rewards
    assert made == [("pong", 4, {"num_threads": 2, "frameskip": 4, "reward_clipping": False,
                                 "autoreset_mode": "SameStep"})]
    assert len(actions) == (20 + 3) * 4  # 20 untimed warm-up steps, then the 3 timed
    assert set(actions) <= set(range(6)) and len(set(actions)) > 1  # random, in range


def test_ale_alone_times_each_game_as_a_run_steps_it_and_refuses_a_name_that_is_no_rom(
        monkeypatch):
    """Each game by its ROM id, as many envs as one 2-core actor steps, every core, the
    presets' frame skip; the machine named beside the figures."""
    calls = []

    def timed(rom, envs, threads, frame_skip, seconds):
        calls.append((rom, envs, threads, frame_skip, seconds))
        return 1234.56

    monkeypatch.setattr(ale_speed, "ale_random_fps", timed)
    monkeypatch.setattr(ale_speed.os, "cpu_count", lambda: 16)
    figures = ale_speed.ale_alone(["Pong", "NameThisGame"], 5.0)
    assert calls == [("pong", 64, 16, 4, 5.0), ("name_this_game", 64, 16, 4, 5.0)]
    assert figures["frames_per_s"] == {"Pong": 1234.6, "NameThisGame": 1234.6}
    assert (figures["envs"], figures["threads"], figures["seconds"]) == (64, 16, 5.0)
    assert figures["machine"] == ale_speed.machine_name()
    with pytest.raises(ValueError, match="'NoSuchGame' names no ALE ROM"):
        ale_speed.ale_alone(["NoSuchGame"], 5.0)
    assert calls[2:] == []  # refused before any game is timed


def test_ale_alone_says_how_many_cores_other_processes_kept_busy_meanwhile(monkeypatch):
    """Over 10 s of timing the machine spent 30 CPU seconds, this process 20 of them (its
    ale-py threads): other processes kept 1.0 core busy."""
    busy = iter([(100.0, 10.0), (130.0, 30.0)])
    ticks = iter([50.0, 60.0])
    monkeypatch.setattr(ale_speed, "busy_seconds", lambda: next(busy))
    monkeypatch.setattr(ale_speed.time, "monotonic", lambda: next(ticks))
    monkeypatch.setattr(ale_speed, "ale_random_fps", lambda *args: 1000.0)
    assert ale_speed.ale_alone(["Pong"], 5.0)["busy_elsewhere"] == 1.0


def test_busy_seconds_counts_every_state_of_the_machine_but_idle_and_io_wait(monkeypatch):
    """The machine: 10 + 1 + 2 busy of 68 s; this process: its own user and system time,
    not its children's (ale-py steps in threads)."""
    import psutil

    machine = namedtuple("scputimes", "user nice system idle iowait")(10.0, 1.0, 2.0, 50.0, 5.0)
    own = SimpleNamespace(user=3.0, system=1.0, children_user=9.0)  # children: not ale-py's
    monkeypatch.setattr(psutil, "cpu_times", lambda: machine)
    monkeypatch.setattr(psutil, "Process", lambda: SimpleNamespace(cpu_times=lambda: own))
    assert ale_speed.busy_seconds() == (13.0, 4.0)


def test_ale_py_itself_steps_and_is_timed():
    """The real vector env (two envs, a fifth of a second): what fps.py sets beside an
    agent's frames/s."""
    assert ale_speed.ale_random_fps("pong", 2, threads=1, frame_skip=4, seconds=0.2) > 0
