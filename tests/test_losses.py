"""Tests for distrl.losses against hand-computed numbers on a T=2, B=1, A=2 case, the reward
clipping modes, and where gradients may and may not flow."""

from __future__ import annotations

import math

import pytest
import torch

from distrl.losses import (
    REWARD_CLIPPING,
    baseline_loss,
    clip_rewards,
    entropy,
    entropy_loss,
    policy_gradient_loss,
)

LN2, LN3 = math.log(2.0), math.log(3.0)


def _logits() -> torch.Tensor:
    """[T=2, B=1, A=2]: pi(.|x_0) = (1/2, 1/2); logits (ln 3, 0) give pi(.|x_1) = (3/4, 1/4)."""
    return torch.tensor([[[0.0, 0.0]], [[LN3, 0.0]]], dtype=torch.float64)


ACTIONS = torch.tensor([[0], [1]])  # [T, B]
ADVANTAGES = torch.tensor([[2.0], [3.0]], dtype=torch.float64)  # [T, B]


def test_policy_gradient_loss_by_hand() -> None:
    # log pi(a_0 = 0 | x_0) = ln 1/2 = -ln 2;  log pi(a_1 = 1 | x_1) = ln 1/4 = -2 ln 2
    # loss = -(2 * -ln 2 + 3 * -2 ln 2) = 8 ln 2 = 5.545177...
    loss = policy_gradient_loss(_logits(), ACTIONS, ADVANTAGES)
    assert loss.shape == ()
    assert loss.item() == pytest.approx(8 * LN2, abs=1e-12)
    # Had the loss taken a_1 = 0 (p = 3/4) instead: -(2 * -ln 2 + 3 * ln 3/4) != 8 ln 2.
    other = policy_gradient_loss(_logits(), torch.tensor([[0], [0]]), ADVANTAGES)
    assert other.item() == pytest.approx(2 * LN2 - 3 * math.log(0.75), abs=1e-12)


def test_policy_gradient_gradients_skip_the_advantages() -> None:
    logits = _logits().requires_grad_(True)
    values = torch.tensor([[0.5], [1.0]], dtype=torch.float64, requires_grad=True)
    advantages = ADVANTAGES + values  # as if the advantages were built from the critic
    policy_gradient_loss(logits, ACTIONS, advantages).backward()
    assert values.grad is None  # no gradient into the advantages' inputs
    # d loss / d logits_t = -A_t * (onehot(a_t) - pi_t), with A = 2 + 0.5, 3 + 1:
    #   t=0: -2.5 * ([1, 0] - [1/2, 1/2]) = [-1.25, 1.25]
    #   t=1: -4.0 * ([0, 1] - [3/4, 1/4]) = [3.0, -3.0]
    expected = torch.tensor([[[-1.25, 1.25]], [[3.0, -3.0]]], dtype=torch.float64)
    torch.testing.assert_close(logits.grad, expected, rtol=0, atol=1e-12)

    leaf = ADVANTAGES.clone().requires_grad_(True)
    loss = policy_gradient_loss(_logits().requires_grad_(True), ACTIONS, leaf)
    loss.backward()
    assert leaf.grad is None


def test_baseline_loss_by_hand() -> None:
    vs = torch.tensor([[1.0], [2.0]], dtype=torch.float64, requires_grad=True)
    values = torch.tensor([[0.5], [4.0]], dtype=torch.float64, requires_grad=True)
    # 0.5 * ((1 - 0.5)^2 + (2 - 4)^2) = 0.5 * (0.25 + 4) = 2.125
    loss = baseline_loss(vs, values)
    assert loss.item() == pytest.approx(2.125, abs=1e-12)
    loss.backward()
    # d/dV = V - v_s = [-0.5, 2.0]; the targets get none.
    torch.testing.assert_close(values.grad, torch.tensor([[-0.5], [2.0]], dtype=torch.float64))
    assert vs.grad is None


def test_entropy_loss_and_entropy_by_hand() -> None:
    # sum_a pi log pi:  t=0: 2 * 1/2 * ln 1/2 = -ln 2 = -0.693147
    #                   t=1: 3/4 ln 3/4 + 1/4 ln 1/4 = -0.215762 - 0.346574 = -0.562335
    t0 = -LN2
    t1 = 0.75 * math.log(0.75) + 0.25 * math.log(0.25)
    assert entropy_loss(_logits()).item() == pytest.approx(t0 + t1, abs=1e-12)  # -1.255482
    # entropy is the mean over the T * B = 2 steps: (0.693147 + 0.562335) / 2 = 0.627741
    assert entropy(_logits()).item() == pytest.approx(-(t0 + t1) / 2, abs=1e-12)


def test_losses_sum_over_time_and_batch_and_entropy_averages() -> None:
    # The same step repeated over B = 3 columns triples the summed losses ...
    logits = _logits().expand(2, 3, 2)
    actions, advantages = ACTIONS.expand(2, 3), ADVANTAGES.expand(2, 3)
    assert policy_gradient_loss(logits, actions, advantages).item() == pytest.approx(24 * LN2)
    assert entropy_loss(logits).item() == pytest.approx(3 * entropy_loss(_logits()).item())
    # ... and leaves the mean entropy alone; a uniform policy over 4 actions has ln 4.
    assert entropy(logits).item() == pytest.approx(entropy(_logits()).item())
    assert entropy(torch.zeros(5, 2, 4)).item() == pytest.approx(math.log(4), abs=1e-6)


REWARDS = torch.tensor([-10.0, -1.0, -0.5, 0.0, 0.5, 1.0, 10.0], dtype=torch.float64)


def test_clip_rewards_abs_one_and_none() -> None:
    rewards = REWARDS.clone()
    assert clip_rewards(rewards, "abs_one").tolist() == [-1.0, -1.0, -0.5, 0.0, 0.5, 1.0, 1.0]
    assert clip_rewards(rewards, "none").tolist() == REWARDS.tolist()
    assert torch.equal(rewards, REWARDS)  # the actors' raw rewards are never modified


def test_clip_rewards_soft_asymmetric() -> None:
    clipped = clip_rewards(REWARDS, "soft_asymmetric")
    expected = [5 * math.tanh(r / 5) if r >= 0 else 0.3 * 5 * math.tanh(r / 5)
                for r in REWARDS.tolist()]
    assert clipped.tolist() == pytest.approx(expected, abs=1e-12)
    # by hand: 5 tanh(2) = 4.820138, 0.3 * 5 tanh(-2) = -1.446041, 5 tanh(0.1) = 0.498340
    assert clipped[-1].item() == pytest.approx(4.820138, abs=1e-6)
    assert clipped[0].item() == pytest.approx(-1.446041, abs=1e-6)
    assert clipped[4].item() == pytest.approx(0.498340, abs=1e-6)


def test_clip_rewards_bad_mode() -> None:
    assert REWARD_CLIPPING == ("none", "abs_one", "soft_asymmetric")
    with pytest.raises(
        ValueError,
        match=r"reward clipping must be one of none, abs_one, soft_asymmetric; got 'clip'",
    ):
        clip_rewards(REWARDS, "clip")



def test_baseline_loss_rejects_a_trailing_value_dimension() -> None:
    vs = torch.zeros(3, 1)  # [T=3, B=1]
    values = torch.ones(3, 1, 1)  # [T, B, 1] straight from a value head
    try:
        loss = baseline_loss(vs, values)
    except ValueError as error:
        assert "shape" in str(error)
        return
    # Unchecked, vs - values would broadcast to [3, 3, 1]: 4.5 instead of 1.5.
    pytest.fail(f"no error for shapes [3, 1] and [3, 1, 1]; the loss came out {loss.item()}")


def test_policy_gradient_loss_rejects_batch_major_advantages() -> None:
    logits = torch.randn(2, 3, 4)  # [T=2, B=3, A=4]
    actions = torch.zeros(2, 3, dtype=torch.long)
    advantages = torch.arange(6.0).view(3, 2)  # [B, T] by mistake
    try:
        loss = policy_gradient_loss(logits, actions, advantages)
    except ValueError as error:
        assert "shape" in str(error)
        return
    # Unchecked, view_as would pair the [T, B] log-probs with the wrong advantages.
    pytest.fail(f"no error for advantages [3, 2] with logits [2, 3, 4]; loss {loss.item()}")
