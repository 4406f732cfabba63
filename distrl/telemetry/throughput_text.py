"""What a throughput diagnosis says: one line per side (:func:`describe`), the verdict
(:func:`verdict`) and concrete advice in the run's own settings (:func:`advise`), from
the figures of :mod:`distrl.telemetry.throughput_figures`.
"""

from __future__ import annotations

import math

from distrl.telemetry.throughput_figures import (
    BALANCED_WITHIN,
    Figures,
    RunContext,
    _margin_text,
)


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
        advice += _oversubscription(fig, ctx, bound)
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


def _oversubscription(fig: Figures, ctx: RunContext, bound: str) -> list[str]:
    """Threads beyond the cores: the run's torch threads compete with each other. A
    learner-bound run keeps its learner threads: they speed up the side that bounds it
    (Pong APPO on 2 cores, learner 2 threads + 1 actor thread: 1.03x the frames/s of
    learner_threads=1, docs/notes/2026-11-25.md)."""
    actors = ctx.actors if not ctx.seed else 0  # env workers run no torch
    threads = fig.learner_threads + actors * ctx.actor_threads
    if threads <= fig.cores:
        return []
    excess = (f"{threads:g} torch threads (learner {fig.learner_threads:g} + {actors} actors "
              f"x {ctx.actor_threads}) compete for {fig.cores:g} cores")
    if ctx.actor_threads > 1:
        return [f"{excess}: distributed.actor_threads=1 removes the excess"]
    if fig.learner_threads > 1 and bound != "learner":
        return [f"{excess}: distributed.learner_threads=1 removes the excess"]
    return []


def _round_sig(value: float) -> float:
    """Two significant digits, never 0."""
    if value <= 0:
        return 0.01
    digits = 1 - math.floor(math.log10(value))
    return max(round(value, digits), 10.0 ** -digits)
