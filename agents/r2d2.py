"""R2D2: recurrent experience replay in distributed RL (Kapturowski et al. 2019).

Ape-X's topology with an LSTM: actors act epsilon-greedily with their own network copy,
carrying the recurrent state across steps and resetting it at each episode's start;
they cut their experience into overlapping sequences stored with the recurrent state at
their first step, give each sequence a priority and send it to one prioritized replay.
The learner burns in the LSTM on a sequence's first steps without gradient, then trains
a dueling double-Q network on n-step targets under the invertible value rescaling ``h``.
Read top to bottom: config -> network -> policy -> loss -> parts -> run.

Where the rest of it lives:
- ``distrl/replay/sequence_writer.py``: the actors' overlapping sequences with their
  stored recurrent state; ``distrl/replay/sequence_storage.py``: their storage, each
  frame once; ``distrl/replay/samplers.py`` and ``sum_tree.py``: prioritized sampling.
- ``distrl/rl/losses.py``: value rescaling, the transformed n-step targets and the sequence
  priorities (eta-mix of max and mean).
- As Ape-X: ``distrl/runners/replay_sources.py`` (the actors),
  ``distrl/runners/replay_learner.py`` (the replay feed and priority write-back),
  ``distrl/runners/replay_family.py`` (a learner rank's replay and checkpoint),
  ``distrl/runners/runner.py`` (the run).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

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
    check_unit_interval,
)
from distrl.nets.models import RecurrentDuelingQNet, flatten_rnn_weights
from distrl.nets.side_thread import computed_now
from distrl.replay.formats import SequenceFormat
from distrl.rl import losses
from distrl.rl.exploration import epsilon_greedy, epsilon_ladder
from distrl.run.run_settings import Conventions
from distrl.types import SequenceBatch, SequenceSample

if TYPE_CHECKING:
    from distrl.config import RunConfig
    from distrl.runners.runner import ProgressHook, RunSummary, StopCheck
    from distrl.training.agent_parts import ReplayAgentParts

ACTOR_PRIORITIES = ("acting", "recompute")

# ---------------------------------------------------------------- config

# Where a run leaves them open: on Atari only a game's end ends an episode (R2D2 disabled
# Ape-X's loss-of-life-as-episode-end heuristic, Kapturowski et al. 2019, Section 2); all
# 18 actions (Section 2.3: "Like Ape-X, we use 4-frame-stacks and the full 18-action set");
# the final evaluation acts with epsilon 0.001 (seed_rl's Atari R2D2, eval_epsilon; the
# paper names none).
CONVENTIONS = Conventions(terminal_on_life_loss=False, full_action_space=True,
                          eval_epsilon=0.001)


def r2d2_optimizer() -> OptimizerConfig:
    """Adam, lr 1e-4, eps 1e-3 (Kapturowski et al. 2019, Table 2), constant lr, as
    TensorFlow runs it (``adam_tf``: eps added to the root of the raw second moment, which
    damps the first few thousand updates more than torch's placement; seed_rl's R2D2 uses
    Keras's Adam, the same rule). The paper names no gradient clipping; the global norm is
    clipped at 40 as for the other agents and as seed_rl's R2D2 (clip_norm 40)."""
    return OptimizerConfig(name="adam_tf", lr=1e-4, lr_schedule="constant", eps=1e-3,
                           max_grad_norm=40.0)


def r2d2_model() -> ModelConfig:
    """A 512-unit LSTM between the torso (Nature CNN for frames) and the dueling head."""
    return ModelConfig(use_lstm=True, lstm_size=512)


@dataclass
class R2D2Config:
    """R2D2 hyperparameters; defaults from Kapturowski et al. 2019, Table 2."""

    name: str = "r2d2"
    trace_length: int = 80  # m, trained steps per sequence
    overlap: int = 40  # steps adjacent sequences share (a new one every m - overlap steps)
    burn_in: int = 40  # l, steps unrolled without gradient before the trained ones; 0: none
    stored_state: bool = True  # start from the actor's stored state; False: zero state
    n_step: int = 5
    discount: float = 0.997
    rescale_epsilon: float = 1e-3  # the eps of h(x) = sign(x)(sqrt(|x|+1)-1) + eps x
    batch_size: int = 64  # sequences per learner update
    # Sequences. The paper keeps 10^5 (4M observations, 28 GiB of Atari frames); half of
    # that fits a 24 GiB machine. Set 100_000 where memory allows.
    replay_capacity: int = 50_000
    learning_starts: int = 2_500  # sequences stored before the first update
    target_update_interval: int = 2_500  # learner updates between target-network copies
    priority_eta: float = 0.9  # p = eta max|delta| + (1 - eta) mean|delta|
    priority_alpha: float = 0.9  # priority exponent
    priority_beta: float = 0.6  # importance-sampling exponent
    priority_epsilon: float = 1e-6
    epsilon_base: float = 0.4  # the Ape-X ladder over every env of the run
    epsilon_exponent: float = 7.0
    actor_buffer: int = 40  # env steps per env between an actor's sends
    # actor steps between weight pulls: Table 2's "actor parameter update interval: 400
    # environment steps", an environment step being one agent step (4 frames)
    weight_sync_steps: int = 400
    replay_ratio: float = 0.0  # sequences sampled per sequence inserted; 0: free running
    staleness_interval: int = 100  # updates between recurrent-state staleness measurements
    # New sequences' initial priorities: "acting" from the Q values the actor computed while
    # acting on their steps (seed_rl's R2D2; Ape-X's actors reuse their acting Q values,
    # Horgan et al. 2018), no second forward pass; "recompute": a fresh unroll of each sequence from
    # its stored state with the actor's current weights, 3x the acting forward at Table 2's
    # burn-in 40, length 80 and period 40.
    actor_priorities: str = "acting"
    model: ModelConfig = field(default_factory=r2d2_model)
    # Where the learner trains (model, target network, loss): auto = the GPU when there is
    # one (cuda:LOCAL_RANK under torchrun), cpu, cuda or cuda:N. Actors act on CPU copies.
    device: str = "auto"
    # The learner update's arithmetic: float32, or bfloat16 mixed precision (convolutions,
    # matrix products and the LSTM on bfloat16 inputs, accumulated in float32; weights and
    # optimizer float32; distrl.training.learner.precision_context). Actors act in float32.
    precision: str = "float32"
    optimizer: OptimizerConfig = field(default_factory=r2d2_optimizer)

    def __post_init__(self) -> None:
        if self.name != "r2d2":
            raise ConfigError(f"agent.name must be 'r2d2' for R2D2Config, got {self.name!r}")
        for name in ("trace_length", "n_step", "batch_size", "replay_capacity",
                     "target_update_interval", "actor_buffer", "weight_sync_steps",
                     "staleness_interval"):
            check_count(f"agent.{name}", getattr(self, name))
        for name in ("burn_in", "overlap", "learning_starts", "rescale_epsilon",
                     "priority_epsilon", "replay_ratio", "epsilon_exponent"):
            check_non_negative(f"agent.{name}", getattr(self, name))
        for name in ("discount", "priority_eta", "priority_alpha", "priority_beta",
                     "epsilon_base"):
            check_unit_interval(f"agent.{name}", getattr(self, name))
        check_device("agent.device", self.device)
        check_choice("agent.precision", self.precision, PRECISIONS)
        check_choice("agent.actor_priorities", self.actor_priorities, ACTOR_PRIORITIES)
        if self.model.init != "default":
            raise ConfigError(
                f"agent.model.init must be default for r2d2 (its Q-network keeps PyTorch's "
                f"initialisation; orthogonal is for IMPALA's actor-critic net), got "
                f"{self.model.init!r}")
        if self.overlap >= self.trace_length:
            raise ConfigError(f"agent.overlap ({self.overlap}) must be less than "
                              f"agent.trace_length ({self.trace_length})")
        if self.replay_capacity < max(self.batch_size, self.learning_starts):
            raise ConfigError(f"agent.replay_capacity ({self.replay_capacity}) must be at least "
                              f"agent.batch_size ({self.batch_size}) and agent.learning_starts "
                              f"({self.learning_starts})")

    @property
    def period(self) -> int:
        """Steps between the starts of adjacent sequences."""
        return self.trace_length - self.overlap


# ---------------------------------------------------------------- network and policy


def make_network(obs_shape: tuple[int, ...], num_actions: int,
                 model: ModelConfig) -> RecurrentDuelingQNet:
    """Torso -> LSTM(features, previous action, previous reward) -> dueling head."""
    return RecurrentDuelingQNet(obs_shape, num_actions, torso=model.torso,
                                hidden_size=model.hidden_size, mlp_layers=model.mlp_layers,
                                use_lstm=model.use_lstm, lstm_size=model.lstm_size,
                                head_size=model.head_size)


class RecurrentEpsilonGreedyPolicy:
    """Epsilon-greedy in the recurrent network's Q values (env ``i`` explores with
    ``epsilons[i]``); the LSTM state is carried across steps (the actor zeroes it at an
    episode's start) and fed the last action and reward."""

    def __init__(self, model: RecurrentDuelingQNet, epsilons: torch.Tensor,
                 generator: torch.Generator | None = None) -> None:
        self.model = model
        self.epsilons = epsilons
        self.generator = generator

    def initial_state(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        return self.model.initial_state(batch_size)

    @torch.no_grad()
    def __call__(self, observations: torch.Tensor, core_state: tuple[torch.Tensor, ...],
                 last_actions: torch.Tensor | None = None,
                 last_rewards: torch.Tensor | None = None) -> PolicyOutput:
        n = observations.shape[0]
        if last_actions is None:
            last_actions = torch.full((n,), -1, dtype=torch.int64)
        if last_rewards is None:
            last_rewards = torch.zeros(n)
        q, core_state = self.model(observations.unsqueeze(0), last_actions.unsqueeze(0),
                                   last_rewards.unsqueeze(0), core_state)
        # The Q values go to the writer with the step: the initial priorities of the
        # sequences it completes are computed from them (acting_priorities).
        return PolicyOutput(epsilon_greedy(q[0], self.epsilons, self.generator),
                            {"q": q[0]}, core_state)


# ---------------------------------------------------------------- loss


def unroll(model: RecurrentDuelingQNet, batch: SequenceSample, burn_in: int,
           stored_state: bool = True) -> torch.Tensor:
    """``[L, B, A]`` Q values over whole sequences, from the stored recurrent state (or
    zeros). The first ``burn_in`` steps only refresh the state: they run without gradient
    (R2D2 Section 3, "burn-in"), so no gradient reaches them or flows back through them."""
    num_sequences = batch.actions.shape[1]
    state = (model.state_from_flat(batch.stored_state) if stored_state
             else model.initial_state(num_sequences))
    resets = batch.resets
    pieces = []
    if burn_in > 0:
        with torch.no_grad():
            q_burn_in, state = model(batch.observations[:burn_in], batch.prev_actions[:burn_in],
                                     batch.prev_rewards[:burn_in], state, resets[:burn_in])
        pieces.append(q_burn_in)
    q_rest, _ = model(batch.observations[burn_in:], batch.prev_actions[burn_in:],
                      batch.prev_rewards[burn_in:], state, resets[burn_in:])
    return torch.cat([*pieces, q_rest])


def trained_steps(valid: torch.Tensor, terminated: torch.Tensor, burn_in: int,
                  trace_length: int, n: int) -> torch.Tensor:
    """``[m, B]`` bool: the trained steps that have an n-step target, i.e. real steps whose
    episode terminates within ``n`` steps or whose step ``t + n`` is real (a truncated
    episode's last ``n`` steps have neither and are left out)."""
    window = slice(burn_in, burn_in + trace_length)
    ends = torch.zeros_like(valid[window])
    for k in range(n):
        ends |= (terminated & valid)[burn_in + k:burn_in + k + trace_length]
    bootstrap = valid[burn_in + n:burn_in + n + trace_length]
    return valid[window] & (ends | bootstrap)


def sequence_td_errors(
    q_online: torch.Tensor, q_target: torch.Tensor, batch: SequenceSample, burn_in: int,
    trace_length: int, n: int, discount: float, rescale_epsilon: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(td [m, B], mask [m, B])``: TD errors of the trained steps on the ``h`` scale against
    transformed n-step double-Q targets (R2D2 Section 2), and which steps count."""
    after = slice(burn_in, None)
    targets = losses.transformed_n_step_double_q_targets(
        batch.rewards[after], (~batch.terminated[after]).float(), q_online[after].detach(),
        q_target[after], discount, n, rescale_epsilon)
    trained = slice(burn_in, burn_in + trace_length)
    q_taken = q_online[trained].gather(-1, batch.actions[trained].unsqueeze(-1)).squeeze(-1)
    mask = trained_steps(batch.valid, batch.terminated, burn_in, trace_length, n)
    return torch.where(mask, targets - q_taken, 0.0), mask


class R2D2Loss:
    """Squared TD error summed over the trained steps, importance-weighted per sequence and
    averaged over sequences; returns the eta-mixed sequence priorities. Holds the
    target network (copied every ``target_update_interval`` calls) and every
    ``staleness_interval`` calls measures the recurrent-state staleness of Section 3:
    ``||q(h_stored) - q(h_burned_in)||_2 / |max_a q(h_burned_in)|`` at the first and the
    last trained step, where ``h_stored`` is the state the actor had there."""

    def __init__(self, model: RecurrentDuelingQNet, target_update_interval: int, burn_in: int,
                 trace_length: int, n_step: int, discount: float, rescale_epsilon: float,
                 priority_eta: float, stored_state: bool = True,
                 staleness_interval: int = 100) -> None:
        self.target = flatten_rnn_weights(copy.deepcopy(model)).requires_grad_(False)
        self.target_update_interval = target_update_interval
        self.burn_in, self.trace_length, self.n_step = burn_in, trace_length, n_step
        self.discount, self.rescale_epsilon = discount, rescale_epsilon
        self.priority_eta = priority_eta
        self.stored_state = stored_state
        self.staleness_interval = staleness_interval
        self.calls = 0

    def target_pass(self, model: RecurrentDuelingQNet, batch: SequenceSample
                    ) -> Callable[[], torch.Tensor]:
        """The target network's unroll over the whole sequence, the target first synced if
        due; the learner step runs it beside the online unroll
        (:class:`distrl.training.learner.TargetPassLoss`)."""
        if self.calls % self.target_update_interval == 0:
            self.target.load_state_dict(model.state_dict())
        return lambda: unroll(self.target, batch, self.burn_in, self.stored_state)

    def __call__(self, model: RecurrentDuelingQNet, batch: SequenceSample,
                 target: Future | None = None
                 ) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
        if target is None:  # called alone: the target pass first, in this thread
            target = computed_now(self.target_pass(model, batch), batch.observations.device)
        measure = self.calls % self.staleness_interval == 0
        self.calls += 1
        q_online = unroll(model, batch, self.burn_in, self.stored_state)
        q_target = target.result()
        td, mask = sequence_td_errors(q_online, q_target, batch, self.burn_in,
                                      self.trace_length, self.n_step, self.discount,
                                      self.rescale_epsilon)
        weights = batch.weights.to(td.dtype).unsqueeze(0)
        # Summed over a sequence's steps, averaged over sequences (as Acme's R2D2 does);
        # Adam's eps of 1e-3 is large next to per-step gradients.
        loss = (weights * 0.5 * td.square()).sum(dim=0).mean()
        priorities = losses.sequence_priorities(td.detach().abs(), mask, self.priority_eta)
        metrics = {
            "loss/td_squared": float(loss.detach()),
            "learner/td_error": float(td.detach().abs().sum() / mask.sum().clamp(min=1)),
            "learner/q_mean": float(q_online[self.burn_in:].detach().mean()),
            "learner/trained_step_fraction": float(mask.float().mean()),
            "replay/is_weight_mean": float(batch.weights.mean()),
            "replay/batch_priority_mean": float(priorities.mean()),
            "replay/batch_priority_max": float(priorities.max()),
        }
        if measure:
            metrics.update(self.staleness(model, batch, q_online.detach()))
        return loss, metrics, priorities

    @torch.no_grad()
    def staleness(self, model: RecurrentDuelingQNet, batch: SequenceSample,
                  q_burned_in: torch.Tensor) -> dict[str, float]:
        """Relative Q discrepancy between the actor's stored state at the first trained
        step and the learner's burned-in state, at the first and the last trained step."""
        trained = slice(self.burn_in, self.burn_in + self.trace_length)
        q_stored, _ = model(batch.observations[trained], batch.prev_actions[trained],
                            batch.prev_rewards[trained], model.state_from_flat(batch.start_state),
                            batch.resets[trained])
        out = {}
        for name, t in (("first", 0), ("last", self.trace_length - 1)):
            fresh = q_burned_in[self.burn_in + t]
            gap = (q_stored[t] - fresh).norm(dim=-1) / fresh.max(dim=-1).values.abs().clamp(
                min=1e-6)
            valid = batch.valid[self.burn_in + t]
            if bool(valid.any()):
                out[f"r2d2/q_staleness_{name}"] = float(gap[valid].mean())
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"target": self.target.state_dict(), "calls": self.calls}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.target.load_state_dict(state["target"])
        self.calls = int(state["calls"])


@torch.no_grad()
def initial_priorities(model: RecurrentDuelingQNet, batch: SequenceSample, burn_in: int,
                       trace_length: int, n_step: int, discount: float, rescale_epsilon: float,
                       priority_eta: float, stored_state: bool = True) -> torch.Tensor:
    """Eta-mixed priorities of new sequences under an actor's own network copy, used as
    online and target network alike (R2D2 follows Ape-X: actors compute priorities)."""
    q = unroll(model, batch, burn_in, stored_state)
    td, mask = sequence_td_errors(q, q, batch, burn_in, trace_length, n_step, discount,
                                  rescale_epsilon)
    return losses.sequence_priorities(td.abs(), mask, priority_eta)


def acting_priorities(q_values: torch.Tensor, batch: SequenceBatch, burn_in: int,
                      trace_length: int, n_step: int, discount: float, rescale_epsilon: float,
                      priority_eta: float) -> torch.Tensor:
    """Eta-mixed priorities of new sequences from the Q values ``[K, L, A]`` the actor
    computed while acting on their steps (:attr:`SequenceWriter.acting_q`), used as online
    and target values alike, as seed_rl's R2D2 computes them from its inference outputs.
    With unchanged weights they equal :func:`initial_priorities` (the actor's running
    state is the stored state burned in), at no second forward pass."""
    q = q_values.transpose(0, 1)
    steps = SequenceSample(
        indices=torch.full((batch.size,), -1, dtype=torch.int64), weights=torch.ones(batch.size),
        observations=torch.empty(0),  # the TD errors read no observation
        prev_actions=batch.prev_actions.t(), prev_rewards=batch.prev_rewards.t(),
        actions=batch.actions.t(), rewards=batch.rewards.t(), terminated=batch.terminated.t(),
        valid=batch.valid.t(), stored_state=batch.stored_state, start_state=batch.start_state)
    td, mask = sequence_td_errors(q, q, steps, burn_in, trace_length, n_step, discount,
                                  rescale_epsilon)
    return losses.sequence_priorities(td.abs(), mask, priority_eta)


def unclipped(rewards: torch.Tensor) -> torch.Tensor:
    """R2D2 clips no rewards: ``h`` rescales the values instead."""
    return rewards


# ---------------------------------------------------------------- parts and run


def parts(cfg: R2D2Config, kernel: str = "auto") -> ReplayAgentParts:
    """The pieces the runner wires together for R2D2 (the replay family); ``kernel`` picks
    the sum tree."""
    from distrl.training.agent_parts import ReplayAgentParts, ReplayConfig

    sequence = {"burn_in": cfg.burn_in, "trace_length": cfg.trace_length, "n_step": cfg.n_step,
                "discount": cfg.discount, "rescale_epsilon": cfg.rescale_epsilon,
                "priority_eta": cfg.priority_eta, "stored_state": cfg.stored_state}
    return ReplayAgentParts(
        name="r2d2",
        make_model=functools.partial(make_network, model=cfg.model),
        make_policy=RecurrentEpsilonGreedyPolicy,
        exploration=functools.partial(epsilon_ladder, base=cfg.epsilon_base,
                                      exponent=cfg.epsilon_exponent),
        make_loss=functools.partial(R2D2Loss, target_update_interval=cfg.target_update_interval,
                                    staleness_interval=cfg.staleness_interval, **sequence),
        initial_priorities=functools.partial(initial_priorities, **sequence),
        acting_priorities=(functools.partial(acting_priorities, **{
            k: v for k, v in sequence.items() if k != "stored_state"})
            if cfg.actor_priorities == "acting" else None),
        transform_rewards=unclipped,
        experience=SequenceFormat(cfg.burn_in, cfg.trace_length, cfg.period, cfg.n_step),
        batch_size=cfg.batch_size,
        replay=ReplayConfig(
            capacity=cfg.replay_capacity, learning_starts=cfg.learning_starts,
            alpha=cfg.priority_alpha, beta=cfg.priority_beta, beta_final=None, beta_steps=0,
            epsilon=cfg.priority_epsilon,
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
    """Train R2D2 with a :class:`distrl.config.RunConfig` whose ``agent`` is R2D2Config;
    ``should_stop(updates)`` and ``progress(updates, frames)`` are called after updates."""
    from distrl.run.run_settings import RunSettings
    from distrl.runners.replay_family import REPLAY
    from distrl.runners.runner import train_agent

    settings = RunSettings.from_config(cfg, CONVENTIONS)
    return train_agent(REPLAY, parts(cfg.agent, cfg.kernel), settings, should_stop=should_stop,
                       progress=progress)
