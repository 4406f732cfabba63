"""Ape-X DQN: distributed prioritized experience replay (Horgan et al. 2018).

Many actors, each with its own exploration rate, act with a copy of the network,
compute the initial priority of their n-step transitions themselves and send them to
one prioritized replay; the learner trains a dueling double DQN on prioritized samples
and writes the new priorities back. Read top to bottom: config -> network -> policy ->
loss -> parts -> run.

Where the rest of it lives:
- ``distrl/replay/writers.py``: the actors' n-step transitions (the writer);
  ``distrl/runners/replay_sources.py``: the actors and their initial priorities, in this
  process or in actor processes, as the learner's source of batches.
- ``distrl/replay/``: the prioritized replay (``storage.py``, ``sum_tree.py``,
  ``samplers.py``: proportional sampling and importance weights; ``buffer.py``);
  ``distrl/runners/replay_learner.py``: the replay feed, drawing the next batch while an update
  runs and writing the priorities back.
- ``distrl/rl/losses.py``: n-step double-Q targets and the Huber loss;
  ``distrl/rl/exploration.py``: the epsilon ladder.
- ``distrl/runners/replay_family.py``: the replay, its source and its checkpoint on a
  learner rank; ``distrl/runners/runner.py``: the run.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import nn

from distrl.acting.actor import PolicyOutput
from distrl.config import (
    PRECISIONS,
    ConfigError,
    ModelConfig,
    OptimizerConfig,
    check_choice,
    check_count,
    check_device,
    check_non_negative,
    check_positive,
    check_unit_interval,
)
from distrl.nets.models import DuelingQNet
from distrl.nets.side_thread import computed_now
from distrl.replay.formats import NStepFormat
from distrl.rl import losses
from distrl.rl.exploration import epsilon_greedy, epsilon_ladder
from distrl.run.run_settings import Conventions
from distrl.types import SampleBatch

if TYPE_CHECKING:
    from distrl.config import RunConfig
    from distrl.runners.runner import ProgressHook, RunSummary, StopCheck
    from distrl.training.agent_parts import ReplayAgentParts

ACTOR_PRIORITIES = ("acting", "recompute")

# ---------------------------------------------------------------- config

# Where a run leaves them open:
# - on Atari a lost life ends the learner's episode while the game goes on, the DQN
#   convention (Mnih et al. 2015) that Ape-X kept and R2D2 later disabled (Kapturowski et
#   al. 2019, Section 2: "compared to Ape-X, we ... disabled the loss-of-life-as-episode-end
#   heuristic");
# - all 18 Atari actions (Kapturowski et al. 2019, Section 2.3: "Like Ape-X, we use
#   4-frame-stacks and the full 18-action set");
# - the final evaluation acts with epsilon 0.001. Horgan et al. 2018 name no evaluation
#   epsilon; 0.001 is that of the baselines Ape-X is set beside (Rainbow, Hessel et al.
#   2018; Dopamine's epsilon_eval) and of seed_rl's Atari R2D2 (eval_epsilon).
CONVENTIONS = Conventions(terminal_on_life_loss=True, full_action_space=True,
                          eval_epsilon=0.001)


def apex_optimizer() -> OptimizerConfig:
    """Centered RMSProp, lr 0.00025 / 4, decay 0.95, eps 1.5e-7, no momentum, gradient
    norms clipped to 40 (Horgan et al. 2018, Appendix C); the lr stays constant. These are
    TensorFlow's RMSProp constants (``rmsprop_tf``): with torch's rule, which starts the
    mean square at 0 and adds eps outside the root, the same numbers take steps tens to
    hundreds of times larger at Ape-X's per-weight gradients (1e-6 to 1e-5)."""
    return OptimizerConfig(name="rmsprop_tf", lr=0.00025 / 4, lr_schedule="constant", alpha=0.95,
                           eps=1.5e-7, momentum=0.0, centered=True, max_grad_norm=40.0)


@dataclass
class ApexConfig:
    """Ape-X hyperparameters; defaults from Horgan et al. 2018, Section 4 and Appendix C."""

    name: str = "apex"
    n_step: int = 3  # n of the n-step return
    discount: float = 0.99  # gamma
    batch_size: int = 512  # transitions per learner update
    replay_capacity: int = 2_000_000  # transitions kept (FIFO)
    learning_starts: int = 50_000  # transitions stored before the first update
    target_update_interval: int = 2_500  # learner updates between target-network copies
    priority_alpha: float = 0.6  # P(i) ~ p_i^alpha
    priority_beta: float = 0.4  # importance-sampling exponent
    priority_beta_final: Optional[float] = None  # anneal beta to this (None: fixed, as Ape-X)
    priority_beta_steps: int = 0  # learner updates over which beta is annealed
    priority_epsilon: float = 1e-6  # added to each positive |TD|, so none has P = 0
    epsilon_base: float = 0.4  # actor i of N explores with 0.4^(1 + 7 i / (N - 1))
    epsilon_exponent: float = 7.0
    actor_buffer: int = 50  # steps per env an actor gathers before sending (local buffer)
    weight_sync_steps: int = 100  # actor steps between weight pulls (400 frames / 4)
    # New transitions' initial priorities: "acting" from the Q values the actor computed
    # while acting (no forward pass); "recompute": the actor's network run again on s_t and
    # s_{t+n}, two forward passes per transition.
    actor_priorities: str = "acting"
    # Samples per inserted transition, held by making learner and actors wait on each other.
    # 0: the paper's free-running learner; in one process, where they take turns, 0 means 1.
    replay_ratio: float = 0.0
    reward_clipping: str = "abs_one"  # applied per step by the actors, before the n-step sum
    huber_delta: float = 1.0
    model: ModelConfig = field(default_factory=ModelConfig)
    # Where the learner trains (model, target network, loss): auto = the GPU when there is
    # one (cuda:LOCAL_RANK under torchrun), cpu, cuda or cuda:N. Actors act on CPU copies.
    device: str = "auto"
    # The learner update's arithmetic: float32, or bfloat16 mixed precision (convolutions,
    # matrix products and the LSTM on bfloat16 inputs, accumulated in float32; weights and
    # optimizer float32; distrl.training.learner.precision_context). Actors act in float32.
    precision: str = "float32"
    optimizer: OptimizerConfig = field(default_factory=apex_optimizer)

    def __post_init__(self) -> None:
        if self.name != "apex":
            raise ConfigError(f"agent.name must be 'apex' for ApexConfig, got {self.name!r}")
        for name in ("n_step", "batch_size", "replay_capacity", "target_update_interval",
                     "actor_buffer", "weight_sync_steps"):
            check_count(f"agent.{name}", getattr(self, name))
        check_positive("agent.huber_delta", self.huber_delta)
        check_non_negative("agent.learning_starts", self.learning_starts)
        check_non_negative("agent.priority_beta_steps", self.priority_beta_steps)
        check_non_negative("agent.priority_epsilon", self.priority_epsilon)
        check_non_negative("agent.replay_ratio", self.replay_ratio)
        check_unit_interval("agent.discount", self.discount)
        check_unit_interval("agent.priority_alpha", self.priority_alpha)
        check_unit_interval("agent.priority_beta", self.priority_beta)
        if self.priority_beta_final is not None:
            check_unit_interval("agent.priority_beta_final", self.priority_beta_final)
        check_unit_interval("agent.epsilon_base", self.epsilon_base)
        check_non_negative("agent.epsilon_exponent", self.epsilon_exponent)
        check_choice("agent.reward_clipping", self.reward_clipping, losses.REWARD_CLIPPING)
        check_device("agent.device", self.device)
        check_choice("agent.precision", self.precision, PRECISIONS)
        check_choice("agent.actor_priorities", self.actor_priorities, ACTOR_PRIORITIES)
        if self.model.init != "default":
            raise ConfigError(
                f"agent.model.init must be default for apex (its Q-network keeps PyTorch's "
                f"initialisation; orthogonal is for IMPALA's actor-critic net), got "
                f"{self.model.init!r}")
        if self.replay_capacity < self.batch_size:
            raise ConfigError(f"agent.replay_capacity ({self.replay_capacity}) must be at least "
                              f"agent.batch_size ({self.batch_size})")
        if self.replay_capacity < self.learning_starts:
            raise ConfigError(f"agent.replay_capacity ({self.replay_capacity}) must be at least "
                              f"agent.learning_starts ({self.learning_starts})")


# ---------------------------------------------------------------- network


def make_network(obs_shape: tuple[int, ...], num_actions: int, model: ModelConfig) -> nn.Module:
    """The dueling network (Wang et al. 2016) on the Nature CNN, or on an MLP for vectors."""
    return DuelingQNet(obs_shape, num_actions, torso=model.torso, hidden_size=model.hidden_size,
                       mlp_layers=model.mlp_layers, head_size=model.head_size)


class EpsilonGreedyPolicy:
    """Greedy in the network's Q values, except that env ``i`` acts uniformly at random
    with probability ``epsilons[i]``. Feed-forward: its recurrent state is empty."""

    def __init__(self, model: nn.Module, epsilons: torch.Tensor,
                 generator: Optional[torch.Generator] = None) -> None:
        self.model = model
        self.epsilons = epsilons
        self.generator = generator

    def initial_state(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        return ()

    @torch.no_grad()
    def __call__(self, observations: torch.Tensor, core_state: tuple[torch.Tensor, ...] = (),
                 last_actions: torch.Tensor | None = None,
                 last_rewards: torch.Tensor | None = None) -> PolicyOutput:
        q = self.model(observations)
        # The Q values go to the writer with the step: the initial priorities of the
        # transitions it completes are computed from them (acting_priorities).
        return PolicyOutput(epsilon_greedy(q, self.epsilons, self.generator), {"q": q}, ())


# ---------------------------------------------------------------- loss


class ApexLoss:
    """Dueling double DQN with n-step returns and importance-weighted Huber loss.

    ``TD_i = G_i - q(s_i, a_i)`` with the n-step double-Q target ``G_i``
    (:func:`distrl.rl.losses.n_step_double_q_targets`); the loss is the mean of
    ``w_i * huber(TD_i)``, and ``|TD_i|`` are the new priorities (Horgan et al. 2018,
    Algorithm 2). Holds the target network and copies the online weights into it every
    ``target_update_interval`` calls. Its target pass (:meth:`target_pass`) is separate, so
    the learner step can run it beside the online passes
    (:class:`distrl.training.learner.TargetPassLoss`).
    """

    def __init__(self, model: nn.Module, target_update_interval: int, huber_delta: float = 1.0):
        self.target = copy.deepcopy(model).requires_grad_(False)
        self.target_update_interval = target_update_interval
        self.huber_delta = huber_delta
        self.calls = 0

    def target_pass(self, model: nn.Module, batch: SampleBatch) -> Callable[[], torch.Tensor]:
        """``Q_target(s_{t+n}, .)`` of the batch, the target first synced if due."""
        if self.calls % self.target_update_interval == 0:
            self.target.load_state_dict(model.state_dict())
        return lambda: self.target(batch.next_observations)

    def __call__(
        self, model: nn.Module, batch: SampleBatch, target: Future | None = None
    ) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
        if target is None:  # called alone: the target pass first, in this thread
            target = computed_now(self.target_pass(model, batch), batch.next_observations.device)
        self.calls += 1
        q = model(batch.observations)
        q_taken = q.gather(1, batch.actions.unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            next_online = model(batch.next_observations)
        next_target = target.result()
        targets = losses.n_step_double_q_targets(batch.returns, batch.discounts, next_online,
                                                 next_target)
        td_errors = targets - q_taken
        loss = losses.weighted_huber_loss(td_errors, batch.weights, self.huber_delta)
        priorities = td_errors.detach().abs()
        metrics = {
            "loss/huber": float(loss.detach()), "learner/td_error": float(priorities.mean()),
            "learner/q_mean": float(q_taken.detach().mean()),
            "replay/is_weight_mean": float(batch.weights.mean()),
        }
        return loss, metrics, priorities

    def state_dict(self) -> dict[str, Any]:
        return {"target": self.target.state_dict(), "calls": self.calls}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.target.load_state_dict(state["target"])
        self.calls = int(state["calls"])


@torch.no_grad()
def initial_priorities(model: nn.Module, batch: SampleBatch) -> torch.Tensor:
    """``|TD|`` of new transitions under an actor's own network copy, used as online and
    target network alike (Horgan et al. 2018, Algorithm 1: actors compute priorities)."""
    q_taken = model(batch.observations).gather(1, batch.actions.unsqueeze(1)).squeeze(1)
    next_q = model(batch.next_observations)
    targets = losses.n_step_double_q_targets(batch.returns, batch.discounts, next_q, next_q)
    return (targets - q_taken).abs()


def acting_priorities(values: tuple[torch.Tensor, torch.Tensor], batch: Any) -> torch.Tensor:
    """``|R_t + discount * max_a Q(s_{t+n}, a) - Q(s_t, a_t)|`` of new transitions from the
    Q values the actor computed while acting (:attr:`NStepWriter.acting_values`: the taken
    action's and the bootstrap observation's best), no forward pass: Ape-X's actors take
    their priorities from the computation they already do for acting (Horgan et al.
    2018). With unchanged weights they equal :func:`initial_priorities`."""
    q_taken, bootstrap = values
    return (batch.returns + batch.discounts * bootstrap - q_taken).abs()


# ---------------------------------------------------------------- parts and run


def parts(cfg: ApexConfig, kernel: str = "auto") -> ReplayAgentParts:
    """The pieces the runner wires together for Ape-X (the replay family); ``kernel`` picks
    the sum tree."""
    from distrl.training.agent_parts import ReplayAgentParts, ReplayConfig

    return ReplayAgentParts(
        name="apex",
        make_model=functools.partial(make_network, model=cfg.model),
        make_policy=EpsilonGreedyPolicy,
        exploration=functools.partial(epsilon_ladder, base=cfg.epsilon_base,
                                      exponent=cfg.epsilon_exponent),
        make_loss=functools.partial(ApexLoss, target_update_interval=cfg.target_update_interval,
                                    huber_delta=cfg.huber_delta),
        initial_priorities=initial_priorities,
        acting_priorities=acting_priorities if cfg.actor_priorities == "acting" else None,
        transform_rewards=functools.partial(losses.clip_rewards, mode=cfg.reward_clipping),
        experience=NStepFormat(cfg.n_step, cfg.discount),
        batch_size=cfg.batch_size,
        replay=ReplayConfig(
            capacity=cfg.replay_capacity, learning_starts=cfg.learning_starts,
            alpha=cfg.priority_alpha, beta=cfg.priority_beta, beta_final=cfg.priority_beta_final,
            beta_steps=cfg.priority_beta_steps, epsilon=cfg.priority_epsilon,
        ),
        actor_buffer=cfg.actor_buffer,
        weight_sync_steps=cfg.weight_sync_steps,
        replay_ratio=cfg.replay_ratio,
        optimizer=cfg.optimizer,
        device=cfg.device,
        precision=cfg.precision,
    )


def run(cfg: RunConfig, should_stop: StopCheck | None = None,
        progress: ProgressHook | None = None) -> RunSummary:
    """Train Ape-X with a :class:`distrl.config.RunConfig` whose ``agent`` is ApexConfig;
    ``should_stop(updates)`` and ``progress(updates, frames)`` are called after updates."""
    from distrl.run.run_settings import RunSettings
    from distrl.runners.replay_family import REPLAY
    from distrl.runners.runner import train_agent

    settings = RunSettings.from_config(cfg, CONVENTIONS)
    return train_agent(REPLAY, parts(cfg.agent, cfg.kernel), settings, should_stop=should_stop,
                       progress=progress)
