"""agent.device: where each agent's learner trains (model, target network, batches).

On a CPU machine the runs check that what the config names reaches the learner and that
every batch field moves (to the ``meta`` device, the one other device every torch has);
the tests marked ``gpu`` train each agent on CUDA where there is one.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from presets import compose_run

import agents
from distrl.config import ConfigError
from distrl.training import learner as learner_module
from distrl.training.learner import Learner, resolve_device, to_device

# Short runs of every agent on CartPole that make a few updates (one process).
RUNS = {
    "impala": ("agent=impala", "env=CartPole", "total_frames=1920",
               "distributed.envs_per_actor=8"),
    "apex": ("+experiment=apex_cartpole", "total_frames=1200", "agent.learning_starts=200",
             "agent.batch_size=16", "eval.episodes=0"),
    "r2d2": ("+experiment=r2d2_cartpole", "total_frames=1600", "agent.learning_starts=8",
             "agent.batch_size=4", "eval.episodes=0"),
    "seed": ("agent=seed", "env=CartPole", "total_frames=1920",
             "distributed.envs_per_actor=8"),
    "seed_r2d2": ("+experiment=seed_r2d2_cartpole", "total_frames=1600",
                  "agent.r2d2.learning_starts=8", "agent.r2d2.batch_size=4",
                  "eval.episodes=0"),
}


def _tensors(batch: object) -> list[torch.Tensor]:
    """Every tensor inside a batch (dataclass fields, tuples, lists, dicts)."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return [t for f in dataclasses.fields(batch) for t in _tensors(getattr(batch, f.name))]
    if isinstance(batch, (tuple, list)):
        return [t for item in batch for t in _tensors(item)]
    if isinstance(batch, dict):
        return [t for item in batch.values() for t in _tensors(item)]
    return []


def _run_recording(tmp_path, monkeypatch, run: str, *overrides: str) -> dict:
    """Run ``RUNS[run]`` and record, at the learner's first update, the devices of its
    model, of the loss's target network (where it has one) and of the batch the loss got."""
    seen: dict = {}
    step = Learner.step

    def recording_step(self: Learner, batch: object):
        if not seen:
            loss_fn = self.loss_fn

            def recording_loss(model, moved):
                seen["batch"] = moved
                seen["model"] = {p.device for p in model.parameters()}
                target = getattr(loss_fn, "target", None)
                seen["target"] = {p.device for p in target.parameters()} if target else None
                return loss_fn(model, moved)

            self.loss_fn = recording_loss
            try:
                return step(self, batch)
            finally:
                self.loss_fn = loss_fn
        return step(self, batch)

    monkeypatch.setattr(Learner, "step", recording_step)
    cfg = compose_run(tmp_path, run, *RUNS[run], *overrides)
    result = agents.get(cfg.agent.name).run(cfg)
    assert result["updates"] > 0 and seen, "the run made no update"
    return seen


@pytest.mark.parametrize("run", sorted(RUNS))
def test_learner_model_target_and_batch_sit_on_the_named_device(tmp_path, monkeypatch,
                                                                   capfd, run):
    """agent.device=cpu: the model, the target network and every tensor the loss sees are
    on the CPU, the start-up line says so, and every field of that real batch moves to
    another device (meta) with ``to_device``, the one call the learner makes."""
    seen = _run_recording(tmp_path, monkeypatch, run, "agent.device=cpu")
    cpu = {torch.device("cpu")}
    assert seen["model"] == cpu
    if run in ("apex", "r2d2", "seed_r2d2"):
        assert seen["target"] == cpu
    tensors = _tensors(seen["batch"])
    assert len(tensors) >= 4 and {t.device for t in tensors} == cpu
    assert "learner_device=cpu" in capfd.readouterr().out
    moved = _tensors(to_device(seen["batch"], torch.device("meta")))
    assert [t.shape for t in moved] == [t.shape for t in tensors]
    assert {t.device.type for t in moved} == {"meta"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
@pytest.mark.parametrize("run", ["impala", "apex", "r2d2"])
def test_cuda_without_a_gpu_is_one_clear_error(tmp_path, run):
    cfg = compose_run(tmp_path, run, *RUNS[run], "agent.device=cuda")
    with pytest.raises(ConfigError, match=re.escape(
            "agent.device is 'cuda' but torch sees no CUDA device")):
        agents.get(cfg.agent.name).run(cfg)


@pytest.mark.parametrize("value", ["gpu", "cuda:x", "cpu:0", ""])
@pytest.mark.parametrize("agent", ["impala", "apex", "r2d2", "seed"])
def test_a_bad_device_names_the_field(agent, value):
    config_class = getattr(agents.get(agent), agents.AGENTS[agent][1])
    with pytest.raises(ConfigError, match=re.escape(
            f"agent.device must be one of auto, cpu, cuda, cuda:N; got {value!r}")):
        config_class(device=value)


def _fake_gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_auto_takes_the_gpu_of_the_local_rank(monkeypatch):
    _fake_gpus(monkeypatch, 2)
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("auto", local_rank=1) == torch.device("cuda", 1)
    assert resolve_device("cuda", local_rank=1) == torch.device("cuda", 1)
    assert resolve_device("cuda:0", local_rank=1) == torch.device("cuda", 0)
    assert resolve_device("cpu", local_rank=1) == torch.device("cpu")
    _fake_gpus(monkeypatch, 0)
    assert resolve_device("auto", local_rank=1) == torch.device("cpu")


def test_a_missing_gpu_index_names_the_field(monkeypatch):
    _fake_gpus(monkeypatch, 2)
    with pytest.raises(ConfigError, match=re.escape(
            "agent.device is 'cuda:2' but torch sees 2 CUDA devices (cuda:0 .. cuda:1)")):
        resolve_device("cuda:2")
    with pytest.raises(ConfigError, match=re.escape(
            "agent.device is 'auto' but this rank's LOCAL_RANK 3 has no GPU of its own")):
        resolve_device("auto", local_rank=3)


def test_pinning_only_where_a_copy_to_cuda_follows(monkeypatch):
    """The replay's prefetch thread pins a drawn batch only for a CUDA learner (a CPU
    learner would pay the copy for nothing)."""
    pinned = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: pinned.append(self) or self)
    batch = (torch.zeros(3), {"a": torch.ones(2)})
    assert learner_module.pin_for(batch, torch.device("cpu")) is batch and not pinned
    learner_module.pin_for(batch, torch.device("cuda", 0))
    assert len(pinned) == 2


# ---------------------------------------------------------------- on a GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("actors", [0, 2])
@pytest.mark.parametrize("run", sorted(RUNS))
def test_every_agent_trains_on_the_gpu(tmp_path, run, actors):
    """agent.device=cuda, in one process and with 2 actor processes: the run makes its
    updates and the checkpoint's weights were trained on CUDA."""
    overrides = ["agent.device=cuda", f"distributed.actors={actors}"]
    if actors:
        overrides.append("distributed.envs_per_actor=4")
    cfg = compose_run(tmp_path, run, *RUNS[run], *overrides)
    result = agents.get(cfg.agent.name).run(cfg)
    assert result["updates"] > 0
    state = torch.load(result["checkpoint"], weights_only=False)["learner"]["model"]
    assert all(t.is_cuda for t in state.values())


# ---------------------------------------------------------------- learner threads


def test_auto_learner_threads_split_the_cores_only_for_atari_sized_images(monkeypatch):
    from distrl.training.learner_rank import learner_thread_count

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert learner_thread_count(0, (4, 84, 84), cpu) == 4
    assert learner_thread_count("auto", (4, 84, 84), cpu) == 4  # auto where not measured
    assert learner_thread_count(0, (4, 84, 84), cuda) == 1
    assert learner_thread_count(0, (4,), cpu) == 1  # CartPole
    assert learner_thread_count(0, (4, 10, 10), cpu) == 1  # MinAtar
    assert learner_thread_count(3, (4,), cpu) == 3  # a set value is kept
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two torchrun ranks on this host
    assert learner_thread_count(0, (4, 84, 84), cpu) == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert learner_thread_count(0, (4, 84, 84), cpu) == 1


def test_negative_learner_threads_name_the_field():
    from distrl.config import DistributedConfig

    with pytest.raises(ConfigError, match=re.escape(
            "distributed.learner_threads must be auto or a whole number >= 0, got -1")):
        DistributedConfig(learner_threads=-1)
