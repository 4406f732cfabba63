"""``torchrun --nproc_per_node=2 run.py ...`` as a user starts it, two learner ranks.

torchrun reports any failed worker as its own exit 1, so each rank's own exit code is
recorded by a thin wrapper that starts ``python run.py`` as the rank's only child and
writes its code to ``exit<RANK>`` (torchrun's SIGTERM reaches the child directly: it
signals each rank's process group). Checked: a run
exits 0 on every rank with rank 0 alone writing tensorboard and periodic checkpoints; a
second start on the same run directory is refused with one line and exit 2 (the resume
guard), leaving the checkpoints as they were; SIGTERM stops every rank with 143 after a
checkpoint; an unexpected error exits 1 with its traceback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from presets import REPO, Training, run_group

from distrl.run import checkpoint

pytestmark = pytest.mark.dist

TINY = ("agent=impala", "env=CartPole", "distributed.actors=0", "distributed.envs_per_actor=32",
        "distributed.env_groups=1", "agent.batch_size=32", "agent.unroll_length=20")
WRAPPER = """
import os, signal, subprocess, sys
from pathlib import Path
child = subprocess.Popen([sys.executable, {run_py!r}, *sys.argv[1:]])
# torchrun signals each rank's whole process group (os.killpg), the child included:
# this wrapper only waits for it.
signal.signal(signal.SIGTERM, signal.SIG_IGN)
code = child.wait()
Path({out!r}, "exit" + os.environ["RANK"]).write_text(str(code))
sys.exit(code if code >= 0 else 128 - code)
"""


def _command(tmp_path: Path, *overrides: str) -> list[str]:
    wrapper = tmp_path / "rank.py"
    wrapper.write_text(WRAPPER.format(run_py=str(REPO / "run.py"), out=str(tmp_path)))
    for rank in range(2):
        (tmp_path / f"exit{rank}").unlink(missing_ok=True)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc_per_node=2", str(wrapper), *TINY, f"log.dir={tmp_path / 'runs'}",
            "log.name=two", *overrides, f"hydra.run.dir={tmp_path / 'hydra'}"]


def _env() -> dict[str, str]:
    tests = str(REPO / "tests")
    return {**{k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"},
            "PYTHONPATH": f"{tests}{os.pathsep}{REPO}"}


def _torchrun(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    return run_group(_command(tmp_path, *overrides), timeout=240, cwd=REPO, env=_env())


def _rank_codes(tmp_path: Path) -> list[int]:
    return [int((tmp_path / f"exit{rank}").read_text()) for rank in range(2)
            if (tmp_path / f"exit{rank}").exists()]


def _error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("distrl: error:")]


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """A two-rank run of 20 updates with a periodic checkpoint due after every update
    (1 ms apart), whatever the machine's speed: 0.5 s once outlasted a whole fast run."""
    tmp = tmp_path_factory.mktemp("torchrun")
    return tmp, _torchrun(tmp, "total_frames=25600", "checkpoint.interval_s=0.001")


def test_a_finished_run_exits_0_with_rank_0_writing_tensorboard_and_checkpoints(finished):
    tmp, result = finished
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert _rank_codes(tmp) == [0, 0]
    run_dir = tmp / "runs" / "two"
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 1  # rank 0's only
    saved = checkpoint.list_checkpoints(run_dir / "checkpoints")
    assert len(saved) >= 2, saved  # periodic ones before the final one
    final = checkpoint.load(saved[-1])
    # every rank counts its own frames; the checkpoint also holds the run's
    assert final["world_size"] == 2 and final["counters"]["frames"] == 12800
    assert final["frames_all_ranks"] == 25600


def test_a_second_start_on_the_run_directory_is_refused_in_one_line_with_exit_2(finished):
    tmp, first = finished
    assert first.returncode == 0
    run_dir = tmp / "runs" / "two"
    before = {p.name: p.stat().st_mtime_ns for p in (run_dir / "checkpoints").iterdir()}
    again = _torchrun(tmp, "total_frames=25600")
    output = again.stdout + again.stderr
    assert again.returncode == 1  # torchrun's code for any failed worker
    # rank 0 says why and exits 2; rank 1 leaves quietly (0, or torchrun's SIGTERM once rank
    # 0 has failed), never failing first: it used to, now and then, and torchrun then
    # stopped rank 0 before its exit 2
    codes = _rank_codes(tmp)
    assert codes[0] == 2 and codes[1] in (0, -signal.SIGTERM), (codes, output[-3000:])
    assert _error_lines(output) == [
        f"distrl: error: log.name: run directory '{run_dir}' already holds checkpoints; pass "
        f"resume={run_dir} to continue it or choose another log.name"], output[-3000:]
    assert {p.name: p.stat().st_mtime_ns for p in (run_dir / "checkpoints").iterdir()} == before


def test_sigterm_to_torchrun_stops_every_rank_with_143_after_a_checkpoint(tmp_path):
    with Training(_command(tmp_path, "total_frames=1000000000"), cwd=REPO, env=_env()) as job:
        job.wait_until()  # both ranks are training
        job.proc.send_signal(signal.SIGTERM)
        job.finish(timeout=120)
    output = job.output
    assert _rank_codes(tmp_path) == [143, 143], output[-3000:]
    assert output.count("[distrl] received signal 15: checkpointing and stopping") == 2
    assert checkpoint.list_checkpoints(tmp_path / "runs" / "two" / "checkpoints")


def test_an_unexpected_error_exits_1_with_its_traceback(tmp_path):
    result = _torchrun(tmp_path, "env.id=DistrlCrashAfter-v0", "env.imports=[crashing_env]",
                       "total_frames=1000000")
    output = result.stdout + result.stderr
    assert result.returncode == 1
    assert 1 in _rank_codes(tmp_path), output[-3000:]
    assert "DistrlCrashAfter-v0 crashed on purpose" in output
    assert "Traceback (most recent call last)" in output
