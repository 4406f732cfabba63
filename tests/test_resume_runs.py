"""Resuming the runs users stop and start again, beyond the one-process IMPALA and Ape-X
runs (tests/test_impala.py, tests/test_replay_runner.py): IMPALA with actor processes,
SEED-IMPALA and SEED-R2D2 with an env worker process. Each is stopped after a few
updates, resumed from its checkpoint to the end of its budget, and must continue: the
update and frame counters (SEED-R2D2 with its replay in the checkpoint), the
learning-rate schedule (the final lr equals an uninterrupted run's, or for SEED-R2D2, whose
update count follows the load, the schedule's value at its count), and tensorboard's
curves, whose steps go on from the checkpoint instead of starting over."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from presets import compose_preset, compose_run
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import agents
from distrl.run import checkpoint

pytestmark = pytest.mark.dist

RUNS = {
    # name: (overrides, updates in the budget)
    "impala_actor_processes": (("agent=impala", "env=CartPole", "distributed.actors=2",
                                "distributed.envs_per_actor=16", "distributed.env_groups=1",
                                "agent.batch_size=32", "agent.unroll_length=20",
                                "total_frames=6400"), 10),
    "seed_impala": (("agent=seed", "env=CartPole", "distributed.actors=1",
                     "distributed.envs_per_actor=16", "distributed.env_groups=1",
                     "agent.impala.batch_size=16", "agent.impala.unroll_length=20",
                     "total_frames=3200"), 10),
}
SEED_R2D2 = ("seed_r2d2_cartpole", ("distributed.actors=1", "distributed.envs_per_actor=4",
                                    "agent.r2d2.learning_starts=20", "agent.r2d2.batch_size=8",
                                    "total_frames=3000", "checkpoint.replay=true"))
STOP_AT = 4


def _config(tmp_path: Path, name: str, run: str):
    if name == "seed_r2d2":
        cfg = compose_preset(tmp_path, SEED_R2D2[0], run, *SEED_R2D2[1])
    else:
        cfg = compose_run(tmp_path, run, *RUNS[name][0])
    cfg.log.tensorboard = True
    cfg.log.interval_s = 1e-9  # a report after every update
    return cfg


def _curve(run_dir: Path, key: str) -> list[tuple[int, float]]:
    """(step, value) of ``key`` over every event file of the run, as tensorboard shows it
    (a resumed writer's purge drops the events past its checkpoint)."""
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(key)]


def _lr(state: dict) -> float:
    return state["learner"]["optimizer"]["param_groups"][0]["lr"]


@pytest.mark.parametrize("name", [*RUNS, "seed_r2d2"])
def test_a_resumed_run_continues_its_counters_lr_and_curves(tmp_path, name):
    run = agents.get
    full_cfg = _config(tmp_path, name, "full")
    full = run(full_cfg.agent.name).run(full_cfg)
    part_cfg = _config(tmp_path, name, "part")
    part = run(part_cfg.agent.name).run(part_cfg, should_stop=lambda updates: updates >= STOP_AT)
    assert part["updates"] == STOP_AT
    stopped = checkpoint.load(part["checkpoint"])
    stopped_at = stopped["counters"]["frames"]
    resumed_cfg = dataclasses.replace(_config(tmp_path, name, "part"), resume=part["checkpoint"])
    resumed = run(resumed_cfg.agent.name).run(resumed_cfg)

    assert resumed["run_dir"] == part["run_dir"]
    if name == "seed_r2d2":  # updates follow the replay ratio as sequences arrive: timing
        assert resumed["updates"] > STOP_AT and resumed["inserted"] > part["inserted"]
    else:  # a batch of unrolls per update: the budget fixes the count
        assert resumed["updates"] == full["updates"] > STOP_AT
    assert resumed["frames"] >= full_cfg.total_frames and full["frames"] >= full_cfg.total_frames
    final = checkpoint.load(resumed["checkpoint"])
    if name == "seed_r2d2":
        # The update count is the load's, so the final lr is checked against the schedule
        # the stop was on (its length from the lr after STOP_AT updates), at the count of
        # steps the schedule made in both processes, not one that started over at the resume.
        group = stopped["learner"]["optimizer"]["param_groups"][0]
        assert group["lr"] < group["initial_lr"], "the preset's schedule decays: linear"
        planned_updates = STOP_AT / (1.0 - group["lr"] / group["initial_lr"])
        steps = final["learner"]["scheduler"]["last_epoch"]
        assert steps == final["learner"]["updates"] == resumed["updates"]
        expected = group["initial_lr"] * max(1.0 - steps / planned_updates, 0.0)
        assert _lr(final) == pytest.approx(expected, rel=1e-6, abs=1e-15)
    else:
        assert _lr(final) == pytest.approx(_lr(checkpoint.load(full["checkpoint"])),
                                           rel=1e-9, abs=1e-15)
    # Tensorboard: one curve whose steps rise through the restart, the resumed process's
    # updates going on from STOP_AT to the end.
    curve = _curve(Path(part["run_dir"]), "learner/updates")
    steps, updates = [s for s, _ in curve], [int(v) for _, v in curve]
    assert steps == sorted(steps), steps  # (replay updates may come without new frames)
    assert updates == sorted(set(updates)) and updates[-1] == resumed["updates"], updates
    after = [u for s, u in zip(steps, updates, strict=True) if s > stopped_at]
    assert after and after[0] > STOP_AT, (stopped_at, curve)
    # The checkpoint holds the last 100 returns, which a resume continues
    # (tests/test_impala.py::test_a_resumed_run_continues_its_last_100_returns).
    assert stopped["counters"]["recent_returns"] == part["returns"]


def test_an_impala_checkpoint_of_two_ranks_counts_this_ranks_frames_old_or_new(monkeypatch):
    """IMPALA's counter is this rank's frames; a 2-rank checkpoint written before that
    convention (no ``frames_all_ranks``, the counter holding both ranks' frames) resumes
    at the same point as one written after it."""
    from distrl.runners import unroll_family

    monkeypatch.setattr(unroll_family, "restore_learner", lambda *args: None)
    monkeypatch.setattr(unroll_family.checkpoint, "set_rng_state", lambda state: None)
    restored = []
    for state in ({"counters": {"frames": 25600, "elapsed_s": 3.0}, "world_size": 2},
                  {"counters": {"frames": 12800, "elapsed_s": 3.0}, "world_size": 2,
                   "frames_all_ranks": 25600}):
        run = object.__new__(unroll_family.UnrollRun)  # only what restore() reads
        run.learner, run.opt = None, None
        run.counters = {"frames": 0, "elapsed_s": 0.0}
        run.restore({**state, "rng": None})
        restored.append(run.counters["frames"])
    assert restored == [12800, 12800]


def test_a_resumed_run_continues_the_random_streams_its_checkpoint_saved(monkeypatch):
    """Both families' restore puts back the global random streams (torch's samples IMPALA's
    actions; numpy's and Python's): the draws after a restore are those that followed the
    save, not those of the seed the process started with."""
    import random

    import numpy as np
    import torch

    from distrl.runners import replay_family, unroll_family

    monkeypatch.setattr(unroll_family, "restore_learner", lambda *args: None)
    monkeypatch.setattr(replay_family, "restore_learner", lambda *args: None)
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    saved = checkpoint.rng_state()
    expected = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)])
    unroll = object.__new__(unroll_family.UnrollRun)  # only what restore() reads
    unroll.learner, unroll.opt, unroll.counters = None, None, {"frames": 0, "elapsed_s": 0.0}
    replay = object.__new__(replay_family.ReplayRun)
    replay.learner, replay.opt, replay.loss, replay.replay = None, None, None, None
    replay.rank = dataclasses.make_dataclass("Rank", ["ranks"])(None)
    replay.counters = {"frames": 0, "elapsed_s": 0.0}
    for run in (unroll, replay):
        torch.manual_seed(99), np.random.seed(99), random.seed(99)
        run.restore({"counters": {"frames": 640, "elapsed_s": 1.0}, "rng": saved})
        assert torch.equal(torch.rand(3), expected[0])
        assert np.array_equal(np.random.rand(3), expected[1])
        assert [random.random() for _ in range(3)] == expected[2]
        assert run.counters["frames"] == 640
