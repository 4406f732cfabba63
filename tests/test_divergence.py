"""The divergence guard: a non-finite loss or gradient norm skips the update (no step,
nothing published, no priorities written back), K in a row stop the run, and weights a
step made non-finite stop it at once; whole runs with lr=1e6 never publish or checkpoint
a non-finite weight."""

from __future__ import annotations

import math

import pytest
import torch
from presets import compose_run, run_py
from torch import nn

from agents import apex, impala, seed
from distrl.run import checkpoint
from distrl.training.learner import Diverged, Learner, make_lr_schedule
from distrl.transport.weights import WeightStore


def _learner(losses: list[float], lr: float = 0.1, max_skipped: int = 3):
    """A one-weight learner whose loss is ``w * next(losses)``; returns it and its store."""
    values = iter(losses)
    return _learner_of(lambda w: w * next(values), lr, max_skipped)


def _learner_of(loss_of_weight, lr: float = 0.1, max_skipped: int = 3):
    """A one-weight learner (w = 1, SGD) whose loss is ``loss_of_weight(w)``; returns it
    and its store."""
    model = nn.Linear(1, 1, bias=False)
    nn.init.constant_(model.weight, 1.0)

    def loss_fn(model, batch):
        return loss_of_weight(model.weight.sum()), {}, torch.tensor([1.0, 2.0])

    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    store = WeightStore(model)
    learner = Learner(model, loss_fn, optimizer, make_lr_schedule(optimizer, "constant", 10),
                      max_grad_norm=1e9, weights=store, max_skipped_updates=max_skipped)
    return learner, store


def test_a_non_finite_loss_skips_the_update_and_publishes_nothing():
    learner, store = _learner([1.0, math.nan, math.inf, 1.0])
    metrics, priorities = learner.step(None)
    assert learner.updates == 1 and store.version == 1
    assert float(learner.model.weight.detach()) == pytest.approx(0.9)  # w - lr * 1
    assert metrics["learner/skipped_updates"] == 0.0 and priorities is not None
    for _ in range(2):  # nan, then inf
        metrics, priorities = learner.step(None)
        assert priorities is None and metrics["learner/skipped_updates"] == 1.0
        assert learner.updates == 1 and store.version == 1
        assert float(learner.model.weight.detach()) == pytest.approx(0.9)
        assert learner.model.weight.grad is None
    learner.step(None)  # a finite update resets the run of skips
    assert learner.skipped_in_a_row == 0 and learner.skipped_updates == 2
    assert float(learner.model.weight.detach()) == pytest.approx(0.8) and store.version == 2


def test_a_finite_loss_with_a_non_finite_gradient_skips_the_update_too():
    """loss = sqrt(w - 1) at w = 1: the loss is 0, its gradient 0.5 / sqrt(0) = inf."""
    learner, store = _learner_of(lambda w: torch.sqrt(w - 1.0))
    metrics, priorities = learner.step(None)
    assert metrics["learner/loss"] == 0.0 and metrics["learner/grad_norm"] == math.inf
    assert priorities is None and metrics["learner/skipped_updates"] == 1.0
    assert store.version == 0 and learner.updates == 0
    assert float(learner.model.weight.detach()) == 1.0


def test_k_skipped_updates_in_a_row_stop_the_run_by_name():
    learner, store = _learner([math.nan] * 3, max_skipped=3)
    learner.step(None)
    learner.step(None)
    with pytest.raises(Diverged, match=(
            r"^training diverged: 3 updates in a row had a non-finite loss or gradient norm "
            r"\(last: loss nan, grad norm nan, lr 0\.1\) and were skipped; "
            r"agent\.optimizer\.max_skipped_updates=3\. Lower agent\.optimizer\.lr")):
        learner.step(None)
    assert store.version == 0 and float(learner.model.weight.detach()) == 1.0


def test_a_step_that_makes_the_weights_non_finite_is_never_published():
    learner, store = _learner([1e10], lr=1e38)  # w - 1e38 * 1e10 overflows float32
    with pytest.raises(Diverged, match=r"update 1 made the weights non-finite \(lr 1e\+38\)"):
        learner.step(None)
    assert store.version == 0 and learner.updates == 0


# ---------------------------------------------------------------- whole runs


def _guard_publish_and_save(monkeypatch) -> dict[str, int]:
    """Fail the test if a non-finite weight is ever published or checkpointed."""
    seen = {"published": 0, "saved": 0}
    publish, save = WeightStore.publish, checkpoint.save

    def checked_publish(self, model, version):
        assert all(torch.isfinite(p).all() for p in model.parameters()), "published non-finite"
        seen["published"] += 1
        return publish(self, model, version)

    def checked_save(state, *args, **kwargs):
        if "learner" in state:
            for name, value in state["learner"]["model"].items():
                assert torch.isfinite(value).all(), f"checkpointed non-finite {name}"
            seen["saved"] += 1
        return save(state, *args, **kwargs)

    monkeypatch.setattr(WeightStore, "publish", checked_publish)
    monkeypatch.setattr(checkpoint, "save", checked_save)
    return seen


@pytest.mark.parametrize(("agent", "run", "overrides"), [
    ("impala", impala.run, ["agent.batch_size=8", "agent.unroll_length=20"]),
    ("apex", apex.run, ["agent.learning_starts=200", "agent.batch_size=32"]),
])
def test_lr_1e6_stops_with_one_line_and_the_last_good_checkpoint_newest(
        tmp_path, monkeypatch, agent, run, overrides):
    seen = _guard_publish_and_save(monkeypatch)
    cfg = compose_run(tmp_path, "diverge", f"agent={agent}", "env.id=CartPole-v1",
                      "distributed.actors=0", "distributed.envs_per_actor=8",
                      "distributed.env_groups=1", "agent.optimizer.lr=1e6",
                      "total_frames=2000000", *overrides)
    cfg.checkpoint.interval_s = 0.0  # a checkpoint after every update
    with pytest.raises(Diverged, match=r"^training diverged: "):
        run(cfg)
    assert seen["published"] >= 1 and seen["saved"] >= 1
    saved = checkpoint.list_checkpoints(tmp_path / "diverge" / "checkpoints")
    assert saved
    for path in saved:
        model = checkpoint.load(path)["learner"]["model"]
        assert all(torch.isfinite(value).all() for value in model.values()), path


def test_run_py_stops_a_diverged_run_with_one_line_and_exit_1(tmp_path):
    proc = run_py(tmp_path, "agent=apex", "env.id=CartPole-v1", "distributed.actors=0",
                  "distributed.envs_per_actor=8", "distributed.env_groups=1",
                  "agent.optimizer.lr=1e6", "agent.learning_starts=200", "agent.batch_size=32",
                  "total_frames=2000000", f"log.dir={tmp_path}", "log.name=diverge",
                  "log.tensorboard=false", timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("distrl: error: training diverged: "), lines
    assert "Traceback" not in proc.stdout + proc.stderr


def test_seed_names_its_nested_optimizer_setting(tmp_path):
    """SEED keeps IMPALA's optimizer under agent.impala: the message names that path."""
    cfg = compose_run(tmp_path, "diverge", "agent=seed", "env.id=CartPole-v1",
                      "distributed.actors=0", "distributed.envs_per_actor=8",
                      "distributed.env_groups=1", "agent.impala.optimizer.lr=1e6",
                      "agent.impala.batch_size=8", "agent.impala.unroll_length=20",
                      "total_frames=2000000")
    with pytest.raises(Diverged, match=r"agent\.impala\.optimizer\.max_skipped_updates=10\. "
                                       r"Lower agent\.impala\.optimizer\.lr;"):
        seed.run(cfg)
