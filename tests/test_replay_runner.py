"""The runner with the replay family and Ape-X's parts: transport, prefetching, the
replay-ratio limiter, resume with the replay, failing actors, and learning CartPole (slow)."""

from __future__ import annotations

import dataclasses
import math
import time
from types import SimpleNamespace

import pytest
import torch
from learning import learning_seed, report, run_beside
from presets import compose_preset
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from agents import apex
from distrl.acting.actor import ActorStats
from distrl.replay.buffer import ReplayBuffer
from distrl.replay.formats import NStepFormat
from distrl.replay.samplers import PrioritizedSampler
from distrl.replay.storage import TransitionStorage
from distrl.replay.writers import NStepWriter
from distrl.rl.exploration import epsilon_ladder
from distrl.run.checkpoint import load
from distrl.run.supervisor import TooManyRestarts
from distrl.runners.replay_learner import Prefetcher, ReplayFeed
from distrl.runners.replay_sources import BatchSlots, rank_epsilons
from distrl.transport.distributed import RankInfo

# The learning test's budget in env steps of CartPole-v1: the preset's is 150k, cut for CI's
# time (its lr decays linearly to 0 over whichever budget runs).
CARTPOLE_FRAMES = 100_000
# Half the lowest calibration figure of the two Ape-X CartPole runs, rounded down
# (tests/learning.py): training 490.7 / 462.9 (one process) and 390.1 / 195.4 (actors) on
# seeds 100 / 101, greedy evaluation 497.1 / 473.1 and 411.1 / 184.9, at CARTPOLE_FRAMES
# (tests/learning_calibration.txt; at the preset's 150k: 430.1 / 490.5 and 500.0 / 500.0).
APEX_TRAIN, APEX_EVAL = 90.0, 90.0


def preset(tmp_path, name: str, *overrides: str):
    """``python run.py +experiment=apex_cartpole`` as a typed config, writing under tmp_path."""
    return compose_preset(tmp_path, "apex_cartpole", name, *overrides)


def test_learner_ranks_share_one_epsilon_ladder_each_with_the_same_mix():
    """Under torchrun the ladder spans every env of every rank (Ape-X's eps_i over all
    actors); rank r takes every world-th rate, so each replay shard sees explorers and
    near-greedy envs alike."""
    ladder = epsilon_ladder(8, base=0.4)
    shares = [rank_epsilons(ladder, RankInfo(r, 2, r, "gloo")) for r in range(2)]
    assert torch.equal(shares[0], ladder[[0, 2, 4, 6]])
    assert torch.equal(shares[1], ladder[[1, 3, 5, 7]])
    assert shares[0][0] == 0.4 and shares[1].max() > 0.4**3  # both get a high rate
    assert torch.equal(rank_epsilons(ladder, None), ladder)


def _batch(writer: NStepWriter, steps: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    writer.begin(torch.randint(0, 255, (writer.num_envs, 4, 3, 3), generator=gen,
                               dtype=torch.uint8))
    for _ in range(steps):
        done = torch.rand(writer.num_envs, generator=gen) < 0.5
        writer.add(torch.randint(0, 4, (writer.num_envs,), generator=gen),
                   torch.randn(writer.num_envs, generator=gen),
                   torch.randint(0, 255, (writer.num_envs, 4, 3, 3), generator=gen,
                                 dtype=torch.uint8), done, torch.zeros_like(done))
    return writer.flush()


def test_slots_carry_the_largest_batch_an_env_group_can_flush():
    # Episodes end at half of all steps, so many first observations store whole stacks.
    writer = NStepWriter(num_envs=3, n=3, discount=0.9, frame_stack=4)
    batch = _batch(writer, steps=10, seed=0)
    slots = BatchSlots(2, NStepFormat(3, 0.9), num_envs=3, flush_steps=10, frame_shape=(3, 3),
                       frame_dtype=torch.uint8, stack=4, state_size=0)
    priorities = torch.rand(batch.size)
    slots.write(batch, priorities, should_stop=lambda: False, stats=ActorStats())
    got, got_priorities = slots.read(timeout=1.0)
    for field in ("frames", "observation_frames", "next_observation_frames", "actions",
                  "returns", "discounts"):
        assert torch.equal(getattr(got, field), getattr(batch, field)), field
    assert torch.equal(got_priorities, priorities)
    assert slots.read(timeout=0.0) is None
    assert slots.pool.free_count() == 2  # the slot went back


def test_slot_overflow_is_an_error_not_a_truncated_batch():
    writer = NStepWriter(num_envs=3, n=3, discount=0.9, frame_stack=4)
    batch = _batch(writer, steps=10, seed=1)
    slots = BatchSlots(1, NStepFormat(3, 0.9), num_envs=1, flush_steps=2, frame_shape=(3, 3),
                       frame_dtype=torch.uint8, stack=4, state_size=0)
    with pytest.raises(RuntimeError, match="exceeds the slot size"):
        slots.write(batch, torch.rand(batch.size), should_stop=lambda: False, stats=ActorStats())


def test_prefetched_draws_do_not_depend_on_thread_timing():
    """Draw t+1 sees the replay after write-back t-1, however slow the thread is."""

    def run(delay: float) -> list[torch.Tensor]:
        writer = NStepWriter(num_envs=2, n=2, discount=0.9, frame_stack=4)
        buffer = ReplayBuffer(TransitionStorage(500, (3, 3), torch.uint8, 4),
                              PrioritizedSampler(500))
        batch = _batch(writer, steps=40, seed=2)
        buffer.add(batch, torch.ones(batch.size))
        prefetcher = Prefetcher(buffer, 16, torch.Generator().manual_seed(0))
        draw = prefetcher._draw
        prefetcher._draw = lambda: (time.sleep(delay), draw())[1]
        drawn = []
        for step in range(5):
            sample, _ = prefetcher.next()
            drawn.append(sample.indices)
            prefetcher.settle()
            buffer.update_priorities(sample.indices, torch.full((16,), 10.0 * (step + 1)))
        prefetcher.close()
        return drawn

    fast, slow = run(0.0), run(0.05)
    assert all(torch.equal(a, b) for a, b in zip(fast, slow, strict=True))


def test_a_draw_slower_than_the_update_is_the_learners_batch_time(tmp_path, monkeypatch):
    """The prefetch thread draws the next batch during the update, and the learner waits
    for that draw before writing priorities back. With a draw made 40 ms slower, longer
    than CartPole's update, the learner waits for it after each update; the diagnosis
    counts that wait as building batches ("batch"), not as time nobody accounts for
    ("other")."""
    draw = Prefetcher._draw
    monkeypatch.setattr(Prefetcher, "_draw", lambda self: (time.sleep(0.04), draw(self))[1])
    cfg = preset(tmp_path, "slow_draw", "total_frames=3000", "agent.replay_ratio=2.0")
    cfg.log.interval_s = 0.2
    figures = apex.run(cfg)["throughput"]["figures"]
    # Each update's turn lasts at least the 40-ms draw, the update running beside it: the
    # step and the batch figures account for at least 36 ms of each (without the wait,
    # only the step's few ms and the inserts).
    seconds_per_update = 1.0 / figures["updates_per_s"]
    accounted = (figures["learner_step"] + figures["learner_copy"]) * seconds_per_update
    assert accounted >= 0.036, figures


def test_one_process_holds_the_replay_ratio(tmp_path):
    cfg = preset(tmp_path, "ratio", "total_frames=6000", "agent.replay_ratio=2.0")
    result = apex.run(cfg)
    # Credit accrues from the batch that reaches learning_starts; an update spends one
    # batch; the last insert's credit may be left over. One more batch is drawn than
    # trained on: the prefetched one.
    trained = result["updates"] * 64
    assert result["sampled"] == trained + 64
    assert trained <= 2.0 * result["inserted"]
    assert trained >= 2.0 * (result["inserted"] - 1000 - 8 * 16) - 64


def test_the_logged_replay_ratio_is_the_one_held_not_the_last_reports(tmp_path):
    """An insert is a slot of envs x actor_buffer transitions (8 x 16 here), which pays
    for two updates of 64 at ratio 2, so at 20 reports a second most reports see no insert.
    ``replay/ratio`` is the ratio held since learning started, sampled (the prefetched
    batch included) per transition inserted from then: near 2 at the end, and never the
    hundreds a report without an insert would read as a ratio of that report alone."""
    cfg = preset(tmp_path, "ratio_log", "total_frames=6000", "agent.replay_ratio=2.0")
    cfg.log.tensorboard, cfg.log.interval_s = True, 0.05
    result = apex.run(cfg)
    events = EventAccumulator(str(result["run_dir"]), size_guidance={"scalars": 0})
    events.Reload()
    ratios = [e.value for e in events.Scalars("replay/ratio")]
    assert len(ratios) >= 10
    assert 1.9 <= ratios[-1] <= 2.1
    assert max(ratios) <= 3.0, ratios


def test_resume_with_the_replay_continues_bit_exactly(tmp_path):
    """Stop after 4 updates with checkpoint.replay=true and resume to 9 == 9 updates in one
    go. The first actor batch's credit covers updates 1..12, so no env step happens in
    between and the learner's inputs come only from the checkpoint (model, optimizer,
    target network, replay, sampling generator, the batch already drawn)."""
    common = ("agent.learning_starts=100", "agent.actor_buffer=50", "agent.replay_ratio=4.0",
              "distributed.envs_per_actor=4", "total_frames=1000000",
              "checkpoint.replay=true")
    full = apex.run(preset(tmp_path, "full", *common), should_stop=lambda u: u >= 9)
    part = apex.run(preset(tmp_path, "part", *common), should_stop=lambda u: u >= 4)
    saved = load(part["checkpoint"])
    assert saved["replay"]["inserted"] == part["inserted"] > 100
    assert saved["prefetched"] is not None
    resumed_cfg = preset(tmp_path, "part", *common)
    resumed_cfg.resume = part["checkpoint"]
    resumed = apex.run(resumed_cfg, should_stop=lambda u: u >= 9)
    assert resumed["updates"] == full["updates"] == 9
    assert resumed["inserted"] == full["inserted"]  # no actor batch after the checkpoint
    a, b = load(full["checkpoint"]), load(resumed["checkpoint"])
    for name, value in a["learner"]["model"].items():
        assert torch.equal(value, b["learner"]["model"][name]), name
    assert torch.equal(a["replay"]["sampler"]["tree"]["tree"],
                       b["replay"]["sampler"]["tree"]["tree"])
    assert torch.equal(a["prefetched"].indices, b["prefetched"].indices)


def test_checkpoint_without_replay_leaves_it_out(tmp_path):
    result = apex.run(preset(tmp_path, "noreplay", "total_frames=2000"))
    assert "replay" not in load(result["checkpoint"])


@pytest.mark.dist
def test_a_failing_actor_process_ends_the_run_with_its_error(tmp_path, capfd):
    """Each crash is restarted until distributed.max_actor_restarts is spent; the env's
    traceback reaches stderr and the run ends naming the setting."""
    cfg = preset(tmp_path, "crash", "distributed.actors=2", "distributed.envs_per_actor=2",
                 "env.id=DistrlCrashAfter-v0", "env.imports=[crashing_env]",
                 "distributed.max_actor_restarts=2")
    with pytest.raises(TooManyRestarts, match=r"actor [01] exited with code 1: actors would "
                       r"be restarted 3 times, more than distributed\.max_actor_restarts=2"):
        apex.run(cfg)
    assert capfd.readouterr().err.count("DistrlCrashAfter-v0 crashed on purpose") >= 3


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.dist
def test_learns_cartpole_in_one_process_and_with_two_actor_processes(tmp_path):
    """CARTPOLE_FRAMES, then the preset's 50 greedy episodes of the final weights, for
    the preset in one process and, side by side with it, with 2 actor processes of 4 envs
    (the learner keeps the replay ratio, so what each learns does not depend on the load).
    Thresholds: APEX_TRAIN, APEX_EVAL (from seeds 100 and 101); runs seed 8."""
    seed = learning_seed()
    budget = f"total_frames={CARTPOLE_FRAMES}"
    with run_beside(apex.run, preset(tmp_path, "serial", f"seed={seed}", budget),
                    "one-process") as serial_result:
        actors = apex.run(preset(tmp_path, "actors", "distributed.actors=2",
                                 "distributed.envs_per_actor=4", f"seed={seed}", budget))
        serial = serial_result()
    report("apex_serial", seed, serial)
    report("apex_actors", seed, actors)
    for name, result in (("one process", serial), ("actors", actors)):
        assert result["frames"] >= CARTPOLE_FRAMES, name
        assert result["mean_return_20"] >= APEX_TRAIN, (name, result["returns"][-20:])
        assert result["eval_return"] >= APEX_EVAL, (name, result["eval_returns"])
    # Credit for updates accrues once the replay holds learning_starts (1,000) items, so
    # those are left out. The rest: credit not yet spent, inserts in flight.
    assert actors["sampled"] == pytest.approx(4.0 * (actors["inserted"] - 1000), rel=0.03)


def test_preset_is_the_papers_agent_with_cartpole_settings(tmp_path):
    cfg = preset(tmp_path, "x")
    assert isinstance(cfg.agent, apex.ApexConfig)
    defaults = dataclasses.asdict(apex.ApexConfig())
    changed = {k for k, v in dataclasses.asdict(cfg.agent).items() if v != defaults[k]}
    assert changed == {"batch_size", "replay_capacity", "learning_starts",
                       "target_update_interval", "actor_buffer", "weight_sync_steps",
                       "replay_ratio", "epsilon_base", "optimizer"}


def test_stop_at_return_ends_the_run_once_the_last_20_episodes_reach_it(tmp_path):
    # Every CartPole episode returns at least 8, so the run ends at the first update
    # after 20 episodes; without the setting it would run to total_frames.
    result = apex.run(preset(tmp_path, "solved", "stop_at_return=8.0"))
    assert result["mean_return_20"] >= 8.0 and len(result["returns"]) >= 20
    assert result["frames"] < 3000 and result["updates"] >= 1


def test_a_budget_below_learning_starts_ends_without_updates(tmp_path):
    result = apex.run(preset(tmp_path, "short", "total_frames=500", "checkpoint.replay=true"))
    assert result["updates"] == 0 and 500 <= result["frames"] < 1000
    assert load(result["checkpoint"])["replay"]["inserted"] == result["inserted"]


def test_each_episode_is_logged_with_the_epsilon_of_the_env_that_played_it(tmp_path):
    cfg = preset(tmp_path, "epsilons", "total_frames=2000")
    cfg.log.tensorboard = True
    apex.run(cfg)
    events = EventAccumulator(str(tmp_path / "epsilons"), size_guidance={"scalars": 0})
    events.Reload()
    returns, epsilons = events.Scalars("episode/return"), events.Scalars("episode/epsilon")
    assert len(epsilons) == len(returns) > 8
    assert [e.step for e in epsilons] == [r.step for r in returns]
    # 8 envs, one actor: the preset's ladder 0.1^(1 + 7 i / 7); every env finished games
    ladder = epsilon_ladder(8, cfg.agent.epsilon_base, cfg.agent.epsilon_exponent)
    ladder = ladder.float().tolist()  # as tensorboard keeps them
    assert sorted({e.value for e in epsilons}) == sorted(ladder)


def test_an_episodes_epsilon_is_its_actors_share_of_the_ladder():
    # actor 1's env 2 is the run's env 1 * 4 + 2; an env not known (-1: an actor-only
    # rank's) and one past the ladder have none
    ladder = epsilon_ladder(8)
    learner = SimpleNamespace(envs_per_actor=4, layout=SimpleNamespace(epsilons=ladder))
    assert ReplayFeed._episode_epsilon(learner, 1, 2) == float(ladder[6])
    assert math.isnan(ReplayFeed._episode_epsilon(learner, 1, -1))
    assert math.isnan(ReplayFeed._episode_epsilon(learner, 2, 0))
