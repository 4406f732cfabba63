"""Typed configuration: one dataclass per concern, validated on construction.

Defaults are the papers' values with the citation beside them; YAML files under
``experiments/`` only override. Every check raises :class:`ConfigError` naming
the field and what is allowed, so a bad command line fails with one clear line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from omegaconf import MISSING

# The checks live in distrl.validation; the schema's users import them from here too.
from distrl.validation import (  # noqa: F401
    AUTO,
    AUTO_FIELDS,
    ConfigError,
    check_choice,
    check_count,
    check_count_or_auto,
    check_non_negative,
    check_positive,
    check_run_name,
    check_unit_interval,
    is_auto,
    refuse_non_finite,
)

PROTOCOLS = ("deepmind", "machado")


@dataclass
class EnvConfig:
    """Which environment to run and its preprocessing.

    Atari defaults follow the DQN/IMPALA conventions (Mnih et al. 2015; Espeholt et al.
    2018): 84x84 grayscale, 4-frame stack, action repeat 4 with a max over the last two
    frames, up to 30 no-op starts, 108,000-frame episode cap, minimal action set,
    no sticky actions; a lost life is terminal for the learner as the agent's paper has
    it (the game goes on). ``protocol: machado`` switches to Machado et
    al. 2018 (sticky actions 0.25, full action set) unless those fields are set.

    MinAtar games (Young & Tian 2019; ``id: MinAtar-Breakout``, ...) read only
    ``repeat_action_probability`` (None: 0.1), ``full_action_space`` (None: all 6 actions),
    ``difficulty_ramping`` and ``max_episode_frames`` (one frame per step); the protocol
    and the Atari preprocessing do not apply to them.
    """

    # an Atari game (Pong, MsPacman, ...), a MinAtar game (MinAtar-Breakout, ...) or a
    # registered gymnasium id
    id: str = "Pong"
    protocol: str = "deepmind"  # deepmind | machado
    frame_skip: int = 4  # action repeat (Mnih et al. 2015)
    frame_stack: int = 4  # frames stacked into one observation
    image_size: int = 84  # observations are image_size x image_size
    grayscale: bool = True
    max_pool: bool = True  # max over the last two frames of each repeat
    noop_max: int = 30  # up to this many no-op actions at episode start
    max_episode_frames: int = 108_000  # 30 minutes of play at 60 Hz
    repeat_action_probability: Optional[float] = None  # None: 0 (deepmind) or 0.25 (machado)
    full_action_space: Optional[bool] = None  # None: minimal (deepmind) or full (machado)
    # A lost life ends the learner's episode (discount 0, recurrent state reset, n-step and
    # sequence cuts) while the game goes on; returns are still logged and evaluated per whole
    # game. None: the agent's paper's choice (IMPALA Table G.1 and Ape-X: yes; R2D2 Section 2:
    # no). Only Atari games have lives; elsewhere it changes nothing.
    terminal_on_life_loss: Optional[bool] = None
    # Refused: ale-py's episodic_life restarts the whole game at every life loss, so an agent
    # never sees a later stage. terminal_on_life_loss is the papers' form.
    episodic_life: bool = False
    fire_reset: bool = False  # press FIRE after reset (a baselines trick, off in the papers)
    # MinAtar only: the games speed up as play goes on (Young & Tian 2019, Section 3, on by
    # default there; Asterix, Seaquest and SpaceInvaders ramp, Breakout and Freeway do not).
    difficulty_ramping: bool = True
    imports: list[str] = field(default_factory=list)  # modules that register user envs

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ConfigError(f"env.id must be a non-empty string, got {self.id!r}")
        check_choice("env.protocol", self.protocol, PROTOCOLS)
        for name in ("frame_skip", "frame_stack", "image_size", "max_episode_frames"):
            check_positive(f"env.{name}", getattr(self, name))
        check_non_negative("env.noop_max", self.noop_max)
        if self.repeat_action_probability is not None:
            check_unit_interval("env.repeat_action_probability", self.repeat_action_probability)
        if not isinstance(self.difficulty_ramping, bool):
            raise ConfigError(
                f"env.difficulty_ramping must be true or false, got {self.difficulty_ramping!r}"
            )
        if self.episodic_life:
            raise ConfigError(
                "env.episodic_life=true is refused: ale-py restarts the whole game at every "
                "life loss, so later stages are never seen; use env.terminal_on_life_loss=true "
                "(a lost life ends the learner's episode while the game goes on)"
            )

    @property
    def sticky_action_probability(self) -> float:
        """Sticky-action probability after applying the protocol default."""
        if self.repeat_action_probability is not None:
            return float(self.repeat_action_probability)
        return 0.25 if self.protocol == "machado" else 0.0

    @property
    def use_full_action_space(self) -> bool:
        """Whether the full 18-action set is used, after applying the protocol default."""
        if self.full_action_space is not None:
            return bool(self.full_action_space)
        return self.protocol == "machado"


OPTIMIZERS = ("rmsprop_tf", "rmsprop", "adam", "adam_tf")
# The learner update's arithmetic (``agent.precision``): float32 throughout, or bfloat16
# mixed precision (:class:`distrl.training.learner.Learner`).
PRECISIONS = ("float32", "bfloat16")
LR_SCHEDULES = ("linear", "constant")


@dataclass
class OptimizerConfig:
    """Optimizer and gradient clipping; defaults are IMPALA's (Espeholt et al. 2018, Table G.1)."""

    # rmsprop_tf: TensorFlow's RMSProp, the optimizer whose constants IMPALA and Ape-X
    # publish (eps inside the square root, mean square starting at 1); rmsprop: torch's
    # (eps outside, starting at 0); adam_tf: TensorFlow's Adam, whose constants R2D2
    # publishes (eps added to the root of the raw second moment); adam: torch's (eps added
    # to the root of the bias-corrected one, so it damps the early updates less)
    name: str = "rmsprop_tf"
    lr: float = 0.0006  # IMPALA Atari learning rate
    lr_schedule: str = "linear"  # linear: decay to 0 over total_frames (IMPALA); constant
    alpha: float = 0.99  # RMSProp decay
    eps: float = 0.01  # RMSProp / Adam epsilon
    momentum: float = 0.0  # RMSProp momentum
    centered: bool = False  # centered RMSProp (Ape-X uses it)
    beta1: float = 0.9  # Adam only
    beta2: float = 0.999  # Adam only
    max_grad_norm: float = 40.0  # global-norm gradient clipping
    # Divergence guard: an update with a non-finite loss or gradient norm is skipped; this
    # many in a row stop the run (the newest checkpoint keeps the last good weights).
    max_skipped_updates: int = 10

    def __post_init__(self) -> None:
        check_choice("agent.optimizer.name", self.name, OPTIMIZERS)
        check_choice("agent.optimizer.lr_schedule", self.lr_schedule, LR_SCHEDULES)
        check_positive("agent.optimizer.lr", self.lr)
        check_positive("agent.optimizer.eps", self.eps)
        check_positive("agent.optimizer.max_grad_norm", self.max_grad_norm)
        check_non_negative("agent.optimizer.momentum", self.momentum)
        check_unit_interval("agent.optimizer.alpha", self.alpha)
        check_positive("agent.optimizer.max_skipped_updates", self.max_skipped_updates)


TORSOS = ("auto", "shallow", "nature", "resnet", "minatar", "mlp")
INITS = ("default", "orthogonal")
DEVICES = ("auto", "cpu", "cuda")  # or cuda:N


def check_device(name: str, value: Any) -> None:
    """Raise ConfigError unless ``value`` is auto, cpu, cuda or cuda:N."""
    if isinstance(value, str) and re.fullmatch(r"cuda:\d+", value):
        return
    if value not in DEVICES:
        raise ConfigError(f"{name} must be one of auto, cpu, cuda, cuda:N; got {value!r}")


@dataclass
class ModelConfig:
    """Network shape. ``torso: auto`` picks the agent's paper's image torso (IMPALA's shallow
    CNN; the Nature CNN for the DQN agents) for images, MinAtar's network for 10x10 images
    (every agent) and an MLP otherwise."""

    # auto | shallow (IMPALA Fig. 3 left) | nature (Mnih et al. 2015) | resnet (IMPALA Fig. 3
    # right) | minatar (Young & Tian 2019: conv 16 3x3, fc 128) | mlp
    torso: str = "auto"
    hidden_size: int = 256  # MLP torso width (the CNN torsos keep their papers' widths)
    mlp_layers: int = 2
    use_lstm: bool = False  # optional LSTM core between torso and heads
    lstm_size: int = 256
    head_size: int = 512  # hidden units of each dueling stream (Wang et al. 2016: 512)
    # default: PyTorch's initialisation, as the papers' code uses its framework's.
    # orthogonal (actor-critic nets only): gain sqrt(2) for the conv and fc layers, 0.01 for
    # the policy head, 1 for the value head, zero biases, as PPO's implementations do.
    init: str = "default"

    def __post_init__(self) -> None:
        check_choice("agent.model.torso", self.torso, TORSOS)
        check_choice("agent.model.init", self.init, INITS)
        check_positive("agent.model.hidden_size", self.hidden_size)
        check_positive("agent.model.mlp_layers", self.mlp_layers)
        check_positive("agent.model.lstm_size", self.lstm_size)
        check_positive("agent.model.head_size", self.head_size)


@dataclass
class DistributedConfig:
    """Process topology on one host. ``actors: 0`` runs actor and learner in one process.

    ``auto`` (the default of the four sized fields) lets :mod:`distrl.training.sizing` choose at the
    start of a run: for Atari from the cores and a two-second measurement of what a frame
    costs each side, elsewhere the hand-set 2 actors x 32 envs in 2 groups.
    """

    # actor processes (SEED: env worker processes); 0 = serial mode (one process, for
    # debugging and tests)
    actors: Union[int, str] = AUTO
    envs_per_actor: Union[int, str] = AUTO  # environments each actor steps as one batch
    # envs split into groups stepped while the policy runs on another
    env_groups: Union[int, str] = AUTO
    env_threads: int = 1  # threads of each Atari vector env group
    # Torch threads in the learner process. auto on Atari: measured (distrl.training.sizing); else
    # (and 0): 1 for vectors, small grids and a GPU learner (R2D2 on CartPole ran 55%
    # slower with 2), every core of this process's share for other pixel observations.
    learner_threads: Union[int, str] = AUTO
    actor_threads: int = 1  # torch threads in each actor process
    # Learner processes keep the memory they free for their next update instead of
    # returning it to the system (distrl.run.malloc; glibc only): a Pong IMPALA update on one
    # core spent about a fifth of its time faulting in fresh pages without it.
    keep_freed_memory: bool = True
    slots: int = 0  # shared unroll slots; 0 = 2 x the slots one batch needs x actors
    start_timeout_s: float = 120.0  # how long to wait for actors to produce their first unroll
    # Actor supervision (IMPALA, Ape-X, R2D2 actor processes): an actor that exits or shows
    # no sign of life for actor_timeout_s is restarted, its partial unroll dropped; more
    # restarts than max_actor_restarts end the run (after a final checkpoint).
    actor_timeout_s: float = 60.0
    max_actor_restarts: int = 10
    # Under torchrun: ranks 0..learner_ranks-1 learn, the others only act and stream their
    # experience to a learner rank (distrl.acting.remote); 0 = every rank learns.
    learner_ranks: int = 0
    # Under torchrun: rank 0 broadcasts its weights to the other learners every this many
    # updates (beside the start); 0 = only at the start.
    resync_interval: int = 1000

    def __post_init__(self) -> None:
        check_count_or_auto("distributed.actors", self.actors, minimum=0)
        check_count_or_auto("distributed.envs_per_actor", self.envs_per_actor)
        check_count_or_auto("distributed.env_groups", self.env_groups)
        check_count_or_auto("distributed.learner_threads", self.learner_threads, minimum=0)
        check_non_negative("distributed.learner_ranks", self.learner_ranks)
        check_non_negative("distributed.resync_interval", self.resync_interval)
        for name in ("env_threads", "actor_threads", "start_timeout_s", "actor_timeout_s"):
            check_positive(f"distributed.{name}", getattr(self, name))
        check_non_negative("distributed.slots", self.slots)
        check_non_negative("distributed.max_actor_restarts", self.max_actor_restarts)
        if not isinstance(self.keep_freed_memory, bool):
            raise ConfigError("distributed.keep_freed_memory must be true or false, got "
                              f"{self.keep_freed_memory!r}")
        if (not is_auto(self.envs_per_actor) and not is_auto(self.env_groups)
                and self.envs_per_actor % self.env_groups):
            raise ConfigError(
                f"distributed.envs_per_actor ({self.envs_per_actor}) must be a multiple of "
                f"distributed.env_groups ({self.env_groups})"
            )


PROGRESS_MODES = ("auto", "bar", "lines")


@dataclass
class LogConfig:
    """Where and how often to report."""

    dir: str = "runs"  # tensorboard and checkpoints go under dir/<name>
    name: str = ""  # run name; empty: <agent>-<env>-seed<seed>-<start time>
    interval_s: float = 5.0  # console report and scalar flush period
    tensorboard: bool = True
    # the console report: auto (a live progress bar on an interactive terminal, else plain
    # lines), bar, or lines (one `[distrl] frames=...` line per report, as log files get)
    progress: str = "auto"

    def __post_init__(self) -> None:
        check_positive("log.interval_s", self.interval_s)
        check_run_name("log.name", self.name)
        check_choice("log.progress", self.progress, PROGRESS_MODES)


@dataclass
class CheckpointConfig:
    """Periodic atomic checkpoints."""

    interval_s: float = 600.0  # seconds between checkpoints; the final one is always written
    keep: int = 2  # how many recent checkpoints to keep
    replay: bool = False  # also store replay buffers (replay-based agents)

    def __post_init__(self) -> None:
        check_positive("checkpoint.interval_s", self.interval_s)
        check_positive("checkpoint.keep", self.keep)


@dataclass
class EvalConfig:
    """Evaluation of the final weights on fresh envs after the last checkpoint
    (:mod:`distrl.acting.evaluation`); logged under ``eval/`` and returned as ``eval_return``."""

    episodes: int = 0  # whole episodes, one per env, each env's first; 0: no evaluation
    # The Q agents (apex, r2d2) act epsilon-greedily with this; 0 is greedy. None: the
    # agent's protocol (its CONVENTIONS: apex and r2d2 0.001; IMPALA samples from its
    # softmax policy and refuses any value but 0).
    epsilon: Optional[float] = None

    def __post_init__(self) -> None:
        check_non_negative("eval.episodes", self.episodes)
        if self.epsilon is not None:
            check_unit_interval("eval.epsilon", self.epsilon)


@dataclass
class RunConfig:
    """One experiment: which agent on which env, for how long, in which topology."""

    agent: Any = MISSING  # one of the agents' configs (see agents/__init__.py)
    env: EnvConfig = field(default_factory=EnvConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    log: LogConfig = field(default_factory=LogConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    seed: int = 0
    total_frames: int = 200_000_000  # IMPALA's Atari budget; env frames (agent steps x frame_skip)
    resume: Optional[str] = None  # path of a checkpoint (or a run directory) to continue from
    # On resume the checkpoint's settings are the run's; the command line may change only the
    # settings named here, e.g. [total_frames, agent.optimizer.lr] (distrl.run.resume_settings).
    resume_overrides: list[str] = field(default_factory=list)
    # V-trace and sum-tree ops: compiled distrl._C where built (auto), only compiled
    # (refused if missing), or the pure-torch reference; the run logs which path it took.
    kernel: str = "auto"
    # End the run once the mean raw return of the last 20 episodes reaches this (a task's
    # "solved" level, e.g. 475 for CartPole-v1); None: run the whole frame budget.
    stop_at_return: Optional[float] = None

    def __post_init__(self) -> None:
        refuse_non_finite(self)  # every float setting, the agent's included
        check_positive("total_frames", self.total_frames)
        check_non_negative("seed", self.seed)
        check_choice("kernel", self.kernel, KERNELS)
        for name in self.resume_overrides:
            if not isinstance(name, str) or not name:
                raise ConfigError(f"resume_overrides must list settings by their dotted "
                                  f"path, e.g. [total_frames]; got {name!r}")
        if self.resume_overrides and not self.resume:
            raise ConfigError(
                f"resume_overrides names {', '.join(self.resume_overrides)} but resume is not "
                "set; it applies only when resuming (resume=<run dir or checkpoint>)")


KERNELS = ("auto", "compiled", "reference")  # the choices of distrl.ops.KERNEL_CHOICES


def atari_game_name(rom: str) -> str:
    """The name ``env.id`` and the ``env=`` group take for an ale-py ROM id: "ms_pacman" ->
    "MsPacman" (title-cased, without its underscores)."""
    return rom.title().replace("_", "")


def atari_game_names() -> list[str]:
    """Every ALE game by its name: "Pong", "MsPacman", "SpaceInvaders", ..."""
    from ale_py import roms  # here, not above: the schema's users need no emulator

    return [atari_game_name(rom) for rom in roms.get_all_rom_ids()]


def register_configs() -> None:
    """Register the schemas with Hydra's ConfigStore (agents register their own)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="run_schema", node=RunConfig)
    cs.store(group="env", name="env_schema", node=EnvConfig)
    # env=<Game> for every ALE game (env=Pong, env=Breakout, ...): the Atari conventions are
    # EnvConfig's defaults, and the budget is RunConfig's (IMPALA's 200M frames).
    for game in atari_game_names():
        cs.store(group="env", name=game, package="_global_",
                 node={"env": {"id": game}})
