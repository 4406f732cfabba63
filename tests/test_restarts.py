"""A rank killed under ``torchrun --max-restarts=1 ... resume=auto``: torchrun starts the
whole worker group again with the same command, and the run continues from its newest
checkpoint in the same run directory to the end of its budget: two IMPALA learners, an
IMPALA learner with an actor-only rank (the actor rank killed), two Ape-X learners with
their replay shards. Each rank runs under a thin wrapper that records its ``run.py``
child's pid, so the test can SIGKILL rank 1 mid-run as a failing machine would."""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest
from presets import REPO, Training
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from distrl.run import checkpoint

pytestmark = pytest.mark.dist

WRAPPER = """
import os, signal, subprocess, sys
from pathlib import Path
child = subprocess.Popen([sys.executable, {run_py!r}, *sys.argv[1:]])
start = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
Path({out!r}, f"pid{{os.environ['RANK']}}-{{start}}").write_text(str(child.pid))
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # torchrun signals the child's group too
code = child.wait()
sys.exit(code if code >= 0 else 128 - code)
"""
CARTPOLE = ("env=CartPole", "distributed.actors=0", "distributed.envs_per_actor=32",
            "distributed.env_groups=1")
RUNS = {
    # name: (overrides, this rank's frames per update)
    "impala": (("agent=impala", *CARTPOLE, "agent.batch_size=32", "agent.unroll_length=20",
                "total_frames=64000"), 640),
    "impala_actor_rank": (("agent=impala", *CARTPOLE, "agent.batch_size=32",
                           "agent.unroll_length=20", "total_frames=64000",
                           "distributed.learner_ranks=1"), 640),
    "apex": (("+experiment=apex_cartpole", *CARTPOLE, "total_frames=16000",
              "agent.learning_starts=500", "checkpoint.replay=true", "checkpoint.keep=1000"), None),
}


def _command(tmp_path: Path, overrides: tuple[str, ...]) -> list[str]:
    wrapper = tmp_path / "rank.py"
    wrapper.write_text(WRAPPER.format(run_py=str(REPO / "run.py"), out=str(tmp_path)))
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc_per_node=2", "--max-restarts=1", str(wrapper), *overrides,
            f"log.dir={tmp_path / 'runs'}", "log.name=job", "resume=auto",
            "checkpoint.interval_s=0.5", "log.interval_s=0.5",
            f"hydra.run.dir={tmp_path / 'hydra'}"]


def _env() -> dict[str, str]:
    tests = str(REPO / "tests")
    return {**{k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"},
            "PYTHONPATH": f"{tests}{os.pathsep}{REPO}"}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", list(RUNS))
def test_a_killed_rank_is_restarted_and_the_run_completes_its_budget(tmp_path, name):
    overrides, frames_per_update = RUNS[name]
    total = int(next(o for o in overrides if o.startswith("total_frames=")).split("=")[1])
    checkpoints = tmp_path / "runs" / "job" / "checkpoints"
    with Training(_command(tmp_path, overrides), cwd=REPO, env=_env()) as job:
        # both ranks train and a periodic checkpoint is on disk: kill rank 1 (a lost host)
        job.wait_until(lambda: bool(checkpoint.list_checkpoints(checkpoints)))
        before = checkpoint.load(checkpoint.list_checkpoints(checkpoints)[-1])
        os.kill(int((tmp_path / "pid1-0").read_text()), signal.SIGKILL)
        code = job.finish(timeout=480)
    output = job.output
    assert code == 0, output[-4000:]
    assert (tmp_path / "pid1-1").exists()  # torchrun started the group again
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["job"]
    assert "[distrl] restart 1 by the launcher: continuing from" in output, output[-4000:]
    saved = checkpoint.list_checkpoints(checkpoints)
    final = checkpoint.load(saved[-1])
    frames = final.get("frames_all_ranks", final["counters"]["frames"])  # one learner: its own
    assert frames >= total
    assert final["learner"]["updates"] > before["learner"]["updates"]
    if frames_per_update is not None:  # IMPALA: every update learns one batch per rank
        assert frames == total
        assert final["counters"]["frames"] == final["learner"]["updates"] * frames_per_update
    events = EventAccumulator(str(checkpoints.parent), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.value for e in events.Scalars("run/restarts")] == [1.0]
    steps = [e.step for e in events.Scalars("perf/fps")]
    assert steps == sorted(steps)  # tensorboard goes on from the checkpoint, not back
    if name == "apex":  # each rank's replay came back as its shard held it
        step = int(re.search(r"restart 1 by the launcher: continuing from \S+checkpoint-(\d+)",
                             output).group(1))
        for rank in range(2):
            shard = checkpoint.load_shard(checkpoints.parent, step, rank)["replay"]
            assert (f"[distrl] resume: rank {rank}'s replay is back with "
                    in output), output[-4000:]
            back = re.search(rf"rank {rank}'s replay is back with (\d+) items \((\d+) inserted",
                             output)
            assert int(back.group(1)) > 0 and int(back.group(2)) == shard["inserted"]
