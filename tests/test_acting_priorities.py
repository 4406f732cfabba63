"""R2D2's and Ape-X's initial priorities from the Q values the actor computed while acting
(seed_rl's R2D2; Ape-X's actors): the same numbers as a fresh unroll of each new sequence from
its stored state with the same weights, without that second forward pass; a batch with a
step whose Q values were not recorded falls back to the fresh unroll."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from agents import apex, r2d2
from distrl.acting.actor import reset_core_state
from distrl.config import ConfigError, EnvConfig, ModelConfig
from distrl.envs import make_envs
from distrl.replay.formats import NStepFormat
from distrl.replay.sequence_writer import SequenceWriter
from distrl.replay.writers import NStepWriter

SETTINGS = {"burn_in": 4, "trace_length": 8, "n_step": 2, "discount": 0.99,
            "rescale_epsilon": 1e-3, "priority_eta": 0.9}


def play(steps: int, record_q: bool = True, num_envs: int = 4, unrecorded: int = -1):
    """CartPole played by R2D2's epsilon-greedy policy, its steps written as sequences
    (burn-in 4, 8 trained steps, a new one every 4, 2 bootstrap steps), the Q values of
    every step recorded with it (none with ``record_q`` False, all but step ``unrecorded``
    otherwise). Returns the model, the writer and every flushed batch with the Q values
    the writer kept for it, and the step after which it was flushed."""
    torch.manual_seed(0)
    model = r2d2.make_network((4,), 2, ModelConfig(use_lstm=True, lstm_size=16,
                                                   hidden_size=16, head_size=16)).eval()
    policy = r2d2.RecurrentEpsilonGreedyPolicy(model, torch.full((num_envs,), 0.3),
                                               torch.Generator().manual_seed(1))
    envs = make_envs(EnvConfig(id="CartPole-v1"), num_envs, seed=0)
    writer = SequenceWriter(num_envs, burn_in=4, trace_length=8, period=4, bootstrap=2,
                            frame_stack=None)
    observations = torch.from_numpy(envs.reset())
    state = policy.initial_state(num_envs)
    writer.begin(observations, state)
    last_actions, last_rewards = torch.full((num_envs,), -1), torch.zeros(num_envs)
    batches = []
    for t in range(steps):
        output = policy(observations, state, last_actions, last_rewards)
        step = envs.step(output.actions.numpy())
        state = reset_core_state(output.core_state, step.dones)
        observations = torch.from_numpy(step.observations)
        ended = torch.from_numpy(step.dones)
        writer.add(output.actions, torch.from_numpy(step.rewards), observations,
                   torch.from_numpy(step.terminated), torch.from_numpy(step.truncated), state,
                   q_values=output.extras["q"] if record_q and t != unrecorded else None)
        last_actions = torch.where(ended, -1, output.actions)
        last_rewards = torch.where(ended, 0.0, torch.from_numpy(step.rewards).float())
        batch = writer.flush()
        if batch is not None:
            batches.append((batch, writer.acting_q, t))
    envs.close()
    return model, writer, batches


def test_priorities_from_acting_equal_a_fresh_unroll_with_the_same_weights():
    """Each flushed batch is checked as it is flushed (the fresh unroll reads frames the
    writer keeps only until its next batch)."""
    checked = {"batches": 0, "padded": 0}
    original_flush = SequenceWriter.flush

    def checking_flush(writer):
        batch = original_flush(writer)
        if batch is not None and writer.acting_q is not None:
            fresh = r2d2.initial_priorities(checking_flush.model, writer.as_sample(batch),
                                            **SETTINGS)
            assert torch.allclose(r2d2.acting_priorities(writer.acting_q, batch, **SETTINGS),
                                  fresh, rtol=1e-5, atol=1e-6)
            checked["batches"] += 1
            checked["padded"] += int((~batch.valid).any())
        return batch

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SequenceWriter, "flush", checking_flush)
        checking_flush.model = play(0)[0]  # the model play() builds, the same weights
        play(150)
    # CartPole's episodes end within the 150 steps: padded sequences were checked too
    assert checked["batches"] > 10 and checked["padded"] > 0


def test_a_step_without_q_values_leaves_the_batch_to_the_fresh_unroll():
    _, _, batches = play(60, record_q=False)
    assert batches and all(q is None for _, q, _ in batches)


def test_one_step_without_q_values_leaves_only_the_batches_holding_it_to_the_fresh_unroll():
    """Step 30 unrecorded: batches flushed before it keep their Q values, and so do those
    flushed once every sequence holding it (14 steps: burn-in, trained, bootstrap) is
    out; the one or more between are left to the fresh unroll."""
    _, _, batches = play(80, unrecorded=30)
    assert all(q is not None for _, q, t in batches if t < 30)
    assert all(q is not None for _, q, t in batches if t >= 30 + 14 + 4)
    left = [t for _, q, t in batches if q is None]
    assert left and all(30 <= t < 30 + 14 + 4 for t in left)


def test_the_writer_keeps_q_values_across_a_checkpoint():
    _, writer, _ = play(30)
    state = writer.state_dict()
    restored = SequenceWriter(4, burn_in=4, trace_length=8, period=4, bootstrap=2,
                              frame_stack=None)
    restored.load_state_dict(state)
    mine = [r.q for records in writer._episodes for r in records]
    theirs = [r.q for records in restored._episodes for r in records]
    assert len(mine) == len(theirs) and all(
        (a is None and b is None) or torch.equal(a, b) for a, b in zip(mine, theirs, strict=True))


def test_the_setting_is_checked_and_reaches_the_parts():
    with pytest.raises(ConfigError, match="agent.actor_priorities must be one of acting, "
                                          "recompute; got 'fresh'"):
        r2d2.R2D2Config(actor_priorities="fresh")
    assert r2d2.parts(r2d2.R2D2Config()).acting_priorities is not None
    recompute = dataclasses.replace(r2d2.R2D2Config(), actor_priorities="recompute")
    assert r2d2.parts(recompute).acting_priorities is None


def play_apex(steps: int, num_envs: int = 4, checked: dict | None = None):
    """CartPole played by Ape-X's epsilon-greedy policy into 3-step transitions; each
    flushed batch's acting priorities are compared with the actor network run again."""
    torch.manual_seed(0)
    model = apex.make_network((4,), 2, ModelConfig(hidden_size=16, head_size=16)).eval()
    policy = apex.EpsilonGreedyPolicy(model, torch.full((num_envs,), 0.3),
                                      torch.Generator().manual_seed(1))
    envs = make_envs(EnvConfig(id="CartPole-v1"), num_envs, seed=0)
    writer = NStepWriter(num_envs, n=3, discount=0.99, frame_stack=None)
    observations = torch.from_numpy(envs.reset())
    writer.begin(observations)
    for _ in range(steps):
        output = policy(observations)
        step = envs.step(output.actions.numpy())
        observations = torch.from_numpy(step.observations)
        writer.add(output.actions, torch.from_numpy(step.rewards), observations,
                   torch.from_numpy(step.terminated), torch.from_numpy(step.truncated),
                   q_values=output.extras["q"])
        batch = writer.flush()
        if batch is not None and checked is not None:
            fresh = apex.initial_priorities(model, NStepFormat(3, 0.99).as_sample(writer, batch))
            assert writer.acting_values is not None
            assert torch.allclose(apex.acting_priorities(writer.acting_values, batch), fresh,
                                  rtol=1e-5, atol=1e-6)
            checked["batches"] += 1
            checked["ended"] += int((batch.discounts == 0).any())
    envs.close()
    return writer


def test_apex_priorities_from_acting_equal_the_network_run_again():
    checked = {"batches": 0, "ended": 0}
    play_apex(120, checked=checked)
    # episodes end within the 120 steps: transitions with discount 0 were checked too
    assert checked["batches"] > 50 and checked["ended"] > 0


def test_apex_full_transitions_wait_one_step_for_their_bootstrap_and_survive_a_checkpoint():
    writer = play_apex(7)
    waiting = sum(map(len, writer._waiting))
    assert waiting == 4  # each env's last full transition waits for the next step's Q values
    restored = NStepWriter(4, n=3, discount=0.99, frame_stack=None)
    restored.load_state_dict(writer.state_dict())
    assert restored._waiting == writer._waiting and restored.pending() == writer.pending()


def test_apex_setting_is_checked_and_reaches_the_parts():
    with pytest.raises(ConfigError, match="agent.actor_priorities must be one of acting, "
                                          "recompute; got 'fresh'"):
        apex.ApexConfig(actor_priorities="fresh")
    assert apex.parts(apex.ApexConfig()).acting_priorities is not None
    assert apex.parts(apex.ApexConfig(actor_priorities="recompute")).acting_priorities is None


def test_writer_states_saved_before_the_acting_values_still_load():
    """A checkpoint written before the writers kept Q values: Ape-X's steps were 3-tuples,
    its transitions 5-tuples with no waiting list; R2D2's records had 7 fields."""
    state = play_apex(7).state_dict()
    old = dict(state, windows=[[s[:3] for s in w] for w in state["windows"]],
               emitted=[t[:5] for t in state["emitted"]])
    del old["waiting"]
    writer = NStepWriter(4, n=3, discount=0.99, frame_stack=None)
    writer.load_state_dict(old)
    assert all(s.q_taken is None for w in writer._windows for s in w)
    assert sum(map(len, writer._windows)) == sum(map(len, state["windows"]))
    _, sequences, _ = play(30)
    state = sequences.state_dict()
    old = dict(state, episodes=[[r[:7] for r in records] for records in state["episodes"]])
    restored = SequenceWriter(4, burn_in=4, trace_length=8, period=4, bootstrap=2,
                              frame_stack=None)
    restored.load_state_dict(old)
    assert all(r.q is None for records in restored._episodes for r in records)
