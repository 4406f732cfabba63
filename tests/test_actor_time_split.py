"""Where an actor's seconds go on the console (env / forward / copy): a replay actor's
initial-priority forward is network time, counted as forward, not as copying.

The counters read a fake clock (tests/fake_clock.py) that the stand-in priority function
moves by PRIORITY_S each call: every one of those seconds must land in ``policy_s`` and
none in ``copy_s``, whatever the machine's speed. The SEED server's clock also runs with
the real one (its batching waits on deadlines read from it), so there the real seconds of
its forwards and copies come on top; they are a few, not hundreds."""

from __future__ import annotations

import dataclasses

import fake_clock
from presets import compose_preset

from agents import apex, r2d2, seed
from distrl.acting import actor as actor_module
from distrl.acting import inference
from distrl.acting.actor import ActorStats
from distrl.run.run_settings import RunSettings
from distrl.runners import seed_sources
from distrl.runners.replay_sources import ActorLayout, build_replay_actor
from distrl.runners.seed_sources import SeedReplaySource
from distrl.transport.weights import WeightStore

PRIORITY_S = 100.0  # what each initial-priority call costs on the fake clock


def test_replay_actor_counts_its_initial_priority_forward_as_forward_not_copy(tmp_path,
                                                                             monkeypatch):
    # recompute: the priorities run the actor's network (acting ones reuse its outputs)
    cfg = compose_preset(tmp_path, "apex_cartpole", "split", "distributed.actors=0",
                         "agent.actor_priorities=recompute")
    settings = RunSettings.from_config(cfg, apex.CONVENTIONS)
    parts = apex.parts(cfg.agent)
    calls = []
    clock = fake_clock.install(monkeypatch, actor_module)

    def slow_priorities(model, batch):
        clock.advance(PRIORITY_S)
        calls.append(batch)
        return apex.initial_priorities(model, batch)

    parts = dataclasses.replace(parts, initial_priorities=slow_priorities)
    envs = settings.distributed.envs_per_actor
    layout = ActorLayout((4,), 2, None, parts.exploration(envs))
    model = parts.make_model(layout.obs_shape, layout.num_actions)
    emitted = []
    stats = ActorStats()
    actor = build_replay_actor(parts, settings, layout, model, WeightStore(model),
                               lambda batch, priorities: emitted.append(priorities), 0, stats)
    try:
        while len(emitted) < 3:
            actor.step()
    finally:
        actor.close()
    assert len(calls) == len(emitted) == 3
    assert stats.policy_s == 3 * PRIORITY_S
    # Before the fix the priority forward was inside the copy block and counted there.
    assert stats.copy_s == 0.0


def test_seed_server_counts_the_initial_priority_forward_as_forward_not_copy(tmp_path,
                                                                             monkeypatch):
    """SEED-R2D2's server computes the priorities of new sequences itself: its counters
    put that time under forward, not under copying."""
    calls, drained = [], []
    clock = fake_clock.install(monkeypatch, actor_module, seed_sources, inference,
                               on_real_clock=True)
    unpatched_priorities, unpatched_drain = r2d2.initial_priorities, SeedReplaySource.drain

    def slow_priorities(*args, **kwargs):
        clock.advance(PRIORITY_S)
        calls.append(1)
        return unpatched_priorities(*args, **kwargs)

    def counted_drain(source):
        out = unpatched_drain(source)
        drained.append((len(calls), out[0][1]))
        return out

    monkeypatch.setattr(r2d2, "initial_priorities", slow_priorities)
    monkeypatch.setattr(SeedReplaySource, "drain", counted_drain)
    # recompute: the priorities run the inference model (acting ones reuse its outputs)
    seed.run(compose_preset(tmp_path, "seed_r2d2_cartpole", "seed", "total_frames=3000",
                            "agent.r2d2.actor_priorities=recompute"))
    spent = drained[-1][0] * PRIORITY_S  # the priority calls before the last drain
    assert drained[-1][0] >= 5
    assert sum(stats.policy_s for _, stats in drained) >= spent
    assert sum(stats.copy_s for _, stats in drained) < PRIORITY_S  # not one call's worth
