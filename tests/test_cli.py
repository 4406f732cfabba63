"""End-to-end bad-input tests of ``python run.py``: a clear error, a non-zero exit, no damage.

Each case launches the real command line in a subprocess (Hydra and all) and checks
that it exits non-zero before training, that its output names the field and what the
field allows, that our own errors are one ``distrl: error:`` line with no traceback, and
that the checkpoints of an existing run are left byte-for-byte as they were. Every run
writes under ``tmp_path`` only (``log.dir`` and ``hydra.run.dir``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# A serial CartPole run that does 4 updates (4 x 20 steps x 32 envs = 2,560 frames) in seconds.
TINY_RUN = (
    "agent=impala", "env=CartPole", "total_frames=2560", "distributed.actors=0",
    "agent.batch_size=32", "agent.unroll_length=20", "distributed.envs_per_actor=32",
    "distributed.env_groups=1",
)
ERROR_TIMEOUT_S = 90  # an error case fails in ~3 s; a case that wrongly trains stops here
TRAIN_TIMEOUT_S = 180
STARTED = "[distrl] run_dir="  # printed once the run has started


def run_cli(
    tmp_path: Path, *overrides: str, log_dir: Path | None = None, timeout: float = ERROR_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """``python run.py`` with the tiny run's settings, then ``overrides`` (the last one wins)."""
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    command = [
        sys.executable, "run.py", *TINY_RUN,
        f"log.dir={log_dir or tmp_path / 'runs'}", f"hydra.run.dir={tmp_path / 'hydra'}",
        *overrides,
    ]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def assert_distrl_error(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    """A non-zero exit before training, and stderr exactly one error line holding ``needles``."""
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in result.stderr, result.stderr
    assert STARTED not in result.stdout, f"the run started before failing:\n{output}"
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one error line, got {len(lines)}:\n{result.stderr}"
    assert lines[0].startswith("distrl: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} missing from: {lines[0]}"
    return lines[0]


def assert_hydra_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Hydra rejected the command line (exit 1, no traceback); its message holds ``needles``."""
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in result.stderr, result.stderr
    assert STARTED not in result.stdout, output
    for needle in needles:
        assert needle in output, f"{needle!r} missing from:\n{output}"


# ---------------------------------------------------------------- config errors


def test_unknown_env_id_names_field_and_examples(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "env.id=NotAnEnv-v0")
    assert_distrl_error(result, "env.id", "'NotAnEnv-v0'", "CartPole-v1", "Atari")
    assert not (tmp_path / "runs").exists(), "a run directory was created for a bad env id"


def test_unknown_agent_lists_the_registered_agents(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "agent=nope")
    assert_hydra_error(result, "'agent/nope'", "Available options in 'agent'", "impala")


def test_unknown_config_key_is_named(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "distributed.nonsense=1")
    assert_hydra_error(result, "distributed.nonsense", "DistributedConfig")


def test_unknown_kernel_lists_the_choices(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "kernel=fast")
    assert_distrl_error(result, "kernel must be one of auto, compiled, reference", "'fast'")
    assert not (tmp_path / "runs").exists()


def test_wrong_type_names_field_and_type(tmp_path: Path) -> None:
    result = run_cli(tmp_path, "distributed.actors=abc")
    assert_hydra_error(result, "distributed.actors", "'abc'", "Integer")


@pytest.mark.parametrize(
    "field, value",
    [
        ("agent.batch_size", "0"),
        ("agent.unroll_length", "-5"),
        ("agent.optimizer.lr", "-1"),
        ("distributed.envs_per_actor", "0"),
        ("total_frames", "0"),
        ("log.interval_s", "0"),
    ],
)
def test_non_positive_size_or_rate_names_field(tmp_path: Path, field: str, value: str) -> None:
    result = run_cli(tmp_path, f"{field}={value}")
    line = assert_distrl_error(result, "must be a positive number", f"got {value}")
    assert line.startswith(f"distrl: error: {field} must"), line
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "overrides, field, value",
    [
        (("agent.optimizer.lr=nan",), "agent.optimizer.lr", "nan"),
        (("agent.optimizer.lr=inf",), "agent.optimizer.lr", "inf"),
        (("agent.entropy_cost=-inf",), "agent.entropy_cost", "-inf"),
        (("stop_at_return=nan",), "stop_at_return", "nan"),
        (("checkpoint.interval_s=inf",), "checkpoint.interval_s", "inf"),
        (("agent.optimizer.max_grad_norm=nan",), "agent.optimizer.max_grad_norm", "nan"),
    ],
)
def test_nan_or_inf_is_refused_by_name(tmp_path: Path, overrides: tuple[str, ...], field: str,
                                       value: str) -> None:
    """nan passes every range check (nan <= 0 is False): without a finite check an lr of
    nan would train to garbage and exit 0."""
    result = run_cli(tmp_path, *overrides)
    line = assert_distrl_error(result, f"{field} must be a finite number, got {value}")
    assert line == f"distrl: error: {field} must be a finite number, got {value}", line
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("agent, prefix", [("impala", "agent"), ("apex", "agent"),
                                            ("r2d2", "agent"), ("seed", "agent.impala")])
def test_every_agents_nested_float_settings_are_checked_for_nan(agent: str, prefix: str) -> None:
    """The finite check walks the whole config, the agent's nested dataclasses included."""
    from agents import apex, impala, r2d2, seed
    from distrl.config import ConfigError, RunConfig

    agent_cfg = {"impala": impala.ImpalaConfig, "apex": apex.ApexConfig,
                 "r2d2": r2d2.R2D2Config, "seed": seed.SeedConfig}[agent]()
    optimizer = agent_cfg.impala.optimizer if agent == "seed" else agent_cfg.optimizer
    optimizer.lr = float("nan")
    with pytest.raises(ConfigError, match=rf"^{prefix}\.optimizer\.lr must be a finite number"):
        RunConfig(agent=agent_cfg)


@pytest.mark.parametrize("name", ["../outside", "/abs/run", "a/b", ".."])
def test_log_name_must_stay_inside_log_dir(tmp_path: Path, name: str) -> None:
    result = run_cli(tmp_path, f"log.name={name}", log_dir=tmp_path / "logs" / "runs")
    assert_distrl_error(result, "log.name must be one plain directory name inside log.dir",
                        repr(name))
    assert not (tmp_path / "logs").exists() and not Path("/abs/run").exists()


# ---------------------------------------------------------------- checkpoint errors


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny run ``run1`` with one checkpoint; tests work on copies of it."""
    root = tmp_path_factory.mktemp("trained")
    result = run_cli(root, "log.name=run1", timeout=TRAIN_TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = root / "runs" / "run1"
    assert [p.name for p in (run_dir / "checkpoints").iterdir()] == ["checkpoint-000000000004.pt"]
    return run_dir


@pytest.fixture
def run1(trained_run: Path, tmp_path: Path) -> Path:
    """This test's own copy of the trained run, at ``tmp_path/runs/run1``."""
    return Path(shutil.copytree(trained_run, tmp_path / "runs" / "run1"))


def snapshot(run_dir: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``run_dir`` (hidden temporaries too): sha256 and mtime in ns."""
    return {
        str(p.relative_to(run_dir)):
            (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(run_dir.rglob("*")) if p.is_file()
    }


def snapshot_subset(files: dict[str, tuple[str, int]], folder: str) -> dict[str, tuple[str, int]]:
    """The entries of a :func:`snapshot` under ``folder``, relative to it."""
    prefix = folder + os.sep
    return {k[len(prefix):]: v for k, v in files.items() if k.startswith(prefix)}


def test_snapshot_sees_a_changed_checkpoint(run1: Path) -> None:
    # The no-damage checks below are only as good as snapshot(): it must see edits and extras.
    before = snapshot(run1)
    (run1 / "checkpoints" / ".checkpoint-x.tmp").write_bytes(b"")
    assert snapshot(run1) != before
    (run1 / "checkpoints" / ".checkpoint-x.tmp").unlink()
    checkpoint = run1 / "checkpoints" / "checkpoint-000000000004.pt"
    os.utime(checkpoint, ns=(0, 0))
    assert snapshot(run1) != before


def test_resume_from_garbage_file(run1: Path, tmp_path: Path) -> None:
    before = snapshot(run1)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(bytes(range(256)) * 4)
    result = run_cli(tmp_path, f"resume={garbage}")
    assert_distrl_error(result, "resume", str(garbage), "cannot read checkpoint")
    assert snapshot(run1) == before


def test_resume_from_truncated_checkpoint(run1: Path, tmp_path: Path) -> None:
    before = snapshot(run1)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes((run1 / "checkpoints" / "checkpoint-000000000004.pt").read_bytes()[:4096])
    result = run_cli(tmp_path, f"resume={truncated}")
    assert_distrl_error(result, "resume", str(truncated), "cannot read checkpoint")
    assert snapshot(run1) == before


def test_resume_from_missing_path(run1: Path, tmp_path: Path) -> None:
    before = snapshot(run1)
    missing = tmp_path / "no-such-checkpoint.pt"
    result = run_cli(tmp_path, f"resume={missing}")
    assert_distrl_error(result, "resume", str(missing), "does not exist")
    assert snapshot(run1) == before
    assert not missing.exists()


def test_fresh_run_over_existing_run_is_refused(run1: Path, tmp_path: Path) -> None:
    before = snapshot(run1)
    result = run_cli(tmp_path, "log.name=run1")
    assert_distrl_error(result, "log.name", "already holds checkpoints", f"resume={run1}")
    assert snapshot(run1) == before


def test_resume_with_invalid_override(run1: Path, tmp_path: Path) -> None:
    before = snapshot(run1)
    result = run_cli(tmp_path, f"resume={run1}", "agent.batch_size=0")
    assert_distrl_error(result, "agent.batch_size", "positive")
    assert snapshot(run1) == before


def test_resume_with_other_model_shape(run1: Path, tmp_path: Path) -> None:
    before = snapshot(run1)
    # Named in resume_overrides, so that the checkpoint itself is what refuses it.
    result = run_cli(tmp_path, f"resume={run1}", "agent.model.hidden_size=64",
                     "resume_overrides=[agent.model.hidden_size]")
    assert snapshot(run1) == before
    assert_distrl_error(result, "resume", "does not fit")


def test_resume_with_other_optimizer(run1: Path, tmp_path: Path) -> None:
    before = snapshot(run1)
    # More frames than the run has done, so the resumed run would train.
    result = run_cli(tmp_path, f"resume={run1}", "agent.optimizer.name=adam", "total_frames=5120",
                     "resume_overrides=[agent.optimizer.name,total_frames]")
    assert snapshot(run1 / "checkpoints") == snapshot_subset(before, "checkpoints")
    assert_distrl_error(result, "resume", "optimizer")
    assert snapshot(run1) == before
