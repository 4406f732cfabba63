"""``distributed.*=auto``: the run's topology from the machine's cores and a short
measurement of what one env frame costs each side.

A distributed run on one host is two workloads sharing the cores. Per env frame the
actors pay for stepping the env (``env_s``) and for the policy's forward pass
(``forward_s``); the learner pays ``learn_s[t]`` seconds of wall time with ``t`` torch
threads. With ``C`` cores and the learner on ``t`` threads, the run cannot go faster
than the learner alone, nor than the cores can pay for every frame::

    fps(t) = min(1 / learn_s[t],  C / (env_s + forward_s + t * learn_s[t]))

(SEED's learner also runs the inference, so its own term is ``inference_s + learn_s[t]``,
where ``inference_s`` is the forward pass on the learner's device: ``forward_s`` on the
CPU, the GPU's own batched forward with a GPU learner, whose frames then cost the cores
only ``env_s``. Its ``t`` stops one short of ``C``: the inference server's thread runs beside the
learner's in the same process, and a learner whose OpenMP threads outnumber the cores left
to them waits on each other; on 2 cores SEED-IMPALA Pong ran 1.20x faster with one learner
thread than with the two the model without that rule chose.)
:func:`choose_topology` takes the fewest threads whose ``fps(t)`` is within
:data:`THREAD_GAIN` (10%) of the highest: a thread that does not speed the learner up only
takes a core from the actors, and a learner whose OpenMP threads wait on each other
collapses when anything else takes a core (APPO on Pong, 2 cores, 2 learner threads
predicted 1.07x one thread's frames/s; beside a second run it made 315 frames/s, and 2,240
on one thread: docs/notes/2026-11-28.md),
then as many actor processes as the actors' share ``fps * (env_s + forward_s)`` of cores
needs, each counted as the cores one actor keeps busy (:func:`cores_per_actor`: its two
env groups overlap ale-py's stepping with the forward pass, so between one and two).
Actors that outrun the learner then block on full unroll slots (or the replay ratio)
rather than spend the learner's cores on stale experience.

:func:`measure_costs` times the three costs on this machine in about two seconds: the
env's own vector env stepping random actions on one thread, and the agent's network
forward (actor batch) and forward-and-backward (learner batch) at 1 and ``C`` threads
(in between, Amdahl's law through the two points). :func:`resolve` does both for the
settings that say ``auto`` and logs the choice with its figures.

Only pixel games (Atari) are measured: there the split decides the run's speed (Pong
IMPALA on 2 cores: 1 actor of 64 envs and 1 learner thread ran 1.14x the hand-set 2 actors
of 32 and 2 threads, docs/notes/2026-11-24.md). For vectors and MinAtar's grids ``auto``
keeps the hand-set values below (their presets set their own), and under torchrun, where
every rank must choose alike, the reference costs below stand in for a measurement.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from omegaconf import OmegaConf
from torch import nn

from distrl.config import EnvConfig
from distrl.envs import atari_rom, make_envs
from distrl.run.run_settings import RunSettings
from distrl.training.learner import precision_context
from distrl.validation import AUTO_FIELDS, is_auto

# What ``auto`` means where nothing is measured (not pixels): the hand-set topology.
FIXED = {"actors": 2, "envs_per_actor": 32, "env_groups": 2}
# Envs an Atari env group steps as one batch: large enough for an efficient batched
# forward pass, and no larger (batch 16 -> 32 halves the per-frame cost of a Pong
# forward on one core; 64 saves little more and doubles the policy lag of an unroll).
ATARI_ENVS_PER_GROUP = 32
# Pong IMPALA's costs per env frame on this project's 2-core machine (docs/notes/
# 2026-11-24.md): used under torchrun, where ranks must agree without measuring.
REFERENCE_ENV_S = 83e-6
REFERENCE_FORWARD_S = 25e-6
REFERENCE_LEARN_S = {1: 86e-6, 2: 53e-6}
# Most observations in a timed learner pass: Pong IMPALA's whole batch (32 x 20), which
# one thread takes ~0.2 s over.
LEARNER_BATCH = 640


@dataclass(frozen=True)
class Costs:
    """Seconds per env frame (agent steps x frame skip) on this machine."""

    env_s: float  # one core stepping the envs
    forward_s: float  # an actor's forward pass on one thread, at its env group's batch
    learn_s: dict[int, float]  # learner wall seconds by torch threads (1 and the cores)
    measured: bool = True  # False: the reference costs (under torchrun)
    # The forward pass on a GPU learner at the same batch (SEED's central inference runs
    # there); None: the learner is on the CPU, where inference costs forward_s.
    gpu_forward_s: float | None = None

    @property
    def inference_s(self) -> float:
        """Learner wall seconds per frame spent on SEED's central inference."""
        return self.forward_s if self.gpu_forward_s is None else self.gpu_forward_s

    def learn_at(self, threads: int) -> float:
        """Learner wall seconds per frame on ``threads`` threads: measured, or Amdahl's law
        through the 1-thread figure and the largest measured one."""
        if threads in self.learn_s:
            return self.learn_s[threads]
        one = self.learn_s[1]
        most = max(self.learn_s)
        if most == 1:
            return one
        # one * ((1 - p) + p / most) = learn_s[most]  ->  the parallel fraction p
        p = min(max((1 - self.learn_s[most] / one) / (1 - 1 / most), 0.0), 1.0)
        return one * ((1 - p) + p / threads)


# A learner thread more must promise at least this factor of frames/s (module docstring).
THREAD_GAIN = 1.10


@dataclass(frozen=True)
class Topology:
    """A chosen topology and the figures it was chosen by."""

    actors: int
    envs_per_actor: int
    env_groups: int
    learner_threads: int
    predicted_fps: float
    reasons: tuple[str, ...]


def predicted_fps(costs: Costs, cores: int, threads: int, central_inference: bool,
                  gpu_learner: bool = False) -> float:
    """Frames/s the cost model allows with the learner on ``threads`` threads (the
    module docstring's ``fps(t)``)."""
    learn = costs.learn_at(threads)
    learner_wall = learn + (costs.inference_s if central_inference else 0.0)
    learner_cpu = 0.0 if gpu_learner else threads * learn
    # SEED with a GPU learner: the forward passes run on the GPU, not the cores.
    forward_cpu = 0.0 if central_inference and gpu_learner else costs.forward_s
    cpu_per_frame = costs.env_s + forward_cpu + learner_cpu
    return min(1.0 / learner_wall, cores / cpu_per_frame)


def cores_per_actor(costs: Costs, central_inference: bool) -> float:
    """Cores one actor process keeps busy. With two env groups, ale-py's worker thread
    steps one group while the forward pass runs for the other: per frame the actor takes
    the longer of the two in wall time and their sum in CPU time, so
    ``(env_s + forward_s) / max(env_s, forward_s)``, between 1 and 2. SEED's env workers
    only step envs (the learner runs the forward passes): 1.

    The first GPU check (H100, 16 cores, docs/notes/2026-11-27.md) measured env 141 us and
    forward 23 us: 1.16 by this rule, and 8 actors kept 8.4 cores busy; the flat 2 used
    before gave 8 actors for 16 cores and left half of them idle.
    """
    if central_inference:
        return 1.0
    return (costs.env_s + costs.forward_s) / max(costs.env_s, costs.forward_s)


def envs_per_group(batch_size: int | None, per_group: int = ATARI_ENVS_PER_GROUP) -> int:
    """The largest count <= ``per_group`` that divides ``batch_size`` (an unroll batch is
    whole env groups' unrolls); ``per_group`` where batches are not made of unrolls."""
    if batch_size is None:
        return per_group
    return max(n for n in range(1, min(per_group, batch_size) + 1) if batch_size % n == 0)


def choose_topology(costs: Costs, cores: int, batch_size: int | None,
                    central_inference: bool, gpu_learner: bool = False) -> Topology:
    """The topology the cost model ranks first on ``cores`` cores (module docstring).

    Args:
        costs: per-frame costs (:func:`measure_costs`).
        cores: cores this run may use.
        batch_size: unrolls per learner batch, which must be whole env groups (IMPALA,
            SEED-IMPALA); None for replay agents.
        central_inference: SEED: the learner process runs the forward passes, its
            "actors" only step envs.
        gpu_learner: the learner trains on a GPU (one CPU thread feeds it).
    """
    # SEED: the inference server's thread keeps a core of its own beside the learner's.
    most = cores - 1 if central_inference and cores > 1 else cores
    candidates = [1] if gpu_learner else list(range(1, most + 1))
    rates = {t: predicted_fps(costs, cores, t, central_inference, gpu_learner)
             for t in candidates}
    best = max(rates.values())
    threads = min(t for t, r in rates.items() if r * THREAD_GAIN >= best)
    fps = rates[threads]
    acting_s = costs.env_s + (0.0 if central_inference else costs.forward_s)
    actor_cores = fps * acting_s
    per_actor = cores_per_actor(costs, central_inference)
    actors = min(max(1, math.ceil(actor_cores / per_actor - 1e-9)), cores)
    per_group = envs_per_group(batch_size)
    groups = 2
    kind = "env workers" if central_inference else "actors"
    forward_where = ""
    if central_inference:
        forward_where = (" (run by the learner)" if costs.gpu_forward_s is None else
                         f" ({costs.inference_s * 1e6:.0f} us on the learner's GPU, "
                         "which runs it)")
    reasons = (
        f"cost per env frame: env {costs.env_s * 1e6:.0f} us, forward "
        f"{costs.forward_s * 1e6:.0f} us{forward_where}, learner "
        + ", ".join(f"{costs.learn_at(t) * 1e6:.0f} us on {t} thread{'s' * (t > 1)}"
                    for t in sorted({1, threads, max(candidates)}))
        + ("" if costs.measured else " (reference costs: not measured under torchrun)"),
        "predicted frames/s by learner threads: "
        + ", ".join(f"{t}: {r:,.0f}" for t, r in rates.items())
        + (f" (at most {most}: the inference server's thread keeps a core)"
           if most < cores and not gpu_learner else "")
        + f" -> learner_threads={threads}",
        f"{kind} need {actor_cores:.2f} of {cores} cores at {fps:,.0f} frames/s, "
        f"{per_actor:.2f} each with 2 env groups -> actors={actors}",
        f"{per_group} envs per group (a batched forward"
        + (f", dividing agent.batch_size={batch_size})" if batch_size else ")")
        + f" -> envs_per_actor={per_group * groups} env_groups={groups}",
    )
    return Topology(actors, per_group * groups, groups, threads, fps, reasons)


def _time(fn: Callable[[], object], seconds: float, sync: Callable[[], None]) -> float:
    """Seconds per call of ``fn``: one warm-up call, then the median of calls made for
    about ``seconds``."""
    fn()
    sync()
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < 3 or (time.perf_counter() < deadline and len(times) < 50):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def measure_costs(env_cfg: EnvConfig, make_model: Callable[[tuple[int, ...], int], nn.Module],
                  per_group: int, learner_batch: int, learner_passes: float,
                  max_threads: int, device: torch.device, seconds: float = 0.3,
                  precision: str = "float32") -> Costs:
    """Time one env frame's three costs on this machine (module docstring).

    Args:
        env_cfg: the run's env, stepped with random actions, ``per_group`` envs on one thread.
        make_model: the agent's ``(obs_shape, num_actions) -> model``; its torso's forward
            (``per_group`` observations, one thread) and forward-and-backward
            (``learner_batch`` observations) are timed, the rest of a network being small
            beside a convolution on pixels.
        learner_passes: forward-and-backward passes the learner makes per env step
            (:func:`learner_passes`).
        max_threads: the most learner threads to time (1 and this many).
        device: the learner's device.
        seconds: about how long each figure is timed.
        precision: ``agent.precision``: the learner's pass is timed in the run's arithmetic.
    """
    envs = make_envs(env_cfg, per_group, seed=0, num_threads=1)
    try:
        rng = np.random.default_rng(0)
        envs.reset()
        actions = [rng.integers(0, envs.num_actions, size=per_group) for _ in range(64)]
        step = iter(range(1 << 30))
        env_wall = _time(lambda: envs.step(actions[next(step) % 64]), seconds, lambda: None)
        frames_per_step = envs.frames_per_step
        obs_shape, num_actions = envs.observation_shape, envs.num_actions
    finally:
        envs.close()
    threads_before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        torso = make_model(obs_shape, num_actions).torso
        obs = torch.randint(0, 256, (per_group, *obs_shape), dtype=torch.uint8)
        with torch.inference_mode():
            forward = _time(lambda: torso(obs), seconds, lambda: None)
        learner_torso = make_model(obs_shape, num_actions).torso.to(device)
        batch = torch.randint(0, 256, (learner_batch, *obs_shape), dtype=torch.uint8,
                              device=device)
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        gpu_forward = None
        if device.type == "cuda":  # what SEED's inference costs there, one group's batch
            obs_gpu = obs.to(device)
            with torch.inference_mode():
                gpu_forward = _time(lambda: learner_torso(obs_gpu), seconds, sync)

        def train_step() -> None:
            with precision_context(precision, device):
                loss = learner_torso(batch).float().square().mean()
            loss.backward()

        counts = [1] if device.type == "cuda" else sorted({1, max_threads})
        learn: dict[int, float] = {}
        for threads in counts:
            torch.set_num_threads(threads)
            learn[threads] = (_time(train_step, seconds, sync) / learner_batch
                              * learner_passes / frames_per_step)
    finally:
        torch.set_num_threads(threads_before)
    per_frame = per_group * frames_per_step
    return Costs(env_s=env_wall / per_frame, forward_s=forward / per_frame, learn_s=learn,
                 gpu_forward_s=None if gpu_forward is None else gpu_forward / per_frame)


def reference_costs() -> Costs:
    """Pong IMPALA's measured costs on a 2-core machine: what torchrun ranks size by."""
    return Costs(REFERENCE_ENV_S, REFERENCE_FORWARD_S, dict(REFERENCE_LEARN_S), measured=False)


def learner_passes(replay_ratio: float | None, steps_per_item: int = 1,
                   trained_steps: int = 1, forward_only_steps: int = 0) -> float:
    """Forward-and-backward passes (a forward alone counted as a third of one) the learner
    makes per env step.

    Unroll agents (``replay_ratio`` None) learn from each step once. A replay agent samples
    ``replay_ratio`` items per inserted item of ``steps_per_item`` new steps, training on
    ``trained_steps`` of each and running ``forward_only_steps`` more without gradients
    (target network, double-Q's next states, R2D2's burn-in); an uncapped replay ratio (0)
    is counted as one sample per item.
    """
    if replay_ratio is None:
        return 1.0
    ratio = replay_ratio if replay_ratio > 0 else 1.0
    return ratio * (trained_steps + forward_only_steps / 3) / steps_per_item


def runs_inference(source_factory: object) -> bool:
    """Whether an experience source (a class, or a ``functools.partial`` of one) runs the
    actors' forward passes in the learner's process (SEED's ``central_inference``)."""
    factory = getattr(source_factory, "func", source_factory)
    return bool(getattr(factory, "central_inference", False))


def machine_cores() -> int:
    """Cores this process may run on, divided among torchrun's ranks on this host."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def resolve(settings: RunSettings, make_model: Callable[[tuple[int, ...], int], nn.Module],
            batch_size: int | None, learner_batch: int, passes: float,
            central_inference: bool, device: torch.device,
            announce: Callable[[str], None] | None = None,
            precision: str = "float32") -> RunSettings:
    """``settings`` with every ``distributed`` field that says ``auto`` set (module
    docstring), in its config text too (so a checkpoint resumes with the same topology);
    values given as numbers are kept. The choice and its figures are printed (by rank 0)
    or passed to ``announce``. The learner's cost is measured in ``precision``
    (``agent.precision``)."""
    dist = settings.distributed
    auto = [name for name in AUTO_FIELDS if is_auto(getattr(dist, name))]
    if not auto:
        return settings
    cores = machine_cores()
    pixels = atari_rom(settings.env.id) is not None
    if not pixels:
        chosen = dict(FIXED, learner_threads=0)  # 0: learner_rank's rule by the obs shape
        reasons: Sequence[str] = (
            "measured sizing is for Atari games; here auto keeps the hand-set topology",)
    else:
        under_torchrun = int(os.environ.get("WORLD_SIZE", "1")) > 1
        per_group = envs_per_group(batch_size)
        costs = reference_costs() if under_torchrun else measure_costs(
            settings.env, make_model, per_group, min(learner_batch, LEARNER_BATCH), passes,
            max_threads=cores, device=device, precision=precision)
        top = choose_topology(costs, cores, batch_size, central_inference,
                              gpu_learner=device.type == "cuda")
        chosen = {"actors": top.actors, "envs_per_actor": top.envs_per_actor,
                  "env_groups": top.env_groups, "learner_threads": top.learner_threads}
        reasons = top.reasons
    values = {name: chosen[name] for name in auto}
    resolved = dataclasses.replace(dist, **values)
    shown = " ".join(f"distributed.{name}={value}" for name, value in values.items())
    if announce is None:
        announce = print if os.environ.get("RANK", "0") == "0" else (lambda line: None)
    announce(f"[distrl] auto sizing on {cores} core{'s' * (cores > 1)}: {shown}")
    for reason in reasons:
        announce(f"[distrl]   {reason}")
    return dataclasses.replace(settings, distributed=resolved,
                               config_text=_with_topology(settings.config_text, values))


def _with_topology(config_text: str, values: dict[str, int]) -> str:
    """The run's config text with the chosen ``distributed`` values in place of ``auto``."""
    if not config_text.strip():
        return config_text
    config = OmegaConf.create(config_text)
    for name, value in values.items():
        OmegaConf.update(config, f"distributed.{name}", value, force_add=True)
    return OmegaConf.to_yaml(config)
