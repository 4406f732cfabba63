"""Throughput diagnosis: which side of a run, the actors or the learner, bounds its frames
per second, by how much, and what to change, in the run's own settings.

A run is two workloads that feed each other (ARCHITECTURE.md, "The one idea"): actors
(or SEED's env workers and inference server) turn the policy into frames, the learner
turns frames into updates. Each side's time splits into work and waiting for the other:

- actors: stepping envs, the forward pass, copying (into slots or replay writers, weight
  pulls), and waiting for a free slot, i.e. for the learner;
- learner: its update step, building a batch (gathering slots, inserting into the
  replay, the prefetched sample), and waiting for a batch or for the replay ratio's
  credit, i.e. for the actors.

The **capacity** of a side is its rate divided by its busy fraction: the frames/s it
would reach if it never waited. The side with the lower capacity bounds the run; the
margin is the ratio of the capacities (within 15%: balanced). In one process
(``distributed.actors=0``) the sides take turns, so a side's busy fraction is its share
of the loop and the same rule names the side that takes longer. When both sides are
busy and the cores are all in use, the run is also **CPU-bound**: the sides compete for
cores, and moving work between them gains little.

Everything here is a pure function of :class:`Figures` (sums over a span of the run)
and a :class:`RunContext` (the run's settings); the live run (:mod:`distrl.loop`) and
``python -m distrl.diagnose`` (which reads the figures back from tensorboard) share it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from distrl.config import is_auto

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
    learner_copy_s: float = _sum()  # the learner building batches (slot gathers, inserts, samples)
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


@dataclass
class Diagnosis:
    """Which side bounds the run (``bound``: learner, actors, balanced or unknown), by how
    much (``margin``: the faster side's capacity over the slower's, >= 1), whether the
    cores are the limit (``cpu_bound``), the figures as text lines, and advice."""

    bound: str
    margin: float
    cpu_bound: bool
    lines: list[str]
    advice: list[str]
    figures: dict[str, float]  # rates, fractions, capacities, cores (see :func:`derive`)

    @property
    def code(self) -> int:
        """-1 actor-bound, 0 balanced (or unknown), 1 learner-bound."""
        return BOUND_CODES[self.bound]

    @property
    def short(self) -> str:
        """``learner x2.3``, ``actors x1.6``, ``balanced`` or ``?``, ``+cpu`` if CPU-bound."""
        text = {"balanced": "balanced", "unknown": "?"}.get(self.bound)
        if text is None:
            text = f"{self.bound} x{_margin_text(self.margin)}"
        return text + (" +cpu" if self.cpu_bound else "")

    def scalars(self) -> dict[str, float]:
        """The diagnosis as tensorboard scalars under ``throughput/``."""
        return {"throughput/bound_code": float(self.code),
                "throughput/margin": _finite(self.margin),
                "throughput/cpu_bound": float(self.cpu_bound),
                **{f"throughput/{k}": _finite(v) for k, v in self.figures.items()}}

    def to_dict(self) -> dict[str, Any]:
        """For the run's summary (JSON-friendly: no NaN or inf)."""
        return {"bound": self.bound, "margin": _finite(self.margin, None),
                "cpu_bound": self.cpu_bound, "lines": list(self.lines),
                "advice": list(self.advice),
                "figures": {k: _finite(v, None) for k, v in self.figures.items()}}


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


def diagnose(fig: Figures, ctx: RunContext) -> Diagnosis:
    """Which side bounds the run the figures describe, and advice in ``ctx``'s settings."""
    d = derive(fig)
    serial = fig.serial >= 0.5
    capacities = d["actor_capacity"], d["learner_capacity"]
    if fig.updates == 0 or fig.actor_frames == 0 or any(
            math.isnan(c) or c <= 0 for c in capacities):
        bound, margin = "unknown", NAN
    else:
        ratio = capacities[0] / capacities[1]
        margin = max(ratio, 1 / ratio)
        bound = ("balanced" if margin < BALANCED_WITHIN
                 else "learner" if ratio > 1 else "actors")
    saturated = d["machine_busy"] >= CPU_FULL * fig.cores
    cpu_bound = (not serial and saturated and d["actor_busy"] >= BUSY
                 and d["learner_busy"] >= BUSY)
    lines = describe(fig, d, ctx)
    lines.append("verdict  " + verdict(bound, margin, cpu_bound, serial, fig, d, ctx))
    return Diagnosis(bound, margin, cpu_bound, lines,
                     advise(bound, margin, cpu_bound, saturated, serial, fig, d, ctx), d)


# ---------------------------------------------------------------- text


def rate_text(value: float) -> str:
    """Frames/s for people: 28,900; 312; 4.25."""
    if math.isnan(value):
        return "?"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def pct(value: float) -> str:
    return "?" if math.isnan(value) else f"{100 * value:.0f}%"


def gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.2f} GiB" if nbytes < 2**30 * 10 else f"{nbytes / 2**30:.0f} GiB"


def describe(fig: Figures, d: dict[str, float], ctx: RunContext) -> list[str]:
    """One line per side, then the queue or replay, then CPU and memory."""
    serial = fig.serial >= 0.5
    waiting = ("the rest of the loop (the learner's turn)" if serial
               else "waiting for a free slot")
    if ctx.seed:
        split = (f"env workers {pct(d['actor_env'])}, inference {pct(d['actor_forward'])}, "
                 f"copy {pct(d['actor_copy'])}")
    else:
        split = (f"env {pct(d['actor_env'])}, forward {pct(d['actor_forward'])}, "
                 f"copy {pct(d['actor_copy'])}")
    actors = (f"actors   {rate_text(d['actor_fps'])} frames/s; busy {pct(d['actor_busy'])} "
              f"({split}), {waiting} {pct(d['actor_wait'])}; capacity "
              f"{rate_text(d['actor_capacity'])} frames/s")
    if ctx.seed:
        actors = actors.replace("actors   ", "serving  ", 1)
    if serial:
        waits = f"the actor's turn {pct(d['learner_wait'])}"
    elif fig.ratio_wait_s > 0 or ctx.replay:
        waits = (f"waiting for new data {pct(d['learner_ratio_wait'])}"
                 f" (learning_starts, replay ratio)")
    else:
        waits = f"waiting for batches {pct(d['learner_batch_wait'])}"
    # The loop's time neither side accounts for (collecting counters, logging,
    # checkpoints): large, it says the figures miss where the time goes.
    if serial:
        other = 1.0 - d["learner_busy"] - d["actor_busy"]
    else:
        other = 1.0 - d["learner_busy"] - d["learner_batch_wait"] - d["learner_ratio_wait"]
    if other > 0.1:
        waits += f", other {pct(other)}"
    learner = (f"learner  {rate_text(d['learner_fps'])} frames/s learned "
               f"({d['updates_per_s']:.3g} updates/s); busy {pct(d['learner_busy'])} "
               f"(step {pct(d['learner_step'])}, batch {pct(d['learner_copy'])}), {waits}; "
               f"capacity {rate_text(d['learner_capacity'])} frames/s")
    lines = [actors, learner]
    if not math.isnan(fig.slots_full) and not serial:
        lines.append(f"queue    slots {pct(fig.slots_full)} full")
    if not math.isnan(fig.replay_ratio_target):
        asked = ("uncapped" if fig.replay_ratio_target == 0
                 else f"{fig.replay_ratio_target:g} asked")
        if fig.replay_ratio_target > 0 and d["replay_ratio"] < 0.9 * fig.replay_ratio_target:
            asked += (": short of it, the learner lags behind the inserts or the replay is "
                      "still filling to learning_starts")
        fill = "" if math.isnan(fig.replay_fill) else f"size {pct(fig.replay_fill)} of capacity; "
        lines.append(f"replay   {fill}ratio {d['replay_ratio']:.3g} sampled per inserted "
                     f"({asked})")
    children = "env workers" if ctx.seed else "actors"
    others = d["machine_busy"] - d["cpu_busy"]
    lines.append(f"cpu      {d['cpu_busy']:.2f} of {fig.cores:g} cores busy with this run "
                 f"(learner {d['cpu_learner']:.2f}, {children} {d['cpu_actors']:.2f}), "
                 f"{others:.2f} with other processes")
    lines.append(f"memory   learner {gib(fig.learner_rss)}, {children} {gib(fig.actors_rss)}")
    return lines


def verdict(bound: str, margin: float, cpu_bound: bool, serial: bool, fig: Figures,
            d: dict[str, float], ctx: RunContext) -> str:
    """One sentence: the bound side, by how much and why."""
    side = ctx.actor_side
    if bound == "unknown":
        if fig.updates == 0:
            return ("unknown: the learner made no update yet (filling the replay to "
                    "learning_starts, or starting)")
        return "unknown: too few figures from one of the sides"
    if serial:
        text = (f"one process: the actors' turn is {pct(d['actor_busy'])} of the time, the "
                f"learner's {pct(d['learner_busy'])}; ")
    else:
        text = ""
    if bound == "balanced":
        text += f"balanced: the capacities are within {100 * (BALANCED_WITHIN - 1):.0f}%"
    elif bound == "learner":
        text += f"learner-bound x{_margin_text(margin)}"
        if not serial:
            text += f": the {side} wait {pct(d['actor_wait'])} of their time for a free slot"
    else:
        text += f"actor-bound x{_margin_text(margin)}"
        if not serial:
            wait = d["learner_batch_wait"] + d["learner_ratio_wait"]
            text += f": the learner waits {pct(wait)} of the time for the {side}"
    if cpu_bound:
        text += (f"; CPU-bound: both sides are busy and {d['machine_busy']:.1f} of "
                 f"{fig.cores:g} cores are in use, so the sides compete for cores")
    return text


# ---------------------------------------------------------------- advice


def advise(bound: str, margin: float, cpu_bound: bool, saturated: bool, serial: bool,
           fig: Figures, d: dict[str, float], ctx: RunContext) -> list[str]:
    """Concrete changes in the run's own settings, each with why; every setting named
    exists and every value is one the config accepts."""
    advice: list[str] = []
    cores = int(round(fig.cores))
    idle = fig.cores - d["machine_busy"]
    if bound == "unknown":
        return advice
    if serial:
        if cores >= 2:
            busy_elsewhere = (f" ({d['machine_busy'] - d['cpu_busy']:.1f} more are busy with "
                              "other processes)" if idle < 0.5 else "")
            advice.append(
                f"distributed.actors=1 steps the envs in an actor process beside the "
                f"learner: the sides now take turns in one process, using "
                f"{d['cpu_busy']:.1f} of {cores} cores{busy_elsewhere}")
        if bound == "actors":
            advice += _cheaper_acting(fig, d, ctx)
        elif bound == "learner":
            advice += _lower_replay_ratio(margin, fig, ctx)
        return advice
    if bound == "learner":
        advice += _feed_the_learner(margin, saturated, idle, fig, d, ctx)
    elif bound == "actors":
        advice += _feed_the_actors(margin, saturated, idle, fig, d, ctx)
    elif cpu_bound:
        advice.append(f"both sides keep pace with each other and the {cores} cores are "
                      "busy: only cheaper work per frame (a smaller network or fewer "
                      "threads competing) makes this run faster")
    if cpu_bound or saturated:
        advice += _oversubscription(fig, ctx)
    return advice


def _feed_the_learner(margin: float, saturated: bool, idle: float, fig: Figures,
                      d: dict[str, float], ctx: RunContext) -> list[str]:
    advice = []
    side = ctx.actor_side
    needed = ctx.actors * d["actor_busy"] * BALANCED_WITHIN  # processes' worth of work
    fewer = max(1, math.ceil(needed))
    if ctx.actors > 1 and fewer < ctx.actors:
        why = (f"would leave more of the {fig.cores:g} busy cores to the learner"
               if saturated else "would do: the others only wait")
        advice.append(f"learner-bound: the {side} wait {pct(d['actor_wait'])} of the time; "
                      f"distributed.actors={fewer} {why} (the {side} need about "
                      f"{needed:.1f} processes' worth of time)")
    if fig.learner_gpu < 0.5 and idle >= 1.0 and fig.learner_threads < fig.cores:
        threads = int(min(fig.cores, fig.learner_threads + math.floor(idle)))
        advice.append(
            f"learner on cpu with {idle:.1f} idle cores: distributed.learner_threads="
            f"{threads} (now {fig.learner_threads:g}) lets its torch use them; that pays "
            "for image convolutions, while small networks can run slower with more threads")
    advice += _lower_replay_ratio(margin, fig, ctx)
    if not advice:
        advice.append(f"learner-bound: a faster learner step is what helps (a GPU with "
                      f"{ctx.path}.device=cuda, or a smaller network)")
    return advice


def _lower_replay_ratio(margin: float, fig: Figures, ctx: RunContext) -> list[str]:
    if not (ctx.replay and fig.replay_ratio_target > 0):
        return []
    lower = _round_sig(fig.replay_ratio_target / margin)
    return [f"{ctx.path}.replay_ratio={lower:g} (now {fig.replay_ratio_target:g}) is what "
            "the learner sustains at this speed: fewer updates per frame, so the actors "
            "stop waiting (it changes how often each item is replayed)"]


def _feed_the_actors(margin: float, saturated: bool, idle: float, fig: Figures,
                     d: dict[str, float], ctx: RunContext) -> list[str]:
    advice = []
    side = ctx.actor_side
    wait = d["learner_batch_wait"] + d["learner_ratio_wait"]
    intro = f"actor-bound: the learner waits {pct(wait)} of the time for batches"
    advice += [f"{intro}; {line}" for line in _cheaper_acting(fig, d, ctx)]
    if not saturated and idle >= 0.7:
        more = ctx.actors + max(1, math.floor(idle))
        advice.append(f"{intro}; distributed.actors={more} (now {ctx.actors}) puts the "
                      f"{idle:.1f} idle cores to work for the {side}")
    elif saturated:
        advice.append(f"{intro}, but the {fig.cores:g} cores are busy: more "
                      f"{'env workers' if ctx.seed else 'actor processes'} would compete "
                      "with the learner for them")
        if fig.learner_gpu < 0.5 and fig.learner_threads > 1:
            advice.append(f"distributed.learner_threads=1 (now {fig.learner_threads:g}) "
                          f"leaves more cores to the {side} while the learner waits")
    if ctx.replay and fig.replay_ratio_target > 0 and d["learner_ratio_wait"] > 0.2:
        higher = _round_sig(fig.replay_ratio_target * margin)
        advice.append(
            f"{ctx.path}.replay_ratio={higher:g} (now {fig.replay_ratio_target:g}) would "
            "use the learner's idle time: more updates per frame (it changes how often "
            "each item is replayed)")
    if not advice:
        busy = max(d["actor_busy"], 1e-9)
        advice.append(f"{intro}; the {side} spend {pct(d['actor_env'] / busy)} of their "
                      f"busy time stepping envs and {pct(d['actor_forward'] / busy)} in the "
                      "forward pass, with no idle core to add: only a cheaper env or "
                      "network per frame, or more cores, makes this run faster")
    return advice


def _cheaper_acting(fig: Figures, d: dict[str, float], ctx: RunContext) -> list[str]:
    """Advice that makes each actor frame cheaper, from the actors' time split."""
    advice = []
    busy = d["actor_busy"]
    if not busy > 0:
        return advice
    forward, env = d["actor_forward"] / busy, d["actor_env"] / busy
    if forward >= 0.5:
        if ctx.seed and ctx.max_inference_batch > 0:
            advice.append(f"inference is {pct(forward)} of the serving time: "
                          "agent.max_inference_batch=0 lets one call serve every waiting env")
        else:
            setting, note = _more_envs(ctx)
            advice.append(f"the forward pass is {pct(forward)} of the {ctx.actor_side}' busy "
                          f"time: {setting} batches more envs per forward{note}")
    if env >= 0.5 and ctx.async_envs and ctx.env_groups == 1 and ctx.envs_per_actor % 2 == 0:
        advice.append(f"env stepping is {pct(env)} of the {ctx.actor_side}' busy time: "
                      "distributed.env_groups=2 overlaps env stepping with inference")
    return advice


def _more_envs(ctx: RunContext) -> tuple[str, str]:
    """``distributed.envs_per_actor`` doubled, and a note naming the batch size an unroll
    learner then needs (its batch is whole env groups)."""
    envs = 2 * ctx.envs_per_actor
    per_group = envs // ctx.env_groups
    note = ""
    if not ctx.replay and ctx.batch_size % per_group:
        batch = ctx.batch_size * per_group // math.gcd(ctx.batch_size, per_group)
        note = (f" (with {ctx.path}.batch_size={batch}: a batch is whole env groups of "
                f"{per_group})")
    return f"distributed.envs_per_actor={envs}", note


def _oversubscription(fig: Figures, ctx: RunContext) -> list[str]:
    """Threads beyond the cores: the run's torch threads compete with each other."""
    actors = ctx.actors if not ctx.seed else 0  # env workers run no torch
    threads = fig.learner_threads + actors * ctx.actor_threads
    if threads <= fig.cores:
        return []
    excess = (f"{threads:g} torch threads (learner {fig.learner_threads:g} + {actors} actors "
              f"x {ctx.actor_threads}) compete for {fig.cores:g} cores")
    if ctx.actor_threads > 1:
        return [f"{excess}: distributed.actor_threads=1 removes the excess"]
    if fig.learner_threads > 1:
        return [f"{excess}: distributed.learner_threads=1 removes the excess"]
    return []


def _round_sig(value: float) -> float:
    """Two significant digits, never 0."""
    if value <= 0:
        return 0.01
    digits = 1 - math.floor(math.log10(value))
    return max(round(value, digits), 10.0 ** -digits)
