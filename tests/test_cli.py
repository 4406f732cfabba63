"""``python run.py``: bad input is one ``distrl: error:`` line and exit 2, with no
traceback and no damage; a finished run exits 0, one stopped by SIGINT / SIGTERM 130 /
143 after its final checkpoint, one that fails 1 with its traceback.

Most bad-input cases go to one child process that runs them one after another through
run.py's own entry point (tests/run_py_child.py: the hook that makes Hydra's errors one
line, ``@hydra.main``, the exit code), since each would spend seconds importing in a
process of its own. A few cases launch ``python run.py`` itself (the process's exit code,
several at once, signals). Every run writes under ``tmp_path`` only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml
from presets import Training, run_py_command, run_py_env

from distrl.run import checkpoint
from distrl.run.resume_settings import auto_run_dir

REPO = Path(__file__).resolve().parents[1]
# A serial CartPole run that does 4 updates (4 x 20 steps x 32 envs = 2,560 frames) in seconds.
COMMON = ("env=CartPole", "total_frames=2560", "distributed.actors=0",
          "distributed.envs_per_actor=32", "distributed.env_groups=1")
TINY_RUN = ("agent=impala", *COMMON, "agent.batch_size=32", "agent.unroll_length=20")
ERROR_TIMEOUT_S = 90  # an error case fails in ~4 s; a case that wrongly trains stops here
TRAIN_TIMEOUT_S = 180
STARTED = "[distrl] run_dir="  # printed once the run has started


def command_line(log_dir: Path, overrides: tuple[str, ...]) -> list[str]:
    """The tiny run's settings for the agent ``overrides`` starts with (``agent=...``,
    else IMPALA), ``log.dir``, then ``overrides`` (the last one wins)."""
    if overrides and overrides[0].startswith("agent="):
        return [overrides[0], *COMMON, f"log.dir={log_dir}", *overrides[1:]]
    return [*TINY_RUN, f"log.dir={log_dir}", *overrides]


def cli_command(tmp_path: Path, *overrides: str) -> list[str]:
    """``python run.py`` with :func:`command_line`, writing under ``tmp_path`` only."""
    return run_py_command(tmp_path, *command_line(tmp_path / "runs", overrides))


def run_cli(tmp_path: Path, *overrides: str, timeout: float = ERROR_TIMEOUT_S,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python run.py`` (see :func:`cli_command`) in a subprocess."""
    return subprocess.run(cli_command(tmp_path, *overrides), cwd=REPO,
                          env=run_py_env(**(env or {})), capture_output=True, text=True,
                          timeout=timeout)


class RunPyChild:
    """tests/run_py_child.py: ``python run.py`` command lines, one after another in one
    child process, each through run.py's entry point."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.cases = 0
        self.stderr = open(folder / "child-stderr.txt", "w")  # noqa: SIM115 (closed in close)
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "run_py_child.py")], cwd=REPO,
            env=run_py_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.stderr, text=True)

    def run(self, log_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
        """``python run.py`` with :func:`command_line`; Hydra's own output goes to a fresh
        folder of the child's, away from ``log_dir``."""
        self.cases += 1
        arguments = [*command_line(log_dir, overrides),
                     f"hydra.run.dir={self.folder / f'hydra-{self.cases}'}"]
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(arguments) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], ERROR_TIMEOUT_S)
        reply = self.proc.stdout.readline() if ready else ""
        if not reply:
            self.close()
            pytest.fail(f"run_py_child gave no reply within {ERROR_TIMEOUT_S} s to "
                        f"{arguments}:\n{(self.folder / 'child-stderr.txt').read_text()[-3000:]}")
        result = json.loads(reply)
        return subprocess.CompletedProcess(arguments, result["code"], result["stdout"],
                                           result["stderr"])

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


@pytest.fixture(scope="module")
def run_py_child(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunPyChild]:
    child = RunPyChild(tmp_path_factory.mktemp("run_py_child"))
    try:
        yield child
    finally:
        child.close()


def assert_bad_input(result: subprocess.CompletedProcess[str]) -> str:
    """Exit 2 before training, no traceback, and stderr exactly one ``distrl: error:``
    line, which is returned."""
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output, output
    assert STARTED not in result.stdout, f"the run started before failing:\n{output}"
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one error line, got {len(lines)}:\n{result.stderr}"
    assert lines[0].startswith("distrl: error: "), lines[0]
    return lines[0]


def assert_distrl_error(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    """:func:`assert_bad_input`, and the line holds every one of ``needles``."""
    line = assert_bad_input(result)
    for needle in needles:
        assert needle in line, f"{needle!r} missing from: {line}"
    return line


# ---------------------------------------------------------------- the real command line

# Bad input given to real processes, launched together (each spends seconds importing).
PROCESS_CASES = {
    "unknown_key": ("agent.optimizer.lrr=1",),
    "wrong_type": ("total_frames=abc",),
    "unknown_agent": ("agent=nope",),
    "bad_value": ("agent.batch_size=0",),
    "replay_too_large": ("agent=apex", "agent.replay_capacity=1000000000000",
                         "agent.learning_starts=100", "agent.batch_size=32"),
}


@pytest.fixture(scope="module")
def processes(tmp_path_factory: pytest.TempPathFactory
              ) -> dict[str, tuple[subprocess.CompletedProcess[str], Path]]:
    """Each of PROCESS_CASES run by ``python run.py`` (all at once): result and tmp dir."""
    running = {}
    for name, overrides in PROCESS_CASES.items():
        tmp = tmp_path_factory.mktemp(name)
        command = cli_command(tmp, *overrides)
        running[name] = (command, tmp, subprocess.Popen(
            command, cwd=REPO, env=run_py_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True))
    results = {}
    for name, (command, tmp, proc) in running.items():
        try:
            out, err = proc.communicate(timeout=ERROR_TIMEOUT_S)
        finally:
            if proc.poll() is None:
                proc.kill()
        results[name] = (subprocess.CompletedProcess(command, proc.returncode, out, err), tmp)
    return results


def test_unknown_config_key_is_one_line_and_exit_2(processes: dict) -> None:
    """Hydra itself reports a bad override in five lines and exits 1; run.py's hook makes
    it one line naming the key, like every other bad input."""
    line = assert_bad_input(processes["unknown_key"][0])
    assert line == ("distrl: error: Could not override 'agent.optimizer.lrr': "
                    "Key 'lrr' not in 'OptimizerConfig'")


def test_wrong_type_is_one_line_and_exit_2(processes: dict) -> None:
    line = assert_bad_input(processes["wrong_type"][0])
    assert line == ("distrl: error: Error merging override total_frames=abc: Value 'abc' of "
                    "type 'str' could not be converted to Integer")


def test_unknown_agent_lists_the_agents_in_one_line(processes: dict) -> None:
    line = assert_bad_input(processes["unknown_agent"][0])
    assert line == ("distrl: error: In 'config': Could not find 'agent/nope'; available "
                    "options: apex, impala, r2d2, seed")


def test_bad_value_is_one_line_and_exit_2(processes: dict) -> None:
    result, tmp = processes["bad_value"]
    line = assert_bad_input(result)
    assert line == "distrl: error: agent.batch_size must be a positive number, got 0"
    assert not (tmp / "runs").exists()


def test_replay_larger_than_available_memory_is_refused_at_start(processes: dict) -> None:
    """10^12 CartPole transitions need ~62 TiB when full: refused before anything is
    allocated (a ring that large would be reserved lazily and killed as it filled)."""
    line = assert_bad_input(processes["replay_too_large"][0])
    assert re.fullmatch(r"distrl: error: agent\.replay_capacity=1000000000000 needs 62\.1 TiB "
                        r"when full but this machine has \d+\.\d [KMGT]iB available; the "
                        r"largest capacity that fits is \d+", line), line


def test_an_unexpected_error_exits_1_with_its_traceback(tmp_path: Path) -> None:
    """A real failure (the env raises on its 30th step) is not bad input: its traceback
    is kept for the bug report."""
    result = run_cli(tmp_path, "env.id=DistrlCrashAfter-v0", "env.imports=[crashing_env]",
                     env={"PYTHONPATH": str(REPO / "tests")})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" in result.stderr
    assert "RuntimeError: DistrlCrashAfter-v0 crashed on purpose" in result.stderr
    assert "distrl: error:" not in result.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_stops_the_run_after_its_final_checkpoint_with_128_plus_signal(
        tmp_path: Path, signum: int) -> None:
    """Once the run is training (its first report), a signal ends it with a final
    checkpoint and exit 130 (SIGINT), 143 (SIGTERM) or 138 (SIGUSR1, Slurm's warning
    before a time limit or a preemption), not 0 like a finished run; the evaluation,
    which is the finished run's, is skipped (a preemption's grace period is short)."""
    command = cli_command(tmp_path, "total_frames=1000000000", "log.interval_s=0.2",
                          "log.name=stopped", "eval.episodes=2")
    with Training(command, cwd=REPO, env=run_py_env()) as run:
        run.wait_until()
        run.proc.send_signal(signum)
        code = run.finish(timeout=ERROR_TIMEOUT_S)
    output = run.output
    assert code == 128 + signum, output
    assert f"[distrl] received signal {signum}: checkpointing and stopping" in output
    assert "Traceback" not in output, output
    final = re.findall(r"\[distrl\] checkpoint (\S+)", output)
    assert len(final) == 1, output
    assert Path(final[0]).parent == tmp_path / "runs" / "stopped" / "checkpoints"
    assert checkpoint.load(final[0])["learner"]["updates"] >= 1
    assert (f"[distrl] eval: skipped, the run was stopped by signal {int(signum)} before its "
            "budget; it evaluates when it finishes") in output
    assert "[distrl] eval: 2 episodes" not in output


# ---------------------------------------------------------------- config errors, in process


@pytest.mark.parametrize("overrides, line", [
    # every agent's main numeric settings out of range
    (("agent=impala", "agent.optimizer.lr=0"),
     "agent.optimizer.lr must be a positive number, got 0.0"),
    (("agent=impala", "agent.discount=-0.1"), "agent.discount must lie in [0, 1], got -0.1"),
    (("agent=impala", "agent.entropy_cost=-1"),
     "agent.entropy_cost must be a number >= 0, got -1.0"),
    (("agent=apex", "agent.discount=1.5"), "agent.discount must lie in [0, 1], got 1.5"),
    (("agent=apex", "agent.batch_size=0"), "agent.batch_size must be an int >= 1, got 0"),
    (("agent=apex", "agent.n_step=0"), "agent.n_step must be an int >= 1, got 0"),
    (("agent=apex", "agent.epsilon_base=1.5"),
     "agent.epsilon_base must lie in [0, 1], got 1.5"),
    (("agent=apex", "agent.replay_capacity=100"),
     "agent.replay_capacity (100) must be at least agent.batch_size (512)"),
    (("agent=apex", "agent.priority_alpha=-0.5"),
     "agent.priority_alpha must lie in [0, 1], got -0.5"),
    (("agent=r2d2", "agent.n_step=0"), "agent.n_step must be an int >= 1, got 0"),
    (("agent=r2d2", "agent.trace_length=0"), "agent.trace_length must be an int >= 1, got 0"),
    (("agent=r2d2", "agent.burn_in=-1"), "agent.burn_in must be a number >= 0, got -1"),
    (("agent=r2d2", "agent.overlap=80"),
     "agent.overlap (80) must be less than agent.trace_length (80)"),
    (("agent=r2d2", "agent.replay_capacity=10"),
     "agent.replay_capacity (10) must be at least agent.batch_size (64) and "
     "agent.learning_starts (2500)"),
    (("agent=seed", "agent.learner=dqn"), "agent.learner must be one of impala, r2d2; got 'dqn'"),
    (("agent=seed", "agent.worker_timeout_s=0"),
     "agent.worker_timeout_s must be a positive number, got 0.0"),
    # choices
    (("agent.optimizer.name=sgd",),
     "agent.optimizer.name must be one of rmsprop_tf, rmsprop, adam, adam_tf; got 'sgd'"),
    (("agent.optimizer.lr_schedule=cosine",),
     "agent.optimizer.lr_schedule must be one of linear, constant; got 'cosine'"),
    (("agent.model.torso=transformer",),
     "agent.model.torso must be one of auto, shallow, nature, resnet, minatar, mlp; "
     "got 'transformer'"),
    (("agent.device=tpu",), "agent.device must be one of auto, cpu, cuda, cuda:N; got 'tpu'"),
    (("kernel=bogus",), "kernel must be one of auto, compiled, reference; got 'bogus'"),
    (("env.protocol=atari57",), "env.protocol must be one of deepmind, machado; got 'atari57'"),
    # env, topology, run, eval, checkpoint and log settings
    (("env.frame_skip=0",), "env.frame_skip must be a positive number, got 0"),
    (("distributed.actors=-1",),
     "distributed.actors must be auto or a whole number >= 0, got -1"),
    (("distributed.envs_per_actor=0",),
     "distributed.envs_per_actor must be auto or a whole number >= 1, got 0"),
    (("distributed.envs_per_actor=3", "distributed.env_groups=2"),
     "distributed.envs_per_actor (3) must be a multiple of distributed.env_groups (2)"),
    (("seed=-1",), "seed must be a number >= 0, got -1"),
    (("eval.episodes=-1",), "eval.episodes must be a number >= 0, got -1"),
    (("eval.epsilon=2",), "eval.epsilon must lie in [0, 1], got 2.0"),
    (("checkpoint.keep=0",), "checkpoint.keep must be a positive number, got 0"),
    (("checkpoint.interval_s=0",), "checkpoint.interval_s must be a positive number, got 0.0"),
    (("log.progress=fancy",), "log.progress must be one of auto, bar, lines; got 'fancy'"),
    # what Hydra refuses while composing the config
    (("agent.optimizer.lrr=1",),
     "Could not override 'agent.optimizer.lrr': Key 'lrr' not in 'OptimizerConfig'"),
    (("distributed.nonsense=1",),
     "Could not override 'distributed.nonsense': Key 'nonsense' not in 'DistributedConfig'"),
    (("distributed.actors=abc",),
     "distributed.actors must be auto or a whole number >= 0, got 'abc'"),
    (("agent.optimizer.lr=null",),
     "Error merging override agent.optimizer.lr=null: field 'agent.optimizer.lr' is not "
     "Optional"),
    (("env=NotAGame",),
     "In 'config': Could not find 'env/NotAGame'; available options: CartPole, "
     "CartPoleNoVelocity, MinAtar-Asterix, MinAtar-Breakout, MinAtar-Freeway, "
     "MinAtar-Seaquest, MinAtar-SpaceInvaders, or any Atari game by its ALE name "
     "(e.g. Breakout, MsPacman)"),
    (("env=Breakuot",),
     "In 'config': Could not find 'env/Breakuot'; available options: CartPole, "
     "CartPoleNoVelocity, MinAtar-Asterix, MinAtar-Breakout, MinAtar-Freeway, "
     "MinAtar-Seaquest, MinAtar-SpaceInvaders, or any Atari game by its ALE name "
     "(e.g. Breakout, MsPacman); did you mean Breakout?"),
    (("+experiment=nope",),
     "In 'config': Could not find 'experiment/nope'; available options: apex_cartpole, "
     "atari_short_apex, atari_short_appo, atari_short_impala, atari_short_r2d2, "
     "atari_short_seed, atari_short_seed_appo, atari_short_seed_r2d2, "
     "minatar_apex, minatar_impala, minatar_r2d2, "
     "minatar_seed, minatar_seed_r2d2, r2d2_cartpole, seed_r2d2_cartpole"),
    (("seed=[",), "cannot parse the override 'seed=[': no viable alternative at input '['"),
    # a game's id under another family's group would keep that group's budget and settings
    (("env.id=ALE/MsPacman-v5",),
     "env.id: 'ALE/MsPacman-v5' is an Atari game, but env=CartPole chose the other settings "
     "(env, budget, the agent's settings for CartPole); choose the game's own group: "
     "env=MsPacman"),
    (("env=MinAtar-Breakout", "env.id=Pong"),
     "env.id: 'Pong' is an Atari game, but env=MinAtar-Breakout chose the other settings "
     "(env, budget, the agent's settings for MinAtar-Breakout); choose the game's own group: "
     "env=Pong"),
    (("env.id=MinAtar-Breakout",),
     "env.id: 'MinAtar-Breakout' is a MinAtar game, but env=CartPole chose the other settings "
     "(env, budget, the agent's settings for CartPole); choose the game's own group: "
     "env=MinAtar-Breakout"),
    (("env.id=MinAtar/Breakout-v1",),  # the gym spelling names its group, not itself
     "env.id: 'MinAtar/Breakout-v1' is a MinAtar game, but env=CartPole chose the other "
     "settings (env, budget, the agent's settings for CartPole); choose the game's own "
     "group: env=MinAtar-Breakout"),
    (("env.id=MinAtar/Pacman-v1",),  # no such game: named with the five there are
     "env.id: 'MinAtar/Pacman-v1' names no MinAtar game; expected one of MinAtar-Asterix, "
     "MinAtar-Breakout, MinAtar-Freeway, MinAtar-Seaquest, MinAtar-SpaceInvaders (or "
     "MinAtar/<Game>-v0, all actions, or -v1, the minimal set)"),

    # ...and passes where the group is of the id's family, or the id is no game: the next
    # check speaks
    (("env=Pong", "env.id=Breakout", "total_frames=0"),
     "total_frames must be a positive number, got 0"),
    (("env.id=Acrobot-v1", "total_frames=0"), "total_frames must be a positive number, got 0"),
])
def test_bad_setting_is_one_line_naming_it(run_py_child: RunPyChild, tmp_path: Path,
                                           overrides: tuple[str, ...], line: str) -> None:
    result = run_py_child.run(tmp_path / "runs", *overrides)
    assert assert_bad_input(result) == f"distrl: error: {line}"
    assert not (tmp_path / "runs").exists(), "a run directory was created for bad input"


@pytest.mark.parametrize(
    "field, value",
    [
        ("agent.batch_size", "0"),
        ("agent.unroll_length", "-5"),
        ("agent.optimizer.lr", "-1"),
        ("distributed.env_threads", "0"),
        ("total_frames", "0"),
        ("log.interval_s", "0"),
    ],
)
def test_non_positive_size_or_rate_names_field(run_py_child: RunPyChild,
                                               tmp_path: Path, field: str, value: str) -> None:
    result = run_py_child.run(tmp_path / "runs", f"{field}={value}")
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
def test_nan_or_inf_is_refused_by_name(run_py_child: RunPyChild, tmp_path: Path,
                                       overrides: tuple[str, ...], field: str,
                                       value: str) -> None:
    """nan passes every range check (nan <= 0 is False): without a finite check an lr of
    nan would train to garbage and exit 0."""
    result = run_py_child.run(tmp_path / "runs", *overrides)
    line = assert_bad_input(result)
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
def test_log_name_must_stay_inside_log_dir(run_py_child: RunPyChild, tmp_path: Path,
                                           name: str) -> None:
    result = run_py_child.run(tmp_path / "logs" / "runs", f"log.name={name}")
    assert_distrl_error(result, "log.name must be one plain directory name inside log.dir",
                        repr(name))
    assert not (tmp_path / "logs").exists() and not Path("/abs/run").exists()


def test_unknown_env_id_names_field_and_examples(run_py_child: RunPyChild,
                                                 tmp_path: Path) -> None:
    result = run_py_child.run(tmp_path / "runs", "env.id=NotAnEnv-v0")
    assert_distrl_error(result, "env.id", "'NotAnEnv-v0'", "CartPole-v1", "Atari")
    assert not (tmp_path / "runs").exists(), "a run directory was created for a bad env id"


# ---------------------------------------------------------------- errors found at start


@pytest.mark.parametrize("overrides, line", [
    (("agent.batch_size=33",),
     "agent.batch_size (33) must be a multiple of the envs per group, "
     "distributed.envs_per_actor / distributed.env_groups = 32"),
    (("distributed.slots=1",),
     "distributed.slots (1) must be at least one batch (1) plus one per env group (1)"),
    (("eval.epsilon=0.1",),
     "eval.epsilon applies to the Q-learning agents (apex, r2d2); impala is evaluated "
     "sampling its own policy, so leave it unset, got 0.1"),
])
def test_contradicting_settings_are_one_line(run_py_child: RunPyChild,
                                             tmp_path: Path, overrides: tuple[str, ...],
                                             line: str) -> None:
    result = run_py_child.run(tmp_path / "runs", *overrides)
    assert assert_bad_input(result) == f"distrl: error: {line}"


@pytest.mark.parametrize("overrides, pattern", [
    (("agent=r2d2", "agent.replay_capacity=1000000000"),
     r"agent\.replay_capacity=1000000000 needs 12\.0 TiB when full but this machine has "
     r"\d+\.\d [KMGT]iB available; the largest capacity that fits is \d+"),
    (("agent=seed", "agent.learner=r2d2", "agent.r2d2.replay_capacity=1000000000"),
     r"agent\.r2d2\.replay_capacity=1000000000 needs 12\.0 TiB when full but this machine "
     r"has \d+\.\d [KMGT]iB available; the largest capacity that fits is \d+"),
    (("distributed.slots=100000000",),
     r"out of memory allocating the unroll slots \(100000000 slots \(distributed\.slots\) of "
     r"agent\.unroll_length=20 steps x 32 envs = 2\.7 TiB, but this machine has "
     r"\d+\.\d [KMGT]iB available\); lower distributed\.slots, agent\.unroll_length or "
     r"distributed\.envs_per_actor"),
])
def test_sizes_this_machine_cannot_hold_are_one_line(run_py_child: RunPyChild,
                                                     tmp_path: Path, overrides: tuple[str, ...],
                                                     pattern: str) -> None:
    """Nothing is allocated: the sizes are computed and compared with MemAvailable."""
    line = assert_bad_input(run_py_child.run(tmp_path / "runs", *overrides))
    assert re.fullmatch(f"distrl: error: {pattern}", line), line


# ---------------------------------------------------------------- checkpoint errors


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny run ``run1`` with one checkpoint (``python run.py`` exits 0); tests
    work on copies of it."""
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
    checkpoint_file = run1 / "checkpoints" / "checkpoint-000000000004.pt"
    os.utime(checkpoint_file, ns=(0, 0))
    assert snapshot(run1) != before


def test_resume_from_garbage_file(run_py_child: RunPyChild, run1: Path,
                                  tmp_path: Path) -> None:
    before = snapshot(run1)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(bytes(range(256)) * 4)
    result = run_py_child.run(tmp_path / "runs", f"resume={garbage}")
    assert_distrl_error(result, "resume", str(garbage), "cannot read checkpoint")
    assert snapshot(run1) == before


def test_resume_from_truncated_checkpoint(run_py_child: RunPyChild, run1: Path,
                                          tmp_path: Path) -> None:
    before = snapshot(run1)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes((run1 / "checkpoints" / "checkpoint-000000000004.pt").read_bytes()[:4096])
    result = run_py_child.run(tmp_path / "runs", f"resume={truncated}")
    assert_distrl_error(result, "resume", str(truncated), "cannot read checkpoint")
    assert snapshot(run1) == before


def test_resume_from_a_file_that_is_no_checkpoint(run_py_child: RunPyChild,
                                                  tmp_path: Path) -> None:
    other = tmp_path / "weights.pt"
    torch.save({"weights": torch.zeros(3)}, other)
    result = run_py_child.run(tmp_path / "runs", f"resume={other}")
    assert assert_bad_input(result) == \
        f"distrl: error: resume: '{other}' is not a distrl checkpoint"


def test_resume_from_missing_path(run_py_child: RunPyChild, run1: Path,
                                  tmp_path: Path) -> None:
    before = snapshot(run1)
    missing = tmp_path / "no-such-checkpoint.pt"
    result = run_py_child.run(tmp_path / "runs", f"resume={missing}")
    assert_distrl_error(result, "resume", str(missing), "does not exist")
    assert snapshot(run1) == before
    assert not missing.exists()


def test_resume_of_another_agents_checkpoint(run_py_child: RunPyChild, run1: Path,
                                             tmp_path: Path) -> None:
    before = snapshot(run1)
    result = run_py_child.run(tmp_path / "runs", "agent=apex", f"resume={run1}")
    assert assert_bad_input(result) == (
        "distrl: error: agent.name: this run was started with 'impala', the command line "
        "gives 'apex'; agent.name cannot change on resume: the checkpoint holds this agent's "
        "learner; start a new run (another log.name) for another agent")
    assert snapshot(run1) == before


def test_fresh_run_over_existing_run_is_refused(run_py_child: RunPyChild, run1: Path,
                                                tmp_path: Path) -> None:
    before = snapshot(run1)
    result = run_py_child.run(tmp_path / "runs", "log.name=run1")
    assert_distrl_error(result, "log.name", "already holds checkpoints", f"resume={run1}")
    assert snapshot(run1) == before


def test_resume_with_invalid_override(run_py_child: RunPyChild, run1: Path,
                                      tmp_path: Path) -> None:
    before = snapshot(run1)
    result = run_py_child.run(tmp_path / "runs", f"resume={run1}", "agent.batch_size=0")
    assert_distrl_error(result, "agent.batch_size", "positive")
    assert snapshot(run1) == before


def test_resume_with_other_model_shape(run_py_child: RunPyChild, run1: Path,
                                       tmp_path: Path) -> None:
    before = snapshot(run1)
    # Named in resume_overrides, so that the checkpoint itself is what refuses it.
    result = run_py_child.run(tmp_path / "runs", f"resume={run1}",
                            "agent.model.hidden_size=64",
                            "resume_overrides=[agent.model.hidden_size]")
    assert snapshot(run1) == before
    assert assert_bad_input(result).startswith(
        "distrl: error: resume: checkpoint does not fit this run (agent.model and the replay "
        "settings must match the checkpoint's config): ")


def test_resume_with_other_optimizer(run_py_child: RunPyChild, run1: Path,
                                     tmp_path: Path) -> None:
    before = snapshot(run1)
    # More frames than the run has done, so the resumed run would train.
    result = run_py_child.run(tmp_path / "runs", f"resume={run1}",
                            "agent.optimizer.name=adam", "total_frames=5120",
                            "resume_overrides=[agent.optimizer.name,total_frames]")
    assert snapshot(run1 / "checkpoints") == snapshot_subset(before, "checkpoints")
    # The checkpoint's own check refuses it (IMPALA's default optimizer is TF's RMSProp),
    # not the settings merge, which resume_overrides let through.
    assert assert_bad_input(result) == ("distrl: error: resume: checkpoint was trained with "
                                        "agent.optimizer.name='rmsprop_tf', not 'adam'")
    assert snapshot(run1) == before


# ---------------------------------------------------------------- resume=auto


def test_resume_auto_starts_a_named_run_then_continues_it_past_a_damaged_checkpoint(
        run_py_child: RunPyChild, tmp_path: Path) -> None:
    """The same command started again (a launcher's restart) continues the same run: its
    counters go on, one run directory; a damaged newest checkpoint is skipped by name."""
    runs = tmp_path / "runs"
    checkpoints = runs / "job" / "checkpoints"
    first = run_py_child.run(runs, "resume=auto", "log.name=job")
    assert first.returncode == 0, first.stdout + first.stderr
    assert (f"[distrl] resume=auto: no checkpoint in {runs / 'job'}, starting the run there"
            in first.stdout)
    grown = ("resume=auto", "log.name=job", "resume_overrides=[total_frames]")
    second = run_py_child.run(runs, *grown, "total_frames=5120")
    assert second.returncode == 0, second.stdout + second.stderr
    assert (f"[distrl] resume=auto: continuing {runs / 'job'} from its newest intact "
            f"checkpoint" in second.stdout)
    state = checkpoint.load(checkpoints / "checkpoint-000000000008.pt")
    assert (state["counters"]["frames"], state["learner"]["updates"]) == (5120, 8)
    (checkpoints / "checkpoint-000000000008.pt").write_bytes(b"damaged")
    third = run_py_child.run(runs, *grown, "total_frames=7680")
    assert third.returncode == 0, third.stdout + third.stderr
    assert f"resume: skipped {checkpoints / 'checkpoint-000000000008.pt'}" in third.stdout
    assert (f"resume: resuming from {checkpoints / 'checkpoint-000000000004.pt'}, the "
            f"newest intact checkpoint" in third.stdout)
    state = checkpoint.load(checkpoints / "checkpoint-000000000012.pt")
    assert (state["counters"]["frames"], state["learner"]["updates"]) == (7680, 12)
    assert [p.name for p in runs.iterdir()] == ["job"]


def test_slurms_sigusr1_stops_a_run_with_138_and_the_same_command_continues_it(
        tmp_path: Path) -> None:
    """Preemption as Slurm warns of it (``--signal=USR1@120``): the run checkpoints and
    exits 138, "stopped, resume me"; the same command started again (a requeued job)
    continues from that checkpoint to the end of its budget, in the same run directory."""
    command = cli_command(tmp_path, "resume=auto", "log.name=preempted", "total_frames=64000",
                          "log.interval_s=0.2", "eval.episodes=2")
    with Training(command, cwd=REPO, env=run_py_env()) as run:
        run.wait_until()
        run.proc.send_signal(signal.SIGUSR1)
        code = run.finish(timeout=ERROR_TIMEOUT_S)
    output = run.output
    assert code == 138, output
    assert f"[distrl] received signal {int(signal.SIGUSR1)}: checkpointing" in output
    stopped = checkpoint.load(re.findall(r"\[distrl\] checkpoint (\S+)", output)[-1])
    assert 0 < stopped["counters"]["frames"] < 64000
    again = subprocess.run(command, cwd=REPO, env=run_py_env(), capture_output=True,
                           text=True, timeout=TRAIN_TIMEOUT_S)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    run_dir = tmp_path / "runs" / "preempted"
    assert (f"[distrl] resume=auto: continuing {run_dir} from its newest intact checkpoint"
            in again.stdout)
    final = checkpoint.load(checkpoint.list_checkpoints(run_dir / "checkpoints")[-1])
    assert final["counters"]["frames"] == 64000
    assert final["learner"]["updates"] == 64000 // 640 > stopped["learner"]["updates"]
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["preempted"]
    assert "[distrl] eval: skipped" in output  # the stopped part did not evaluate
    assert "[distrl] eval: 2 episodes" in again.stdout  # the finished run did


def test_resume_auto_without_a_name_a_restart_would_find_is_one_line(
        run_py_child: RunPyChild, tmp_path: Path) -> None:
    result = run_py_child.run(tmp_path / "runs", "resume=auto")
    assert assert_bad_input(result) == (
        "distrl: error: resume=auto needs a run directory that a restart finds again: set "
        "log.name, or start under torchrun (TORCHELASTIC_RUN_ID) or Slurm (SLURM_JOB_ID)")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name, environ, expected", [
    ("mine", {"TORCHELASTIC_RUN_ID": "r7", "SLURM_JOB_ID": "42"}, "mine"),
    ("", {"TORCHELASTIC_RUN_ID": "r7", "SLURM_JOB_ID": "42"}, "torchrun-r7"),
    ("", {"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "42"}, "slurm-42"),
    ("", {"SLURM_JOB_ID": "42"}, "slurm-42"),
])
def test_resume_auto_names_the_run_by_what_a_restart_keeps(name: str, environ: dict[str, str],
                                                           expected: str) -> None:
    assert auto_run_dir("/runs", name, environ) == (expected, Path("/runs") / expected)


# ---------------------------------------------------------------- sweeps (-m)


def _sweep(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(REPO / "run.py"), "-m", *TINY_RUN,
               f"log.dir={tmp_path / 'runs'}", "log.tensorboard=false", *overrides,
               f"hydra.sweep.dir={tmp_path / 'multirun'}"]
    return subprocess.run(command, cwd=REPO, env=run_py_env(), capture_output=True, text=True,
                          timeout=TRAIN_TIMEOUT_S)


def test_a_sweep_runs_each_job_to_its_own_run_directory(tmp_path: Path) -> None:
    result = _sweep(tmp_path, "seed=0,1")
    assert result.returncode == 0, result.stdout + result.stderr
    runs = sorted((tmp_path / "runs").iterdir())
    assert [run.name.split("-")[3] for run in runs] == ["seed0", "seed1"], runs
    for seed, run in enumerate(runs):
        saved = checkpoint.load(checkpoint.list_checkpoints(run / "checkpoints")[-1])
        assert yaml.safe_load(saved["config"])["seed"] == seed
        assert saved["counters"]["frames"] == 2560  # each job ran its whole budget


def test_a_sweep_job_with_bad_input_ends_the_sweep_with_exit_2(tmp_path: Path) -> None:
    """The first job trains; the second's bad batch size is one line and exit 2."""
    result = _sweep(tmp_path, "agent.batch_size=32,0")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "distrl: error: agent.batch_size must be a positive number, got 0" in result.stderr
    assert "Traceback" not in result.stderr
    (run,) = (tmp_path / "runs").iterdir()
    assert checkpoint.list_checkpoints(run / "checkpoints")


def test_resume_naming_the_default_env_group_is_refused_for_another_env(
        run_py_child: RunPyChild, tmp_path: Path) -> None:
    """A run of CartPoleNoVelocity resumed with ``env=CartPole``, the default group: no
    setting of the command line differs from the defaults, so only the group named on it
    tells that another env was asked for; it is refused as another env.id is."""
    runs = tmp_path / "runs"
    assert run_py_child.run(runs, "env=CartPoleNoVelocity", "log.name=nv").returncode == 0
    before = snapshot(runs / "nv")
    result = run_py_child.run(runs, "env=CartPole", f"resume={runs / 'nv'}")
    assert assert_bad_input(result) == (
        "distrl: error: env.id: this run was started with 'CartPoleNoVelocity-v1', the "
        "command line gives 'CartPole-v1'; to change it on resume add it to "
        "resume_overrides, e.g. resume_overrides=[env.id]")
    assert snapshot(runs / "nv") == before
