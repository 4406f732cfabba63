"""Tests for distrl.rl.losses against hand-computed numbers on a T=2, B=1, A=2 case, the reward
clipping modes, and where gradients may and may not flow."""

from __future__ import annotations

import math

import pytest
import torch
from reference import (
    inverse_value_rescale_naive,
    sequence_priorities_naive,
    transformed_n_step_targets_naive,
    value_rescale_naive,
)

from distrl.rl.losses import (
    REWARD_CLIPPING,
    baseline_loss,
    clip_rewards,
    clipped_surrogate_loss,
    entropy,
    entropy_loss,
    inverse_value_rescale,
    policy_gradient_loss,
    sequence_priorities,
    standardize,
    transformed_n_step_double_q_targets,
    value_rescale,
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


def test_clipped_surrogate_loss_by_hand() -> None:
    # r = pi / mu = (1.5, 0.5, 1.05); eps = 0.2, so clip(r) = (1.2, 0.8, 1.05).
    # A > 0 takes min(r, clip r) A: 1.2 * 2;  A > 0: min(0.5, 0.8) * 3 = 1.5;
    # A < 0 takes the larger ratio: max(1.05, 1.05) * -4 = -4.2.  loss = -(2.4 + 1.5 - 4.2).
    mu = torch.tensor([[0.2], [0.4], [0.2]], dtype=torch.float64)
    ratio = torch.tensor([[1.5], [0.5], [1.05]], dtype=torch.float64)
    log_pi = torch.log(mu * ratio).requires_grad_(True)
    advantages = torch.tensor([[2.0], [3.0], [-4.0]], dtype=torch.float64)
    loss = clipped_surrogate_loss(log_pi, torch.log(mu), advantages, clip=0.2)
    assert loss.item() == pytest.approx(-(2.4 + 1.5 - 4.2), abs=1e-12)
    loss.backward()
    # Clipped terms carry no gradient; unclipped ones d(-r A)/d log pi = -r A.
    expected = torch.tensor([[0.0], [-0.5 * 3.0], [1.05 * 4.0]], dtype=torch.float64)
    torch.testing.assert_close(log_pi.grad, expected, rtol=0, atol=1e-12)
    # The same step with a negative advantage at r = 1.5 is not clipped: min(-1.5, -1.2)*1.
    negative = clipped_surrogate_loss(torch.log(mu[:1] * 1.5), torch.log(mu[:1]),
                                      torch.tensor([[-1.0]], dtype=torch.float64), clip=0.2)
    assert negative.item() == pytest.approx(1.5, abs=1e-12)


def test_clipped_surrogate_loss_errors() -> None:
    zeros = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"clip must be in \(0, 1\), got 1.5"):
        clipped_surrogate_loss(zeros, zeros, zeros, clip=1.5)
    with pytest.raises(ValueError, match=r"advantages_t must have shape \[T, B\]"):
        clipped_surrogate_loss(zeros, zeros, torch.zeros(3, 2), clip=0.1)


def test_standardize_by_hand() -> None:
    # (1, 2, 3): mean 2, sample std 1 -> (-1, 0, 1).
    out = standardize(torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64))
    torch.testing.assert_close(out, torch.tensor([[-1.0, 0.0, 1.0]], dtype=torch.float64),
                               rtol=0, atol=1e-7)


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


# ------------------------------------------------------------------ R2D2

# h(x) = sign(x) (sqrt(|x| + 1) - 1) + 0.001 x, by hand:
#   h(0) = 0;  h(3) = (2 - 1) + 0.003 = 1.003;  h(-8) = -(3 - 1) - 0.008 = -2.008;
#   h(24) = (5 - 1) + 0.024 = 4.024;  h(80) = (9 - 1) + 0.08 = 8.08;  h(99) = 9 + 0.099 = 9.099
H_BY_HAND = [(0.0, 0.0), (3.0, 1.003), (-8.0, -2.008), (24.0, 4.024), (80.0, 8.08),
             (99.0, 9.099)]


def test_value_rescale_by_hand() -> None:
    x = torch.tensor([pair[0] for pair in H_BY_HAND], dtype=torch.float64)
    h = torch.tensor([pair[1] for pair in H_BY_HAND], dtype=torch.float64)
    torch.testing.assert_close(value_rescale(x), h, rtol=0, atol=1e-12)
    torch.testing.assert_close(inverse_value_rescale(h), x, rtol=0, atol=1e-9)
    # eps = 0 is the bare square-root squash: h(3) = 1, h^-1(2) = 3^2 - 1 = 8.
    assert value_rescale(torch.tensor([3.0]), eps=0.0).item() == 1.0
    assert inverse_value_rescale(torch.tensor([-2.0]), eps=0.0).item() == -8.0


X_WIDE = torch.logspace(-6, 6, 241, dtype=torch.float64)
X_WIDE = torch.cat([-X_WIDE.flip(0), torch.zeros(1, dtype=torch.float64), X_WIDE])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_value_rescale_round_trips_over_twelve_decades(dtype: torch.dtype) -> None:
    x = X_WIDE.to(dtype)
    scale = x.double().abs().clamp(min=1.0)
    for there_and_back in (inverse_value_rescale(value_rescale(x)),
                           value_rescale(inverse_value_rescale(x))):
        assert there_and_back.dtype == dtype
        error = ((there_and_back.double() - x.double()).abs() / scale).max().item()
        assert error < 1e-5, f"{dtype}: worst relative round-trip error {error:.3g}"
    # h is odd and strictly increasing, and h^-1 of 0 is exactly 0.
    h = value_rescale(X_WIDE)
    torch.testing.assert_close(h, -value_rescale(-X_WIDE), rtol=0, atol=0)
    assert bool((h[1:] > h[:-1]).all())
    assert inverse_value_rescale(torch.zeros(2, dtype=dtype)).tolist() == [0.0, 0.0]


def test_inverse_value_rescale_of_float32_is_float64_rounded() -> None:
    # Computed in float64 and rounded once: equal to the float64 answer cast to float32.
    x = X_WIDE.float()
    assert torch.equal(inverse_value_rescale(x), inverse_value_rescale(x.double()).float())


def test_value_rescale_matches_the_paper_formula() -> None:
    # The rearranged forms in distrl against sign(x)(sqrt(|x|+1)-1)+eps x and Prop. A.2 as
    # written, on moderate x where the written forms are still accurate in float64.
    x = torch.linspace(-300.0, 300.0, 601, dtype=torch.float64)
    for eps in (1e-3, 1e-2):
        want = torch.tensor([value_rescale_naive(v, eps) for v in x.tolist()], dtype=x.dtype)
        torch.testing.assert_close(value_rescale(x, eps), want, rtol=1e-12, atol=1e-12)
        back = torch.tensor([inverse_value_rescale_naive(v, eps) for v in want.tolist()],
                            dtype=x.dtype)
        torch.testing.assert_close(inverse_value_rescale(want, eps), back, rtol=1e-9, atol=1e-9)


def test_sequence_priorities_by_hand() -> None:
    td = torch.tensor([[1.0, 4.0, 5.0], [3.0, 0.0, 6.0], [2.0, 8.0, 7.0]])  # [T=3, B=3]
    mask = torch.tensor([[True, True, False], [True, True, False], [True, False, False]])
    # column 0: max 3, mean (1 + 3 + 2) / 3 = 2 -> 0.9 * 3 + 0.1 * 2 = 2.9
    # column 1: the 8 is masked out; max 4, mean (4 + 0) / 2 = 2 -> 0.9 * 4 + 0.1 * 2 = 3.8
    # column 2: no step counts -> 0
    got = sequence_priorities(td, mask)
    assert got.shape == (3,)
    assert got.tolist() == pytest.approx([2.9, 3.8, 0.0], abs=1e-6)
    # eta = 1 is the maximum, eta = 0 the mean.
    assert sequence_priorities(td, mask, eta=1.0).tolist() == pytest.approx([3.0, 4.0, 0.0])
    assert sequence_priorities(td, mask, eta=0.0).tolist() == pytest.approx([2.0, 2.0, 0.0])


def test_sequence_priorities_ignore_padding_and_match_the_reference() -> None:
    generator = torch.Generator().manual_seed(0)
    td = torch.rand(7, 5, generator=generator, dtype=torch.float64) * 3.0
    mask = torch.rand(7, 5, generator=generator) < 0.6
    mask[:, 0] = False
    want = sequence_priorities_naive(td.numpy(), mask.numpy(), 0.9)
    got = sequence_priorities(td, mask)
    torch.testing.assert_close(got, torch.from_numpy(want), rtol=1e-12, atol=1e-12)
    # Whatever sits in the unmasked steps (NaN sentinels, huge values) changes nothing.
    padded = td.masked_fill(~mask, float("nan"))
    torch.testing.assert_close(sequence_priorities(padded, mask), got, rtol=0, atol=0)
    torch.testing.assert_close(sequence_priorities(td.masked_fill(~mask, 1e9), mask), got,
                               rtol=0, atol=0)
    # A float 0/1 mask means the same as the bool one.
    torch.testing.assert_close(sequence_priorities(td, mask.double()), got, rtol=0, atol=0)
    td.requires_grad_(True)
    assert not sequence_priorities(td, mask).requires_grad


def test_sequence_priorities_errors() -> None:
    td, mask = torch.ones(3, 2), torch.ones(3, 2, dtype=torch.bool)
    for eta in (1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match=r"eta must be in \[0, 1\]"):
            sequence_priorities(td, mask, eta=eta)
    with pytest.raises(ValueError, match=r"mask must have shape \[T, B\] = \(3, 2\)"):
        sequence_priorities(td, mask.T)
    with pytest.raises(ValueError, match=r"td_abs must have shape \[T, B\]"):
        sequence_priorities(torch.ones(3), mask)


def _by_hand_q() -> tuple[torch.Tensor, torch.Tensor]:
    """q_online, q_target [T=4, B=1, A=2] for the transformed-target hand cases.

    Only steps 2 and 3 are bootstrapped from when n = 2. At both, the online network
    prefers the action whose target value is *not* the largest, so plain max-Q would
    give a different target from double-Q.
    """
    q_online = torch.tensor([[[0.0, 0.0]], [[0.0, 0.0]], [[1.0, 0.0]], [[0.0, 0.5]]],
                            dtype=torch.float64)
    # step 2: [h(24), h(99)], online picks action 0 -> h^-1 = 24 (max-Q would take 99)
    # step 3: [h(99), h(80)], online picks action 1 -> h^-1 = 80 (max-Q would take 99)
    q_target = torch.tensor([[[5.0, 5.0]], [[5.0, 5.0]], [[4.024, 9.099]], [[9.099, 8.08]]],
                            dtype=torch.float64)
    return q_online, q_target


def test_transformed_n_step_double_q_targets_by_hand() -> None:
    q_online, q_target = _by_hand_q()
    rewards = torch.tensor([[1.0], [2.0], [4.0], [0.0]], dtype=torch.float64)  # [T=4, B=1]
    continuations = torch.ones(4, 1, dtype=torch.float64)
    # gamma = 0.5, n = 2, eps = 1e-3; targets for t = 0, 1:
    #   t=0: r_0 + 0.5 r_1 + 0.25 * 24 = 1 + 1 + 6 = 8    -> h(8)  = 2 + 0.008 = 2.008
    #   t=1: r_1 + 0.5 r_2 + 0.25 * 80 = 2 + 2 + 20 = 24 -> h(24) = 4 + 0.024 = 4.024
    got = transformed_n_step_double_q_targets(rewards, continuations, q_online, q_target,
                                              discount=0.5, n=2)
    assert got.shape == (2, 1)
    torch.testing.assert_close(got, torch.tensor([[2.008], [4.024]], dtype=torch.float64),
                               rtol=0, atol=1e-9)
    # Max-Q instead of double-Q would have bootstrapped from 99 at both steps:
    #   t=0: 2 + 24.75 = 26.75, t=1: 4 + 24.75 = 28.75. Evaluating with the online network's
    # own target values (q_online = q_target) does exactly that.
    single = transformed_n_step_double_q_targets(rewards, continuations, q_target, q_target,
                                                 discount=0.5, n=2)
    want = [value_rescale_naive(26.75), value_rescale_naive(28.75)]
    assert single.flatten().tolist() == pytest.approx(want, abs=1e-9)


def test_transformed_n_step_double_q_targets_stop_at_a_termination() -> None:
    q_online, q_target = _by_hand_q()
    rewards = torch.tensor([[-1.0], [8.0], [100.0], [0.0]], dtype=torch.float64)
    # The episode terminates at step 1; step 2 begins a new one.
    continuations = torch.tensor([[True], [False], [True], [True]])
    #   t=0: r_0 + 0.5 r_1 = -1 + 4 = 3, no bootstrap (c_0 c_1 = 0)  -> h(3) = 1.003
    #   t=1: r_1 = 8; r_2 = 100 and the bootstrap are dropped (c_1 = 0) -> h(8) = 2.008
    want = torch.tensor([[1.003], [2.008]], dtype=torch.float64)
    got = transformed_n_step_double_q_targets(rewards, continuations, q_online, q_target,
                                              discount=0.5, n=2)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-9)
    # Everything after the termination may be NaN padding without changing the targets.
    rewards[2:] = float("nan")
    q_online[2:], q_target[2:] = float("nan"), float("nan")
    got = transformed_n_step_double_q_targets(rewards, continuations, q_online, q_target,
                                              discount=0.5, n=2)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-9)


def _random_sequence(
    generator: torch.Generator, num_steps: int, batch: int, num_actions: int
) -> tuple[torch.Tensor, ...]:
    rewards = torch.randn(num_steps, batch, generator=generator, dtype=torch.float64) * 5.0
    continuations = (torch.rand(num_steps, batch, generator=generator) > 0.2).double()
    q_online = torch.randn(num_steps, batch, num_actions, generator=generator,
                           dtype=torch.float64) * 3.0
    q_target = torch.randn(num_steps, batch, num_actions, generator=generator,
                           dtype=torch.float64) * 3.0
    return rewards, continuations, q_online, q_target


@pytest.mark.parametrize("n, batch, num_actions", [(1, 3, 2), (3, 4, 5), (5, 2, 3), (8, 6, 4)])
def test_transformed_n_step_double_q_targets_match_the_reference(
    n: int, batch: int, num_actions: int
) -> None:
    generator = torch.Generator().manual_seed(100 * n + batch)
    num_steps = n + 7
    sequence = _random_sequence(generator, num_steps, batch, num_actions)
    rewards, continuations, q_online, q_target = sequence
    assert (continuations == 0).any()  # some terminations inside the windows
    want = torch.from_numpy(transformed_n_step_targets_naive(
        *(x.numpy() for x in sequence), discount=0.97, n=n))
    got = transformed_n_step_double_q_targets(*sequence, discount=0.97, n=n)
    assert got.shape == (num_steps - n, batch)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # The same in float32, with bool continuations.
    got32 = transformed_n_step_double_q_targets(
        rewards.float(), continuations.bool(), q_online.float(), q_target.float(),
        discount=0.97, n=n)
    assert got32.dtype == torch.float32
    torch.testing.assert_close(got32.double(), want, rtol=1e-5, atol=1e-5)
    # Targets of a sequence cut at step s are the whole sequence's targets from s on.
    for start in (1, 4):
        cut = transformed_n_step_double_q_targets(*(x[start:] for x in sequence),
                                                  discount=0.97, n=n)
        torch.testing.assert_close(cut, got[start:], rtol=0, atol=1e-12)


def test_transformed_n_step_double_q_targets_carry_no_gradient() -> None:
    generator = torch.Generator().manual_seed(1)
    rewards, continuations, q_online, q_target = _random_sequence(generator, 5, 2, 3)
    q_online.requires_grad_(True)
    q_target.requires_grad_(True)
    got = transformed_n_step_double_q_targets(rewards, continuations, q_online, q_target,
                                              discount=0.99, n=3)
    assert not got.requires_grad and got.grad_fn is None


def test_transformed_n_step_double_q_targets_errors() -> None:
    rewards, continuations = torch.zeros(4, 2), torch.ones(4, 2)
    q = torch.zeros(4, 2, 3)

    def call(**changes: object) -> torch.Tensor:
        args = dict(rewards=rewards, continuations=continuations, q_online=q, q_target=q,
                    discount=0.99, n=2)
        args.update(changes)
        return transformed_n_step_double_q_targets(**args)

    assert call().shape == (2, 2)
    for n in (4, 5):
        with pytest.raises(ValueError, match=rf"n = {n} needs sequences of T > n steps; "
                                             r"rewards has T = 4"):
            call(n=n)
    for n in (0, -1, 2.0):
        with pytest.raises(ValueError, match=r"n must be a positive int"):
            call(n=n)
    with pytest.raises(ValueError, match=r"rewards must have shape \[T, B\] = \(4, 2\)"):
        call(rewards=torch.zeros(4, 3))
    with pytest.raises(ValueError, match=r"continuations must have shape \[T, B\]"):
        call(continuations=torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"q_target must have q_online's shape"):
        call(q_target=torch.zeros(4, 2, 4))
    with pytest.raises(ValueError, match=r"q_online must have shape \[T, B, A\]"):
        call(q_online=torch.zeros(4, 2))
