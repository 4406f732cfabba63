"""Compose ``python run.py +experiment=<name>`` as a typed config that writes under a tmp dir,
or run ``python run.py`` itself in a subprocess as a user would."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import agents
from distrl.config import register_configs

REPO = Path(__file__).resolve().parents[1]


def compose_preset(tmp_path: Path, experiment: str, name: str, *overrides: str) -> Any:
    """The typed RunConfig of ``+experiment=<experiment>`` plus ``overrides``; logs and
    checkpoints go to ``tmp_path/name``, without tensorboard or timed checkpoints."""
    return compose_run(tmp_path, name, f"+experiment={experiment}", *overrides)


def compose_run(tmp_path: Path, name: str, *overrides: str) -> Any:
    """The typed RunConfig of ``python run.py <overrides>``, written under ``tmp_path/name``
    as in :func:`compose_preset`."""
    register_configs()
    agents.register_configs()
    with initialize_config_dir(str(REPO / "experiments"), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    cfg = OmegaConf.to_object(cfg)
    cfg.log.dir, cfg.log.name, cfg.log.tensorboard = str(tmp_path), name, False
    cfg.log.interval_s = 30.0
    cfg.checkpoint.interval_s = 3600.0
    return cfg


def run_py_env(tests_on_path: bool = False, **extra: str) -> dict[str, str]:
    """The environment for a ``run.py`` subprocess: without HYDRA_FULL_ERROR (so errors are the
    one line a user sees), with ``tests/`` importable for the test envs when asked."""
    environment = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    if tests_on_path:
        environment["PYTHONPATH"] = f"{REPO / 'tests'}{os.pathsep}{REPO}"
    return {**environment, **extra}


def run_py_command(tmp_path: Path, *overrides: str, hydra_dir: str = "hydra") -> list[str]:
    """``python run.py <overrides>`` with Hydra's own output under ``tmp_path/hydra_dir``."""
    return [sys.executable, str(REPO / "run.py"), *overrides,
            f"hydra.run.dir={tmp_path / hydra_dir}"]


def run_py(tmp_path: Path, *overrides: str, timeout: float = 180,
           tests_on_path: bool = False) -> subprocess.CompletedProcess[str]:
    """Run ``python run.py <overrides>`` to its end (see :func:`run_py_command`)."""
    return subprocess.run(run_py_command(tmp_path, *overrides), cwd=REPO,
                          env=run_py_env(tests_on_path), capture_output=True, text=True,
                          timeout=timeout)


def run_group(command: list[str], timeout: float, **kwargs: Any
              ) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` for a command that starts processes of its own (torchrun and its
    ranks): it runs in a new process group, and the whole group is killed if the call ends
    any other way than by the command's exit (its timeout, the test's time limit)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


class Training:
    """A command that trains (``run.py``, torchrun, a launcher script), started in a session
    of its own with stdout and stderr read together by a thread, for tests that act on it
    mid-run: ``wait_until`` it trains, then signal or kill it, then ``finish``. Leaving the
    ``with`` block SIGKILLs whatever is left of it (:meth:`kill`), so no test leaves a process
    behind, also when it fails or times out."""

    def __init__(self, command: list[str], **popen: Any) -> None:
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True, **popen)
        self.lines: list[str] = []
        assert self.proc.stdout is not None
        stdout = self.proc.stdout
        self._reader = threading.Thread(target=lambda: self.lines.extend(stdout), daemon=True)
        self._reader.start()

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_until(self, ready: Callable[[], bool] | None = None) -> None:
        """Wait until it has reported an update (``updates=`` in a report line: training,
        past start-up, its signal handlers in place) and ``ready()`` holds; it must not
        exit first. The test's own time limit ends a wait that never ends."""
        while not (any("updates=" in line for line in self.lines) and (ready is None or ready())):
            assert self.proc.poll() is None, self.output[-3000:]
            threading.Event().wait(0.2)

    def finish(self, timeout: float) -> int:
        """Wait for its exit (at most ``timeout`` s) and the last of its output; its code."""
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL whatever is left of it: every process under it first (torchrun starts its
        workers in sessions of their own, out of reach of a kill of its group), then its
        process group."""
        if self.proc.poll() is None:
            with contextlib.suppress(psutil.NoSuchProcess):  # a zombie's children included
                for child in psutil.Process(self.proc.pid).children(recursive=True):
                    with contextlib.suppress(psutil.NoSuchProcess):
                        child.kill()
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> Training:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
