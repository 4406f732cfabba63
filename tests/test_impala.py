"""IMPALA end to end: the loss on a hand-checkable unroll, resume, and learning CartPole."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from learning import learning_seed, report
from marks import needs_extension
from presets import compose_run
from reference import impala_loss_naive

from agents import impala
from distrl import ops
from distrl.config import (
    CheckpointConfig,
    ConfigError,
    DistributedConfig,
    EnvConfig,
    LogConfig,
    ModelConfig,
    RunConfig,
)
from distrl.run.checkpoint import load
from distrl.telemetry.logging import MetricLogger
from distrl.training.learner import Learner
from distrl.types import Unroll

# CartPole budget for the learning tests: 1.2M env frames (= agent steps). Measured on
# 2 CPU cores: ~40 s in one process, ~30 s with 2 actor processes.
CARTPOLE_FRAMES = 1_200_000

# Half the lowest calibration figure of the two IMPALA CartPole tests, rounded down
# (tests/learning.py): training 476.9 / 496.5 (one process) and 493.8 / 500.0 (actors) on
# seeds 100 / 101, evaluation 482.8 / 500.0 and 500.0 / 500.0
# (tests/learning_calibration.txt).
IMPALA_TRAIN, IMPALA_EVAL = 230.0, 240.0


def cartpole_config(tmp_path, name: str, actors: int = 0, total_frames: int = CARTPOLE_FRAMES,
                    seed: int = 0, **agent) -> RunConfig:
    envs_per_actor = 32 if actors == 0 else 16
    return RunConfig(
        agent=impala.ImpalaConfig(**agent),
        env=EnvConfig(id="CartPole-v1"),
        distributed=DistributedConfig(actors=actors, envs_per_actor=envs_per_actor,
                                      env_groups=1),
        log=LogConfig(dir=str(tmp_path), name=name, interval_s=30.0, tensorboard=False),
        checkpoint=CheckpointConfig(interval_s=3600.0),
        seed=seed,
        total_frames=total_frames,
    )


KERNELS = [
    "reference",
    pytest.param("compiled", marks=needs_extension),
]


@pytest.mark.parametrize("kernel", KERNELS)
def test_loss_on_policy_reduces_to_actor_critic(kernel):
    """With mu == pi, rho = 1, so the pg advantage is r + gamma * v_{s+1} - V(x_s) and the
    baseline loss regresses onto the n-step return; checked on a 2-step unroll by hand,
    through both V-trace paths."""
    torch.manual_seed(0)
    model = impala.make_network((3,), 2, ModelConfig(torso="mlp", hidden_size=8))
    obs = torch.randn(3, 1, 3)
    with torch.no_grad():
        logits, values, _ = model(obs, ())
    unroll = Unroll(
        observations=obs, actions=torch.tensor([[1], [0]]), rewards=torch.tensor([[1.0], [2.0]]),
        dones=torch.tensor([[False], [False]]), behaviour_logits=logits[:-1].clone(),
        policy_versions=torch.zeros(2, 1, dtype=torch.long), core_state=(),
    )
    loss, metrics, _ = impala.loss_fn(
        model, unroll, discount=0.9, baseline_cost=0.5, entropy_cost=0.0,
        reward_clipping="none", clip_rho_threshold=1.0, clip_c_threshold=1.0,
        clip_pg_rho_threshold=1.0, vtrace_lambda=1.0, kernel=kernel,
    )
    v0, v1, v2 = values[:, 0].tolist()
    vs1 = 2.0 + 0.9 * v2  # one-step target from x_1
    vs0 = 1.0 + 0.9 * vs1  # two-step return from x_0
    expected_baseline = 0.5 * ((vs0 - v0) ** 2 + (vs1 - v1) ** 2)
    assert metrics["loss/baseline"] == pytest.approx(expected_baseline, rel=1e-5)
    log_pi = torch.log_softmax(logits[:-1, 0], -1)
    adv0, adv1 = 1.0 + 0.9 * vs1 - v0, 2.0 + 0.9 * v2 - v1
    expected_pg = -(log_pi[0, 1] * adv0 + log_pi[1, 0] * adv1).item()
    assert metrics["loss/policy"] == pytest.approx(expected_pg, rel=1e-5)
    assert loss.item() == pytest.approx(expected_pg + 0.5 * expected_baseline, rel=1e-5)


def test_term_gradient_norms_on_the_torso_match_separate_backward_passes():
    """grad/torso_<term> is the norm of that weighted term's own gradient on the torso
    (measured term by term with separate backward passes here), and measuring leaves the
    update's gradient unchanged; ImpalaLoss measures on calls 0, k, 2k, ..."""
    torch.manual_seed(1)
    model = impala.make_network((3,), 2, ModelConfig(torso="mlp", hidden_size=8))
    unroll = Unroll(torch.randn(4, 2, 3), torch.tensor([[1, 0], [0, 1], [1, 1]]),
                    torch.randn(3, 2), torch.zeros(3, 2, dtype=torch.bool),
                    torch.randn(3, 2, 2), torch.zeros(3, 2, dtype=torch.long), ())
    settings = dict(discount=0.9, baseline_cost=0.5, entropy_cost=0.01, reward_clipping="none",
                    clip_rho_threshold=1.0, clip_c_threshold=1.0, clip_pg_rho_threshold=1.0,
                    vtrace_lambda=1.0)
    # The reference runs in float64: it takes a term as the difference of two losses,
    # ~100x the entropy term, which float32 would round to about 1e-5 relative.
    model64 = copy.deepcopy(model).double()
    unroll64 = dataclasses.replace(unroll, observations=unroll.observations.double(),
                                   rewards=unroll.rewards.double(),
                                   behaviour_logits=unroll.behaviour_logits.double())
    torso = list(model64.torso.parameters())

    def torso_grad_norm(loss):
        model64.zero_grad()
        loss.backward()
        return float(torch.sqrt(sum(p.grad.square().sum() for p in torso)))

    def weighted(baseline_cost, entropy_cost):
        return impala.loss_fn(model64, unroll64, **{**settings, "baseline_cost": baseline_cost,
                                                    "entropy_cost": entropy_cost})[0]

    alone = {"policy": torso_grad_norm(weighted(0.0, 0.0)),
             "value": torso_grad_norm(weighted(0.5, 0.0) - weighted(0.0, 0.0)),
             "entropy": torso_grad_norm(weighted(0.0, 0.01) - weighted(0.0, 0.0))}
    loss, measured, _ = impala.loss_fn(model, unroll, **settings, measure_terms=True)
    for name in alone:
        assert measured[f"grad/torso_{name}"] == pytest.approx(alone[name], rel=1e-5)
    model.zero_grad()
    loss.backward()
    measured_grads = [p.grad.clone() for p in model.parameters()]
    plain, _, _ = impala.loss_fn(model, unroll, **settings)
    model.zero_grad()
    plain.backward()
    for got, want in zip(measured_grads, (p.grad for p in model.parameters()), strict=True):
        assert torch.equal(got, want)
    periodic = impala.ImpalaLoss(2, **settings)
    measured_calls = ["grad/torso_value" in periodic(model, unroll)[1] for _ in range(5)]
    assert measured_calls == [True, False, True, False, True]


def test_loss_resets_core_state_where_the_previous_step_ended_an_episode():
    """dones[t] (observations[t+1] starts anew) must become resets[t+1] for the core."""
    torch.manual_seed(0)
    model = impala.make_network((3,), 2, ModelConfig(torso="mlp", hidden_size=8, use_lstm=True,
                                                     lstm_size=4))
    seen = {}
    forward = model.forward

    def spy(observations, core_state, resets=None):
        seen["resets"] = resets.clone()
        return forward(observations, core_state, resets)

    model.forward = spy
    unroll = Unroll(torch.randn(4, 2, 3), torch.zeros(3, 2, dtype=torch.long),
                    torch.zeros(3, 2), torch.tensor([[True, False], [False, False],
                                                     [False, True]]),
                    torch.zeros(3, 2, 2), torch.zeros(3, 2, dtype=torch.long),
                    model.initial_state(2))
    impala.loss_fn(model, unroll, discount=0.9, baseline_cost=1.0, entropy_cost=0.0,
                   reward_clipping="none", clip_rho_threshold=1.0, clip_c_threshold=1.0,
                   clip_pg_rho_threshold=1.0, vtrace_lambda=1.0)
    expected = torch.tensor([[False, False], [True, False], [False, False], [False, True]])
    assert torch.equal(seen["resets"], expected)


def test_run_logs_the_kernel_path(tmp_path, capsys):
    impala.run(dataclasses.replace(cartpole_config(tmp_path, "ref", total_frames=640),
                                   kernel="reference"))
    assert "[distrl] kernel=reference: pure-torch reference ops on cpu (as asked)\n" in (
        capsys.readouterr().out
    )


def test_kernel_compiled_without_extension_is_refused_before_writing(tmp_path, monkeypatch):
    monkeypatch.setattr(ops, "_LOAD_ERROR", "No module named 'distrl._C'")
    cfg = dataclasses.replace(cartpole_config(tmp_path, "nope", total_frames=640),
                              kernel="compiled")
    with pytest.raises(ConfigError, match=r"kernel=compiled but distrl._C is not loaded"):
        impala.run(cfg)
    assert not (tmp_path / "nope").exists()


def test_resume_continues_update_counter_and_learning_rate(tmp_path):
    """Stopped after K updates and resumed: the resumed run's first update starts from the
    checkpoint's weights and optimizer moments, and it ends where an uninterrupted run of
    the same length ends in updates, frames and learning rate."""
    frames = 20 * 640  # 20 updates of T=20 x B=32 CartPole steps
    full = impala.run(cartpole_config(tmp_path, "full", total_frames=frames))
    part = impala.run(cartpole_config(tmp_path, "part", total_frames=frames),
                      should_stop=lambda updates: updates >= 7)
    assert part["updates"] == 7
    resumed_cfg = cartpole_config(tmp_path, "part", total_frames=frames)
    resumed_cfg.resume = part["checkpoint"]
    first_step: dict[str, Any] = {}
    original_step = Learner.step

    def recording_step(learner: Learner, batch: Any) -> tuple[dict[str, float], Any]:
        if not first_step:  # the weights and optimizer state the resumed run starts from
            first_step["model"] = copy.deepcopy(learner.model.state_dict())
            first_step["optimizer"] = copy.deepcopy(learner.optimizer.state_dict())
        return original_step(learner, batch)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Learner, "step", recording_step)
        resumed = impala.run(resumed_cfg)
    saved = load(part["checkpoint"])["learner"]
    for name, value in saved["model"].items():
        assert torch.equal(first_step["model"][name], value), name
    moments = first_step["optimizer"]["state"]
    assert moments and moments.keys() == saved["optimizer"]["state"].keys()
    for key, state in saved["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.equal(torch.as_tensor(moments[key][name]), torch.as_tensor(value)), name
    assert full["updates"] == 20
    assert resumed["updates"] == full["updates"]
    assert resumed["frames"] == full["frames"] == frames
    assert resumed["lr"] == pytest.approx(full["lr"], abs=1e-12)
    assert resumed["run_dir"] == part["run_dir"]


@contextlib.contextmanager
def recorded_episodes() -> Iterator[list[float]]:
    """The returns every MetricLogger writes inside the block, in order."""
    played: list[float] = []
    original_episode = MetricLogger.episode

    def recording_episode(logger: MetricLogger, episode_return: float, *args: Any,
                          **kwargs: Any) -> None:
        played.append(float(episode_return))
        original_episode(logger, episode_return, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(MetricLogger, "episode", recording_episode)
        yield played


def test_a_resumed_run_continues_its_last_100_returns(tmp_path):
    """The checkpoint holds the last 100 training returns, and a resumed run's window (its
    20-game mean, which stop_at_return reads) goes on from them, as one uninterrupted run's:
    after one more update, fewer than 20 new games, it already has a 20-game mean."""
    frames = 20 * 640
    part = impala.run(cartpole_config(tmp_path, "part", total_frames=frames),
                      should_stop=lambda updates: updates >= 7)
    window = load(part["checkpoint"])["counters"]["recent_returns"]
    assert window == part["returns"] and len(window) > 20
    resumed_cfg = cartpole_config(tmp_path, "part", total_frames=frames)
    resumed_cfg.resume = part["checkpoint"]
    with recorded_episodes() as played:
        resumed = impala.run(resumed_cfg, should_stop=lambda updates: updates >= 8)
    assert resumed["updates"] == 8 and 0 < len(played) < 20
    assert resumed["returns"] == (window + played)[-100:]
    assert resumed["mean_return_20"] == pytest.approx(np.mean((window + played)[-20:]))


def test_a_resumed_run_reads_stop_at_return_only_once_each_env_has_ended_a_game(tmp_path):
    """Every CartPole game returns at least 8, so stop_at_return=8 holds on the carried
    window at once; after a resume the run still waits until its 32 envs have ended 32
    games (the first to end after a restart are the shortest), then stops."""
    frames = 20 * 640
    part = impala.run(cartpole_config(tmp_path, "part", total_frames=100_000),
                      should_stop=lambda updates: updates >= 7)
    assert len(part["returns"]) >= 20 and min(part["returns"]) >= 8
    resumed_cfg = dataclasses.replace(
        cartpole_config(tmp_path, "part", total_frames=100_000), stop_at_return=8.0)
    resumed_cfg.resume = part["checkpoint"]
    with recorded_episodes() as played:
        resumed = impala.run(resumed_cfg)
    assert resumed["frames"] < 100_000 - frames  # stopped by the return, not the budget
    assert len(played) >= 32
    assert resumed["updates"] > 8


def test_ppo_clip_loss_is_the_clipped_surrogate_on_vtrace_advantages():
    """agent.ppo_clip (APPO): with pi != mu, the policy term is -sum min(r A, clip(r) A),
    r = pi/mu, A = r_t + gamma vs_{t+1} - V(x_t) from V-trace's vs; checked on a 2-step
    unroll by hand, the baseline term unchanged."""
    torch.manual_seed(0)
    model = impala.make_network((3,), 2, ModelConfig(torso="mlp", hidden_size=8))
    obs = torch.randn(3, 1, 3)
    with torch.no_grad():
        logits, values, _ = model(obs, ())
    behaviour = logits[:-1].clone()
    behaviour[0, 0, 1] += 1.0  # mu more likely than pi to take a_0 = 1: r_0 < 1
    behaviour[1, 0, 0] -= 1.0  # mu less likely to take a_1 = 0: r_1 > 1 + eps
    unroll = Unroll(
        observations=obs, actions=torch.tensor([[1], [0]]), rewards=torch.tensor([[1.0], [2.0]]),
        dones=torch.tensor([[False], [False]]), behaviour_logits=behaviour,
        policy_versions=torch.zeros(2, 1, dtype=torch.long), core_state=(),
    )
    kwargs = dict(discount=0.9, baseline_cost=0.5, entropy_cost=0.0, reward_clipping="none",
                  clip_rho_threshold=1.0, clip_c_threshold=1.0, clip_pg_rho_threshold=1.0,
                  vtrace_lambda=1.0, kernel="reference")
    _, metrics, _ = impala.loss_fn(model, unroll, ppo_clip=0.1, **kwargs)
    log_pi = torch.log_softmax(logits[:-1, 0], -1)
    log_mu = torch.log_softmax(behaviour[:, 0], -1)
    r0 = torch.exp(log_pi[0, 1] - log_mu[0, 1]).item()
    r1 = torch.exp(log_pi[1, 0] - log_mu[1, 0]).item()
    assert r0 < 0.9 and r1 > 1.1
    v0, v1, v2 = values[:, 0].tolist()
    vs1 = 2.0 + 0.9 * v2  # rho_1 clipped to 1
    vs0 = v0 + r0 * (1.0 + 0.9 * v1 - v0) + 0.9 * r0 * (vs1 - v1)  # c_0 = rho_0 < 1
    adv0, adv1 = 1.0 + 0.9 * vs1 - v0, 2.0 + 0.9 * v2 - v1
    surrogate = [min(r * a, min(max(r, 0.9), 1.1) * a) for r, a in ((r0, adv0), (r1, adv1))]
    assert metrics["loss/policy"] == pytest.approx(-sum(surrogate), rel=1e-5)
    assert metrics["policy/clip_fraction"] == 1.0  # both ratios are outside [0.9, 1.1]
    assert metrics["loss/baseline"] == pytest.approx(
        0.5 * ((vs0 - v0) ** 2 + (vs1 - v1) ** 2), rel=1e-5)
    # IMPALA's own term differs here: -sum min(1, r) A log pi.
    _, plain, _ = impala.loss_fn(model, unroll, **kwargs)
    assert plain["loss/policy"] != pytest.approx(metrics["loss/policy"], rel=1e-3)


@pytest.mark.parametrize("clip", [0.0, 1.0, -0.1])
def test_ppo_clip_must_be_in_the_open_unit_interval(clip):
    with pytest.raises(ConfigError, match=r"agent.ppo_clip must be in \(0, 1\) or null"):
        impala.ImpalaConfig(ppo_clip=clip)


def test_passes_update_twice_per_batch_and_spread_the_lr_schedule_over_all(tmp_path):
    """agent.passes=2: 10 batches make 20 updates, and the linear schedule, planned over
    all 20, reaches 0 at the last one."""
    result = impala.run(cartpole_config(tmp_path, "passes", total_frames=10 * 640, passes=2))
    assert result["frames"] == 10 * 640
    assert result["updates"] == 20
    assert result["lr"] == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("passes", [0, 2.5])
def test_passes_must_be_a_whole_number_naming_the_field(passes):
    with pytest.raises(ConfigError, match=r"agent.passes must be an int >= 1"):
        impala.ImpalaConfig(passes=passes)


def test_stop_at_return_ends_the_run_once_the_last_20_episodes_reach_it(tmp_path):
    # Every CartPole episode returns at least 8: the run ends at the first update after
    # 20 episodes instead of running its 100k frames.
    cfg = dataclasses.replace(cartpole_config(tmp_path, "solved", total_frames=100_000),
                              stop_at_return=8.0)
    result = impala.run(cfg)
    assert result["mean_return_20"] >= 8.0 and len(result["returns"]) >= 20
    assert result["frames"] < 5_000


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_learns_cartpole_in_one_process(tmp_path):
    """``python run.py``: IMPALA with its CartPole learning rate (agent_env/impala_CartPole),
    the whole 1.2M frames, then 20 episodes of the final policy (sampling).
    Thresholds: IMPALA_TRAIN, IMPALA_EVAL (from seeds 100 and 101); runs seed 8."""
    seed = learning_seed()
    result = impala.run(compose_run(tmp_path, "serial", f"seed={seed}", "eval.episodes=20"))
    report("impala_serial", seed, result)
    assert result["frames"] >= CARTPOLE_FRAMES
    assert result["mean_return_20"] >= IMPALA_TRAIN, result["returns"][-20:]
    assert result["eval_return"] >= IMPALA_EVAL, result["eval_returns"]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.dist
def test_learns_cartpole_with_two_actor_processes(tmp_path):
    """As in one process, with 2 actor processes of 16 envs. Thresholds: IMPALA_TRAIN,
    IMPALA_EVAL (from seeds 100 and 101); runs seed 8."""
    seed = learning_seed()
    result = impala.run(compose_run(tmp_path, "actors", "distributed.actors=2",
                                    "distributed.envs_per_actor=16", f"seed={seed}",
                                    "eval.episodes=20"))
    report("impala_actors", seed, result)
    assert result["frames"] >= CARTPOLE_FRAMES
    assert result["mean_return_20"] >= IMPALA_TRAIN, result["returns"][-20:]
    assert result["eval_return"] >= IMPALA_EVAL, result["eval_returns"]


@pytest.mark.dist
def test_actor_processes_accept_seeds_beyond_32_bits(tmp_path):
    """Actor seeds are seed * 1,000,003 + id + 1: numpy takes only 32 bits, and seed=5000
    once crashed every actor process (before the traceback could reach the learner)."""
    result = impala.run(cartpole_config(tmp_path, "big-seed", actors=2, total_frames=2 * 640,
                                        seed=5000))
    assert result["updates"] == 2


@pytest.mark.parametrize("kernel", KERNELS)
def test_loss_with_every_term_on_matches_the_term_by_term_reference(kernel):
    """Off-policy (rho clipped), rewards outside [-1, 1] clipped, episode ends mid-unroll,
    lambda 0.9, standardised advantages and an entropy cost, all at once, against
    tests/reference.py's term-by-term IMPALA loss."""
    torch.manual_seed(3)
    T, B, A = 5, 3, 4
    model = impala.make_network((6,), A, ModelConfig(torso="mlp", hidden_size=16))
    obs = torch.randn(T + 1, B, 6)
    with torch.no_grad():
        logits, values, _ = model(obs, ())
    dones = torch.zeros(T, B, dtype=torch.bool)
    dones[1, 0] = dones[3, 2] = True
    unroll = Unroll(
        observations=obs, actions=torch.randint(0, A, (T, B)),
        rewards=torch.tensor([[3.0, -0.5, 0.0], [-2.0, 1.0, 0.25], [0.0, 7.0, -1.5],
                              [0.5, 0.0, 2.0], [-4.0, 0.75, 0.0]]),
        dones=dones, behaviour_logits=2.0 * torch.randn(T, B, A),
        policy_versions=torch.zeros(T, B, dtype=torch.long), core_state=(),
    )
    settings = dict(discount=0.99, baseline_cost=0.5, entropy_cost=0.01)
    total, metrics, _ = impala.loss_fn(
        model, unroll, **settings, reward_clipping="abs_one", clip_rho_threshold=1.0,
        clip_c_threshold=1.0, clip_pg_rho_threshold=1.0, vtrace_lambda=0.9, kernel=kernel,
        normalize_advantages=True)
    want = impala_loss_naive(
        logits[:-1].double().numpy(), unroll.behaviour_logits.double().numpy(),
        unroll.actions.numpy(), unroll.rewards.double().numpy(), dones.numpy(),
        values.double().numpy(), **settings, clip_rewards_to_one=True,
        normalize_advantages=True, lambda_=0.9)
    ratios = (torch.log_softmax(logits[:-1], -1) - torch.log_softmax(unroll.behaviour_logits, -1)
              ).gather(-1, unroll.actions.unsqueeze(-1)).exp()
    assert (ratios > 1).any() and (ratios < 1).any()  # the clip bites somewhere
    assert metrics["loss/policy"] == pytest.approx(want["policy"], rel=1e-4, abs=1e-5)
    assert metrics["loss/baseline"] == pytest.approx(want["baseline"], rel=1e-5)
    assert metrics["loss/entropy"] == pytest.approx(want["entropy"], rel=1e-5)
    assert total.item() == pytest.approx(want["total"], rel=1e-4, abs=1e-5)
