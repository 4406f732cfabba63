"""Tests for distrl.run.run_lock: one owner per run directory. A second taker is refused with
the owner's pid, host, start time and command line; release frees the directory (and
deletes the lock file); a lock left by a SIGKILLed process does not block; and two
``run.py`` runs on one ``log.name``: the second exits 2 with one line naming the first."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from presets import run_py_command, run_py_env

from distrl.config import ConfigError
from distrl.run import run_lock

REPO = Path(__file__).resolve().parents[1]


def _expected_refusal(run_dir: Path, field: str = "log.name") -> str:
    owner = json.loads((run_dir / "distrl.lock").read_text())
    advice = " or choose another log.name" if field == "log.name" else ""
    return (f"{field}: run directory '{run_dir}' is in use by pid {owner['pid']} on "
            f"{owner['host']} since {owner['since']} ({owner['command']}); wait for it to "
            f"end{advice}")


def test_a_second_lock_in_one_process_is_refused_naming_the_owner(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = run_lock.take(run_dir)
    owner = json.loads((run_dir / "distrl.lock").read_text())
    assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
    assert shlex.split(owner["command"])[1:] == sys.argv  # the python executable, then argv
    # local time to the second and the time zone's name, e.g. "2026-12-01 20:30:05 UTC"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S*", owner["since"]), owner["since"]
    with pytest.raises(ConfigError) as info:
        run_lock.take(run_dir)
    assert str(info.value) == _expected_refusal(run_dir)
    with pytest.raises(ConfigError) as info:
        run_lock.take(run_dir, "resume")  # a resume names its own field, no log.name advice
    assert str(info.value) == _expected_refusal(run_dir, "resume")
    assert first.held

    first.release()
    assert not first.held and not (run_dir / "distrl.lock").exists()
    first.release()  # idempotent
    with run_lock.take(run_dir) as again:  # free again once released
        assert again.held and (run_dir / "distrl.lock").exists()
    assert not (run_dir / "distrl.lock").exists()


def test_release_removes_the_directories_it_made_while_still_empty(tmp_path: Path) -> None:
    nested = tmp_path / "logs" / "runs" / "a"
    run_lock.take(nested).release()
    assert list(tmp_path.iterdir()) == []  # a run that failed before writing leaves nothing
    with run_lock.take(nested):
        (nested / "events.out").write_text("x")  # the run wrote something: kept
    assert [p.name for p in nested.iterdir()] == ["events.out"]
    existing = tmp_path / "existing"
    existing.mkdir()
    run_lock.take(existing).release()
    assert existing.is_dir()  # not made by the lock: never removed


def test_a_lock_file_deleted_between_open_and_flock_is_opened_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner ends (deleting the file) just after a second run opened it: the second
    must not keep a lock on the deleted file, or a third run would get the directory too."""
    run_dir = tmp_path / "run"
    first = run_lock.take(run_dir)
    real_flock = fcntl.flock
    calls: list[int] = []

    def owner_ends_first(fd: int, operation: int) -> None:
        if not calls:
            first.release()
        calls.append(fd)
        real_flock(fd, operation)

    monkeypatch.setattr(run_lock.fcntl, "flock", owner_ends_first)
    second = run_lock.take(run_dir)
    monkeypatch.undo()
    assert len(calls) == 2  # locked the deleted file, noticed, took the new one
    assert json.loads((run_dir / "distrl.lock").read_text())["pid"] == os.getpid()
    with pytest.raises(ConfigError, match="is in use by pid"):
        run_lock.take(run_dir)
    second.release()


def test_a_lock_left_by_a_sigkilled_process_does_not_block(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\nfrom distrl.run import run_lock\nrun_lock.take(sys.argv[1])\n"
         "print('locked', flush=True)\ntime.sleep(120)\n", str(run_dir)],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(ConfigError) as info:
            run_lock.take(run_dir)
        assert f"is in use by pid {holder.pid} on {socket.gethostname()} since " in str(info.value)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    stale = json.loads((run_dir / "distrl.lock").read_text())
    assert stale["pid"] == holder.pid  # the dead owner's file is still there ...
    with run_lock.take(run_dir):  # ... and does not block: the kernel dropped its lock
        assert json.loads((run_dir / "distrl.lock").read_text())["pid"] == os.getpid()


def test_a_run_that_fails_after_taking_the_lock_releases_it(tmp_path: Path) -> None:
    """The lock lives as long as the run function: an error raised after the run
    directory was made (here: too few slots) releases it, in the same process."""
    from presets import compose_run

    from agents import impala

    cfg = compose_run(tmp_path, "run", "agent=impala", "env=CartPole", "distributed.actors=0",
                      "distributed.slots=1")
    with pytest.raises(ConfigError, match=r"^distributed\.slots \(1\) must be at least"):
        impala.run(cfg)
    assert not (tmp_path / "run").exists()  # lock file and the empty directory removed
    with run_lock.take(tmp_path / "run"):
        pass


# A serial CartPole run; the first run's frames keep it going for ~20-40 s on 2 cores,
# long past the second run's start-up.
TINY_RUN = ("agent=impala", "env=CartPole", "distributed.actors=0", "agent.batch_size=32",
            "agent.unroll_length=20", "distributed.envs_per_actor=32",
            "distributed.env_groups=1", "eval.episodes=0")


def _run_py(tmp_path: Path, hydra: str, *overrides: str) -> list[str]:
    return run_py_command(tmp_path, *TINY_RUN, f"log.dir={tmp_path / 'runs'}", "log.name=same",
                          *overrides, hydra_dir=hydra)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_second_run_py_on_a_running_directory_exits_2_naming_the_owner(
    tmp_path: Path
) -> None:
    env = run_py_env()
    run_dir = tmp_path / "runs" / "same"
    lock = run_dir / "distrl.lock"
    first = subprocess.Popen(_run_py(tmp_path, "hydra1", "total_frames=192000"), cwd=REPO,
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not (lock.exists() and lock.read_text()):  # the test's time limit ends a hang
            assert first.poll() is None, first.communicate()
            time.sleep(0.1)
        second = subprocess.run(_run_py(tmp_path, "hydra2", "total_frames=2560"), cwd=REPO,
                                env=env, capture_output=True, text=True, timeout=120)
        assert first.poll() is None, "the first run ended before the second was refused"
        out, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert second.returncode == 2, second.stdout + second.stderr
    assert "Traceback" not in second.stderr
    lines = [line for line in second.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, second.stderr
    assert re.fullmatch(
        rf"distrl: error: log\.name: run directory '{re.escape(str(run_dir))}' is in use by "
        rf"pid {first.pid} on {re.escape(socket.gethostname())} since [-0-9]+ [:0-9]+.* "
        rf"\(python\S* \S*run\.py .*log\.name=same.*\); wait for it to end or choose another "
        r"log\.name", lines[0]), lines[0]
    assert "[distrl] run_dir=" not in second.stdout  # refused before it started
    assert first.returncode == 0, out[-2000:] + err[-2000:]
    assert "[distrl] checkpoint " in out
    assert not lock.exists()  # released when the run ended


def test_a_resume_locks_its_run_directory_and_refuses_another_agents_checkpoint(
        tmp_path: Path) -> None:
    """``make_run_dir`` with ``resume``: the run directory is taken for the run (a second
    resume is refused while the first holds it), and a checkpoint of another agent is
    refused naming both (the Python API's only guard: run.py's settings merge refuses it
    earlier)."""
    import contextlib
    from types import SimpleNamespace

    from distrl.run import checkpoint
    from distrl.training.run_dir import make_run_dir

    run_dir = tmp_path / "run"
    saved = checkpoint.save({"format": 1, "agent": "impala"}, run_dir / "checkpoints", 1)
    settings = SimpleNamespace(resume=str(run_dir))
    with contextlib.ExitStack() as owner:
        found, state = make_run_dir(settings, "impala", owner)
        assert found == run_dir and state.get("agent") == "impala"
        with pytest.raises(ConfigError) as info:
            make_run_dir(settings, "impala", contextlib.ExitStack())
        assert str(info.value) == _expected_refusal(run_dir, "resume")
    with pytest.raises(checkpoint.CheckpointError) as refused, contextlib.ExitStack() as owner:
        make_run_dir(settings, "apex", owner)
    assert str(refused.value) == (f"resume: checkpoint '{saved}' is from agent 'impala', "
                                  f"not 'apex'")


def test_a_stale_lock_with_a_longer_record_is_rewritten_whole(tmp_path: Path) -> None:
    """A lock left unlocked by a dead owner whose record is longer than the new one's: the
    new owner's record replaces it whole, so the next refusal can read who holds it."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "distrl.lock").write_text(json.dumps(
        {"pid": 1, "host": "h", "since": "s", "command": "x" * 4096}) + "\n")
    with run_lock.take(run_dir):
        owner = json.loads((run_dir / "distrl.lock").read_text())
        assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()
