"""The figures a throughput diagnosis is made from: :class:`Figures` (what a run
measured over a span: frames, seconds of each side's work and waiting, CPU), the run's
settings as :class:`RunContext`, and :func:`derive` (rates, busy and waiting fractions,
capacities). :mod:`distrl.telemetry.throughput` turns them into a verdict; see its docstring.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from distrl.validation import is_auto

NAN = float("nan")
BALANCED_WITHIN = 1.15  # capacities closer than this count as balanced
BUSY = 0.7  # a side busier than this is not waiting much
CPU_FULL = 0.85  # this share of the cores busy: the machine is saturated

# bound -> the numeric code logged as throughput/bound_code
BOUND_CODES = {"actors": -1, "balanced": 0, "learner": 1, "unknown": 0}


def _sum(default: float = 0.0) -> Any:
    return field(default=default, metadata={"combine": "sum"})


def _level(default: float = NAN) -> Any:
    return field(default=default, metadata={"combine": "mean"})


@dataclass(frozen=True)
class Figures:
    """What a run measured over ``span_s`` seconds (one report, or several combined).

    Seconds of the actors are summed over every actor process (or the SEED server);
    seconds of the learner are its loop's. Sums add up when spans are combined; levels
    are averaged, weighted by span. Each field is logged as ``throughput/raw/<name>``.
    """

    span_s: float = _sum()
    actor_frames: float = _sum()  # env frames the actors stepped
    # env frames' worth the learner consumed: the frames it learned from (unroll agents);
    # replay agents: frames inserted x (sampled per inserted) / (the ratio asked)
    learned_frames: float = _sum()
    updates: float = _sum()
    env_s: float = _sum()  # actors stepping envs (SEED: waiting for its env workers)
    forward_s: float = _sum()  # actors' forward passes (SEED: batched inference)
    actor_copy_s: float = _sum()  # actors writing steps into slots or writers, pulling weights
    actor_wait_s: float = _sum()  # actors waiting for a free slot: for the learner
    step_s: float = _sum()  # the learner's updates
    # the learner building batches: slot gathers, inserts, samples, and waits for the
    # prefetched draw of its next batch
    learner_copy_s: float = _sum()
    batch_wait_s: float = _sum()  # the learner waiting for full slots
    ratio_wait_s: float = _sum()  # replay: waiting for learning_starts or replay-ratio credit
    sampled: float = _sum()  # replay items sampled
    inserted: float = _sum()  # replay items inserted
    learner_cpu_s: float = _sum()  # CPU seconds of the learner process
    actors_cpu_s: float = _sum()  # CPU seconds of its child processes
    # CPU seconds the usable cores were busy, other jobs included (0: not measured)
    machine_cpu_s: float = _sum()
    serial: float = _level(0.0)  # 1: actor and learner take turns in one process
    replay_ratio_target: float = _level()  # samples per insert asked (0: uncapped); NaN: unrolls
    replay_fill: float = _level()  # replay size / capacity
    slots_full: float = _level()  # full slots / slots between actors and learner
    cores: float = _level(1.0)  # cores the learner process may use
    learner_rss: float = _level(0.0)  # resident bytes of the learner process
    actors_rss: float = _level(0.0)  # resident bytes of its children, summed
    learner_threads: float = _level(1.0)  # torch threads of the learner
    learner_gpu: float = _level(0.0)  # 1: the learner trains on a GPU

    def as_scalars(self, prefix: str = "throughput/raw/") -> dict[str, float]:
        """Every field as a tensorboard scalar."""
        return {prefix + f.name: float(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_scalars(cls, scalars: Mapping[str, float],
                     prefix: str = "throughput/raw/") -> Figures:
        """The figures logged by :meth:`as_scalars` (fields not there keep their defaults)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key.removeprefix(prefix): float(value) for key, value in scalars.items()
                      if key.startswith(prefix) and key.removeprefix(prefix) in names})


def combine(parts: list[Figures]) -> Figures:
    """One set of figures for consecutive spans: sums added, levels span-weighted means
    (NaN levels, e.g. no replay, are left out)."""
    if not parts:
        return Figures()
    values: dict[str, float] = {}
    total_span = sum(p.span_s for p in parts)
    for f in dataclasses.fields(Figures):
        column = [getattr(p, f.name) for p in parts]
        if f.metadata["combine"] == "sum":
            values[f.name] = float(sum(column))
            continue
        weighted = [(v, p.span_s) for v, p in zip(column, parts, strict=True)
                    if not math.isnan(v)]
        weight = sum(w for _, w in weighted)
        if not weighted:
            values[f.name] = NAN
        elif weight > 0:
            values[f.name] = sum(v * w for v, w in weighted) / weight
        else:
            values[f.name] = weighted[-1][0]
    values["span_s"] = total_span
    return Figures(**values)


def steady(reports: list[Figures]) -> list[Figures]:
    """The reports that describe the run at pace: all but the first when there are three
    or more, since the first spans the start (actor processes spawning, the first batches
    on their way) when the learner can only wait."""
    return reports[1:] if len(reports) >= 3 else reports


@dataclass(frozen=True)
class RunContext:
    """The settings the advice names (read from the run's config, so the advice is in the
    run's own terms)."""

    agent: str = "impala"  # agent.name
    path: str = "agent"  # where the learner's settings are: agent, agent.impala, agent.r2d2
    replay: bool = False  # a replay learner (Ape-X, R2D2, SEED-R2D2)
    seed: bool = False  # SEED: env workers and central inference
    actors: int = 2
    envs_per_actor: int = 32
    env_groups: int = 2
    learner_threads: int = 0  # the setting (0: auto)
    actor_threads: int = 1
    batch_size: int = 32
    replay_ratio: float = 0.0  # the setting (replay agents)
    max_inference_batch: int = 0  # SEED
    async_envs: bool = False  # envs step in threads while the policy runs (ale-py's Atari)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], async_envs: bool) -> RunContext:
        """From the run's resolved config (the ``config`` text logged at start, parsed)."""
        agent = config.get("agent", {}) or {}
        dist = config.get("distributed", {}) or {}
        name = str(agent.get("name", "impala"))
        path, learner = "agent", agent
        if name == "seed":
            inner = str(agent.get("learner", "impala"))
            path, learner = f"agent.{inner}", agent.get(inner, {}) or {}
        replay = "replay_ratio" in learner
        defaults = cls()
        return cls(
            agent=name, path=path, replay=replay, seed=name == "seed",
            actors=_size(dist, "actors", defaults.actors),
            envs_per_actor=_size(dist, "envs_per_actor", defaults.envs_per_actor),
            env_groups=_size(dist, "env_groups", defaults.env_groups),
            learner_threads=_size(dist, "learner_threads", defaults.learner_threads),
            actor_threads=int(dist.get("actor_threads", defaults.actor_threads)),
            batch_size=int(learner.get("batch_size", defaults.batch_size)),
            replay_ratio=float(learner.get("replay_ratio", 0.0) or 0.0),
            max_inference_batch=int(agent.get("max_inference_batch", 0) or 0),
            async_envs=async_envs)

    @property
    def actor_side(self) -> str:
        return "env workers + inference" if self.seed else "actors"


def _size(dist: Mapping[str, Any], name: str, default: int) -> int:
    """A topology setting; ``auto`` (a config text written before sizing chose) reads as
    the default."""
    value = dist.get(name, default)
    return default if is_auto(value) else int(value)


def _finite(value: float, instead: Any = 0.0) -> Any:
    return value if math.isfinite(value) else instead


def _margin_text(margin: float) -> str:
    return f"{margin:.1f}" if margin < 100 else ">100"


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else NAN


def derive(fig: Figures) -> dict[str, float]:
    """Rates, busy and waiting fractions and capacities of both sides.

    Actor fractions are of the actors' own time (the sum of their measured seconds; one
    process: the loop's span, the rest being the learner's turn); learner fractions are
    of the span. ``*_capacity`` is a side's rate over its busy fraction.
    """
    span = max(fig.span_s, 1e-9)
    actor_busy_s = fig.env_s + fig.forward_s + fig.actor_copy_s
    actor_time = span if fig.serial >= 0.5 else actor_busy_s + fig.actor_wait_s
    learner_busy_s = fig.step_s + fig.learner_copy_s
    out = {
        "actor_fps": fig.actor_frames / span,
        "learner_fps": fig.learned_frames / span,
        "updates_per_s": fig.updates / span,
        "actor_busy": _ratio(actor_busy_s, actor_time),
        "actor_env": _ratio(fig.env_s, actor_time),
        "actor_forward": _ratio(fig.forward_s, actor_time),
        "actor_copy": _ratio(fig.actor_copy_s, actor_time),
        "actor_wait": _ratio(actor_time - actor_busy_s, actor_time),
        "learner_busy": learner_busy_s / span,
        "learner_step": fig.step_s / span,
        "learner_copy": fig.learner_copy_s / span,
        "learner_batch_wait": fig.batch_wait_s / span,
        "learner_ratio_wait": fig.ratio_wait_s / span,
        "learner_wait": max(1.0 - learner_busy_s / span, 0.0),
        "cpu_learner": fig.learner_cpu_s / span,
        "cpu_actors": fig.actors_cpu_s / span,
        "cpu_busy": (fig.learner_cpu_s + fig.actors_cpu_s) / span,
        # the usable cores' busy share whoever used them; never below this run's own
        "machine_busy": max(fig.machine_cpu_s, fig.learner_cpu_s + fig.actors_cpu_s) / span,
        "cores": fig.cores,
        "replay_ratio": _ratio(fig.sampled, fig.inserted),
    }
    out["actor_capacity"] = _ratio(out["actor_fps"], out["actor_busy"])
    out["learner_capacity"] = _ratio(out["learner_fps"], out["learner_busy"])
    return out


