"""A run's directory and its checkpoints: where a run writes (locked for its one owner),
what resuming loads, and turning a checkpoint that does not fit the run into an error that
names the setting."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from distrl.config import OptimizerConfig
from distrl.run import checkpoint, run_lock
from distrl.run.run_settings import RunSettings
from distrl.training.learner import Learner, rebase_lr_schedule
from distrl.transport import distributed
from distrl.validation import ConfigError

CHECKPOINT_FORMAT = 1


def default_run_name(agent_name: str, env_id: str, seed: int, job: int | None = None) -> str:
    """A run's directory name when ``log.name`` is empty: ``<agent>-<env>-seed<seed>-<start
    time>``, and ``-job<N>`` for job N of a Hydra sweep (``-m``), whose jobs may start in the
    same second with the same seed."""
    name = f"{agent_name}-{env_id.replace('/', '_')}-seed{seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    return name if job is None else f"{name}-job{job}"


def make_run_dir(settings: RunSettings, agent_name: str, owner: contextlib.ExitStack
                 ) -> tuple[Path, checkpoint.Checkpoint | None]:
    """The run directory, locked for this run until ``owner`` closes (a directory another
    live run holds is a ConfigError), and, when resuming, the checkpoint loaded from it."""
    if settings.resume:
        newest = checkpoint.resolve(settings.resume)
        run_dir = newest.parent.parent if newest.parent.name == "checkpoints" else newest.parent
        owner.enter_context(run_lock.take(run_dir, "resume"))
        state = checkpoint.load(settings.resume)
        if state.get("agent") != agent_name:
            raise checkpoint.CheckpointError(
                f"resume: checkpoint '{state.path}' is from agent {state.get('agent')!r}, "
                f"not {agent_name!r}"
            )
        return run_dir, state
    name = settings.log.name or default_run_name(agent_name, settings.env.id, settings.seed)
    run_dir = Path(settings.log.dir) / name
    owner.enter_context(run_lock.take(run_dir, "log.name"))
    if checkpoint.list_checkpoints(run_dir / "checkpoints"):
        raise ConfigError(
            f"log.name: run directory '{run_dir}' already holds checkpoints; "
            f"pass resume={run_dir} to continue it or choose another log.name"
        )
    return run_dir, None


class RefusedOnRank0(Exception):
    """Rank 0 refused the run (its run directory or checkpoint, bad input it reports
    itself); the other learner ranks leave quietly, so that torchrun lets rank 0 end with
    its one error line and exit 2 instead of stopping it when another rank fails first."""


def run_dir_for_ranks(settings: RunSettings, agent_name: str, ranks: distributed.RankInfo | None,
                      owner: contextlib.ExitStack
                      ) -> tuple[Path, checkpoint.Checkpoint | None]:
    """:func:`make_run_dir` on rank 0 (which holds the lock until ``owner`` closes), the
    same directory on every other rank, which loads the checkpoint file rank 0 chose
    (rank 0 may have skipped a damaged newest one); a checkpoint written by another
    number of learner ranks is refused. When rank 0 refuses the run (a run directory in
    use, a damaged checkpoint), the other ranks raise :class:`RefusedOnRank0`."""
    resumed: checkpoint.Checkpoint | None = None
    refused: ConfigError | checkpoint.CheckpointError | None = None
    if ranks is None or ranks.is_main:
        try:
            run_dir, resumed = make_run_dir(settings, agent_name, owner)
            chosen = (str(run_dir), str(resumed.path) if resumed is not None else None, "")
        except (ConfigError, checkpoint.CheckpointError) as error:
            if ranks is None:
                raise
            refused, chosen = error, ("", None, str(error))
    else:
        chosen = ("", None, "")
    run_dir_name, resumed_path, refusal = distributed.from_rank_0(chosen, ranks)
    if refused is not None:
        raise refused
    if refusal:
        raise RefusedOnRank0(refusal)
    run_dir = Path(run_dir_name)
    if resumed is None and resumed_path is not None:
        resumed = checkpoint.load(resumed_path)
    world = ranks.learners if ranks is not None else 1
    if resumed is not None and resumed.get("world_size", 1) != world:
        raise checkpoint.CheckpointError(
            f"resume: checkpoint '{resumed.path}' was written by "
            f"{resumed.get('world_size', 1)} learner rank(s), this run has {world}; relaunch "
            "with the same torchrun --nproc_per_node/--nnodes (replay shards and batches are "
            "per rank)")
    return run_dir, resumed


def restore_learner(learner: Learner, state: dict[str, Any], opt: OptimizerConfig,
                    *extra: tuple[Any, str]) -> None:
    """Load a checkpoint's learner (and each ``(object, key)`` of ``extra``), turning a
    mismatch into a :class:`CheckpointError` that names the setting to fix; the lr
    schedule is then rebased on this run's ``opt.lr`` (:func:`rebase_lr_schedule`)."""
    saved_optimizer = state.get("optimizer_name")
    if saved_optimizer != opt.name:
        raise checkpoint.CheckpointError(
            f"resume: checkpoint was trained with agent.optimizer.name={saved_optimizer!r}, "
            f"not {opt.name!r}"
        )
    try:
        learner.load_state_dict(state["learner"])
        for target, key in extra:
            target.load_state_dict(state[key])
    except (RuntimeError, KeyError, ValueError) as error:
        detail = next((line.strip() for line in str(error).splitlines()
                       if "size mismatch" in line or "Missing" in line), str(error))
        raise checkpoint.CheckpointError(
            "resume: checkpoint does not fit this run (agent.model and the replay settings "
            f"must match the checkpoint's config): {detail}"
        ) from None
    rebase_lr_schedule(learner.scheduler, opt.lr)


def final_checkpoint(resumed: checkpoint.Checkpoint | None, updates: int,
                     save: Callable[[], Path], announce: bool = True) -> Path:
    """Write the last checkpoint, unless a resumed run did no update (then leave the one it
    resumed from as is)."""
    if resumed is not None and updates == resumed["learner"]["updates"]:
        final = resumed.path
    else:
        final = save()
    if announce:
        print(f"[distrl] checkpoint {final}", flush=True)
    return final
