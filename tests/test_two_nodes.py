"""Two torchrun "nodes" on one machine, as two hosts would start them: ``torchrun
--nnodes=2 --node-rank=k --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT``, one process
each, meeting over loopback. Checked: data-parallel IMPALA learners, and an IMPALA learner
with an actor-only rank on the other node, both nodes exit 0; and a whole node lost
mid-run, after which the job, started again as a whole, continues the run. (A rank killed
and its worker group restarted on one node is tests/test_restarts.py.)"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest
from presets import REPO, Training

from distrl.run import checkpoint

pytestmark = pytest.mark.dist

TINY = ("agent=impala", "env=CartPole", "distributed.actors=0", "distributed.envs_per_actor=32",
        "distributed.env_groups=1", "agent.batch_size=32", "agent.unroll_length=20")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node(node_rank: int, port: int, tmp_path: Path, *overrides: str,
          max_restarts: int = 1) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
            f"--node-rank={node_rank}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=distrl-test",
            f"--max-restarts={max_restarts}",
            str(REPO / "run.py"), *TINY, f"log.dir={tmp_path / 'runs'}", "log.name=job",
            "resume=auto", *overrides, f"hydra.run.dir={tmp_path / f'hydra{node_rank}'}"]


def _start_nodes(port: int, tmp_path: Path, *overrides: str, max_restarts: int = 1
                 ) -> list[Training]:
    """Node 0 first, and node 1 once node 0's agent hosts the rendezvous store (on one
    machine either agent could host it)."""
    first = _start(_node(0, port, tmp_path, *overrides, max_restarts=max_restarts))
    deadline = time.monotonic() + 60
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        assert time.monotonic() < deadline and first.proc.poll() is None, first.output
        time.sleep(0.1)
    return [first, _start(_node(1, port, tmp_path, *overrides, max_restarts=max_restarts))]


def _env() -> dict[str, str]:
    tests = str(REPO / "tests")
    return {**{k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"},
            "PYTHONPATH": f"{tests}{os.pathsep}{REPO}", "GLOO_SOCKET_IFNAME": "lo"}


def _start(command: list[str]) -> Training:
    """One torchrun node, in a session of its own, its output read in a thread."""
    return Training(command, cwd=REPO, env=_env())


def _run_to_end(nodes: list[Training], timeout: float = 300) -> tuple[list[int], str]:
    """Both nodes' exit codes and output once they end; whatever is left is killed."""
    try:
        codes = [node.finish(timeout=timeout) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    return codes, "".join(node.output for node in nodes)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", ["two_learners", "learner_and_actor_rank"])
def test_two_nodes_on_loopback_train_and_both_exit_0(tmp_path, case):
    port = _free_port()
    extra = ("total_frames=25600",) + (("distributed.learner_ranks=1",)
                                        if case == "learner_and_actor_rank" else ())
    codes, output = _run_to_end(_start_nodes(port, tmp_path, *extra))
    assert codes == [0, 0], output[-4000:]
    final = checkpoint.load(checkpoint.list_checkpoints(tmp_path / "runs" / "job"
                                                        / "checkpoints")[-1])
    if case == "two_learners":
        assert final["world_size"] == 2 and final["frames_all_ranks"] == 25600
        assert "learner_ranks=2 actor_ranks=0" in output
    else:
        assert final["world_size"] == 1 and final["counters"]["frames"] == 25600
        assert "learner_ranks=1 actor_ranks=1" in output
        assert "actor rank 1: sent" in output


@pytest.mark.timeout(600)
def test_a_lost_node_ends_the_job_and_the_job_started_again_continues_the_run(tmp_path):
    """A whole node lost mid-run (its torchrun agent and rank SIGKILLed) under
    ``--max-restarts=0``: the other node's rank fails on its next all-reduce and that node
    exits non-zero, leaving the newest checkpoint; the job started again as a whole (Slurm's
    requeue, a resubmitted TrainJob: the same command on both nodes) continues the run
    directory from it to the end of its budget."""
    overrides = ("total_frames=64000", "checkpoint.interval_s=0.5", "log.interval_s=0.5")
    checkpoints = tmp_path / "runs" / "job" / "checkpoints"
    nodes = _start_nodes(_free_port(), tmp_path, *overrides, max_restarts=0)
    try:
        nodes[0].wait_until(lambda: bool(checkpoint.list_checkpoints(checkpoints)))
        nodes[1].kill()
        survivor = nodes[0].finish(timeout=240)
    finally:
        for node in nodes:
            node.kill()
    assert survivor != 0, nodes[0].output[-3000:]
    before = checkpoint.load(checkpoint.list_checkpoints(checkpoints)[-1])
    assert 0 < before["frames_all_ranks"] < 64000

    codes, output = _run_to_end(_start_nodes(_free_port(), tmp_path, *overrides,
                                             max_restarts=0))
    assert codes == [0, 0], output[-4000:]
    assert (f"[distrl] resume=auto: continuing {checkpoints.parent} from its newest intact "
            "checkpoint") in output
    final = checkpoint.load(checkpoint.list_checkpoints(checkpoints)[-1])
    assert final["frames_all_ranks"] == 64000
    assert final["learner"]["updates"] > before["learner"]["updates"]
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["job"]
