"""What an agent plugs into the training loop: its network, policy, loss and the few
numbers that shape its experience. The two families differ only in where a learner
batch comes from: :class:`UnrollAgentParts` (IMPALA: on-policy unrolls from slots) and
:class:`ReplayAgentParts` (Ape-X, R2D2: a prioritized replay).

Every callable must be picklable (a module-level function or class, or a
``functools.partial`` of one): actor processes build their own copies. The parts are
frozen: an agent that trains with another's parts (SEED) changes its copy with
``dataclasses.replace``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import nn

from distrl.acting.actor import Policy
from distrl.config import OptimizerConfig
from distrl.replay.formats import ExperienceFormat
from distrl.training.learner import LossFn
from distrl.transport.queues import FieldSpec
from distrl.types import SequenceBatch, TransitionBatch

# (model, a new batch as the learner would sample it) -> [K] priorities
PriorityFn = Callable[[nn.Module, Any], torch.Tensor]
ReplayBatch = TransitionBatch | SequenceBatch  # what a writer flushes: items and their frames


@dataclass(frozen=True)
class UnrollAgentParts:
    """What an unroll-based agent (IMPALA) plugs into
    :func:`distrl.runners.runner.train_agent` with the unroll family."""

    name: str
    make_model: Callable[[tuple[int, ...], int], nn.Module]  # (obs_shape, num_actions) -> model
    make_policy: Callable[[nn.Module], Policy]
    loss_fn: LossFn  # (model, Unroll) -> (loss, metrics, priorities)
    policy_extras: Callable[[int], dict[str, FieldSpec]]  # num_actions -> per-step extras [..]
    unroll_length: int
    batch_size: int
    optimizer: OptimizerConfig
    device: str = "cpu"  # where the learner trains: auto, cpu, cuda, cuda:N (SEED: inference too)
    precision: str = "float32"  # the learner update's arithmetic: float32 or bfloat16 (mixed)
    # Where this agent's settings sit in the config, for messages naming one of them
    # (SEED nests its learner's under agent.impala / agent.r2d2).
    settings_path: str = "agent"
    passes: int = 1  # gradient updates per batch (sample reuse; 1 in the paper)


@dataclass(frozen=True)
class ReplayConfig:
    """The prioritized replay's settings (Schaul et al. 2016; Horgan et al. 2018)."""

    capacity: int
    learning_starts: int  # transitions stored before the first update
    alpha: float
    beta: float
    beta_final: Optional[float]
    beta_steps: int
    epsilon: float


@dataclass(frozen=True)
class ReplayAgentParts:
    """What a replay-based agent (Ape-X, R2D2) plugs into
    :func:`distrl.runners.runner.train_agent` with the replay family."""

    name: str
    make_model: Callable[[tuple[int, ...], int], nn.Module]  # (obs_shape, num_actions) -> model
    make_policy: Callable[[nn.Module, torch.Tensor], Policy]  # (model, epsilons [E]) -> policy
    exploration: Callable[[int], torch.Tensor]  # number of envs in the run -> [count] epsilons
    make_loss: Callable[[nn.Module], LossFn]  # model -> its loss (holding the target net)
    initial_priorities: PriorityFn  # computed by the actors with their network copy
    transform_rewards: Callable[[torch.Tensor], torch.Tensor]  # reward clipping, per step
    experience: ExperienceFormat  # n-step transitions or sequences
    batch_size: int  # items (transitions or sequences) per learner update
    replay: ReplayConfig
    actor_buffer: int  # steps per env an actor gathers before sending
    weight_sync_steps: int  # actor steps between weight pulls
    replay_ratio: float  # samples per inserted item; 0: uncapped (1 in one process)
    optimizer: OptimizerConfig
    device: str = "cpu"  # where the learner trains: auto, cpu, cuda, cuda:N (SEED: inference too)
    precision: str = "float32"  # the learner update's arithmetic: float32 or bfloat16 (mixed)
    # Where this agent's settings sit in the config, for messages naming one of them
    # (SEED nests its learner's under agent.impala / agent.r2d2).
    settings_path: str = "agent"
    # (acting values, batch) -> priorities, from the Q values the actor computed while
    # acting (the experience format's ``acting_values``: Ape-X's taken and bootstrap values,
    # R2D2's [K, L, A]); None: every batch takes initial_priorities
    acting_priorities: Optional[Callable[[Any, Any], torch.Tensor]] = None
