"""The run's settings beside the agent's: topology, logging, checkpoints, seed, budget."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from distrl.config import CheckpointConfig, DistributedConfig, EnvConfig, EvalConfig, LogConfig
from distrl.envs.minatar_envs import is_minatar
from distrl.transport import distributed


@dataclass(frozen=True)
class Conventions:
    """An agent's paper's choices for what a run's settings leave open (``None``): each
    agent file declares its own (``CONVENTIONS``) with the source beside each value.

    terminal_on_life_loss: on Atari a lost life ends the learner's episode.
    full_action_space: on Atari under the DeepMind protocol, act on all 18 actions rather
      than the game's minimal set (the Machado protocol and ``env.full_action_space``
      decide where set; MinAtar and gymnasium ids keep their own).
    eval_epsilon: the final evaluation acts epsilon-greedily with this; None: it samples
      the agent's own policy (the actor-critic agents).
    """

    terminal_on_life_loss: bool = False
    full_action_space: bool = False
    eval_epsilon: float | None = None


@dataclass
class RunSettings:
    """Topology, logging and checkpoint settings plus the run's identity."""

    env: EnvConfig
    distributed: DistributedConfig
    log: LogConfig
    checkpoint: CheckpointConfig
    seed: int
    total_frames: int
    resume: str | None = None
    config_text: str = ""  # the resolved config, stored in tensorboard and checkpoints
    kernel: str = "auto"  # compiled ops or the torch reference (distrl.ops)
    stop_at_return: float | None = None  # end once the last 20 episodes' mean reaches it
    evaluation: EvalConfig = dataclasses.field(default_factory=EvalConfig)  # after the run

    @classmethod
    def from_config(cls, cfg: Any, conventions: Conventions | None = None) -> RunSettings:
        """The settings of a :class:`distrl.config.RunConfig` (typed or an OmegaConf node),
        with the agent's paper's ``conventions`` taken where the run leaves a choice open:
        ``env.terminal_on_life_loss``, ``env.full_action_space`` (Atari, DeepMind protocol)
        and ``eval.epsilon`` when they are None."""
        conventions = conventions or Conventions()
        env = cfg.env if isinstance(cfg.env, EnvConfig) else OmegaConf.to_object(cfg.env)
        if env.terminal_on_life_loss is None:
            env = dataclasses.replace(env, terminal_on_life_loss=conventions.terminal_on_life_loss)
        if (env.full_action_space is None and env.protocol == "deepmind"
                and not is_minatar(env.id)):
            env = dataclasses.replace(env, full_action_space=conventions.full_action_space)
        evaluation = (cfg.eval if isinstance(cfg.eval, EvalConfig)
                      else OmegaConf.to_object(cfg.eval))
        if evaluation.epsilon is None:
            evaluation = dataclasses.replace(evaluation, epsilon=conventions.eval_epsilon)
        return cls(env=env, distributed=cfg.distributed, log=cfg.log,
                   checkpoint=cfg.checkpoint, seed=cfg.seed, total_frames=cfg.total_frames,
                   resume=cfg.resume, config_text=OmegaConf.to_yaml(OmegaConf.structured(cfg)),
                   kernel=cfg.kernel, stop_at_return=cfg.stop_at_return,
                   evaluation=evaluation)

    @property
    def local_envs(self) -> int:
        """Envs this rank's actors step: envs_per_actor for each actor (one, in process)."""
        return max(self.distributed.actors, 1) * self.distributed.envs_per_actor

    @property
    def envs_per_group(self) -> int:
        """Envs one env group steps as a batch: envs_per_actor / env_groups."""
        return self.distributed.envs_per_actor // self.distributed.env_groups


def settings_for_rank(settings: RunSettings, ranks: distributed.RankInfo | None) -> RunSettings:
    """The settings a rank's actors use: another seed per rank, so ranks play other episodes."""
    if ranks is None:
        return settings
    return dataclasses.replace(settings, seed=settings.seed + 7_919 * ranks.rank)


def seed_everything(seed: int) -> None:
    """Seed Python, numpy (which takes only 32 bits) and torch from one integer."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed % 2**63)
