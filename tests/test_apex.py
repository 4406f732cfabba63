"""Tests for agents/apex.py and the Ape-X pieces of distrl (losses, dueling network, and
the n-step writer feeding the replay buffer)."""

from __future__ import annotations

import math

import pytest
import torch
from target_pass import call_loss

from agents.apex import (
    ApexConfig,
    ApexLoss,
    EpsilonGreedyPolicy,
    epsilon_ladder,
    initial_priorities,
    make_network,
)
from distrl.config import ConfigError, ModelConfig
from distrl.nets.models import DuelingQNet
from distrl.replay.buffer import ReplayBuffer
from distrl.replay.samplers import PrioritizedSampler
from distrl.replay.storage import TransitionStorage
from distrl.replay.writers import NStepWriter
from distrl.rl import losses
from distrl.types import SampleBatch


def test_n_step_double_q_target_hand_computed():
    # Online net picks argmax of [1, 5, 2] = action 1 and [4, 0, 3] = action 0; the target
    # net evaluates them: 10 and -2. G = R + gamma^n * q_target(s', argmax q(s', .)).
    returns = torch.tensor([1.5, -0.5])
    discounts = torch.tensor([0.99 ** 3, 0.0])  # second: the episode ended within n steps
    online = torch.tensor([[1.0, 5.0, 2.0], [4.0, 0.0, 3.0]])
    target = torch.tensor([[7.0, 10.0, 30.0], [-2.0, 50.0, 9.0]])
    got = losses.n_step_double_q_targets(returns, discounts, online, target)
    assert got.tolist() == pytest.approx([1.5 + 0.970299 * 10.0, -0.5])
    # Not max over the target (that would be 30 for the first): double Q decouples them.
    assert got[0] != pytest.approx(1.5 + 0.970299 * 30.0)


def test_weighted_huber_loss_hand_computed():
    td = torch.tensor([0.5, -3.0, 2.0])
    weights = torch.tensor([1.0, 0.5, 0.25])
    # huber(0.5) = 0.125; huber(-3) = 3 - 0.5 = 2.5; huber(2) = 1.5
    want = (1.0 * 0.125 + 0.5 * 2.5 + 0.25 * 1.5) / 3
    assert losses.weighted_huber_loss(td, weights).item() == pytest.approx(want)


class TableQ(torch.nn.Module):
    """Q(s, a) = table[s, a] for integer observations s: a network whose values are known."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(table.clone())

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        return self.table[observations[:, 0].long()]


def table_q() -> TableQ:
    """Q values of 3 states x 2 actions: s=0 [0, 1], s=1 [2, 3], s=2 [5, -1]."""
    return TableQ(torch.tensor([[0.0, 1.0], [2.0, 3.0], [5.0, -1.0]]))


def two_transitions() -> SampleBatch:
    """(s=0, a=1, G=1 + 0.5 Q(2, .)) and (s=1, a=0, G=2, the episode ended), weights 1, 0.5."""
    return SampleBatch(
        indices=torch.tensor([0, 1]), observations=torch.tensor([[0.0], [1.0]]),
        actions=torch.tensor([1, 0]), returns=torch.tensor([1.0, 2.0]),
        discounts=torch.tensor([0.5, 0.0]), next_observations=torch.tensor([[2.0], [0.0]]),
        weights=torch.tensor([1.0, 0.5]),
    )


def test_apex_loss_priorities_and_target_copies():
    model = table_q()
    loss_fn = ApexLoss(model, target_update_interval=2)
    batch = two_transitions()
    loss, metrics, priorities = loss_fn(model, batch)
    # s=0,a=1: G = 1 + 0.5 * Q_target(2, argmax Q(2)=0) = 1 + 2.5 = 3.5; TD = 3.5 - 1 = 2.5
    # s=1,a=0: G = 2 (episode ended); TD = 2 - 2 = 0
    assert priorities.tolist() == pytest.approx([2.5, 0.0])
    assert loss.item() == pytest.approx((1.0 * (2.5 - 0.5) + 0.5 * 0.0) / 2)
    assert metrics["learner/td_error"] == pytest.approx(1.25)
    # The target net copied the weights at call 0; an online change is not seen until
    # the copy at call 2.
    with torch.no_grad():
        model.table[2, 0] = 9.0
    assert loss_fn(model, batch)[2][0].item() == pytest.approx(2.5)
    assert loss_fn(model, batch)[2][0].item() == pytest.approx(1 + 0.5 * 9.0 - 1)


def test_apex_loss_selects_with_the_online_net_and_evaluates_with_the_target():
    """Double Q inside the loss: once the online net changes its mind at s' = 2 (from
    action 0 to 1) before the target's next copy, the target values the online choice."""
    model = table_q()
    loss_fn = ApexLoss(model, target_update_interval=10)
    batch = two_transitions()
    loss_fn(model, batch)  # call 0 copies [5, -1] into the target
    with torch.no_grad():
        model.table[2] = torch.tensor([0.0, 9.0])
    # argmax online = 1; the stale target's value of it is -1: G = 1 + 0.5 * -1 = 0.5,
    # TD = 0.5 - Q(0, 1) = -0.5. (The target's own max would give 2.5, the online
    # net's value of its choice 4.5.) The second transition ended: TD 2 - 2 = 0.
    assert loss_fn(model, batch)[2].tolist() == pytest.approx([0.5, 0.0])


def test_apex_loss_uses_its_huber_delta():
    # TD errors 2.5 and 0 (as in test_apex_loss_priorities_and_target_copies): huber
    # with delta 2 is 2 * (2.5 - 1) = 3 for the first; weights 1 and 0.5, mean over 2.
    model = table_q()
    loss, _, priorities = ApexLoss(model, target_update_interval=2, huber_delta=2.0)(
        model, two_transitions())
    assert priorities.tolist() == pytest.approx([2.5, 0.0])
    assert loss.item() == pytest.approx(1.5)
    td = torch.tensor([0.5, -3.0, 2.0])
    weights = torch.tensor([1.0, 0.5, 0.25])
    # delta 2: 0.125; 2 * (3 - 1) = 4; 0.5 * 2^2 = 2
    assert losses.weighted_huber_loss(td, weights, delta=2.0).item() == pytest.approx(
        (0.125 + 0.5 * 4.0 + 0.25 * 2.0) / 3)


def test_target_pass_in_a_worker_thread_changes_no_number(intra_op_threads):
    """On CPU the target network's forward pass runs in a worker thread beside the online
    ones; loss, priorities and gradients are bit for bit those of the one-thread order."""
    import threading

    g = torch.Generator().manual_seed(0)
    batch = SampleBatch(
        indices=torch.arange(16), observations=torch.rand(16, 4, 10, 10, generator=g),
        actions=torch.randint(0, 6, (16,), generator=g), returns=torch.randn(16, generator=g),
        discounts=torch.full((16,), 0.97), weights=torch.rand(16, generator=g) + 0.5,
        next_observations=torch.rand(16, 4, 10, 10, generator=g))
    results = {}
    intra_op_threads(1)  # the worker serves a one-thread learner (side_thread)
    for in_thread in (False, True):
        torch.manual_seed(1)
        model = DuelingQNet((4, 10, 10), 6, head_size=16)
        loss_fn = ApexLoss(model, target_update_interval=10)
        seen = []
        loss_fn.target.register_forward_hook(
            lambda *_, seen=seen: seen.append(threading.current_thread().name))
        loss, _, priorities = call_loss(loss_fn, model, batch, in_thread)
        loss.backward()
        results[in_thread] = (loss, priorities, [p.grad for p in model.parameters()])
        assert seen[0].startswith("learner-target") == in_thread
    (l0, p0, g0), (l1, p1, g1) = results[False], results[True]
    assert torch.equal(l0, l1) and torch.equal(p0, p1)
    assert all(torch.equal(a, b) for a, b in zip(g0, g1, strict=True))


@pytest.mark.parametrize("beside", [True, False])
def test_the_learner_step_runs_the_target_pass_in_its_side_thread(intra_op_threads, beside):
    """The learner, not the loss, owns the side thread (``target_beside``): a one-thread
    CPU learner runs ApexLoss's target pass there, or in its own thread when told not to."""
    import threading

    from distrl.training.learner import Learner, make_lr_schedule, make_optimizer

    intra_op_threads(1)
    g = torch.Generator().manual_seed(0)
    batch = SampleBatch(
        indices=torch.arange(8), observations=torch.rand(8, 4, 10, 10, generator=g),
        actions=torch.randint(0, 6, (8,), generator=g), returns=torch.randn(8, generator=g),
        discounts=torch.full((8,), 0.97), weights=torch.ones(8),
        next_observations=torch.rand(8, 4, 10, 10, generator=g))
    model = DuelingQNet((4, 10, 10), 6, head_size=16)
    loss_fn = ApexLoss(model, target_update_interval=10)
    seen: list[str] = []
    loss_fn.target.register_forward_hook(
        lambda *_: seen.append(threading.current_thread().name))
    optimizer = make_optimizer(model.parameters(), "adam", 1e-3)
    learner = Learner(model, loss_fn, optimizer, make_lr_schedule(optimizer, "constant", 1),
                      40.0, target_beside=beside)
    learner.step(batch)
    assert len(seen) == 1
    assert seen[0].startswith("learner-target") == beside
    assert beside or seen[0] == threading.current_thread().name


def test_initial_priorities_use_the_actor_copy_for_both_nets():
    model = TableQ(torch.tensor([[0.0, 1.0], [4.0, 3.0]]))
    batch = SampleBatch(indices=torch.tensor([-1]), observations=torch.tensor([[0.0]]),
                        actions=torch.tensor([0]), returns=torch.tensor([1.0]),
                        discounts=torch.tensor([0.5]), next_observations=torch.tensor([[1.0]]),
                        weights=torch.ones(1))
    got = initial_priorities(model, batch)
    assert got.tolist() == pytest.approx([abs(1.0 + 0.5 * 4.0 - 0.0)])


def test_epsilon_ladder_matches_the_paper():
    eps = epsilon_ladder(8)
    for i in range(8):
        assert eps[i].item() == pytest.approx(0.4 ** (1 + 7 * i / 7))
    assert eps[0].item() == 0.4 and eps[-1].item() == pytest.approx(0.4 ** 8)
    assert epsilon_ladder(1).tolist() == [0.4]


def test_epsilon_greedy_explores_at_each_envs_rate():
    model = TableQ(torch.tensor([[0.0, 0.0, 0.0, 1.0]]))  # greedy action 3
    epsilons = torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64).repeat_interleave(2000)
    policy = EpsilonGreedyPolicy(model, epsilons, torch.Generator().manual_seed(0))
    actions = policy(torch.zeros(6000, 1), ()).actions.view(3, 2000)
    assert torch.all(actions[0] == 3)
    # exploring picks uniformly among 4 actions, so non-greedy with prob eps * 3/4
    for row, eps in ((1, 0.5), (2, 1.0)):
        rate = (actions[row] != 3).double().mean().item()
        assert abs(rate - eps * 0.75) < 4 * math.sqrt(eps * 0.75 * (1 - eps * 0.75) / 2000)


def test_dueling_head_is_value_plus_centred_advantage():
    net = DuelingQNet((4,), 3, torso="mlp", hidden_size=8, mlp_layers=1, head_size=5)
    x = torch.randn(6, 4)
    features = net.torso(x)
    value = net.head.value(features)
    advantage = net.head.advantage(features)
    torch.testing.assert_close(net(x), value + advantage - advantage.mean(1, keepdim=True))
    with pytest.raises(ValueError, match=r"DuelingQNet expects observations of shape \[B, 4\]"):
        net(torch.randn(6, 5))
    assert make_network((4, 84, 84), 6, ModelConfig())(
        torch.zeros(2, 4, 84, 84, dtype=torch.uint8)).shape == (2, 6)


@pytest.mark.parametrize("overrides, message", [
    ({"replay_capacity": 100, "batch_size": 512, "learning_starts": 0},
     r"agent.replay_capacity \(100\) must be at least agent.batch_size \(512\)"),
    ({"replay_capacity": 10_000, "learning_starts": 50_000},
     r"agent.replay_capacity \(10000\) must be at least agent.learning_starts \(50000\)"),
    ({"priority_alpha": 1.2}, r"agent.priority_alpha must lie in \[0, 1\], got 1.2"),
    ({"priority_beta": -0.1}, r"agent.priority_beta must lie in \[0, 1\], got -0.1"),
    ({"n_step": 0}, "agent.n_step must be an int >= 1, got 0"),
    ({"n_step": 2.5}, "agent.n_step must be an int >= 1, got 2.5"),
    ({"reward_clipping": "tanh"}, "agent.reward_clipping must be one of"),
])
def test_bad_config_names_the_field(overrides, message):
    with pytest.raises(ConfigError, match=message):
        ApexConfig(**overrides)


def test_paper_defaults():
    cfg = ApexConfig()
    assert (cfg.n_step, cfg.batch_size, cfg.replay_capacity, cfg.learning_starts) == (
        3, 512, 2_000_000, 50_000)
    assert (cfg.priority_alpha, cfg.priority_beta, cfg.target_update_interval) == (0.6, 0.4, 2500)
    opt = cfg.optimizer
    assert (opt.name, opt.centered, opt.lr, opt.alpha, opt.eps, opt.max_grad_norm) == (
        "rmsprop_tf", True, 0.0000625, 0.95, 1.5e-7, 40.0)  # TF's rule (Appendix C's constants)


def test_default_optimizers_follow_tensorflows_rules():
    """Ape-X's learner gets TF's centered RMSProp and R2D2's TF's Adam, the rules whose
    constants the papers publish (Horgan et al. 2018, Appendix C; Kapturowski et al. 2019,
    Table 2), built as the learner builds them."""
    from agents.r2d2 import R2D2Config
    from distrl.rl.optimizers import AdamTF, RMSpropTF
    from distrl.training.learner_rank import optimizer_for

    model = torch.nn.Linear(3, 2)
    apex_optimizer = optimizer_for(model, ApexConfig().optimizer)
    assert isinstance(apex_optimizer, RMSpropTF)
    group = apex_optimizer.param_groups[0]
    assert (group["centered"], group["alpha"], group["eps"]) == (True, 0.95, 1.5e-7)
    r2d2_optimizer = optimizer_for(model, R2D2Config().optimizer)
    assert isinstance(r2d2_optimizer, AdamTF)
    assert r2d2_optimizer.param_groups[0]["eps"] == 1e-3


def test_writer_to_buffer_rebuilds_the_envs_stacked_observations():
    """Atari-like stacks through NStepWriter into the replay, past both rings' wrap-around:
    every sampled observation equals the stack the env showed at that step."""
    num_envs, stack, n = 3, 4, 3
    writer = NStepWriter(num_envs, n, 0.9, stack)
    storage = TransitionStorage(120, (2, 2), torch.uint8, stack, frame_capacity=150)
    buffer = ReplayBuffer(storage, PrioritizedSampler(120))
    counter = 0
    shown = {}  # action id -> the stacked observation the env showed

    def new_frames(count: int) -> torch.Tensor:
        nonlocal counter
        frames = torch.arange(counter, counter + count).view(count, 1, 1).expand(count, 2, 2)
        counter += count
        return (frames % 251).to(torch.uint8)

    stacks = new_frames(num_envs * stack).view(num_envs, stack, 2, 2)
    writer.begin(stacks)
    generator = torch.Generator().manual_seed(0)
    action = 0
    for step in range(400):
        actions = torch.arange(action, action + num_envs)
        for e in range(num_envs):
            shown[action + e] = stacks[e].clone()
        action += num_envs
        done = torch.rand(num_envs, generator=generator) < 0.05
        fresh = new_frames(num_envs).view(num_envs, 1, 2, 2)
        stacks = torch.cat([stacks[:, 1:], fresh], dim=1)
        if done.any():
            stacks[done] = new_frames(int(done.sum()) * stack).view(-1, stack, 2, 2)
        writer.add(actions, torch.ones(num_envs), stacks, done, torch.zeros(num_envs, dtype=bool))
        if step % 7 == 6:
            batch = writer.flush()
            if batch is not None:
                buffer.add(batch, torch.rand(batch.size, generator=generator) + 0.1)
        if len(buffer) > 20:
            sample = buffer.sample(32, generator)
            for k, a in enumerate(sample.actions.tolist()):
                assert torch.equal(sample.observations[k], shown[a])
    assert storage.frames_written > 2 * storage.frame_capacity
    assert storage.transitions_written > 2 * storage.capacity


@pytest.mark.parametrize("mode", ["abs_one", "none"])
def test_actors_clip_each_reward_before_the_n_step_sum(tmp_path, mode):
    """Ape-X's actors store n-step returns of clipped rewards (Horgan et al. 2018, as DQN):
    on an env paying -7, 0.5 and 3 in turn, each stored return is the discounted sum of
    the clipped rewards after its observation, cut at the episode's end; with
    ``reward_clipping=none`` the raw rewards (which shows the test can tell them apart)."""
    import counting_env
    from presets import compose_preset

    from agents import apex
    from distrl.acting.actor import ActorStats
    from distrl.run.run_settings import RunSettings
    from distrl.runners.replay_sources import ActorLayout, build_replay_actor
    from distrl.transport.weights import WeightStore

    cfg = compose_preset(tmp_path, "apex_cartpole", "clip", "distributed.actors=0",
                         "distributed.envs_per_actor=2", "env.id=DistrlBigRewards-v0",
                         "env.imports=[counting_env]", f"agent.reward_clipping={mode}")
    settings = RunSettings.from_config(cfg, apex.CONVENTIONS)
    parts = apex.parts(cfg.agent)
    layout = ActorLayout((4,), 2, None, parts.exploration(2))
    model = parts.make_model(layout.obs_shape, layout.num_actions)
    batches = []
    actor = build_replay_actor(parts, settings, layout, model, WeightStore(model),
                               lambda batch, priorities: batches.append(batch), 0, ActorStats())
    try:
        while sum(len(b.returns) for b in batches) < 200:
            actor.step()
    finally:
        actor.close()
    n, gamma = cfg.agent.n_step, cfg.agent.discount
    clip = (lambda r: max(-1.0, min(1.0, r))) if mode == "abs_one" else (lambda r: r)
    checked = 0
    for batch in batches:
        starts = batch.frames[batch.observation_frames[:, 0], 0].long().tolist()
        for t, stored in zip(starts, batch.returns.tolist(), strict=True):
            steps = range(t + 1, min(t + n, counting_env.EPISODE_STEPS) + 1)
            want = sum(gamma ** k * clip(counting_env.BIG_REWARDS[s % 3])
                       for k, s in enumerate(steps))
            assert stored == pytest.approx(want, abs=1e-5), (t, stored, want)
            checked += 1
    assert checked >= 200
