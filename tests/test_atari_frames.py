"""Every agent for a few updates on real Atari frames (ale-py Pong, a tiny budget): the
batches that reach each learner's loss hold stacked 84x84 uint8 frames, and actions from
the agent's action set (IMPALA's 6 of Pong's minimal set; the full 18 for Ape-X and R2D2,
as their papers), with the dtypes the losses are written for."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from presets import compose_run

import agents
from distrl.training import learner

SERIAL = ("env=Pong", "distributed.actors=0", "distributed.envs_per_actor=4",
          "distributed.env_groups=1")
RUNS = {
    "impala": (("agent=impala", "agent.batch_size=4", "agent.unroll_length=10",
                "total_frames=480"), 6),
    "apex": (("agent=apex", "agent.batch_size=8", "agent.learning_starts=32",
              "agent.replay_capacity=512", "agent.replay_ratio=1.0", "agent.actor_buffer=8",
              "total_frames=1024"), 18),
    "r2d2": (("agent=r2d2", "agent.batch_size=2", "agent.trace_length=6", "agent.overlap=3",
              "agent.burn_in=2", "agent.n_step=2", "agent.learning_starts=4",
              "agent.replay_capacity=64", "agent.replay_ratio=1.0", "agent.actor_buffer=3",
              "agent.model.lstm_size=16", "total_frames=512"), 18),
    "seed": (("agent=seed", "agent.impala.batch_size=4", "agent.impala.unroll_length=10",
              "total_frames=480"), 6),
    "seed_r2d2": (("agent=seed", "agent.learner=r2d2", "agent.r2d2.batch_size=2",
                   "agent.r2d2.trace_length=6", "agent.r2d2.overlap=3", "agent.r2d2.burn_in=2",
                   "agent.r2d2.n_step=2", "agent.r2d2.learning_starts=4",
                   "agent.r2d2.replay_capacity=64", "agent.r2d2.replay_ratio=1.0",
                   "agent.r2d2.model.lstm_size=16", "total_frames=768"), 18),
}
FRAMES = torch.Size([4, 84, 84])  # 4 stacked 84x84 greyscale frames


def _fields(batch) -> dict[str, torch.Tensor]:
    return {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)
            if isinstance(getattr(batch, f.name), torch.Tensor)}


@pytest.mark.parametrize("name", list(RUNS))
def test_a_few_updates_on_pong_frames_reach_the_loss_as_the_loss_expects(tmp_path, monkeypatch,
                                                                       name):
    overrides, num_actions = RUNS[name]
    seen: list = []
    unpatched = learner.Learner.step

    def recording_step(self, batch):
        seen.append(batch)
        return unpatched(self, batch)

    monkeypatch.setattr(learner.Learner, "step", recording_step)
    cfg = compose_run(tmp_path, name, *SERIAL, *overrides)
    result = agents.get(cfg.agent.name).run(cfg)
    assert result["updates"] >= 2 and len(seen) == result["updates"]
    for batch in seen:
        fields = _fields(batch)
        assert fields["observations"].dtype == torch.uint8
        assert fields["observations"].shape[-3:] == FRAMES
        assert fields["actions"].dtype == torch.int64
        taken = fields["actions"][fields["valid"]] if "valid" in fields else fields["actions"]
        assert 0 <= int(taken.min()) and int(taken.max()) < num_actions
        rewards = fields.get("rewards", fields.get("returns"))
        assert rewards.dtype == torch.float32
    # Both ends of the action set were acted on at least once over the updates seen.
    acted = torch.cat([_fields(b)["actions"].flatten() for b in seen])
    assert int(acted.max()) >= num_actions // 2
    if name in ("impala", "seed"):  # a near-uniform policy over 6 actions, 100+ draws
        assert int(acted.min()) == 0
