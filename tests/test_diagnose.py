"""The throughput diagnosis: the pure rule on hand-made figures (learner-bound,
actor-bound, balanced and CPU-bound, a replay ratio the learner falls short of, one
process), and whole runs made learner-bound (a slowed loss) or actor-bound (a slowed
env) on purpose, whose summary and ``python -m distrl.diagnose`` name the right side.
The whole runs are marked ``slow`` with the learning tests: their verdict rests on
measured time (a 10x lopsided run), so the default ``-m "not slow"`` suite asserts
nothing that depends on the machine's speed or load; CI runs both."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import time

import pytest
from presets import REPO, compose_run
from slow_loss import SlowImpalaLoss

from agents import apex, impala
from distrl.telemetry import diagnose as diagnose_cli
from distrl.telemetry.logging import MetricLogger
from distrl.telemetry.throughput import (
    Figures,
    RunContext,
    combine,
    derive,
    diagnose,
)
from distrl.telemetry.throughput_meter import run_context

IMPALA_2_ACTORS = RunContext(agent="impala", actors=2, envs_per_actor=32, env_groups=1,
                             batch_size=32)

# Two actor processes over 10 s (20 actor-seconds): busy 6 s, waiting 14 s for slots; the
# learner steps 9.5 s of 10; both cores busy.
LEARNER_BOUND = Figures(
    span_s=10.0, actor_frames=10_000, learned_frames=10_000, updates=300, env_s=4.0,
    forward_s=1.5, actor_copy_s=0.5, actor_wait_s=14.0, step_s=9.5, learner_copy_s=0.3,
    batch_wait_s=0.2, learner_cpu_s=9.8, actors_cpu_s=6.0, machine_cpu_s=19.0, cores=2.0,
    learner_threads=1.0, slots_full=0.9)

# One actor process, never waiting, 65% of it the forward pass; the learner waits 68%.
ACTOR_BOUND = Figures(
    span_s=10.0, actor_frames=10_000, learned_frames=10_000, updates=300, env_s=3.0,
    forward_s=6.5, actor_copy_s=0.5, actor_wait_s=0.0, step_s=3.0, learner_copy_s=0.2,
    batch_wait_s=6.8, learner_cpu_s=2.0, actors_cpu_s=10.0, machine_cpu_s=12.0, cores=2.0,
    learner_threads=1.0, slots_full=0.0)


def test_learner_bound_capacity_margin_and_advice():
    result = diagnose(LEARNER_BOUND, IMPALA_2_ACTORS)
    # capacity: actors 1000 / 0.3 busy = 3333 frames/s; learner 1000 / 0.98 = 1020
    assert result.bound == "learner" and result.code == 1
    assert result.margin == pytest.approx((1000 / 0.3) / (1000 / 0.98))
    assert result.short == "learner x3.3"
    assert not result.cpu_bound  # the actors are mostly waiting, not competing
    assert result.lines[-1] == ("verdict  learner-bound x3.3: the actors wait 70% of their "
                                "time for a free slot")
    assert result.advice == [
        "learner-bound: the actors wait 70% of the time; distributed.actors=1 would leave "
        "more of the 2 busy cores to the learner (the actors need about 0.7 processes' worth "
        "of time)"]


def test_learner_bound_with_idle_cores_suggests_learner_threads():
    # this run keeps 1.58 of 4 cores busy, the machine 1.6
    idle = Figures(**{**vars(LEARNER_BOUND), "cores": 4.0, "machine_cpu_s": 16.0})
    advice = diagnose(idle, IMPALA_2_ACTORS).advice
    assert advice[0].endswith("distributed.actors=1 would do: the others only wait (the "
                              "actors need about 0.7 processes' worth of time)")
    assert advice[1].startswith("learner on cpu with 2.4 idle cores: "
                                "distributed.learner_threads=3 (now 1)")


def test_actor_bound_forward_heavy_batches_more_envs_and_uses_idle_cores():
    ctx = RunContext(agent="impala", actors=1, envs_per_actor=32, env_groups=1, batch_size=32)
    result = diagnose(ACTOR_BOUND, ctx)
    # actors 1000 / 1.0 busy; learner 1000 / 0.32 = 3125
    assert result.bound == "actors" and result.code == -1
    assert result.margin == pytest.approx(3.125)
    assert result.short == "actors x3.1"
    assert result.lines[-1] == ("verdict  actor-bound x3.1: the learner waits 68% of the "
                                "time for the actors")
    assert result.advice == [
        "actor-bound: the learner waits 68% of the time for batches; the forward pass is 65% "
        "of the actors' busy time: distributed.envs_per_actor=64 batches more envs per "
        "forward (with agent.batch_size=64: a batch is whole env groups of 64)",
        "actor-bound: the learner waits 68% of the time for batches; distributed.actors=2 "
        "(now 1) puts the 0.8 idle cores to work for the actors"]


def test_actor_bound_on_env_steps_overlaps_them_where_envs_step_in_threads():
    env_heavy = Figures(**{**vars(ACTOR_BOUND), "env_s": 7.0, "forward_s": 2.5,
                           "machine_cpu_s": 19.0})
    atari = RunContext(agent="impala", actors=1, envs_per_actor=32, env_groups=1,
                       batch_size=32, async_envs=True)
    advice = diagnose(env_heavy, atari).advice
    assert advice[0] == ("actor-bound: the learner waits 68% of the time for batches; env "
                         "stepping is 70% of the actors' busy time: distributed.env_groups=2 "
                         "overlaps env stepping with inference")
    assert advice[1].endswith("but the 2 cores are busy: more actor processes would compete "
                              "with the learner for them")
    # envs that step in this thread (gymnasium, MinAtar) gain nothing from a second group
    python_envs = RunContext(**{**vars(atari), "async_envs": False})
    assert not any("env_groups" in line for line in diagnose(env_heavy, python_envs).advice)


def test_balanced_and_cpu_bound():
    both_busy = Figures(
        span_s=10.0, actor_frames=10_000, learned_frames=10_000, updates=300, env_s=12.0,
        forward_s=5.0, actor_copy_s=1.0, actor_wait_s=2.0, step_s=9.0, learner_copy_s=0.2,
        batch_wait_s=0.8, learner_cpu_s=9.0, actors_cpu_s=10.0, machine_cpu_s=19.5, cores=2.0,
        learner_threads=1.0)
    ctx = RunContext(agent="impala", actors=2, envs_per_actor=32, env_groups=1,
                     batch_size=32, actor_threads=2)
    result = diagnose(both_busy, ctx)
    assert result.bound == "balanced" and result.code == 0
    assert result.margin == pytest.approx((1000 / 0.9) / (1000 / 0.92))  # < 1.15
    assert result.cpu_bound and result.short == "balanced +cpu"
    assert result.lines[-1] == (
        "verdict  balanced: the capacities are within 15%; CPU-bound: both sides are busy "
        "and 1.9 of 2 cores are in use, so the sides compete for cores")
    assert result.advice == [
        "both sides keep pace with each other and the 2 cores are busy: only cheaper work "
        "per frame (a smaller network or fewer threads competing) makes this run faster",
        "5 torch threads (learner 1 + 2 actors x 2) compete for 2 cores: "
        "distributed.actor_threads=1 removes the excess"]


def test_a_learner_bound_run_keeps_its_learner_threads():
    # Pong APPO as run on 2 cores: the learner steps 99% of the time on 2 threads, one
    # actor of 1 thread waits half its time for slots; 3 threads on 2 cores, but taking
    # the learner's second thread slows the side that bounds the run (1.03x,
    # docs/notes/2026-11-25.md)
    pong = Figures(
        span_s=10.0, actor_frames=24_000, learned_frames=24_000, updates=150, env_s=1.9,
        forward_s=2.8, actor_copy_s=0.4, actor_wait_s=5.0, step_s=9.9, learner_copy_s=0.0,
        batch_wait_s=0.1, learner_cpu_s=14.8, actors_cpu_s=5.0, machine_cpu_s=19.9,
        cores=2.0, learner_threads=2.0)
    ctx = RunContext(agent="impala", actors=1, envs_per_actor=16, env_groups=2, batch_size=8)
    result = diagnose(pong, ctx)
    assert result.bound == "learner"
    assert not any("learner_threads=1" in line for line in result.advice)
    # the same threads in an actor-bound run: the learner's second thread is the excess
    starved = dataclasses.replace(pong, step_s=3.0, batch_wait_s=7.0, actor_wait_s=0.0,
                                  env_s=6.0, forward_s=3.6)
    advice = diagnose(starved, ctx).advice
    assert diagnose(starved, ctx).bound == "actors"
    assert advice[-1] == ("3 torch threads (learner 2 + 1 actors x 1) compete for 2 cores: "
                          "distributed.learner_threads=1 removes the excess")


def test_replay_ratio_short_of_the_setting_is_learner_bound():
    ctx = RunContext(agent="apex", replay=True, actors=2, envs_per_actor=16, env_groups=1,
                     batch_size=64, replay_ratio=4.0)
    short = Figures(
        span_s=10.0, actor_frames=10_000, learned_frames=5_000, updates=312, env_s=5.0,
        forward_s=2.0, actor_copy_s=1.0, actor_wait_s=12.0, step_s=9.5, learner_copy_s=0.2,
        ratio_wait_s=0.3, sampled=20_000, inserted=10_000, replay_ratio_target=4.0,
        replay_fill=0.1, slots_full=1.0, learner_cpu_s=9.7, actors_cpu_s=8.0,
        machine_cpu_s=19.0, cores=2.0, learner_threads=1.0)
    result = diagnose(short, ctx)
    # actors 1000 / 0.4 = 2500 frames/s; learner (5000 frames' worth in 10 s) 500 / 0.97
    assert result.bound == "learner"
    assert result.margin == pytest.approx(2500 / (500 / 0.97))
    assert ("replay   size 10% of capacity; ratio 2 sampled per inserted (4 asked: short of "
            "it, the learner lags behind the inserts or the replay is still filling to "
            "learning_starts)") in result.lines
    assert result.advice[-1] == (
        "agent.replay_ratio=0.82 (now 4) is what the learner sustains at this speed: fewer "
        "updates per frame, so the actors stop waiting (it changes how often each item is "
        "replayed)")


def test_one_process_compares_the_turns_and_suggests_an_actor_process():
    serial = Figures(
        span_s=10.0, actor_frames=5_000, learned_frames=5_000, updates=150, env_s=1.0,
        forward_s=1.0, actor_copy_s=0.5, step_s=7.0, learner_copy_s=0.3, learner_cpu_s=10.0,
        machine_cpu_s=10.5, serial=1.0, cores=2.0, learner_threads=1.0)
    ctx = RunContext(agent="impala", actors=0, envs_per_actor=32, env_groups=1, batch_size=32)
    result = diagnose(serial, ctx)
    # each side's capacity is its frames over its own turn: 5000 / 2.5 s and 5000 / 7.3 s
    assert result.bound == "learner"
    assert result.margin == pytest.approx(7.3 / 2.5)
    assert result.lines[-1] == ("verdict  one process: the actors' turn is 25% of the time, "
                                "the learner's 73%; learner-bound x2.9")
    assert result.advice == [
        "distributed.actors=1 steps the envs in an actor process beside the learner: the "
        "sides now take turns in one process, using 1.0 of 2 cores"]


def test_no_update_yet_is_unknown_with_no_advice():
    filling = Figures(**{**vars(LEARNER_BOUND), "updates": 0.0, "learned_frames": 0.0,
                         "step_s": 0.0})
    result = diagnose(filling, IMPALA_2_ACTORS)
    assert (result.bound, result.code, result.short, result.advice) == ("unknown", 0, "?", [])
    assert "no update yet" in result.lines[-1]
    assert result.to_dict()["margin"] is None  # JSON has no NaN


def test_combine_adds_sums_and_weighs_levels_by_span():
    a = Figures(span_s=10.0, actor_frames=100, slots_full=1.0, cores=2.0)
    b = Figures(span_s=30.0, actor_frames=300, slots_full=0.0, cores=2.0)
    both = combine([a, b])
    assert (both.span_s, both.actor_frames, both.cores) == (40.0, 400, 2.0)
    assert both.slots_full == pytest.approx(0.25)
    assert math.isnan(both.replay_fill)  # measured in neither
    assert derive(both)["actor_fps"] == pytest.approx(10.0)
    back = Figures.from_scalars({k: v for k, v in both.as_scalars().items()
                                 if not math.isnan(v)})  # the logger drops NaN
    assert math.isnan(back.replay_fill)  # NaN again: the default
    assert back.as_scalars().keys() == both.as_scalars().keys()
    assert all(back.as_scalars()[k] == v for k, v in both.as_scalars().items()
               if not math.isnan(v))


def test_context_reads_the_runs_own_settings_from_its_logged_config():
    text = ("```\nagent:\n  name: seed\n  learner: r2d2\n  max_inference_batch: 8\n"
            "  r2d2:\n    batch_size: 64\n    replay_ratio: 2.0\ndistributed:\n  actors: 3\n"
            "  envs_per_actor: 8\n  env_groups: 2\nenv:\n  id: Pong\n```")
    ctx = run_context(text)
    assert (ctx.agent, ctx.path, ctx.replay, ctx.seed) == ("seed", "agent.r2d2", True, True)
    assert (ctx.actors, ctx.envs_per_actor, ctx.env_groups) == (3, 8, 2)
    assert (ctx.batch_size, ctx.replay_ratio, ctx.max_inference_batch) == (64, 2.0, 8)
    assert ctx.async_envs  # Atari steps in ale-py's threads
    impala_ctx = run_context("agent:\n  name: impala\n  batch_size: 32\nenv:\n  id: CartPole-v1\n")
    assert (impala_ctx.path, impala_ctx.replay, impala_ctx.async_envs) == ("agent", False, False)
    # a config text written before auto sizing chose reads as the hand-set defaults
    auto_ctx = run_context("distributed:\n  actors: auto\n  envs_per_actor: 16\n"
                           "  learner_threads: auto\n")
    assert (auto_ctx.actors, auto_ctx.envs_per_actor, auto_ctx.learner_threads) == (2, 16, 0)


# ---------------------------------------------------------------- whole runs


def _count_run(tmp_path, name: str, env_id: str, actors: int, *overrides: str):
    cfg = compose_run(tmp_path, name, "agent=impala", f"env.id={env_id}",
                      "env.imports=[counting_env]", f"distributed.actors={actors}",
                      "distributed.envs_per_actor=4", "distributed.env_groups=1",
                      "agent.batch_size=4", "agent.unroll_length=10",
                      "distributed.start_timeout_s=60", *overrides)
    cfg.log.tensorboard = True  # the CLI reads the run's events
    cfg.log.interval_s = 0.5
    cfg.log.progress = "lines"
    return cfg


def _slow_impala_loss(monkeypatch, seconds: float) -> None:
    """IMPALA's loss takes ``seconds`` longer (only the learner process computes it)."""
    monkeypatch.setattr(impala, "loss_fn", SlowImpalaLoss(seconds))


def _cli(run_dir, capsys) -> str:
    assert diagnose_cli.main([str(run_dir)]) == 0
    return capsys.readouterr().out


@pytest.mark.slow  # a verdict from measured time: see the module docstring
def test_a_slowed_loss_makes_a_one_process_run_learner_bound(tmp_path, monkeypatch, capsys):
    _slow_impala_loss(monkeypatch, 0.02)  # ~20 ms a step against ~2 ms of acting per batch
    cfg = _count_run(tmp_path, "slow-loss", "DistrlCount-v0", 0, "total_frames=2400")
    result = impala.run(cfg)
    assert result["throughput"]["bound"] == "learner"
    assert result["throughput"]["margin"] > 2
    console = capsys.readouterr().out
    assert "[distrl] throughput over the run: learner x" in console
    assert "[distrl] frames=2400/2400 (100.0%) fps=" in console
    out = _cli(result["run_dir"], capsys)
    assert "bound: learner x" in out and "learner-bound x" in out
    assert "distributed.actors=1 steps the envs in an actor process" in out


@pytest.mark.slow  # a verdict from measured time: see the module docstring
def test_a_slowed_env_makes_a_one_process_run_actor_bound(tmp_path, capsys):
    # 4 envs x 2 ms a step x 10 steps: ~80 ms of acting per update, against a few ms of
    # learning on a 4-number observation
    cfg = _count_run(tmp_path, "slow-env", "DistrlSlowCount-v0", 0, "total_frames=1200")
    result = impala.run(cfg)
    assert result["throughput"]["bound"] == "actors"
    assert result["throughput"]["figures"]["actor_env"] > 0.5
    capsys.readouterr()
    assert "bound: actors x" in _cli(result["run_dir"], capsys)


@pytest.mark.slow  # a verdict from measured time: see the module docstring
@pytest.mark.dist
def test_actor_processes_waiting_for_a_slowed_learner(tmp_path, monkeypatch, capsys):
    _slow_impala_loss(monkeypatch, 0.05)
    cfg = _count_run(tmp_path, "slow-loss-2", "DistrlCount-v0", 1, "total_frames=2000")
    result = impala.run(cfg)
    figures = result["throughput"]["figures"]
    assert result["throughput"]["bound"] == "learner"
    assert figures["actor_wait"] > 0.5  # the actor waits for free slots
    capsys.readouterr()
    assert "the actors wait" in _cli(result["run_dir"], capsys)


@pytest.mark.slow  # a verdict from measured time: see the module docstring
@pytest.mark.dist
def test_a_learner_waiting_for_a_slowed_actor_process_via_the_cli(tmp_path):
    cfg = _count_run(tmp_path, "slow-env-2", "DistrlSlowCount-v0", 1, "total_frames=1600")
    result = impala.run(cfg)
    assert result["throughput"]["bound"] == "actors"
    assert result["throughput"]["figures"]["learner_batch_wait"] > 0.5
    proc = subprocess.run([sys.executable, "-m", "distrl.diagnose", result["run_dir"],
                           "--last", "3"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "bound: actors x" in proc.stdout
    assert "the last 3 of" in proc.stdout and "waiting for batches" in proc.stdout


@pytest.mark.slow  # a verdict from measured time: see the module docstring
def test_replay_path_learner_bound_names_the_replay_ratio(tmp_path, monkeypatch, capsys):
    loss = apex.ApexLoss.__call__

    def slow_loss(self, *args, **kwargs):
        time.sleep(0.02)
        return loss(self, *args, **kwargs)

    monkeypatch.setattr(apex.ApexLoss, "__call__", slow_loss)
    cfg = compose_run(tmp_path, "apex-slow", "agent=apex", "env.id=DistrlCount-v0",
                      "env.imports=[counting_env]", "distributed.actors=0",
                      "distributed.envs_per_actor=4", "distributed.env_groups=1",
                      "agent.batch_size=32", "agent.learning_starts=200",
                      "agent.replay_capacity=5000", "agent.replay_ratio=2",
                      "agent.actor_buffer=4", "total_frames=1600")
    cfg.log.tensorboard, cfg.log.interval_s, cfg.log.progress = True, 0.5, "lines"
    result = apex.run(cfg)
    throughput = result["throughput"]
    assert throughput["bound"] == "learner"
    assert any(line.startswith("replay   size ") and "(2 asked" in line
               for line in throughput["lines"])
    assert any(advice.startswith("agent.replay_ratio=") for advice in throughput["advice"])
    capsys.readouterr()
    out = _cli(result["run_dir"], capsys)
    assert "bound: learner x" in out and "agent.replay_ratio=" in out


def _logged_run(root, reports: int, figures: Figures):
    """A run directory whose events hold ``reports`` reports of ``figures`` and a config, as
    a live run's MetricLogger writes them."""
    logger = MetricLogger(str(root / "logged"), stream=open(os.devnull, "w"))  # noqa: SIM115
    logger.text("config", "```\nagent:\n  name: impala\n  batch_size: 32\ndistributed:\n"
                          "  actors: 2\n  envs_per_actor: 32\n  env_groups: 1\n```")
    for k in range(reports):
        logger.add_many(figures.as_scalars())
        logger.write(1000 * (k + 1), {})
    logger.close()
    return root / "logged"


def test_the_cli_reads_a_runs_events_and_reproduce_records_it(tmp_path, capsys):
    run_dir = _logged_run(tmp_path, 3, LEARNER_BOUND)
    assert diagnose_cli.main([str(run_dir), "--last", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"distrl diagnose: {run_dir} (impala: 2 actor processes x 32 envs in 1 "
                      "group; learner on cpu, 1 thread)")
    assert out[1].startswith("the last 2 of 3 reports: frames 2,000 to 3,000 over 20 s")
    assert out[2] == "bound: learner x3.3"
    assert out[-1] == ("  - learner-bound: the actors wait 70% of the time; distributed.actors=1 "
                       "would leave more of the 2 busy cores to the learner (the actors need "
                       "about 0.7 processes' worth of time)")
    sys.path.insert(0, str(REPO / "benchmarks"))
    import attempt_record
    import suite

    assert suite.read_events(run_dir).has_throughput  # reproduce asks only such runs
    record = attempt_record.run_throughput(run_dir)  # python -m distrl.diagnose --json
    assert record["bound"] == "learner" and record["reports"] == 2  # the start left out
    assert record["margin"] == pytest.approx(diagnose(LEARNER_BOUND, IMPALA_2_ACTORS).margin)
    assert attempt_record.run_throughput(tmp_path) is None  # no events there


def test_the_cli_says_why_it_has_nothing_to_read(tmp_path, capsys):
    assert diagnose_cli.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("distrl diagnose: error: ") and "log.tensorboard=false" in err
