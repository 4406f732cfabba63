"""``examples/slurm/distrl.sbatch`` run as Slurm would run it, with a fake ``srun`` (starts its
command on this machine and passes SIGTERM on, as srun passes signals to its tasks) and a
fake ``scontrol`` (the node list, and a record of ``requeue``) on PATH: Slurm's USR1 before
the time limit stops the run at a checkpoint and requeues the job; the requeued job (the same
script, ``SLURM_RESTART_COUNT=1``) continues the same run directory to the end of its budget.
The real Slurm daemons were not used: they need a configured controller and node daemon,
which a CI machine has not."""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

import pytest
from presets import REPO, Training
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from distrl.run import checkpoint

pytestmark = pytest.mark.dist

SCRIPT = REPO / "examples" / "slurm" / "distrl.sbatch"
FAKE_SRUN = """#!{python}
import signal, subprocess, sys
args = sys.argv[1:]
while args and args[0].startswith("-"):  # srun's own options
    args.pop(0)
child = subprocess.Popen(args)
signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum))
sys.exit(child.wait() % 256)
"""
FAKE_SCONTROL = """#!/bin/bash
echo "$*" >> {log}
if [ "$1 $2" = "show hostnames" ]; then echo 127.0.0.1; fi
"""
TOTAL_FRAMES = 64000
RUN = ("agent=impala", "env=CartPole", "distributed.actors=0", "distributed.envs_per_actor=32",
       "distributed.env_groups=1", "agent.batch_size=32", "agent.unroll_length=20",
       f"total_frames={TOTAL_FRAMES}", "log.interval_s=0.2", "eval.episodes=0")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _slurm(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN.format(python=sys.executable))
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL.format(log=tmp_path / "scontrol.log"))
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    environment = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return {**environment, "PATH": f"{bin_dir}{os.pathsep}{environment['PATH']}",
            "PYTHONPATH": str(REPO), "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node1",
            "SLURM_NNODES": "1", "DISTRL_PROCS_PER_NODE": "1", "DISTRL_PYTHON": sys.executable,
            "DISTRL_RUNS": str(tmp_path / "runs"), "DISTRL_RDZV_PORT": str(_free_port())}


def _start(tmp_path: Path, environment: dict[str, str], attempt: int) -> Training:
    return Training(["bash", str(SCRIPT), *RUN, f"hydra.run.dir={tmp_path / f'hydra{attempt}'}"],
                    cwd=REPO, env=environment)


@pytest.mark.timeout(600)
def test_usr1_stops_the_run_requeues_the_job_and_the_requeued_job_finishes_it(tmp_path):
    environment = _slurm(tmp_path)
    run_dir = tmp_path / "runs" / "slurm-4242"
    with _start(tmp_path, environment, 0) as job:
        job.wait_until()
        job.proc.send_signal(signal.SIGUSR1)  # Slurm's --signal=B:USR1@120: the batch shell
        code = job.finish(timeout=120)
    first = job.output
    assert code == 0, first[-4000:]
    assert "distrl.sbatch: the run stopped (exit" in first, first[-4000:]
    assert "[distrl] received signal 15: checkpointing and stopping" in first
    assert (tmp_path / "scontrol.log").read_text().splitlines()[-1] == "requeue 4242"
    stopped = checkpoint.load(checkpoint.list_checkpoints(run_dir / "checkpoints")[-1])
    assert 0 < stopped["counters"]["frames"] < TOTAL_FRAMES

    # Slurm starts the requeued job with the same script and arguments
    with _start(tmp_path, {**environment, "SLURM_RESTART_COUNT": "1"}, 1) as again:
        code = again.finish(timeout=300)
    output = again.output
    assert code == 0, output[-4000:]
    assert "distrl.sbatch: job 4242, start 2" in output
    assert f"[distrl] resume=auto: continuing {run_dir} from its newest intact checkpoint" in output
    assert "requeue" not in (tmp_path / "scontrol.log").read_text().splitlines()[-1]
    final = checkpoint.load(checkpoint.list_checkpoints(run_dir / "checkpoints")[-1])
    assert final["counters"]["frames"] == TOTAL_FRAMES
    assert final["learner"]["updates"] == TOTAL_FRAMES // 640 > stopped["learner"]["updates"]
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["slurm-4242"]
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.value for e in events.Scalars("run/restarts")] == [1.0]
