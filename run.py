"""Train an agent: ``python run.py agent=impala env=Pong`` (Hydra; ``-m seed=0,1,2`` sweeps).

Exit codes: 0 the run finished (its frame budget spent, or ``stop_at_return`` reached);
130 / 143 / 138 (128 + the signal) a SIGINT / SIGTERM / SIGUSR1 (Slurm's warning before a
time limit or preemption) stopped it after its final checkpoint: "stopped, resume me", the
same command with ``resume=auto`` continues it;
1 it failed: actors failed more often than allowed (after a final checkpoint) or the
learner diverged, told in one line, or an unexpected error, with its traceback; 2 bad
input: a setting, the command line, a checkpoint, or a size this machine cannot hold,
told in one line
``distrl: error: ...`` (under torchrun, when rank 0 refuses its run directory or
checkpoint, the other ranks exit 0 without a line, so that rank 0 is not stopped before
it says why; torchrun itself exits 1). Under ``-m`` a job that exits 2, 130, 138 or 143
ends the sweep with that code; after a job that failed, Hydra runs the remaining jobs,
then exits 1 with the failure's traceback.
"""

from __future__ import annotations

import difflib
import signal
import sys
import traceback
from typing import Any

import hydra
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

import agents
from distrl.config import ConfigError, atari_game_name, atari_game_names, register_configs
from distrl.envs import atari_rom, is_atari
from distrl.envs.minatar_envs import MINATAR_GAMES, is_minatar, minatar_game
from distrl.run.checkpoint import CheckpointError
from distrl.run.resume_settings import settings_of_run
from distrl.run.supervisor import TooManyRestarts
from distrl.training import loop
from distrl.training.learner import Diverged
from distrl.training.run_dir import RefusedOnRank0, default_run_name

register_configs()
agents.register_configs()

EXIT_FINISHED, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
BAD_INPUT = (ConfigError, CheckpointError)
# Failures a run diagnoses itself (actors failing too often after a final checkpoint, a
# diverged learner with the last good checkpoint newest): one line, exit 1.
RUN_FAILED = (TooManyRestarts, Diverged)
COMMAND_LINE_ERRORS = (HydraException, OmegaConfBaseException)  # raised by Hydra's compose


def to_run_config(cfg: DictConfig) -> object:
    """Instantiate the typed dataclasses, which validates every field."""
    return OmegaConf.to_object(cfg)


def format_error(error: BaseException) -> str:
    """One line, ``distrl: error: ...``, for a bad setting, checkpoint or command line.

    Hydra's own messages span several lines (the override, then OmegaConf's cause with
    its ``full_key`` and types, then the config search path); their first lines, which
    name the field, are kept and joined.
    """
    if isinstance(error, MissingConfigException):
        text = _first_line(error) + _available_options(error)
    elif isinstance(error, OverrideParseException):
        text = f"cannot parse the override {error.override!r}: {_first_line(error)}"
    elif isinstance(error, HydraException) and isinstance(error.__cause__,
                                                           OmegaConfBaseException):
        text = f"{_first_line(error).rstrip('.')}: {_first_line(error.__cause__)}"
    else:
        text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    return f"distrl: error: {text or type(error).__name__}"


def _available_options(error: MissingConfigException) -> str:
    """The group's options, the ~100 Atari games of ``env=`` summed up in one phrase, and
    the closest option where the name looks like a typo of one."""
    options = [o for o in error.options or () if not o.endswith("_schema")]
    if not options:
        return ""
    games = set(atari_game_names())
    listed = [o for o in options if o not in games]
    text = f"; available options: {', '.join(listed)}"
    if len(listed) < len(options):
        text += ", or any Atari game by its ALE name (e.g. Breakout, MsPacman)"
    wanted = (error.missing_cfg_file or "").rsplit("/", 1)[-1]
    close = difflib.get_close_matches(wanted, options, n=1, cutoff=0.75)
    return text + (f"; did you mean {close[0]}?" if close else "")


def _first_line(error: BaseException) -> str:
    return next((line.strip() for line in str(error).splitlines() if line.strip()), "")


def name_sweep_job(cfg: DictConfig) -> DictConfig:
    """Under ``-m`` (a Hydra sweep, whatever its launcher), a new run without ``log.name``
    is named as a single run is, plus its job number: jobs that start in the same second
    with the same seed would otherwise share a directory."""
    if cfg.log.name or cfg.get("resume"):
        return cfg
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return cfg
    cfg = cfg.copy()
    cfg.log.name = default_run_name(cfg.agent.name, cfg.env.id, cfg.seed,
                                    job=HydraConfig.get().job.num)
    return cfg


def _game_family(env_id: str) -> str | None:
    return "Atari" if is_atari(env_id) else "MinAtar" if is_minatar(env_id) else None


def check_env_group(cfg: DictConfig) -> None:
    """Refuse ``env.id`` naming an Atari or MinAtar game under another family's ``env=``
    group (CartPole's unless one is chosen): the run would keep that group's budget and its
    ``agent_env`` settings (IMPALA's CartPole learning rate), not the game's."""
    from hydra.core.hydra_config import HydraConfig

    if cfg.get("resume") or not HydraConfig.initialized():
        return
    group = HydraConfig.get().runtime.choices.get("env")
    family = _game_family(cfg.env.id)
    if group is None or family is None or _game_family(group) == family:
        return
    article = "an" if family == "Atari" else "a"
    raise ConfigError(f"env.id: {cfg.env.id!r} is {article} {family} game, but env={group} "
                      f"chose the other settings (env, budget, the agent's settings for "
                      f"{group}); choose the game's own group: env={_group_of(cfg.env.id)}")


def _group_of(env_id: str) -> str:
    """The ``env=`` group of a game's id in any spelling: "ALE/MsPacman-v5" -> MsPacman,
    "MinAtar/Breakout-v1" -> MinAtar-Breakout (an unknown MinAtar game is refused here,
    naming the five)."""
    if is_minatar(env_id):
        module, _ = minatar_game(env_id)
        return next(f"MinAtar-{name}" for name, mod in MINATAR_GAMES.items() if mod == module)
    rom = atari_rom(env_id)
    return atari_game_name(rom) if rom else env_id


def run(cfg: DictConfig) -> int:
    """Validate ``cfg``, train its agent and return the process's exit code; bad input is
    reported on stderr in one line. An unexpected error propagates with its traceback."""
    try:
        check_env_group(cfg)
        run_cfg = to_run_config(settings_of_run(name_sweep_job(cfg)))  # resume: the checkpoint's
        agents.get(run_cfg.agent.name).run(run_cfg)
    except BAD_INPUT as error:
        print(format_error(error), file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    except RefusedOnRank0:  # rank 0 says why and exits 2; torchrun's own exit is then 1
        return EXIT_FINISHED
    except RUN_FAILED as error:  # the run's own failure, its cause in one line: no traceback
        print(f"distrl: error: {error}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    except KeyboardInterrupt:  # a second signal, or one before training started
        return 128 + (loop.stop_signal() or signal.SIGINT)
    stopped_by = loop.stop_signal()
    return EXIT_FINISHED if stopped_by is None else 128 + stopped_by


@hydra.main(version_base="1.3", config_path="experiments", config_name="config")
def main(cfg: DictConfig) -> None:
    code = run(cfg)
    if code != EXIT_FINISHED:
        sys.exit(code)


def _raised_by_the_task(error: BaseException) -> bool:
    """Whether ``error`` came out of a job that :func:`main` ran (rather than out of
    Hydra parsing the command line and composing the config)."""
    return any(frame.f_code is main.__wrapped__.__code__
               for frame, _ in traceback.walk_tb(error.__traceback__))


def report_command_line_errors_in_one_line() -> None:
    """Make Hydra's command-line errors (an unknown key or config group, a value of the
    wrong type, an unparsable override) one ``distrl: error:`` line and exit 2, like every
    other bad input; Hydra itself prints several lines and exits 1.

    Hydra reports them in ``hydra._internal.utils.run_and_report``, which runs the whole
    command; it is wrapped here so that such an error is formatted first. Errors raised by
    a job itself keep Hydra's report (and traceback).
    """
    from hydra._internal import utils as hydra_utils

    hydra_report = hydra_utils.run_and_report

    def run_and_report(func: Any) -> Any:
        def one_line_command_line_errors() -> Any:
            try:
                return func()
            except COMMAND_LINE_ERRORS as error:
                if _raised_by_the_task(error):
                    raise
                print(format_error(error), file=sys.stderr, flush=True)
                sys.exit(EXIT_BAD_INPUT)
        return hydra_report(one_line_command_line_errors)

    hydra_utils.run_and_report = run_and_report


if __name__ == "__main__":
    report_command_line_errors_in_one_line()
    main()
