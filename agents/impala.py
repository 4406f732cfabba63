"""IMPALA: importance-weighted actor-learner architecture (Espeholt et al. 2018).

Actors act with a (possibly stale) policy copy and send fixed-length unrolls; the
learner corrects for the policy lag with V-trace (eq. 1) and minimises the
policy-gradient, baseline and entropy losses of Section 4.2. Read top to bottom:
config -> network -> policy -> loss -> parts -> run.

Where the rest of it lives:
- ``distrl/rl/vtrace.py``: the V-trace targets and advantages (eq. 1), with the compiled
  kernel in ``csrc/`` loaded by ``distrl/ops.py``; ``distrl/rl/losses.py``: the loss terms.
- ``distrl/acting/actor.py``: the acting loop, writing unrolls into the slots of
  ``distrl/transport/queues.py``; ``distrl/acting/actor_processes.py``: actors in
  processes of their own.
- ``distrl/runners/unroll_sources.py``: the actors as the learner's source of unrolls;
  ``distrl/runners/unroll_family.py``: the slots, the feed and the checkpoint on a learner
  rank; ``distrl/runners/runner.py``: the run (its lifecycle, ranks, evaluation);
  ``distrl/training/loop.py``: the training loop; ``distrl/training/learner.py``: the
  optimizer step.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import torch
import torch.nn.functional as F
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
from distrl.nets.models import ActorCriticNet, orthogonal_init_
from distrl.rl import losses, vtrace
from distrl.run.run_settings import Conventions
from distrl.transport.queues import FieldSpec
from distrl.types import Unroll

if TYPE_CHECKING:
    from distrl.config import RunConfig
    from distrl.runners.runner import ProgressHook, RunSummary, StopCheck
    from distrl.training.agent_parts import UnrollAgentParts

# ---------------------------------------------------------------- config

# Where a run leaves them open: on Atari a lost life ends the learner's episode while the
# game goes on (Table G.1: "end of episode when life lost"); the single-game agents act on
# each game's minimal action set (Section 5.3; the multi-task DMLab/Atari agents differ);
# the final evaluation samples the policy, as the paper's scores do.
CONVENTIONS = Conventions(terminal_on_life_loss=True, full_action_space=False,
                          eval_epsilon=None)


@dataclass
class ImpalaConfig:
    """IMPALA hyperparameters; defaults from Espeholt et al. 2018, Table G.1 (Atari)."""

    name: str = "impala"
    unroll_length: int = 20  # T, steps per unroll
    batch_size: int = 32  # B, unrolls per learner update
    discount: float = 0.99  # gamma
    baseline_cost: float = 0.5  # weight of the value loss
    entropy_cost: float = 0.01  # weight of the entropy bonus
    reward_clipping: str = "abs_one"  # none | abs_one ([-1, 1]) | soft_asymmetric
    clip_rho_threshold: Optional[float] = 1.0  # rho-bar in eq. 1 (None: no clipping)
    clip_c_threshold: Optional[float] = 1.0  # c-bar in eq. 1
    clip_pg_rho_threshold: Optional[float] = 1.0  # rho-bar of the policy gradient (4.2)
    vtrace_lambda: float = 1.0  # lambda of Remark 1: c_s = lambda * min(c-bar, rho_s)
    # Gradient updates per batch, each on the same unrolls with V-trace recomputed under the
    # weights the previous one left: sample reuse for short frame budgets (RLlib's IMPALA
    # calls it num_epochs). The paper learns from each unroll once.
    passes: int = 1
    # APPO (IMPALA's V-trace with PPO's clipped surrogate; Sample Factory, RLlib): the
    # policy loss becomes -min(r A, clip(r, 1 - eps, 1 + eps) A) with r = pi / mu and
    # A = r_t + gamma v_{t+1} - V(x_t) (Schulman et al. 2017, eq. 7), which bounds how far
    # the later passes push the policy from the one that acted. None: IMPALA's loss (4.2).
    ppo_clip: Optional[float] = None
    # Scale A (or V-trace's pg advantages) to zero mean and unit variance over each batch,
    # as PPO's implementations do; the paper does not.
    normalize_advantages: bool = False
    # Every this many updates, log the norm of each loss term's gradient on the torso
    # (grad/torso_policy, grad/torso_value, grad/torso_entropy): which term shapes the
    # shared features. 0: never. Costs three extra backward passes when it measures.
    term_gradients_interval: int = 100
    model: ModelConfig = field(default_factory=ModelConfig)
    # Where the learner trains (model, target network, loss): auto = the GPU when there is
    # one (cuda:LOCAL_RANK under torchrun), cpu, cuda or cuda:N. Actors act on CPU copies.
    device: str = "auto"
    # The learner update's arithmetic: float32, or bfloat16 mixed precision (convolutions,
    # matrix products and the LSTM on bfloat16 inputs, accumulated in float32; weights and
    # optimizer float32; distrl.training.learner.precision_context). Actors act in float32.
    precision: str = "float32"
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)

    def __post_init__(self) -> None:
        if self.name != "impala":
            raise ConfigError(f"agent.name must be 'impala' for ImpalaConfig, got {self.name!r}")
        check_positive("agent.unroll_length", self.unroll_length)
        check_positive("agent.batch_size", self.batch_size)
        check_unit_interval("agent.discount", self.discount)
        check_non_negative("agent.baseline_cost", self.baseline_cost)
        check_non_negative("agent.entropy_cost", self.entropy_cost)
        check_choice("agent.reward_clipping", self.reward_clipping, losses.REWARD_CLIPPING)
        for name in ("clip_rho_threshold", "clip_c_threshold", "clip_pg_rho_threshold"):
            if getattr(self, name) is not None:
                check_positive(f"agent.{name}", getattr(self, name))
        check_unit_interval("agent.vtrace_lambda", self.vtrace_lambda)
        check_count("agent.passes", self.passes)
        check_non_negative("agent.term_gradients_interval", self.term_gradients_interval)
        if self.ppo_clip is not None and not 0.0 < self.ppo_clip < 1.0:
            raise ConfigError(f"agent.ppo_clip must be in (0, 1) or null, got {self.ppo_clip!r}")
        if not isinstance(self.normalize_advantages, bool):
            raise ConfigError("agent.normalize_advantages must be true or false, got "
                              f"{self.normalize_advantages!r}")
        check_device("agent.device", self.device)
        check_choice("agent.precision", self.precision, PRECISIONS)


# ---------------------------------------------------------------- network


def make_network(obs_shape: tuple[int, ...], num_actions: int, model: ModelConfig) -> nn.Module:
    """IMPALA's network (Espeholt et al. 2018, Fig. 3): for images the shallow model (conv
    16 8x8/4, conv 32 4x4/2, fc 256; ``torso: auto`` or ``shallow``), the deep ResNet
    (``resnet``) or the Nature CNN (``nature``); an MLP for vectors; then the optional
    LSTM and the policy and value heads; ``model.init: orthogonal`` gives PPO's
    initialisation (:func:`distrl.nets.models.orthogonal_init_`)."""
    net = ActorCriticNet(obs_shape, num_actions, torso=model.torso,
                         hidden_size=model.hidden_size, mlp_layers=model.mlp_layers,
                         use_lstm=model.use_lstm, lstm_size=model.lstm_size,
                         image_torso="shallow")
    return orthogonal_init_(net) if model.init == "orthogonal" else net


class ImpalaPolicy:
    """The actors' behaviour policy mu: sample from the softmax of the network's logits."""

    def __init__(self, model: nn.Module):
        self.model = model

    def initial_state(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        return self.model.initial_state(batch_size)

    @torch.no_grad()
    def __call__(
        self,
        observations: torch.Tensor,
        core_state: tuple[torch.Tensor, ...],
        last_actions: torch.Tensor | None = None,
        last_rewards: torch.Tensor | None = None,
    ) -> PolicyOutput:
        logits, _, core_state = self.model(observations.unsqueeze(0), core_state)
        logits = logits[0]
        actions = torch.multinomial(F.softmax(logits, dim=-1), 1).squeeze(-1)
        return PolicyOutput(actions, {"behaviour_logits": logits}, core_state)


def policy_extras(num_actions: int) -> dict[str, FieldSpec]:
    """What the actors store per step besides the env data: mu's logits, ``[A]``."""
    return {"behaviour_logits": FieldSpec((num_actions,), torch.float32)}


# ---------------------------------------------------------------- loss


def loss_fn(
    model: nn.Module,
    unroll: Unroll,
    *,
    discount: float,
    baseline_cost: float,
    entropy_cost: float,
    reward_clipping: str,
    clip_rho_threshold: float | None,
    clip_c_threshold: float | None,
    clip_pg_rho_threshold: float | None,
    vtrace_lambda: float,
    kernel: str = "auto",
    ppo_clip: float | None = None,
    normalize_advantages: bool = False,
    measure_terms: bool = False,
) -> tuple[torch.Tensor, dict[str, float], None]:
    """IMPALA loss (Section 4.2): V-trace policy gradient + baseline_cost * value loss
    - entropy_cost * entropy, summed over the ``[T, B]`` unroll.

    The network runs over all ``T + 1`` observations; the last step's value is the
    bootstrap ``V(x_T)``. Its recurrent core starts from the state stored by the
    actor and is reset where the previous step ended an episode. ``ppo_clip`` swaps the
    policy term for PPO's clipped surrogate on V-trace's advantages (APPO, see
    :class:`ImpalaConfig`); ``normalize_advantages`` standardises them over the batch.
    ``measure_terms`` adds each weighted term's gradient norm on the torso
    (:func:`torso_gradient_norms`).
    """
    first = torch.zeros_like(unroll.dones[:1])
    resets = torch.cat([first, unroll.dones], dim=0)  # [T+1, B]: observations[t] starts anew
    logits, values, _ = model(unroll.observations, unroll.core_state, resets)
    target_logits_t, values_t, bootstrap_value = logits[:-1], values[:-1], values[-1]

    rewards_t = losses.clip_rewards(unroll.rewards, reward_clipping)
    discounts_t = (~unroll.dones).to(values_t.dtype) * discount
    targets = vtrace.from_logits(
        behaviour_logits=unroll.behaviour_logits, target_logits=target_logits_t.detach(),
        actions=unroll.actions, discounts=discounts_t, rewards=rewards_t,
        values=values_t.detach(), bootstrap_value=bootstrap_value.detach(),
        clip_rho_threshold=clip_rho_threshold, clip_c_threshold=clip_c_threshold,
        clip_pg_rho_threshold=clip_pg_rho_threshold, lambda_=vtrace_lambda, kernel=kernel,
    )
    if ppo_clip is None:
        advantages = targets.pg_advantages
        if normalize_advantages:
            advantages = losses.standardize(advantages)
        pg_loss = losses.policy_gradient_loss(target_logits_t, unroll.actions, advantages)
    else:
        vs_tp1 = torch.cat([targets.vs[1:], bootstrap_value.detach().unsqueeze(0)], dim=0)
        advantages = rewards_t + discounts_t * vs_tp1 - values_t.detach()
        if normalize_advantages:
            advantages = losses.standardize(advantages)
        log_pi = vtrace.action_log_probs(target_logits_t, unroll.actions)
        log_mu = vtrace.action_log_probs(unroll.behaviour_logits, unroll.actions)
        pg_loss = losses.clipped_surrogate_loss(log_pi, log_mu, advantages, ppo_clip)
        # The share of steps whose ratio is outside the clip: how stale the actors' policy is.
        clipped = ((log_pi.detach() - log_mu).exp() - 1.0).abs() > ppo_clip
    value_loss = losses.baseline_loss(targets.vs, values_t)
    entropy_loss = losses.entropy_loss(target_logits_t)
    total = pg_loss + baseline_cost * value_loss + entropy_cost * entropy_loss
    metrics = {
        "loss/policy": pg_loss.item(), "loss/baseline": value_loss.item(),
        "loss/entropy": entropy_loss.item(),
        "policy/entropy": losses.entropy(target_logits_t.detach()).item(),
        "policy/value_mean": values_t.detach().mean().item(),
        "policy/vs_mean": targets.vs.mean().item(),
    }
    if ppo_clip is not None:
        metrics["policy/clip_fraction"] = clipped.float().mean().item()
    if measure_terms:
        metrics.update(torso_gradient_norms(model, {
            "policy": pg_loss, "value": baseline_cost * value_loss,
            "entropy": entropy_cost * entropy_loss}))
    return total, metrics, None


def torso_gradient_norms(model: nn.Module, terms: dict[str, torch.Tensor]) -> dict[str, float]:
    """``grad/torso_<name>``: the global L2 norm of each weighted loss term's gradient on the
    torso's weights, the features policy and value share; the graph is kept for the
    learner's own backward pass, so the update is unchanged."""
    torso = getattr(model, "module", model).torso
    weights = [w for w in torso.parameters() if w.requires_grad]
    norms = {}
    for name, term in terms.items():
        grads = torch.autograd.grad(term, weights, retain_graph=True, allow_unused=True)
        squares = [g.detach().double().square().sum() for g in grads if g is not None]
        norms[f"grad/torso_{name}"] = float(torch.stack(squares).sum().sqrt()) if squares else 0.0
    return norms


class ImpalaLoss:
    """:func:`loss_fn` with the term gradients measured every ``interval`` calls (0: never)."""

    def __init__(self, interval: int, **settings: Any) -> None:
        self.interval = interval
        self.settings = settings
        self.calls = 0

    def __call__(self, model: nn.Module, unroll: Unroll) -> tuple[torch.Tensor,
                                                                  dict[str, float], None]:
        measure = self.interval > 0 and self.calls % self.interval == 0
        self.calls += 1
        return loss_fn(model, unroll, measure_terms=measure, **self.settings)


# ---------------------------------------------------------------- parts and run


def parts(cfg: ImpalaConfig, kernel: str = "auto") -> UnrollAgentParts:
    """The pieces the runner wires together for IMPALA; ``kernel`` picks the V-trace path."""
    from distrl.training.agent_parts import UnrollAgentParts

    return UnrollAgentParts(
        name="impala",
        make_model=functools.partial(make_network, model=cfg.model),
        make_policy=ImpalaPolicy,
        loss_fn=ImpalaLoss(
            cfg.term_gradients_interval, discount=cfg.discount, baseline_cost=cfg.baseline_cost,
            entropy_cost=cfg.entropy_cost, reward_clipping=cfg.reward_clipping,
            clip_rho_threshold=cfg.clip_rho_threshold, clip_c_threshold=cfg.clip_c_threshold,
            clip_pg_rho_threshold=cfg.clip_pg_rho_threshold, vtrace_lambda=cfg.vtrace_lambda,
            kernel=kernel, ppo_clip=cfg.ppo_clip, normalize_advantages=cfg.normalize_advantages,
        ),
        policy_extras=policy_extras,
        unroll_length=cfg.unroll_length,
        batch_size=cfg.batch_size,
        optimizer=cfg.optimizer,
        device=cfg.device,
        precision=cfg.precision,
        passes=cfg.passes,
    )


def run(cfg: RunConfig, should_stop: StopCheck | None = None,
        progress: ProgressHook | None = None) -> RunSummary:
    """Train IMPALA with a :class:`distrl.config.RunConfig` whose ``agent`` is ImpalaConfig."""
    from distrl.run.run_settings import RunSettings
    from distrl.runners.runner import train_agent
    from distrl.runners.unroll_family import UNROLL

    settings = RunSettings.from_config(cfg, CONVENTIONS)
    return train_agent(UNROLL, parts(cfg.agent, cfg.kernel), settings, should_stop=should_stop,
                       progress=progress)
