"""Throughput of an agent: env frames/s and learner updates/s, next to ale-py alone.

    python benchmarks/fps.py agent=impala env=Pong [any run.py override] \
        [--repeats 3] [--warmup-updates 5] [--updates 40] [--vs OVERRIDE ...]

Each repeat trains from scratch; the first ``--warmup-updates`` updates (process
start, first unrolls) are excluded and the next ``--updates`` are timed. The
figure quoted is the median over repeats. For scale it also measures ale-py's
AtariVectorEnv stepping the same number of envs with random actions (same run,
same machine) and prints the ratio.

``agent=seed`` also times its learner's plain agent (IMPALA, or R2D2 with
``agent.learner=r2d2``) with the same settings and topology (env workers become
actors), alternating the two in each repeat, and prints SEED's mean inference batch
size and the frames/s ratio.

``--vs agent.model.torso=nature`` (any run.py overrides) times a second variant, the
same run plus those overrides, alternating with the first in each repeat, and prints
both medians and their ratio: the side-by-side comparison on one machine in one run.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ale_speed import ale_random_fps  # noqa: E402

import agents  # noqa: E402
from distrl.config import is_auto, register_configs  # noqa: E402
from distrl.envs import atari_rom, is_atari  # noqa: E402
from distrl.runners.replay_learner import frames_learned  # noqa: E402
from distrl.training import sizing  # noqa: E402


def load_config(overrides: list[str]):
    register_configs()
    agents.register_configs()
    with initialize_config_dir(str(ROOT / "experiments"), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    return OmegaConf.to_object(cfg)


def twin_overrides(seed_overrides: list[str], learner: str) -> list[str]:
    """The plain agent run (IMPALA or R2D2) that matches a SEED run: the same learner
    settings, device and topology, actors with policy copies instead of central
    inference."""
    out = []
    for override in seed_overrides:
        if override.startswith("agent="):
            out.append(f"agent={learner}")
        elif override.startswith("agent.device="):  # SEED's one device is the learner's
            out.append(override)
        elif override.startswith(f"agent.{learner}."):
            out.append("agent." + override.removeprefix(f"agent.{learner}."))
        elif not override.startswith("agent."):  # SEED's own settings have no twin
            out.append(override)
    return out


def learner_config(cfg):
    """The unroll/replay learner's settings (SEED keeps them under agent.<learner>)."""
    learner = getattr(cfg.agent, "learner", None)
    return getattr(cfg.agent, learner) if learner else cfg.agent


def time_training(cfg, warmup_updates: int,
                  updates: int) -> tuple[float, float, float | None, float | None, str]:
    """Train ``warmup_updates + updates`` updates. Returns frames/s and updates/s over the
    timed part (a replay agent that holds a replay ratio: the frames its updates consume at
    that ratio, the rate the run sustains, as its own throughput report counts) and, for
    replay agents, the fraction of learner time spent waiting on the replay (the
    prefetched sample) over the whole run; for SEED, the mean inference batch (envs per
    call) over the whole run; and the cores the learner process and its children used
    over the whole run (the run's throughput diagnosis)."""
    stamps: dict[int, float] = {}
    frames_at: dict[int, int] = {}

    def should_stop(done: int) -> bool:
        stamps[done] = time.perf_counter()
        return done >= warmup_updates + updates

    def progress(done: int, frames: int) -> None:
        frames_at[done] = frames

    run = agents.get(cfg.agent.name).run
    learner = learner_config(cfg)
    replay_agent = hasattr(learner, "replay_capacity")
    uncapped = replay_agent and learner.replay_ratio == 0
    with tempfile.TemporaryDirectory() as tmp:
        cfg.log.dir, cfg.log.name, cfg.log.tensorboard = tmp, "bench", False
        cfg.checkpoint.interval_s = 1e9
        cfg.total_frames = 10**12
        if uncapped:  # count the frames that arrived in the window
            result = run(cfg, should_stop=should_stop, progress=progress)
        else:
            result = run(cfg, should_stop=should_stop)
    # The count can step by more than one (agent.passes > 1 counts every pass): time from
    # the first count past the warm-up to the one that stopped the run.
    timed_counts = [k for k in stamps if k >= warmup_updates]
    if not timed_counts:
        raise SystemExit(f"fps: the run stopped after {max(stamps, default=0)} updates, "
                         f"before the {warmup_updates} warm-up updates were done: nothing "
                         "was timed (was it stopped, or did its actors not start?)")
    first = min(timed_counts)
    end = max(stamps)
    span, timed = stamps[end] - stamps[first], end - first
    if replay_agent:
        if uncapped:
            frames = frames_at[end] - frames_at[first]
        else:
            frames = frames_learned(timed * learner.batch_size, learner.replay_ratio,
                                    result["frames"], result["inserted"])
        wait = result["replay_wait_s"] / max(result["learner_s"], 1e-9)
    else:  # an update consumes a fixed number of frames
        frames = timed * result["frames"] / result["updates"]
        wait = None
    figures = (result.get("throughput") or {}).get("figures") or {}
    cpu = (f"cpu: learner {figures.get('cpu_learner') or 0:.2f} cores, actors "
           f"{figures.get('cpu_actors') or 0:.2f}")
    return frames / span, timed / span, wait, result.get("inference_batch_mean"), cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup-updates", type=int, default=5)
    parser.add_argument("--updates", type=int, default=40)
    parser.add_argument("--vs", nargs="+", default=None, metavar="OVERRIDE",
                        help="time a second variant: the same overrides plus these")
    args, overrides = parser.parse_known_args()
    cfg = load_config(overrides)
    dist = cfg.distributed
    print(f"hardware: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"torch {torch.__version__}; python {platform.python_version()}")
    print(f"config: agent={cfg.agent.name} env={cfg.env.id} actors={dist.actors} "
          f"envs_per_actor={dist.envs_per_actor} env_groups={dist.env_groups} "
          f"env_threads={dist.env_threads} learner_threads={dist.learner_threads or 'auto'} "
          f"actor_threads={dist.actor_threads} batch={learner_config(cfg).batch_size} "
          + (f"unroll={learner_config(cfg).unroll_length}"
             if hasattr(learner_config(cfg), "unroll_length") else
             f"replay_ratio={learner_config(cfg).replay_ratio} "
             f"learning_starts={learner_config(cfg).learning_starts}"))
    seed = cfg.agent.name == "seed"
    fps, ups, waits, batches, twin_fps, vs_fps, vs_ups = [], [], [], [], [], [], []
    for repeat in range(args.repeats):
        f, u, w, b, cpu = time_training(load_config(overrides), args.warmup_updates,
                                        args.updates)
        fps.append(f)
        ups.append(u)
        waits.append(w)
        batches.append(b)
        shown = "" if w is None else f", {100 * w:.3f}% of learner time waiting on replay"
        shown += "" if b is None else f", mean inference batch {b:.1f} envs"
        print(f"repeat {repeat}: {f:,.0f} frames/s, {u:.3f} updates/s{shown}, {cpu}",
              flush=True)
        if seed:
            f, u, _, _, cpu = time_training(
                load_config(twin_overrides(overrides, cfg.agent.learner)),
                args.warmup_updates, args.updates)
            twin_fps.append(f)
            print(f"repeat {repeat}: {cfg.agent.learner} {f:,.0f} frames/s, {u:.3f} updates/s,"
                  f" {cpu}", flush=True)
        if args.vs:
            f, u, _, _, cpu = time_training(load_config(overrides + args.vs),
                                            args.warmup_updates, args.updates)
            vs_fps.append(f)
            vs_ups.append(u)
            print(f"repeat {repeat}: with {' '.join(args.vs)}: {f:,.0f} frames/s, "
                  f"{u:.3f} updates/s, {cpu}", flush=True)
    median_fps = statistics.median(fps)
    shown = "" if waits[0] is None else (
        f", {100 * statistics.median(waits):.3f}% of learner time waiting on replay")
    shown += "" if batches[0] is None else (
        f", mean inference batch {statistics.median(batches):.1f} envs")
    print(f"{cfg.agent.name} median: {median_fps:,.0f} env frames/s, "
          f"{statistics.median(ups):.3f} learner updates/s{shown} over {args.repeats} repeats")
    if seed:
        twin = statistics.median(twin_fps)
        print(f"{cfg.agent.learner} median (same settings, same run): {twin:,.0f} env "
              f"frames/s; seed/{cfg.agent.learner} = {median_fps / twin:.2f}")
    if args.vs:
        vs = statistics.median(vs_fps)
        print(f"with {' '.join(args.vs)} median (same run): {vs:,.0f} env frames/s, "
              f"{statistics.median(vs_ups):.3f} learner updates/s; "
              f"first/second = {median_fps / vs:.2f} in frames/s, "
              f"{statistics.median(ups) / statistics.median(vs_ups):.2f} in updates/s")
    learner = learner_config(cfg)
    if hasattr(learner, "trace_length"):  # R2D2: a batch is sequences of trained steps
        per_s = statistics.median(ups) * learner.batch_size
        print(f"learner: {per_s:,.1f} sequences/s ({per_s * learner.trace_length:,.0f} "
              f"trained steps/s, plus {learner.burn_in} burn-in and {learner.n_step} "
              f"bootstrap steps per sequence)")
    if is_atari(cfg.env.id):
        # auto: one actor's two groups, what sizing picks on 2 cores (the run prints its own)
        envs = (2 * sizing.ATARI_ENVS_PER_GROUP
                if is_auto(dist.actors) or is_auto(dist.envs_per_actor)
                else max(dist.actors, 1) * dist.envs_per_actor)
        ale = ale_random_fps(atari_rom(cfg.env.id), envs, threads=os.cpu_count() or 1,
                             frame_skip=cfg.env.frame_skip)
        print(f"ale-py AtariVectorEnv alone ({envs} envs, {os.cpu_count()} threads, random "
              f"actions): {ale:,.0f} frames/s; ratio agent/ale = {median_fps / ale:.2f}")


if __name__ == "__main__":
    main()
