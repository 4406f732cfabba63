"""A resumed run's settings: the ones its checkpoint stores, changed only where the command
line gives another value and ``resume_overrides`` names it; and the learning rate those
settings give the optimizer restored from the checkpoint.

``python run.py resume=<run dir>`` composes Hydra's defaults, so without this the run would
continue with the default topology, budget and lr schedule. Here the stored config is the
run's config; a setting the command line *gives* (a dotted key, or a value a config group or
preset such as ``agent=apex`` or ``+experiment=...`` sets beyond the agent's own defaults)
must equal the stored one, be named in ``resume_overrides`` (then it changes, and is
logged), or be one of :data:`FREE` (settings of the machine, of reporting and of
checkpointing, which do not change what is learned). A ``distributed`` size given as
``auto`` keeps the number auto sizing chose when the run started. ``log.dir`` and
``log.name`` become the directory the checkpoint is in (a run directory may have been
moved), and a given one that points elsewhere is refused.

``resume=auto`` is for a command that is started again as it was (torchrun's
``--max-restarts``, a requeued cluster job): the run directory is ``log.dir/log.name``, or,
without a name, ``log.dir`` and torchrun's run id (``TORCHELASTIC_RUN_ID``) or Slurm's job
id (``SLURM_JOB_ID``), which stay the same across restarts; with a checkpoint there the
run continues from it as ``resume=<run dir>`` does, else it starts there.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from distrl.run import checkpoint
from distrl.validation import AUTO_FIELDS, ConfigError, is_auto

# Settings that may differ from the stored ones without being named, each with why: they
# decide where and how the run reports, saves, evaluates or runs, not what it learns.
FREE = {
    "log.interval_s": "how often the console line is printed",
    "log.tensorboard": "whether scalars are written",
    "log.progress": "how the console shows the run's progress",
    "checkpoint.*": "when checkpoints are written and what they hold, not what is learned",
    "eval.*": "played after training on the final weights",
    "stop_at_return": "an extra stopping condition; unlike total_frames it sets no schedule",
    "kernel": "the compiled ops and the torch reference compute the same numbers",
    "distributed.learner_threads": "the machine's cores",
    "distributed.actor_threads": "the machine's cores",
    "distributed.env_threads": "the machine's cores",
    "distributed.start_timeout_s": "the machine's speed",
    "distributed.keep_freed_memory": "how the learner process reuses memory, not what it learns",
    "agent.device": "the machine's devices (a run may move to a GPU)",
    "agent.*.device": "the machine's devices (a run may move to a GPU)",
}
# Settings that no override list can change on resume, and why.
FIXED = {
    "agent.name": "the checkpoint holds this agent's learner; start a new run (another "
                  "log.name) for another agent",
    # set from the directory the checkpoint is in (merge_resumed)
    "log.dir": "a resumed run writes into the directory of the checkpoint it resumes",
    "log.name": "a resumed run writes into the directory of the checkpoint it resumes",
}
# Always the command line's: they say how this run resumes.
COMMAND_LINE = ("resume", "resume_overrides")
AUTO_RESUME = "auto"
# Names that stay the same when a launcher starts the same command again, in this order.
RESTART_STABLE_NAMES = (("TORCHELASTIC_RUN_ID", "torchrun-{}"), ("SLURM_JOB_ID", "slurm-{}"))
# How often a launcher started the same command again: torchrun's restarts of its worker
# group (--max-restarts) and Slurm's requeues.
RESTART_COUNTS = ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")

# A config group chosen on the command line gives the leaf that names the choice.
GROUP_LEAVES = {"agent": "agent.name", "env": "env.id"}


def leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf of a nested dict (a plain container) by its dotted path; lists are leaves."""
    found: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            found.update(leaves(value, f"{path}."))
        else:
            found[path] = value
    return found


def _covers(name: str, path: str) -> bool:
    """Whether ``name`` (a setting or a group of them, as ``agent.optimizer``) holds ``path``."""
    return path == name or path.startswith(f"{name}.")


def _is_free(path: str) -> bool:
    return any(fnmatch.fnmatchcase(path, pattern) for pattern in FREE)


def _sized_at_start(path: str, old_value: Any, new_value: Any) -> bool:
    """Whether ``path`` is a ``distributed`` size given as ``auto`` that the run stored as
    the number auto chose at its start (:func:`distrl.training.sizing.resolve`): the resumed run
    keeps that topology, so the command that started a run also resumes it."""
    section, _, name = path.partition(".")
    return (section == "distributed" and name in AUTO_FIELDS and is_auto(new_value)
            and not is_auto(old_value))


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _set(tree: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for key in parents:
        tree = tree.setdefault(key, {})
    tree[last] = value


def given_leaves(composed: dict[str, Any], baseline: dict[str, Any],
                 command_line_keys: Iterable[str]) -> set[str]:
    """The leaves of ``composed`` that the command line gives: those under a key it names,
    and those whose value differs from ``baseline`` (the same agent composed without
    overrides), which is what a group or preset it chose set."""
    keys = list(command_line_keys)
    base = leaves(baseline)
    return {path for path, value in leaves(composed).items()
            if any(_covers(key, path) for key in keys)
            or path not in base or base[path] != value}


def merge_resumed(stored: dict[str, Any], composed: dict[str, Any], schema: dict[str, Any],
                  given: set[str], overrides: Sequence[str], run_dir: Path
                  ) -> tuple[dict[str, Any], list[str]]:
    """The settings of a resumed run and one log line per setting that changed.

    Args:
        stored: the config the checkpoint holds (a plain nested dict).
        composed: the config the command line composed (plain).
        schema: every setting of the stored agent, with defaults (plain): a leaf here but
            missing from ``stored`` (a setting newer than the checkpoint) is no conflict.
        given: the dotted leaves of ``composed`` the command line gives (:func:`given_leaves`).
        overrides: ``resume_overrides``: settings (or groups of them) whose given value wins.
        run_dir: the directory the checkpoint is in, where the resumed run writes: it gives
            ``log.dir`` and ``log.name`` (the stored ones are where the run started, and a
            run directory may have been moved since).

    Returns:
        ``stored`` with the accepted values, ``resume``/``resume_overrides`` from
        ``composed`` and ``log.dir``/``log.name`` from ``run_dir``, and lines
        ``[distrl] resume: <field> <old> -> <new> (<why>)``.

    Raises:
        ConfigError: a given value differs from the stored one and is neither free nor
            named; ``log.dir`` or ``log.name`` is given but is not ``run_dir``; or
            ``overrides`` names no setting, a fixed one, or one not given.
    """
    old, new, settings = leaves(stored), leaves(composed), {**leaves(schema), **leaves(stored)}
    for name in overrides:
        if name in COMMAND_LINE:
            raise ConfigError(f"resume_overrides: {name!r} is always taken from the command "
                              "line; name only settings the checkpoint stores")
        if name in FIXED:
            raise ConfigError(f"resume_overrides: {name} cannot change on resume: {FIXED[name]}")
        if not any(_covers(name, path) for path in settings):
            raise ConfigError(f"resume_overrides: {name!r} is not a setting; name settings "
                              "by their dotted path, e.g. total_frames, agent.optimizer.lr")
        if not any(_covers(name, path) for path in given):
            raise ConfigError(f"resume_overrides names {name} but the command line gives no "
                              f"value for it; add e.g. {name}=<value>")
    _check_run_dir(new, given, run_dir)
    merged = OmegaConf.to_container(OmegaConf.create(stored))
    assert isinstance(merged, dict)
    _set(merged, "log.dir", str(run_dir.parent))
    _set(merged, "log.name", run_dir.name)
    lines, conflicts = [], []
    for path in (path for path in new if path in given):
        if path in COMMAND_LINE or path in ("log.dir", "log.name"):
            continue
        if path not in settings:
            raise ConfigError(f"{path} is not a setting of this run (agent "
                              f"{old.get('agent.name')!r}, as its checkpoint stores it)")
        if path not in old or old[path] == new[path]:
            if path not in old:
                _set(merged, path, new[path])
            continue
        if not _is_free(path) and _sized_at_start(path, old[path], new[path]):
            lines.append(f"[distrl] resume: {path} {_show(old[path])} (auto chose it at the "
                         "run's start)")
            continue
        named = any(_covers(name, path) for name in overrides)
        if _is_free(path) or (named and path not in FIXED):
            _set(merged, path, new[path])
            why = "may change on resume" if _is_free(path) else "resume_overrides"
            lines.append(f"[distrl] resume: {path} {_show(old[path])} -> {_show(new[path])} "
                         f"({why})")
        else:
            conflicts.append(path)
    if conflicts:
        raise ConfigError(_conflict_message(conflicts, old, new))
    for path in COMMAND_LINE:
        merged[path] = composed.get(path, merged.get(path))
    return merged, lines


def _check_run_dir(new: dict[str, Any], given: set[str], run_dir: Path) -> None:
    """Refuse a given ``log.dir``/``log.name`` that is not where the checkpoint is: the
    run would not write where the command line says."""
    if "log.dir" in given and Path(new["log.dir"]).resolve() != run_dir.parent.resolve():
        path = "log.dir"
    elif "log.name" in given and new["log.name"] != run_dir.name:
        path = "log.name"
    else:
        return
    raise ConfigError(
        f"{path}: a resumed run writes into its checkpoint's directory '{run_dir}', the "
        f"command line gives {path}={_show(new[path])}; leave {path} out, or resume the run "
        "you mean")


def _conflict_message(conflicts: list[str], old: dict[str, Any], new: dict[str, Any]) -> str:
    """One line: the first differing setting with both values, the others by name, and how
    to accept them (or why one cannot change)."""
    first = conflicts[0]
    line = (f"{first}: this run was started with {_show(old[first])}, the command line gives "
            f"{_show(new[first])}")
    if len(conflicts) > 1:
        line += f" (also differing: {', '.join(conflicts[1:])})"
    fixed = [path for path in conflicts if path in FIXED]
    if fixed:
        return f"{line}; {fixed[0]} cannot change on resume: {FIXED[fixed[0]]}"
    names = ",".join(conflicts)
    it = "them" if len(conflicts) > 1 else "it"
    return (f"{line}; to change {it} on resume add {it} to resume_overrides, "
            f"e.g. resume_overrides=[{names}]")


def stored_config(resume: str) -> dict[str, Any]:
    """The config the checkpoint ``resume`` resolves to was written with (a plain dict).

    The file is memory-mapped, so its tensors (a replay of gigabytes) are not read; a file
    that does not load that way goes through :func:`distrl.run.checkpoint.load`, whose error
    names the problem."""
    path = checkpoint.resolve(resume)
    try:
        state = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
    except Exception:
        state = None
    if not isinstance(state, dict) or "format" not in state:
        state = checkpoint.load(resume)
    text = state.get("config")
    if not isinstance(text, str) or not text:
        raise checkpoint.CheckpointError(f"resume: checkpoint '{path}' holds no config")
    tree = OmegaConf.to_container(OmegaConf.create(text), resolve=True)
    assert isinstance(tree, dict)
    return tree


def run_dir_of(resume: str) -> Path:
    """The run directory a resumed run writes into, as :func:`distrl.training.run_dir.make_run_dir`
    finds it: the one holding ``checkpoints/``, or the checkpoint's own directory."""
    path = checkpoint.resolve(resume)
    return path.parent.parent if path.parent.name == "checkpoints" else path.parent


def _plain(cfg: DictConfig) -> dict[str, Any]:
    tree = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(tree, dict)
    return tree


def auto_run_dir(log_dir: str, log_name: str, environ: dict[str, str]) -> tuple[str, Path]:
    """``resume=auto``'s run: its name and directory (see the module's docstring)."""
    name = log_name
    for variable, pattern in RESTART_STABLE_NAMES:
        if not name and environ.get(variable) not in (None, "", "none"):
            name = pattern.format(environ[variable])
    if not name:
        raise ConfigError(
            "resume=auto needs a run directory that a restart finds again: set log.name, or "
            "start under torchrun (TORCHELASTIC_RUN_ID) or Slurm (SLURM_JOB_ID)")
    return name, Path(log_dir) / name


def launcher_restarts(environ: dict[str, str]) -> int:
    """Times a launcher (torchrun, Slurm) has started this command again (0 at its first
    start); a run logs it as ``run/restarts``."""
    return sum(int(environ.get(variable) or 0) for variable in RESTART_COUNTS)


def resolve_auto_resume(cfg: DictConfig, environ: dict[str, str]) -> DictConfig:
    """``cfg`` with ``resume=auto`` made ``resume=<run dir>`` (it holds a checkpoint) or
    a new run named as the restarts will look for it; one line says which."""
    name, run_dir = auto_run_dir(cfg.log.dir, cfg.log.name, environ)
    cfg = cfg.copy()
    cfg.log.name = name
    found = checkpoint.list_checkpoints(run_dir / "checkpoints")
    if found:
        cfg.resume = str(run_dir)
        line = f"[distrl] resume=auto: continuing {run_dir} from its newest intact checkpoint"
    else:
        cfg.resume, cfg.resume_overrides = None, []
        line = f"[distrl] resume=auto: no checkpoint in {run_dir}, starting the run there"
    if environ.get("RANK", "0") == "0":
        print(line, flush=True)
    return cfg


def settings_of_run(cfg: DictConfig) -> DictConfig:
    """run.py's hook: ``cfg`` when not resuming, else the resumed run's config (the
    checkpoint's, with the accepted command-line values; see :func:`merge_resumed`), its
    changes printed one line each; ``resume=auto`` first becomes one of the two
    (:func:`resolve_auto_resume`). Needs a running Hydra app (``@hydra.main``)."""
    if cfg.get("resume") == AUTO_RESUME:
        cfg = resolve_auto_resume(cfg, dict(os.environ))
    if not cfg.get("resume"):
        return cfg
    from hydra import compose
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    OmegaConf.to_object(cfg)  # a bad value is reported as bad before it is compared
    hydra_cfg = HydraConfig.get()
    groups = hydra_cfg.runtime.choices
    keys = []
    for override in OverridesParser.create().parse_overrides(list(hydra_cfg.overrides.task)):
        key = override.key_or_group
        if key in groups:
            keys += [GROUP_LEAVES[key]] if key in GROUP_LEAVES else []
        elif key != "hydra" and not key.startswith("hydra."):
            keys.append(key)
    name = hydra_cfg.job.config_name
    composed = _plain(cfg)
    baseline = _plain(compose(name, overrides=[f"agent={groups['agent']}"]))
    stored = stored_config(cfg.resume)
    # The stored agent's schema (agent group options are named as the agents).
    agent = stored.get("agent", {}).get("name")
    try:
        skeleton = compose(name, overrides=[f"agent={agent}"])
    except HydraException:
        raise checkpoint.CheckpointError(
            f"resume: checkpoint '{checkpoint.resolve(cfg.resume)}' is from agent {agent!r}, "
            "which this version of distrl does not have") from None
    merged, lines = merge_resumed(stored, composed, _plain(skeleton),
                                  given_leaves(composed, baseline, keys),
                                  list(cfg.resume_overrides), run_dir_of(cfg.resume))
    try:
        result = OmegaConf.merge(skeleton, merged)
    except OmegaConfBaseException as error:
        first = str(error).splitlines()[0]
        raise checkpoint.CheckpointError(
            f"resume: the config stored in '{checkpoint.resolve(cfg.resume)}' does not fit "
            f"this version of distrl: {first}") from None
    if os.environ.get("RANK", "0") == "0":  # under torchrun every rank merges; one tells
        for line in lines:
            print(line, flush=True)
    assert isinstance(result, DictConfig)
    return result
