"""What a learner rank builds before it trains, the same for every agent: its run
directory (or the checkpoint it resumes), seeds, the env's shape, its device and threads,
the model (identical on every rank), the optimizer, the learner and the logger."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from distrl import ops
from distrl.config import OptimizerConfig
from distrl.envs import make_envs
from distrl.nets.torsos import channels_last_for_training
from distrl.run.malloc import apply as apply_malloc_setting
from distrl.run.run_settings import RunSettings, seed_everything, settings_for_rank
from distrl.telemetry.logging import MetricLogger
from distrl.telemetry.throughput_meter import ThroughputMeter, run_context
from distrl.training.learner import Learner, LossFn, make_lr_schedule, make_optimizer
from distrl.training.run_dir import run_dir_for_ranks
from distrl.training.sizing import machine_cores
from distrl.transport import distributed
from distrl.transport.weights import WeightStore
from distrl.validation import ConfigError, is_auto


@dataclass
class EnvProbe:
    """What the learner needs to know about the env before building anything."""

    obs_shape: tuple[int, ...]
    obs_dtype: torch.dtype
    num_actions: int
    frames_per_step: int


def probe_env(settings: RunSettings) -> EnvProbe:
    """Open one env to read its observation shape and dtype, actions and frame skip."""
    probe = make_envs(settings.env, 1, settings.seed)
    try:
        dtype = torch.from_numpy(np.zeros(0, dtype=probe.observation_dtype)).dtype
        return EnvProbe(probe.observation_shape, dtype, probe.num_actions,
                        probe.frames_per_step)
    finally:
        probe.close()


def learner_thread_count(requested: int | str, obs_shape: tuple[int, ...],
                         device: torch.device) -> int:
    """``distributed.learner_threads``, 0 or ``auto`` resolved
    (:func:`distrl.training.sizing.resolve` has already measured Atari's): 1 for a GPU
    learner and for observations too small for a convolution to split (vectors, MinAtar's
    10x10 grids), else this process's share of the cores (all of them, divided among the
    ranks that torchrun starts on this host)."""
    if not is_auto(requested) and int(requested) > 0:
        return int(requested)
    atari_sized = len(obs_shape) == 3 and min(obs_shape[1:]) >= 36
    if device.type == "cuda" or not atari_sized:
        return 1
    return machine_cores()


def check_kernel(settings: RunSettings) -> str:
    """The log line of the ops path; ``kernel=compiled`` without distrl._C is refused here,
    before anything is written."""
    try:
        return ops.kernel_summary(settings.kernel, "cpu")
    except ops.KernelError as error:
        raise ConfigError(str(error)) from None


def optimizer_for(model: nn.Module, opt: OptimizerConfig) -> torch.optim.Optimizer:
    """The optimizer ``agent.optimizer`` describes, over ``model``'s parameters."""
    return make_optimizer(
        model.parameters(), opt.name, opt.lr, alpha=opt.alpha, eps=opt.eps,
        momentum=opt.momentum, centered=opt.centered, beta1=opt.beta1, beta2=opt.beta2,
    )


@dataclass
class LearnerRank:
    """A learner rank's run directory, env, device and model (see :func:`start_learner_rank`)."""

    settings: RunSettings
    ranks: distributed.RankInfo | None  # None: one process, no torchrun
    run_dir: Path
    resumed: dict[str, Any] | None  # rank 0's checkpoint when resuming
    env: EnvProbe
    device: torch.device
    threads: int
    model: nn.Module
    malloc: str  # what distrl.run.malloc did in this process, for the start-up line

    @property
    def world(self) -> int:
        """Learner ranks in the run."""
        return self.ranks.learners if self.ranks is not None else 1

    @property
    def main(self) -> bool:
        """Rank 0 (or the only process): it writes the logs and the checkpoint."""
        return self.ranks is None or self.ranks.is_main

    def make_learner(self, loss_fn: LossFn, opt: OptimizerConfig, planned_updates: int,
                     weights: WeightStore, optimizer_path: str = "agent.optimizer",
                     passes: int = 1, precision: str = "float32") -> Learner:
        """The learner with ``agent.optimizer`` (its lr schedule spread over
        ``planned_updates``, counting every pass), making ``passes`` updates per batch in
        ``precision`` (``agent.precision``) and publishing to ``weights``; under torchrun it
        averages gradients over the learner ranks."""
        optimizer = optimizer_for(self.model, opt)
        scheduler = make_lr_schedule(optimizer, opt.lr_schedule, planned_updates)
        averager = (distributed.GradientAverager(self.model, self.ranks.group)
                    if self.ranks is not None else None)
        return Learner(self.model, loss_fn, optimizer, scheduler, opt.max_grad_norm, weights,
                       averager, self.device, opt.max_skipped_updates, optimizer_path,
                       passes, precision)

    def make_logger(self, purge_step: int | None) -> MetricLogger:
        """Rank 0 logs to tensorboard and stdout; the other ranks stay quiet. A resumed
        run's tensorboard drops what the dead run wrote after ``purge_step`` frames."""
        settings = self.settings
        logger = MetricLogger(
            str(self.run_dir) if settings.log.tensorboard and self.main else None,
            settings.log.interval_s, purge_step=purge_step,
            stream=None if self.main else open(os.devnull, "w"),  # noqa: SIM115 - lives with the run
        )
        if self.resumed is None:
            logger.text("config", f"```\n{settings.config_text}\n```")
        return logger

    def make_meter(self, serial: bool) -> ThroughputMeter:
        """The throughput meter of this rank's loop; ``serial``: its actors take turns with
        the learner in this process."""
        settings = self.settings
        context = run_context(settings.config_text, dataclasses.asdict(settings.distributed),
                              settings.env.id)
        return ThroughputMeter(context, serial, self.threads, self.device.type == "cuda")

    def announce(self, kernel_line: str, extra: str = "") -> None:
        """Rank 0 prints where the run writes, its topology and its ops path."""
        if not self.main:
            return
        dist = self.settings.distributed
        line = (f"[distrl] run_dir={self.run_dir} learner_device={self.device} "
                f"learner_threads={self.threads} actor_threads={dist.actor_threads} "
                f"env_threads={dist.env_threads} actors={dist.actors} "
                f"envs_per_actor={dist.envs_per_actor} env_groups={dist.env_groups}{extra} "
                f"{self.malloc}")
        if self.ranks is not None:
            line += (f" learner_ranks={self.world} "
                     f"actor_ranks={self.ranks.world_size - self.world} "
                     f"backend={self.ranks.backend}")
        print(line, flush=True)
        print(f"[distrl] {kernel_line}", flush=True)


def start_learner_rank(settings: RunSettings, ranks: distributed.RankInfo | None,
                       agent_name: str, device: torch.device,
                       make_model: Callable[[tuple[int, ...], int], nn.Module],
                       owner: contextlib.ExitStack) -> LearnerRank:
    """Run directory (rank 0 makes it or loads the checkpoint to resume, and holds its lock
    until ``owner`` closes), this rank's seeds (:func:`~distrl.run.run_settings.settings_for_rank`),
    the env's shape, the torch threads for ``device``, and the model, broadcast from rank 0
    so every rank starts from the same weights; the malloc setting
    (:func:`distrl.run.malloc.apply`, applied before sizing, so this call only names it)."""
    run_dir, resumed = run_dir_for_ranks(settings, agent_name, ranks, owner)
    seed_everything(settings_for_rank(settings, ranks).seed)
    env = probe_env(settings)
    threads = learner_thread_count(settings.distributed.learner_threads, env.obs_shape, device)
    torch.set_num_threads(threads)
    malloc = apply_malloc_setting(settings.distributed.keep_freed_memory)
    model = make_model(env.obs_shape, env.num_actions).to(device)
    if device.type == "cpu":
        channels_last_for_training(model)
    if ranks is not None:
        distributed.broadcast_parameters(model, group=ranks.group)
    return LearnerRank(settings, ranks, run_dir, resumed, env, device, threads, model, malloc)
