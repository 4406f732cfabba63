"""Tests for distrl.training.learner: the linear and constant lr schedules, optimizer settings, the
errors for bad names, global-norm clipping checked against a hand-computed SGD step,
versions published to a WeightStore, and a state_dict round trip that reproduces the
next update exactly."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from distrl.training.learner import Learner, make_lr_schedule, make_optimizer
from distrl.transport.weights import WeightStore


def _sgd(lr: float = 0.5) -> torch.optim.Optimizer:
    return torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=lr)


def _lrs_after_steps(scheduler, optimizer, steps: int) -> list[float]:
    lrs = [optimizer.param_groups[0]["lr"]]
    for _ in range(steps):
        optimizer.step()  # no gradients: a no-op, but keeps the scheduler's order check quiet
        scheduler.step()
        lrs.append(optimizer.param_groups[0]["lr"])
    return lrs


def test_linear_schedule_decays_to_zero_and_stays() -> None:
    optimizer = _sgd(0.5)
    scheduler = make_lr_schedule(optimizer, "linear", total_updates=4)
    # lr after k steps = 0.5 * (1 - k / 4): 0.5, 0.375, 0.25, 0.125, 0, then 0 for good.
    assert _lrs_after_steps(scheduler, optimizer, 7) == pytest.approx(
        [0.5, 0.375, 0.25, 0.125, 0.0, 0.0, 0.0, 0.0], abs=1e-12
    )


def test_linear_schedule_with_zero_updates_does_not_divide_by_zero() -> None:
    optimizer = _sgd(0.5)
    scheduler = make_lr_schedule(optimizer, "linear", total_updates=0)
    assert _lrs_after_steps(scheduler, optimizer, 2) == pytest.approx([0.5, 0.0, 0.0])


def test_constant_schedule() -> None:
    optimizer = _sgd(0.25)
    scheduler = make_lr_schedule(optimizer, "constant", total_updates=2)
    assert _lrs_after_steps(scheduler, optimizer, 5) == [0.25] * 6


def test_bad_names_raise_naming_the_allowed_values() -> None:
    with pytest.raises(ValueError, match=r"one of linear, constant; got 'cosine'"):
        make_lr_schedule(_sgd(), "cosine", 10)
    with pytest.raises(ValueError, match=r"optimizer.name must be one of rmsprop_tf, rmsprop, "
                                         r"adam, adam_tf; got 'sgd'"):
        make_optimizer(nn.Linear(1, 1).parameters(), "sgd", lr=0.1)


def test_rmsprop_settings() -> None:
    params = list(nn.Linear(2, 2).parameters())
    optimizer = make_optimizer(params, "rmsprop", lr=1e-3, alpha=0.9, eps=1e-5, momentum=0.5,
                               centered=True)
    assert type(optimizer) is torch.optim.RMSprop
    group = optimizer.param_groups[0]
    assert (group["lr"], group["alpha"], group["eps"], group["momentum"], group["centered"]) == (
        1e-3, 0.9, 1e-5, 0.5, True
    )
    assert group["params"] == params
    # The defaults are IMPALA's RMSProp (Table G.1): decay 0.99, eps 0.01, no momentum.
    group = make_optimizer(params, "rmsprop", lr=6e-4).param_groups[0]
    assert (group["alpha"], group["eps"], group["momentum"], group["centered"]) == (
        0.99, 0.01, 0.0, False
    )


def test_adam_settings() -> None:
    optimizer = make_optimizer(nn.Linear(2, 2).parameters(), "adam", lr=1e-4, eps=1e-3,
                               beta1=0.8, beta2=0.95)
    assert type(optimizer) is torch.optim.Adam
    group = optimizer.param_groups[0]
    assert (group["lr"], group["betas"], group["eps"]) == (1e-4, (0.8, 0.95), 1e-3)


def _linear_model() -> nn.Linear:
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.5, -0.25]]))
        model.bias.fill_(0.125)
    return model


def _scaled_output_loss(scale: float):
    """loss = scale * (w . x + b): d/dw = scale * x, d/db = scale."""

    def loss_fn(model, batch):
        loss = scale * model(batch).sum()
        return loss, {"loss/custom": 7.0}, "priorities"

    return loss_fn


def _learner(model: nn.Module, loss_fn, lr: float, max_grad_norm: float, store=None) -> Learner:
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scheduler = make_lr_schedule(optimizer, "constant", 1)
    return Learner(model, loss_fn, optimizer, scheduler, max_grad_norm, store)


def test_step_clips_the_global_gradient_norm() -> None:
    model = _linear_model()
    learner = _learner(model, _scaled_output_loss(1000.0), lr=0.1, max_grad_norm=1.0)
    x = torch.tensor([[3.0, 4.0]])
    metrics, priorities = learner.step(x)
    # grad w = 1000 * [3, 4] = [3000, 4000], grad b = 1000;
    # global norm = sqrt(3000^2 + 4000^2 + 1000^2) = sqrt(26e6) = 5099.0195...
    norm = math.sqrt(26e6)
    assert metrics["learner/grad_norm"] == pytest.approx(norm, rel=1e-6)
    # clipped to norm 1, then one SGD step of lr 0.1: delta = -0.1 * g / 5099.0195
    #   w: [0.5, -0.25] - 0.1 * [3000, 4000] / 5099.0195 = [0.441165, -0.328446]
    #   b: 0.125 - 0.1 * 1000 / 5099.0195 = 0.105388
    assert model.weight.detach().tolist()[0] == pytest.approx([0.441165, -0.328446], abs=1e-6)
    assert model.bias.item() == pytest.approx(0.105388, abs=1e-6)
    step = torch.cat([model.weight.detach().flatten() - torch.tensor([0.5, -0.25]),
                      model.bias.detach() - 0.125])
    assert step.norm().item() == pytest.approx(0.1, rel=1e-5)  # lr * max_grad_norm
    # loss before the step: 1000 * (0.5 * 3 - 0.25 * 4 + 0.125) = 625
    assert metrics["learner/loss"] == pytest.approx(625.0)
    assert metrics["learner/lr"] == 0.1
    assert metrics["loss/custom"] == 7.0 and priorities == "priorities"


def test_step_leaves_small_gradients_unscaled() -> None:
    model = _linear_model()
    learner = _learner(model, _scaled_output_loss(0.01), lr=0.1, max_grad_norm=1.0)
    learner.step(torch.tensor([[3.0, 4.0]]))
    # g = 0.01 * [3, 4, 1], norm 0.051 < 1: a plain SGD step, w -= 0.1 * g
    assert model.weight.detach().tolist()[0] == pytest.approx([0.497, -0.254], abs=1e-7)
    assert model.bias.item() == pytest.approx(0.124, abs=1e-7)


def test_each_step_is_a_new_version_published_to_the_store() -> None:
    model = _linear_model()
    store = WeightStore(model)
    learner = _learner(model, _scaled_output_loss(1.0), lr=0.1, max_grad_norm=10.0, store=store)
    reader = nn.Linear(2, 1)
    for expected in (1, 2, 3):
        learner.step(torch.tensor([[1.0, 2.0]]))
        assert learner.version == learner.updates == expected
        assert store.version == expected
        assert store.pull_if_newer(reader, have_version=expected - 1) == expected
        assert torch.equal(reader.weight, model.weight) and torch.equal(reader.bias, model.bias)


def test_passes_make_that_many_updates_on_one_batch() -> None:
    """passes=2: two SGD steps on the same batch, each from the weights the first left."""
    model = _linear_model()
    store = WeightStore(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    learner = Learner(model, _squared_error, optimizer, make_lr_schedule(optimizer, "constant", 1),
                      max_grad_norm=100.0, weights=store, passes=2)
    x = torch.tensor([[1.0, 2.0]])
    metrics, _ = learner.step(x)
    # loss = (w.x + b - 1)^2; out = 0.5 - 0.5 + 0.125 = 0.125, err -0.875:
    #   pass 1: g = 2 * -0.875 * [1, 2, 1] = [-1.75, -3.5, -1.75] -> w [0.675, 0.1], b 0.3
    #   pass 2: out = 0.675 + 0.2 + 0.3 = 1.175, err 0.175, g = 0.35 * [1, 2, 1]
    #           -> w [0.64, 0.03], b 0.265
    assert model.weight.detach().tolist()[0] == pytest.approx([0.64, 0.03], abs=1e-6)
    assert model.bias.item() == pytest.approx(0.265, abs=1e-6)
    assert metrics["learner/loss"] == pytest.approx(0.175 ** 2)  # the last pass's loss
    assert learner.updates == store.version == 2


def _squared_error(model, batch):
    return ((model(batch) - 1.0) ** 2).sum(), {}, None


@pytest.mark.parametrize("passes", [0, 1.5, True])
def test_passes_must_be_a_whole_number(passes) -> None:
    model = _linear_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"passes must be a whole number >= 1"):
        Learner(model, _squared_error, optimizer, make_lr_schedule(optimizer, "constant", 1),
                max_grad_norm=1.0, passes=passes)


def _regression_learner(seed: int) -> Learner:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1))

    def loss_fn(model, batch):
        x, y = batch
        return ((model(x) - y) ** 2).sum(), {}, None

    # RMSProp has per-parameter state and the schedule moves the lr: both must round-trip.
    optimizer = make_optimizer(model.parameters(), "rmsprop", lr=0.01, momentum=0.9)
    scheduler = make_lr_schedule(optimizer, "linear", total_updates=10)
    return Learner(model, loss_fn, optimizer, scheduler, max_grad_norm=0.5)


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(5, 3, generator=g), torch.randn(5, 1, generator=g)


def test_state_dict_round_trip_reproduces_the_next_updates() -> None:
    original = _regression_learner(seed=0)
    for i in range(3):
        original.step(_batch(i))
    saved = copy.deepcopy(original.state_dict())
    expected = []
    for i in (3, 4):
        metrics, _ = original.step(_batch(i))
        expected.append((metrics["learner/lr"], copy.deepcopy(original.model.state_dict())))

    resumed = _regression_learner(seed=1)  # other initial weights
    resumed.load_state_dict(saved)
    assert resumed.updates == resumed.version == 3
    # lr at update k (k = 3, 4) is 0.01 * (1 - k / 10); the scheduler must resume at k = 3.
    for (lr, state), i, lr_by_hand in zip(expected, (3, 4), (0.007, 0.006), strict=True):
        metrics, _ = resumed.step(_batch(i))
        assert metrics["learner/lr"] == lr == pytest.approx(lr_by_hand)
        for name, value in resumed.model.state_dict().items():
            assert torch.equal(value, state[name]), name
    assert resumed.updates == 5

    # Weights alone are not enough: without the optimizer state the next update differs.
    weights_only = _regression_learner(seed=1)
    weights_only.model.load_state_dict(saved["model"])
    weights_only.step(_batch(3))
    assert not torch.equal(weights_only.model[0].weight, expected[0][1]["0.weight"])


def test_to_device_moves_every_tensor_of_a_nested_batch():
    """The meta device stands in for a GPU: every tensor of an Unroll (its LSTM state is
    a tuple) and of a dict must land there; non-tensors stay as they are."""
    from distrl.training.learner import to_device
    from distrl.types import Unroll

    t, b = 3, 2
    unroll = Unroll(observations=torch.zeros(t + 1, b, 4), actions=torch.zeros(t, b).long(),
                    rewards=torch.zeros(t, b), dones=torch.zeros(t, b, dtype=torch.bool),
                    behaviour_logits=torch.zeros(t, b, 2),
                    policy_versions=torch.zeros(t, b).long(),
                    core_state=(torch.zeros(b, 8), torch.zeros(b, 8)))
    moved = to_device(unroll, torch.device("meta"))
    assert type(moved) is Unroll and isinstance(moved.core_state, tuple)
    tensors = [moved.observations, moved.actions, moved.rewards, moved.dones,
               moved.behaviour_logits, moved.policy_versions, *moved.core_state]
    assert all(x.device.type == "meta" for x in tensors)
    assert unroll.observations.device.type == "cpu"  # the original is untouched
    nested = to_device({"a": [torch.ones(1), 3], "b": "text"}, torch.device("meta"))
    assert nested["a"][0].device.type == "meta" and nested["a"][1] == 3 and nested["b"] == "text"
