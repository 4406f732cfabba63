"""The suite's time limit (pytest-timeout, set in pyproject.toml) on a test that hangs.

A test that deadlocks on purpose runs in a child pytest: an IMPALA run with two actor
processes whose learner step blocks forever. The limit must fail it with the stack of
the blocked thread, and the run's actor processes must be gone when the child pytest
exits, so a hang in CI neither eats the CI budget nor leaves orphans behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

HANGING_TEST = textwrap.dedent('''
    import json, os, threading

    import psutil

    from agents import impala
    from distrl.training import learner
    from distrl.config import (CheckpointConfig, DistributedConfig, EnvConfig, LogConfig,
                               RunConfig)

    def test_hangs_in_the_learner_step(tmp_path, monkeypatch):
        def step_forever(self, batch):
            children = [p.pid for p in psutil.Process().children(recursive=True)]
            with open(os.environ["HANG_REPORT"], "w") as f:
                json.dump(children, f)
            threading.Event().wait()  # the deadlock

        monkeypatch.setattr(learner.Learner, "step", step_forever)
        impala.run(RunConfig(
            agent=impala.ImpalaConfig(),
            env=EnvConfig(id="CartPole-v1"),
            distributed=DistributedConfig(actors=2, envs_per_actor=4, env_groups=1),
            log=LogConfig(dir=str(tmp_path), name="hang", interval_s=30.0, tensorboard=False),
            checkpoint=CheckpointConfig(interval_s=3600.0),
            total_frames=10_000_000,
        ))
''')


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.dist
def test_a_hung_test_fails_at_its_limit_with_a_stack_and_leaves_no_child(tmp_path):
    (tmp_path / "test_hang.py").write_text(HANGING_TEST)
    report = tmp_path / "children.json"
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "HANG_REPORT": str(report), "PYTHONPATH": str(repo)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=20",
 str(tmp_path / "test_hang.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "Failed: Timeout (>20.0s) from pytest-timeout" in out
    assert "test_hang.py:16: in step_forever" in out  # where it hung, in the traceback
    children = json.loads(report.read_text())
    assert len(children) >= 2, children  # the two actor processes were running
    deadline = time.monotonic() + 10.0  # an exit is not instant after the parent's
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in children if _alive(pid)]



ABANDONING_TEST = textwrap.dedent('''
    import multiprocessing, os, pathlib, time

    def _sleep():
        time.sleep(3600)

    def test_leaves_a_child_behind():
        child = multiprocessing.get_context("spawn").Process(target=_sleep)
        child.start()
        pathlib.Path(os.environ["CHILD_REPORT"]).write_text(str(child.pid))
        time.sleep(3600)
''')


def test_a_sigterm_to_the_suite_ends_the_children_its_tests_left(tmp_path):
    """A CI runner that cancels a job sends SIGTERM: the session stops as on Ctrl-C and
    the suite's conftest ends a child process the running test started, naming it."""
    (tmp_path / "test_abandon.py").write_text(ABANDONING_TEST)
    report = tmp_path / "child.txt"
    tests = Path(__file__).resolve().parent
    env = {**os.environ, "CHILD_REPORT": str(report),
           "PYTHONPATH": f"{tests}{os.pathsep}{tests.parent}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
         str(tmp_path / "test_abandon.py")],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        while not report.exists() and proc.poll() is None:  # the child has started
            time.sleep(0.05)
        proc.terminate()
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    child = int(report.read_text())
    assert proc.returncode == 2, out  # pytest's "interrupted"
    assert f"conftest: ending child process {child} left running" in out
    assert not _alive(child)
