"""``python run.py -m ...`` under a Hydra launcher plugin, as a sweep on a cluster runs (here
``hydra-joblib-launcher``, two jobs at a time; ``hydra-submitit-launcher`` runs the same task
function in Slurm jobs): every job gets its own run directory, also when the jobs start in
the same second with the same seed, and the same sweep started again with ``resume=auto``
and a name built from the swept setting continues each job's run instead of starting it
afresh."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from presets import run_py

from distrl.run import checkpoint

pytestmark = pytest.mark.dist

TINY = ("agent=impala", "env=CartPole", "total_frames=6400", "distributed.actors=0",
        "distributed.envs_per_actor=32", "distributed.env_groups=1", "agent.batch_size=32",
        "agent.unroll_length=20", "eval.episodes=0", "log.progress=lines")
SWEEP = ("-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
         "agent.optimizer.lr=0.001,0.002")


def _stored_lr(run_dir: Path) -> tuple[float, int]:
    state = checkpoint.load(checkpoint.list_checkpoints(run_dir / "checkpoints")[-1])
    return yaml.safe_load(state["config"])["agent"]["optimizer"]["lr"], state["learner"]["updates"]


def _sweep(tmp_path: Path, *overrides: str, attempt: int = 0):
    return run_py(tmp_path, *SWEEP, *TINY, f"log.dir={tmp_path / 'runs'}", *overrides,
                  f"hydra.sweep.dir={tmp_path / f'sweep{attempt}'}", timeout=240)


@pytest.mark.timeout(300)
def test_each_job_of_a_sweep_gets_its_own_run_directory(tmp_path):
    result = _sweep(tmp_path, "seed=0")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    names = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert sorted(re.sub(r"seed0-\d{8}-\d{6}", "seed0-<start>", n) for n in names) == [
        "impala-CartPole-v1-seed0-<start>-job0", "impala-CartPole-v1-seed0-<start>-job1"]
    lrs = {name[-4:]: _stored_lr(tmp_path / "runs" / name)[0] for name in names}
    assert lrs == {"job0": 0.001, "job1": 0.002}


@pytest.mark.timeout(300)
def test_the_same_sweep_started_again_with_resume_auto_continues_each_run(tmp_path):
    named = ("log.name=lr${agent.optimizer.lr}", "resume=auto")
    first = _sweep(tmp_path, *named)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    for lr in ("0.001", "0.002"):
        assert (f"[distrl] resume=auto: no checkpoint in {tmp_path / 'runs' / f'lr{lr}'}, "
                "starting the run there") in first.stdout
    done = {p.name: _stored_lr(p) for p in (tmp_path / "runs").iterdir()}
    assert done == {"lr0.001": (0.001, 10), "lr0.002": (0.002, 10)}

    again = _sweep(tmp_path, *named, attempt=1)  # a requeued or relaunched sweep
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    for lr in ("0.001", "0.002"):
        assert (f"[distrl] resume=auto: continuing {tmp_path / 'runs' / f'lr{lr}'} from its "
                "newest intact checkpoint") in again.stdout
    assert {p.name: _stored_lr(p) for p in (tmp_path / "runs").iterdir()} == done
