"""Actor supervision: slots a dead producer held come back, and IMPALA and Ape-X runs
survive a SIGKILLed actor with complete unrolls and batches; too many failures end the run
with its cause and a final checkpoint; a hung actor is noticed by its silence."""

from __future__ import annotations

import os
import re
import signal
import time
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from presets import compose_run, run_py

from agents import apex, impala
from distrl.run import checkpoint
from distrl.run.supervisor import ChildProcesses, TooManyRestarts
from distrl.training.learner import Learner
from distrl.transport.queues import WRITING, FieldSpec, SlotPool

SPECS = {"x": FieldSpec((3, 2), torch.float32)}


def _write_then_hang(pool: SlotPool, producer: int, commit_first: bool) -> None:
    """Child: (commit one slot,) then claim another, write half of it and hang."""
    if commit_first:
        index, _ = pool.acquire(timeout=30, producer=producer)
        pool.buffers["x"][index].fill_(1.0)
        pool.commit(index)
    index, _ = pool.acquire(timeout=30, producer=producer)
    pool.buffers["x"][index, 0].fill_(2.0)
    time.sleep(3600)


def _wait_for(condition) -> None:
    """Poll until ``condition`` holds; the test's time limit (pytest-timeout) ends a hang."""
    while not condition():
        time.sleep(0.05)


@pytest.mark.dist
def test_a_dead_producers_half_written_slot_is_reclaimed_and_its_committed_one_kept():
    ctx = mp.get_context("spawn")
    pool = SlotPool(SPECS, num_slots=3, mp_context=ctx)
    child = ctx.Process(target=_write_then_hang, args=(pool, 7, True), daemon=True)
    child.start()
    try:
        _wait_for(lambda: int((pool.state == WRITING).sum()) == 1)
        os.kill(child.pid, signal.SIGKILL)
        child.join(timeout=30)
        assert pool.reclaim(producer=3) == 0  # another producer's slots are not touched
        assert pool.reclaim(producer=7) == 1
        assert pool.free_count() == 2 and pool.full_count() == 1
        (taken,), _ = pool.take(1, timeout=1.0)
        assert (pool.buffers["x"][taken] == 1.0).all()  # the committed unroll, whole
    finally:
        if child.is_alive():
            child.kill()


class _Announcing:
    """A semaphore that sets ``waiting`` as its holder starts to block on it."""

    def __init__(self, semaphore: Any, waiting: Any) -> None:
        self.semaphore, self.waiting = semaphore, waiting

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        if block:
            self.waiting.set()
        return self.semaphore.acquire(block, timeout)


def _acquire_and_report(pool: SlotPool, producer: int, done: Any, waiting: Any) -> None:
    pool.freed = _Announcing(pool.freed, waiting)  # this process's copy of the pool only
    pool.acquire(timeout=60, producer=producer)
    done.set()


@pytest.mark.dist
def test_a_producer_killed_while_waiting_for_a_slot_does_not_block_the_others():
    """With index queues, a producer killed inside ``get`` kept the queue's lock and every
    other producer waited forever; the flag pool has no lock a dead process can hold."""
    ctx = mp.get_context("spawn")
    pool = SlotPool(SPECS, num_slots=1, mp_context=ctx)
    index, _ = pool.acquire(timeout=1.0)
    pool.commit(index)
    taken, _ = pool.take(1, timeout=1.0)  # the learner holds the only slot
    first_done, second_done = ctx.Event(), ctx.Event()
    first_waiting, second_waiting = ctx.Event(), ctx.Event()
    first = ctx.Process(target=_acquire_and_report, args=(pool, 0, first_done, first_waiting),
                        daemon=True)
    first.start()
    first_waiting.wait()  # it found no free slot and blocks for one (the test's limit ends a hang)
    os.kill(first.pid, signal.SIGKILL)
    first.join(timeout=30)
    second = ctx.Process(target=_acquire_and_report,
                         args=(pool, 1, second_done, second_waiting), daemon=True)
    second.start()
    try:
        second_waiting.wait()
        pool.release(taken)
        assert second_done.wait(timeout=60), "the second producer never got the free slot"
        assert not first_done.is_set() and int(pool.state[index]) == WRITING
    finally:
        second.kill()


# ---------------------------------------------------------------- whole runs


def _count_run(tmp_path, name: str, *overrides: str):
    cfg = compose_run(tmp_path, name, "env.id=DistrlCount-v0", "env.imports=[counting_env]",
                      "distributed.actors=2", "distributed.envs_per_actor=4",
                      "distributed.env_groups=1", "distributed.start_timeout_s=60",
                      *overrides)
    cfg.checkpoint.interval_s = 1.0
    return cfg


def _killer(name: str, at_update: int, kills: list[int]):
    """``should_stop(updates)`` that SIGKILLs actor ``name`` at update ``at_update``."""

    def should_stop(updates: int) -> bool:
        if updates == at_update and not kills:
            (pid,) = [p.pid for p in mp.active_children() if p.name == name]
            os.kill(pid, signal.SIGKILL)
            kills.append(pid)
        return False

    return should_stop


def _record_batches(monkeypatch) -> list:
    batches: list = []
    step = Learner.step

    def recording_step(self, batch):
        batches.append(batch)
        return step(self, batch)

    monkeypatch.setattr(Learner, "step", recording_step)
    return batches


def _assert_whole_unroll(unroll) -> None:
    """Each column's observations count up by one, back to 0 only after an episode end."""
    t_obs = unroll.observations[..., 0]  # [T + 1, B]
    assert not torch.isnan(t_obs).any()
    expected_next = torch.where(unroll.dones, torch.zeros_like(t_obs[1:]), t_obs[:-1] + 1)
    assert torch.equal(t_obs[1:], expected_next)
    assert (unroll.policy_versions >= 0).all() and (unroll.actions >= 0).all()


@pytest.mark.dist
def test_impala_survives_a_killed_actor_with_whole_unrolls(tmp_path, monkeypatch):
    batches = _record_batches(monkeypatch)
    kills: list[int] = []
    cfg = _count_run(tmp_path, "kill", "agent=impala", "agent.batch_size=8",
                     "agent.unroll_length=10", "total_frames=24000")
    result = impala.run(cfg, should_stop=_killer("distrl-actor-0", 20, kills))
    assert len(kills) == 1
    assert result["frames"] >= 24000 and result["updates"] == 24000 // 80
    assert result["actor_restarts"] == 1
    assert result["dropped_unrolls"] <= 1  # the unroll it was writing, if any
    assert len(batches) == result["updates"]
    for batch in batches:
        _assert_whole_unroll(batch)


@pytest.mark.dist
def test_apex_survives_a_killed_actor_with_whole_batches(tmp_path, monkeypatch):
    batches = _record_batches(monkeypatch)
    kills: list[int] = []
    cfg = _count_run(tmp_path, "kill", "agent=apex", "agent.batch_size=32",
                     "agent.learning_starts=500", "agent.replay_capacity=20000",
                     "agent.n_step=3", "total_frames=12000")
    result = apex.run(cfg, should_stop=_killer("distrl-actor-1", 10, kills))
    assert len(kills) == 1
    assert result["frames"] >= 12000
    assert result["actor_restarts"] == 1
    for batch in batches:  # an n-step transition spans n steps of one episode, or ends it
        gap = batch.next_observations[:, 0] - batch.observations[:, 0]
        bootstraps = batch.discounts > 0
        assert (gap[bootstraps] == 3).all(), gap[bootstraps]


@pytest.mark.dist
def test_actors_that_keep_failing_end_the_run_with_the_cause_and_a_checkpoint(tmp_path):
    cfg = _count_run(tmp_path, "crash", "agent=impala", "agent.batch_size=8",
                     "agent.unroll_length=10", "total_frames=10000000",
                     "distributed.max_actor_restarts=1")
    cfg.env.id, cfg.env.imports = "DistrlCrashAfter-v0", ["crashing_env"]
    with pytest.raises(TooManyRestarts, match=(
            r"^actor \d exited with code 1: actors would be restarted 2 times, more than "
            r"distributed\.max_actor_restarts=1; the run stopped after its checkpoint .*"
            r"checkpoint-\d+\.pt$")):
        impala.run(cfg)
    saved = checkpoint.list_checkpoints(tmp_path / "crash" / "checkpoints")
    assert saved and checkpoint.load(saved[-1])["agent"] == "impala"
    assert not [p for p in mp.active_children() if p.name.startswith("distrl-actor")]


@pytest.mark.dist
def test_a_hung_actor_is_noticed_by_its_silence_and_restarted(tmp_path, capfd):
    cfg = _count_run(tmp_path, "hang", "agent=impala", "agent.batch_size=4",
                     "agent.unroll_length=5", "total_frames=10000000",
                     "distributed.max_actor_restarts=0", "distributed.actor_timeout_s=2")
    cfg.env.id = "DistrlHangAfter-v0"
    with pytest.raises(TooManyRestarts, match=r"^actor \d was silent for more than 2 s: "):
        impala.run(cfg)


@pytest.mark.dist
def test_run_py_exits_1_with_the_cause_on_its_last_line_and_a_final_checkpoint(tmp_path):
    """The user's view of too many restarts: exit 1, the cause as the last stderr line (the
    actors' own tracebacks come before it), and the run's final checkpoint on disk."""
    proc = run_py(tmp_path, "agent=impala", "env.id=DistrlCrashAfter-v0",
                  "env.imports=[crashing_env]", "distributed.actors=2",
                  "distributed.envs_per_actor=4", "distributed.env_groups=1",
                  "agent.batch_size=8", "agent.unroll_length=10",
                  "distributed.max_actor_restarts=1", f"log.dir={tmp_path}", "log.name=crash",
                  "log.tensorboard=false", timeout=300, tests_on_path=True)
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert re.fullmatch(r"distrl: error: actor \d exited with code 1: actors would be restarted "
                        r"2 times, more than distributed\.max_actor_restarts=1; the run stopped "
                        r"after its checkpoint .*checkpoint-\d+\.pt", last), last
    assert checkpoint.list_checkpoints(tmp_path / "crash" / "checkpoints")


class FakeProcess:
    """A child that runs until killed: what a hung actor looks like to its supervisor."""

    def __init__(self, target: Any, name: str, daemon: bool, args: tuple) -> None:
        self.name, self.pid, self.exitcode = name, None, None
        self.alive = self.killed = False

    def start(self) -> None:
        self.alive, self.pid = True, 1000

    def is_alive(self) -> bool:
        return self.alive

    def kill(self) -> None:
        self.killed, self.alive, self.exitcode = True, False, -9

    def join(self, timeout: float | None = None) -> None:
        pass


class FakeContext:
    Process = FakeProcess

    @staticmethod
    def Event() -> Any:  # noqa: N802 (multiprocessing's name)
        return mp.get_context("spawn").Event()


def test_a_restart_kills_the_running_child_before_its_successor_starts():
    """A silent child still runs: restart kills it, then runs before_restart, then starts
    a new process in its place; past max_restarts it refuses with the count and setting."""
    order: list[str] = []
    children = ChildProcesses(FakeContext(), 2, "actor", target=lambda: None,
                              args_for=lambda i: (i,), label="actor", max_restarts=1,
                              before_restart=lambda i: order.append(
                                  f"before {i}: old killed {children.processes[i].killed}"))
    with children:
        hung = children.processes[0]
        children.restart(0, "was silent for more than 2 s")
        assert hung.killed and not hung.is_alive()
        assert order == ["before 0: old killed True"]
        assert children.processes[0] is not hung and children.processes[0].is_alive()
        assert children.restarts == 1 and not children.processes[1].killed
        with pytest.raises(TooManyRestarts) as refused:
            children.restart(1, "was silent for more than 2 s")
        assert str(refused.value) == (
            "actor 1 was silent for more than 2 s: actors would be restarted 2 times, more "
            "than distributed.max_actor_restarts=1")
        assert not children.processes[1].killed  # a refused restart touches nothing

