"""distrl.transport.distributed with 2 gloo ranks (torch.multiprocessing): gradient averaging keeps
the ranks' parameters identical and equal to one step on the concatenated batch, the
broadcast delivers rank 0's weights, and a failing rank ends a torchrun job."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from fake_meter import fixed_meter
from learning import learning_seed, report
from presets import Training, run_group
from torch import nn

from distrl.training.learner import Learner, make_lr_schedule
from distrl.training.loop import RankFrameBudget
from distrl.transport.distributed import (
    GradientAverager,
    broadcast_parameters,
    init_from_env,
    resync_parameters,
)

pytestmark = pytest.mark.dist
WORLD = 2
# Half the lower calibration figure, rounded down (tests/learning.py): 322.4 / 330.5 on
# seeds 100 / 101 at 1.6M frames (tests/learning_calibration.txt).
IMPALA_RANKS_TRAIN = 160.0
# Half the lower calibration figure, rounded down, the mean over ranks of each one's last
# 20 episodes at the test's 200k steps: 310.40 / 466.65 on seeds 100 / 101
# (tests/learning_calibration.txt).
APEX_RANKS_TRAIN = 150.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(123)
    return torch.randn(8, 5, generator=g), torch.randn(8, 3, generator=g)


def _mean_squared_loss(model: nn.Module, batch) -> tuple[torch.Tensor, dict, None]:
    inputs, targets = batch
    return ((model(inputs) - targets) ** 2).mean(), {}, None


def _learner(model: nn.Module, sync=None) -> Learner:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # Adam would hide a scale error
    return Learner(model, _mean_squared_loss, optimizer,
                   make_lr_schedule(optimizer, "constant", 10), 1e9, sync_gradients=sync)


def _remote_actor_rank_exchange(info, out_dir: str) -> None:
    """Rank 0 learns, rank 1 only acts: rank 1 gets rank 0's weights before acting, sends
    two slots (rank 0 finds them in its pool), gets version 1 after rank 0 publishes it,
    and stops when rank 0 does."""
    from distrl.acting.actor import ActorStats
    from distrl.acting.remote import LearnerConnection, RemoteActors
    from distrl.transport.queues import FieldSpec, SlotPool
    from distrl.transport.weights import WeightStore

    pool = SlotPool({"x": FieldSpec((3, 2), torch.float32, time_major=False),
                     "n": FieldSpec((4,), torch.int64, time_major=False)}, num_slots=2)
    out = Path(out_dir)
    if info.rank == 0:
        model = _model(100)
        store = WeightStore(model)
        with RemoteActors(info, pool, store) as remote:
            first, _ = pool.take(1, timeout=30)
            store.publish(_model(200), version=1)  # rank 1 gets it in the next reply
            second, _ = pool.take(1, timeout=30)
            received = {k: v.clone() for k, v in pool.gather(first + second).items()}
            episodes = remote.drain()[0]
        torch.save({"received": received, "returns": episodes.episode_returns,
                    "frames": episodes.frames}, out / "rank0.pt")
    else:
        model = _model(101)  # its own random weights until rank 0's arrive
        store = WeightStore(model)
        connection = LearnerConnection(info, store.flat.numel())
        connection.first_weights(store)
        store.pull_if_newer(model, -1)
        first_weights = {k: v.clone() for k, v in model.state_dict().items()}
        versions, sent = [], []
        for step in range(10):  # rank 0 stops it after its second slot's reply at most
            pool.buffers["x"][0] = step + 0.5
            pool.buffers["n"][0] = torch.arange(4) * (step + 1)
            sent.append({k: v[0].clone() for k, v in pool.buffers.items()})
            stats = ActorStats(frames=7, episode_returns=[float(step)], episode_lengths=[3])
            go_on = connection.send(pool.buffers, 0, stats, store)
            versions.append(store.version)
            if not go_on:
                break
        store.pull_if_newer(model, -1)
        torch.save({"first_weights": first_weights, "versions": versions, "sent": sent,
                    "last_weights": model.state_dict()}, out / "rank1.pt")


class _UnevenFeed(RankFrameBudget):
    """A feed whose rank collects ``frames_per_update`` frames before each batch, as a
    replay rank with faster or slower actors would."""

    def __init__(self, frames_per_update: int, total_frames: int):
        self.counters = {"frames": 0, "elapsed_s": 0.0}
        self.total_frames, self.frames_per_update = total_frames, frames_per_update

    def next_batch(self, stop_requested):
        if self.budget_spent():
            return None
        self.counters["frames"] += self.frames_per_update
        return _batch(), {}

    def after_update(self, batch, priorities) -> None:
        pass

    def collect(self) -> None:
        pass

    def throughput(self, span_s: float) -> dict[str, float]:
        return {}

    def report(self, span_s: float) -> tuple[dict[str, float], dict[str, float]]:
        return {}, {}


def _train_uneven_ranks(info, out_dir: str) -> None:
    """The training loop on two ranks whose actors collect 300 and 100 frames per update
    of a 2,000-frame run."""
    from distrl.training import loop

    feed = _UnevenFeed(300 if info.rank == 0 else 100, total_frames=2000)
    learner = _learner(_model(0), GradientAverager(_model(0), bucket_bytes=256))
    logger = SimpleNamespace(add=lambda *a: None, add_many=lambda scalars: None,
                             due=lambda: False, write=lambda frames, line: None,
                             mean_recent_return=lambda n: float("nan"), recent_returns=[],
                             stream=io.StringIO())
    settings = SimpleNamespace(total_frames=2000, stop_at_return=None,
                               checkpoint=SimpleNamespace(interval_s=3600.0),
                               log=SimpleNamespace(progress="lines"),
                               distributed=SimpleNamespace(resync_interval=0))
    frames = loop.train(learner, feed, logger, settings, info, feed.counters,
                        lambda frames: Path(out_dir), None, None, fixed_meter())
    torch.save({"frames": frames, "own": feed.counters["frames"], "updates": learner.updates},
               Path(out_dir) / f"rank{info.rank}.pt")


def _rank_main(rank: int, port: int, out_dir: str, task: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    info = init_from_env(timeout_s=60, learner_ranks=1 if task == "remote" else 0)
    assert info is not None and info.backend == "gloo" and info.rank == rank
    try:
        if task == "remote":
            _remote_actor_rank_exchange(info, out_dir)
            return
        if task == "uneven":
            _train_uneven_ranks(info, out_dir)
            return
        if task == "step":
            model = _model(0)
            inputs, targets = _batch()
            half = inputs.shape[0] // WORLD
            mine = slice(rank * half, (rank + 1) * half)
            learner = _learner(model, GradientAverager(model, bucket_bytes=256))
            metrics, _ = learner.step((inputs[mine], targets[mine]))
            assert metrics["learner/allreduce_s"] > 0
        elif task == "resync":  # ranks that drifted apart by 0.25 * rank in one weight
            model = _model(0)
            with torch.no_grad():
                model[0].weight[0, 0] += 0.25 * rank
            drift = resync_parameters(model, info)
            torch.save({"state": model.state_dict(), "drift": drift},
                       Path(out_dir) / f"rank{rank}.pt")
            return
        else:  # broadcast: every rank starts from its own random weights
            model = _model(100 + rank)
            broadcast_parameters(model, src=0)
        torch.save(model.state_dict(), Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _run_ranks(tmp_path: Path, task: str) -> list[dict[str, torch.Tensor]]:
    mp.start_processes(_rank_main, args=(_free_port(), str(tmp_path), task), nprocs=WORLD,
                       start_method="spawn", join=True)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]


def test_an_actor_only_rank_gets_rank_0s_weights_and_its_slots_reach_the_learner(tmp_path):
    learner, actor = _run_ranks(tmp_path, "remote")
    for name, value in _model(100).state_dict().items():  # before acting: rank 0's weights
        assert torch.equal(actor["first_weights"][name], value), name
    assert not torch.equal(actor["first_weights"]["0.weight"], _model(101).state_dict()["0.weight"])
    for name, value in _model(200).state_dict().items():  # version 1 after the broadcast
        assert torch.equal(actor["last_weights"][name], value), name
    assert actor["versions"] == sorted(actor["versions"]) and 1 in actor["versions"]
    for i in range(2):  # the learner's pool holds exactly what the actor rank sent
        assert torch.equal(learner["received"]["x"][3 * i:3 * i + 3], actor["sent"][i]["x"])
        assert torch.equal(learner["received"]["n"][4 * i:4 * i + 4], actor["sent"][i]["n"])
    assert learner["returns"][:2] == [0.0, 1.0] and learner["frames"] >= 14
    assert len(actor["versions"]) <= 3  # told to stop once the learner was done


def test_one_averaged_step_equals_a_single_process_step_on_the_whole_batch(tmp_path):
    states = _run_ranks(tmp_path, "step")
    single = _model(0)
    _learner(single).step(_batch())
    for name, value in single.state_dict().items():
        assert torch.equal(states[0][name], states[1][name]), name  # bit-identical ranks
        torch.testing.assert_close(states[0][name], value, rtol=1e-5, atol=1e-6)
    # The step moved the weights (a test that compares untouched weights cannot fail).
    assert not torch.equal(states[0]["0.weight"], _model(0).state_dict()["0.weight"])


def test_broadcast_delivers_rank_0s_weights(tmp_path):
    states = _run_ranks(tmp_path, "broadcast")
    expected = _model(100).state_dict()
    assert not torch.equal(expected["0.weight"], _model(101).state_dict()["0.weight"])
    for state in states:
        for name, value in expected.items():
            assert torch.equal(state[name], value), name


def test_resync_restores_rank_0s_weights_and_reports_the_drift(tmp_path):
    ranks = _run_ranks(tmp_path, "resync")
    assert ranks[0]["drift"] == 0.0
    assert ranks[1]["drift"] == pytest.approx(0.25)
    for name, value in _model(0).state_dict().items():
        assert torch.equal(ranks[1]["state"][name], value), name


def test_ranks_collecting_at_different_paces_stop_together_once_their_sum_is_spent(tmp_path):
    """300 + 100 frames per update of a 2,000-frame run: 5 updates, 2,000 frames, though
    the faster rank passed its even share (1,000) after 4; stopping there would leave
    1,600."""
    ranks = _run_ranks(tmp_path, "uneven")
    assert [r["frames"] for r in ranks] == [2000, 2000]
    assert [r["own"] for r in ranks] == [1500, 500]
    assert [r["updates"] for r in ranks] == [5, 5]


def test_episodes_are_stamped_at_the_agreed_run_frames_plus_this_ranks_since():
    """The slower of two ranks, resumed at 1,600 run frames with 500 of its own, then 50
    more: its episodes stamp at 1,600 + 2 x 50 = 1,700, not 2 x 550 = 1,100 (below the
    checkpoint they resumed from). At the next agreement, the run's own figure."""
    feed = _UnevenFeed(50, total_frames=4000)
    feed.world = 2
    feed.counters["frames"] = 500
    feed.agreed(1600)  # as the runner seeds a resumed run
    assert feed.episode_frames() == 1600
    feed.next_batch(lambda: False)
    assert feed.episode_frames() == 1700
    assert feed.run_frames() == 1650  # the budget's lower bound counts only its own
    feed.agreed(1810)  # the faster rank collected 260 meanwhile
    assert feed.episode_frames() == 1810


FAILING_RANK = """
import sys, time
import torch, torch.distributed as dist
sys.path.insert(0, {root!r})
from distrl.transport.distributed import init_from_env
info = init_from_env(timeout_s=600)
if info.rank == 1:
    raise RuntimeError("rank 1 fails on purpose")
dist.all_reduce(torch.ones(1))  # rank 0 waits here for a peer that is gone
time.sleep(600)
"""


def test_a_rank_that_raises_ends_the_torchrun_job_non_zero_in_bounded_time(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(FAILING_RANK.format(root=str(Path(__file__).resolve().parents[1])))
    # Bounded: the subprocess's own limit, not a measured duration, fails a hang.
    proc = run_group(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(script)], timeout=120)
    assert proc.returncode != 0
    assert "rank 1 fails on purpose" in proc.stdout + proc.stderr


TRAIN_WITH_2_RANKS = """
import os
import sys
sys.path.insert(0, {root!r})
sys.path.insert(0, {tests!r})
from test_impala import cartpole_config
from gloo_threads import gloo_threads_left
from agents import impala
from pathlib import Path
if __name__ == "__main__":  # actor processes are spawned: they import this file again
    cfg = cartpole_config(Path({tmp!r}), "ranks", actors={actors}, total_frames={frames})
    cfg.log.interval_s = {interval}
    result = impala.run(cfg)
    rank = os.environ["RANK"]  # each rank writes its own file: printed lines interleave
    Path({tmp!r}, f"result{{rank}}.txt").write_text(
        f"{{result['updates']}} {{result['frames']}} {{bool(result['checkpoint'])}} "
        f"{{gloo_threads_left()}}")
"""


def _torchrun(script: Path, nproc: int = 2, timeout: int = 300) -> subprocess.CompletedProcess:
    return run_group(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc_per_node={nproc}", str(script)], timeout=timeout)


def test_sigterm_stops_every_rank_at_the_same_update_with_a_checkpoint(tmp_path):
    """SIGTERM to torchrun (as a cluster scheduler sends it): it forwards the signal, both
    ranks stop at the same update, rank 0 checkpoints, and no process is left behind."""
    script = tmp_path / "train.py"
    root = Path(__file__).resolve().parents[1]
    script.write_text(TRAIN_WITH_2_RANKS.format(root=str(root), tests=str(root / "tests"),
                                                tmp=str(tmp_path), actors=2,
                                                frames=10**9, interval=1.0))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=2", str(script)]
    with Training(command) as job:
        # Rank 0's first report (every second here) comes after an update: both ranks
        # are in their training loops, past actor start-up, with their signal handlers.
        job.wait_until()
        job.proc.send_signal(signal.SIGTERM)
        job.finish(timeout=90)  # a job that ignores SIGTERM fails here
    output = job.output
    assert all((tmp_path / f"result{rank}.txt").exists() for rank in range(2)), output[-3000:]
    results = [(tmp_path / f"result{rank}.txt").read_text().split() for rank in range(2)]
    assert results[0][0] == results[1][0] and int(results[0][0]) > 0, output[-3000:]
    assert results[0][2] == "True"  # rank 0 wrote the checkpoint of that update
    leftover = subprocess.run(["pgrep", "-f", str(script)], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", "processes left behind"


@pytest.mark.parametrize("actors", [0, 2])
def test_impala_trains_with_two_learner_ranks_and_exits_0(tmp_path, actors):
    """10 updates of 2 ranks (each T=20 x B=32 CartPole steps): 12,800 frames in all, rank 0
    alone writes the checkpoint and records the world size."""
    script = tmp_path / "train.py"
    root = Path(__file__).resolve().parents[1]
    script.write_text(TRAIN_WITH_2_RANKS.format(root=str(root), tests=str(root / "tests"),
                                                tmp=str(tmp_path), actors=actors,
                                                frames=10 * 640 * 2, interval=30.0))
    proc = _torchrun(script)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [(tmp_path / f"result{rank}.txt").read_text() for rank in range(2)]
    # rank 0 alone checkpoints; no rank keeps gloo threads past the run
    assert results == ["10 12800 True 0", "10 12800 False 0"]
    checkpoints = list((tmp_path / "ranks" / "checkpoints").glob("*.pt"))
    assert len(checkpoints) == 1
    assert torch.load(checkpoints[0], weights_only=False)["world_size"] == 2


TRAIN_AGENT_WITH_2_RANKS = """
import json
import os
import sys
sys.path.insert(0, {root!r})
sys.path.insert(0, {tests!r})
from pathlib import Path
import agents
from presets import compose_run
from gloo_threads import gloo_threads_left
if __name__ == "__main__":  # actor processes and env workers import this file again
    cfg = compose_run(Path({tmp!r}), {name!r}, *{overrides!r})
    result = agents.get(cfg.agent.name).run(cfg)
    keys = ("updates", "frames", "checkpoint", "inserted", "replay_size", "mean_return_20",
            "slots_sent")
    summary = {{k: result.get(k) for k in keys}}
    summary["gloo_threads"] = gloo_threads_left()
    Path({tmp!r}, "result" + os.environ["RANK"] + ".json").write_text(json.dumps(summary))
"""


def _train_agent(tmp_path: Path, name: str, *overrides: str, timeout: int = 300
                 ) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """``torchrun --nproc_per_node=2 run.py <overrides>``; each rank's summary."""
    script = tmp_path / f"{name}.py"
    root = Path(__file__).resolve().parents[1]
    script.write_text(TRAIN_AGENT_WITH_2_RANKS.format(
        root=str(root), tests=str(root / "tests"), tmp=str(tmp_path), name=name,
        overrides=overrides))
    for rank in range(2):
        (tmp_path / f"result{rank}.json").unlink(missing_ok=True)
    proc = _torchrun(script, timeout=timeout)
    results = [json.loads((tmp_path / f"result{rank}.json").read_text())
               for rank in range(2) if (tmp_path / f"result{rank}.json").exists()]
    return proc, results


REPLAY_AGENTS = {
    "apex": ("+experiment=apex_cartpole", "total_frames=4000"),
    "apex_2_actors": ("+experiment=apex_cartpole", "total_frames=4000",
                      "distributed.actors=2", "distributed.envs_per_actor=4"),
    "r2d2": ("+experiment=r2d2_cartpole", "total_frames=3000", "agent.learning_starts=20",
             "agent.batch_size=8"),
    "seed_r2d2": ("+experiment=seed_r2d2_cartpole", "total_frames=3000",
                  "agent.r2d2.learning_starts=20", "agent.r2d2.batch_size=8",
                  "distributed.actors=1", "distributed.envs_per_actor=4"),
    "seed_impala": ("agent=seed", "env=CartPole", "total_frames=12800",
                    "distributed.actors=1", "distributed.envs_per_actor=16",
                    "distributed.env_groups=1", "agent.impala.batch_size=16"),
}


@pytest.mark.parametrize("agent", list(REPLAY_AGENTS))
def test_every_agent_trains_with_two_learner_ranks_and_exits_0(tmp_path, agent):
    """Both ranks make the same number of updates (gradients are all-reduced in step),
    share the frame budget and stop together; rank 0 writes the checkpoint, and each rank
    of a replay agent its own replay shard."""
    proc, results = _train_agent(tmp_path, "run", *REPLAY_AGENTS[agent])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(results) == 2
    assert results[0]["updates"] == results[1]["updates"] > 0
    assert results[0]["frames"] == results[1]["frames"]
    assert results[0]["checkpoint"] and not results[1]["checkpoint"]  # rank 0 names it
    assert [r["gloo_threads"] for r in results] == [0, 0]  # the process groups are gone
    directory = tmp_path / "run" / "checkpoints"
    (main,) = directory.glob("checkpoint-*.pt")
    assert torch.load(main, weights_only=False)["world_size"] == 2
    if agent != "seed_impala":
        step = int(main.stem.split("-")[1])
        assert results[0]["updates"] == step
        for rank in range(2):
            assert (directory / f"replay-rank{rank}-{step:012d}.pt").exists()


ACTOR_RANK_AGENTS = {
    "impala": ("agent=impala", "env=CartPole", "total_frames=12800",
               "distributed.actors=0", "distributed.envs_per_actor=16",
               "distributed.env_groups=1", "agent.batch_size=16"),
    "impala_2_actors": ("agent=impala", "env=CartPole", "total_frames=12800",
                        "distributed.actors=2", "distributed.envs_per_actor=8",
                        "distributed.env_groups=1", "agent.batch_size=16"),
    "apex": REPLAY_AGENTS["apex"],
    "r2d2": REPLAY_AGENTS["r2d2"],
}


@pytest.mark.parametrize("agent", list(ACTOR_RANK_AGENTS))
def test_an_actor_only_rank_feeds_the_learner_and_both_exit_0(tmp_path, agent):
    """``distributed.learner_ranks=1`` on 2 ranks: rank 1 only acts and streams its slots
    to rank 0, which learns from them beside its own actors' and stops it at the end."""
    proc, results = _train_agent(tmp_path, "run", *ACTOR_RANK_AGENTS[agent],
                                 "distributed.learner_ranks=1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    learner, actor = results
    assert learner["updates"] > 0 and learner["checkpoint"]
    assert actor["updates"] == 0 and actor["slots_sent"] > 0 and not actor["checkpoint"]
    assert learner["gloo_threads"] == actor["gloo_threads"] == 0
    assert "actor_ranks=1" in proc.stdout
    assert f"actor rank 1: sent {actor['slots_sent']} slots to learner rank 0" in proc.stdout


def test_seed_refuses_actor_only_ranks_with_the_setting_named(tmp_path):
    proc, _ = _train_agent(tmp_path, "run", *REPLAY_AGENTS["seed_impala"],
                           "distributed.learner_ranks=1")
    assert proc.returncode != 0
    assert "distributed.learner_ranks: actor-only ranks run actors with a policy copy" in (
        proc.stdout + proc.stderr)


def test_replay_shards_resume_per_rank_and_a_missing_one_is_named(tmp_path):
    """A 2-rank Ape-X run resumed with 2 ranks: each rank gets its own replay back (its
    insert counter continues); a resume in one process is refused with the world size; a
    missing shard stops the resume with its path."""
    overrides = ("+experiment=apex_cartpole", "checkpoint.replay=true")
    proc, first = _train_agent(tmp_path, "run", *overrides, "total_frames=4000")
    assert proc.returncode == 0, proc.stderr[-3000:]
    directory = tmp_path / "run" / "checkpoints"
    shards = [torch.load(p, weights_only=False) for p in sorted(directory.glob("replay-*.pt"))]
    assert [s["replay"]["inserted"] for s in shards] == [r["inserted"] for r in first]
    trees = [s["replay"]["sampler"]["tree"] for s in shards]
    assert any(not torch.equal(a, b) for a, b in zip(trees[0].values(), trees[1].values(),
                                                    strict=True) if torch.is_tensor(a))

    resume = (f"resume={tmp_path / 'run'}", "total_frames=6000")
    proc, second = _train_agent(tmp_path, "resumed", *overrides, *resume)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for before, after in zip(first, second, strict=True):
        assert after["inserted"] > before["inserted"]  # continued from its own shard
        assert after["updates"] > before["updates"]

    from presets import compose_run

    from agents import apex
    from distrl.run.checkpoint import CheckpointError
    with pytest.raises(CheckpointError, match="written by 2 learner rank"):
        apex.run(compose_run(tmp_path, "alone", *overrides, *resume))

    for shard in directory.glob("replay-rank1-*.pt"):
        shard.unlink()
    proc, _ = _train_agent(tmp_path, "missing", *overrides, *resume, "total_frames=9000")
    assert proc.returncode != 0
    assert "learner rank 1's replay shard" in proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_impala_learns_cartpole_with_two_learner_ranks(tmp_path):
    """2 learner ranks, each with 32 envs in its own process, for 1.6M frames of all ranks
    together: 800k per rank (an update takes one batch per rank; the one-rank budget is
    1.2M, cut for CI's time and calibrated at 1.6M); judged on the mean over ranks of each
    one's last 20 episodes. Threshold: IMPALA_RANKS_TRAIN (from seeds 100 and 101); runs
    seed 8."""
    seed = learning_seed()
    script = tmp_path / "learn.py"
    root = Path(__file__).resolve().parents[1]
    script.write_text(LEARN_WITH_2_RANKS.format(root=str(root), tests=str(root / "tests"),
                                                tmp=str(tmp_path), seed=seed))
    proc = _torchrun(script, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    mean, frames = (tmp_path / "result0.txt").read_text().split()
    report("impala_two_ranks", seed, {"mean_return_20": float(mean), "frames": int(frames)})
    assert int(frames) >= 1_600_000 and float(mean) >= IMPALA_RANKS_TRAIN


LEARN_WITH_2_RANKS = """
import dataclasses
import os
import sys
sys.path.insert(0, {root!r})
sys.path.insert(0, {tests!r})
from test_impala import cartpole_config
from agents import impala
from pathlib import Path
if __name__ == "__main__":
    cfg = cartpole_config(Path({tmp!r}), "learn", actors=0, total_frames=1_600_000,
                          seed={seed})
    result = impala.run(cfg)
    Path({tmp!r}, "result" + os.environ["RANK"] + ".txt").write_text(
        f"{{result['mean_return_20']}} {{result['frames']}}")
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_apex_learns_cartpole_with_two_learner_ranks(tmp_path):
    """Ape-X with 2 learner ranks (one process each, 8 envs and a replay shard per rank)
    for 200k env steps of both ranks together, 100k per rank (the one-rank budget is 150k;
    cut for CI's time and calibrated at 200k);
    judged on the mean over ranks of each one's last 20 episodes. Threshold:
    APEX_RANKS_TRAIN (from seeds 100 and 101); runs seed 8."""
    seed = learning_seed()
    proc, results = _train_agent(tmp_path, "learn", "+experiment=apex_cartpole",
                                 "total_frames=200000", f"seed={seed}", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report("apex_two_ranks", seed, results[0])
    # The ranks' actors collect at their own pace: the run ends on the agreed total, not
    # when the faster rank has spent its even share (which once left 199,898).
    assert results[0]["frames"] >= 200_000
    assert results[0]["mean_return_20"] >= APEX_RANKS_TRAIN


def test_more_learner_ranks_than_ranks_is_refused_with_the_setting_named(monkeypatch):
    from distrl.config import ConfigError

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"distributed.learner_ranks must be 0 .* or 1..2 "
                                          r"\(the torchrun world size\), got 3"):
        init_from_env(learner_ranks=3)
    assert not dist.is_initialized()
