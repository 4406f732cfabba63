"""Tests for distrl.rl.optimizers.

RMSpropTF: three steps on a linear model equal the naive float64 TensorFlow rule in
tests/reference.py (IMPALA's and Ape-X's constants, with and without momentum), a first step
checked by hand, torch's RMSprop shown to be a different optimizer, a state_dict round trip
that continues bit for bit, parameters of several dtypes (and CUDA, where there is one), and
make_optimizer's name and argument errors.

AdamTF: the same checks over twenty steps on a two-layer network (R2D2's constants, TF's
defaults, other betas), plus torch's Adam shown to be AdamTF exactly when its eps is divided
by sqrt(1 - beta2^t) each step."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from reference import adam_tf_reference, rmsprop_tf_reference
from torch import nn

from distrl.rl.optimizers import AdamTF, RMSpropTF
from distrl.training.learner import make_optimizer

NUM_STEPS = 3
BATCH, IN, OUT = 5, 3, 2

# name: (lr, alpha (TF decay), eps, momentum, centered)
IMPALA = (6e-4, 0.99, 0.01, 0.0, False)  # Espeholt et al. 2018, Table G.1
APEX = (0.00025 / 4, 0.95, 1.5e-7, 0.0, True)  # Horgan et al. 2018, Appendix
SETTINGS = {
    "impala": IMPALA,
    "apex": APEX,
    "impala_momentum": (6e-4, 0.99, 0.01, 0.9, False),
    "apex_momentum": (0.00025 / 4, 0.95, 1.5e-7, 0.9, True),
}


def _data(seed: int = 0, count: int = NUM_STEPS + 2) -> list[tuple[np.ndarray, np.ndarray]]:
    """A different (inputs [B, IN], targets [B, OUT]) batch for each step, so the gradient
    changes each step by more than the tiny parameter moves would change it."""
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(BATCH, IN)), 3.0 * rng.normal(size=(BATCH, OUT)))
            for _ in range(count)]


def _model(dtype: torch.dtype = torch.float64, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(IN, OUT).to(dtype)


def _loss(model: nn.Module, x: np.ndarray, y: np.ndarray) -> torch.Tensor:
    """0.5 * mean over the batch of ||model(x) - y||^2."""
    param = next(model.parameters())
    x_t = torch.as_tensor(x, dtype=param.dtype, device=param.device)
    y_t = torch.as_tensor(y, dtype=param.dtype, device=param.device)
    return 0.5 * ((model(x_t) - y_t) ** 2).sum(dim=1).mean()


def _numpy_grads(data):
    """The gradient of :func:`_loss` by hand: r = W x + b - y; dW = r^T x / B, db = mean r."""

    def grad_fn(t: int, params: list[np.ndarray]) -> list[np.ndarray]:
        weight, bias = params
        x, y = data[t]
        residual = x @ weight.T + bias - y
        return [residual.T @ x / len(x), residual.mean(axis=0)]

    return grad_fn


def _run(model: nn.Module, optimizer: torch.optim.Optimizer, data, steps: range):
    """Step ``optimizer`` on the batches ``data[t]``, ``t in steps``; the parameters after
    each step as float64 numpy arrays."""
    trajectory = []
    for t in steps:
        optimizer.zero_grad()
        _loss(model, *data[t]).backward()
        optimizer.step()
        trajectory.append([p.detach().cpu().double().numpy().copy() for p in model.parameters()])
    return trajectory


def _assert_continues_identically(model, optimizer, resumed_model, resumed, data) -> None:
    """Steps 2-4 from a restored checkpoint equal the uninterrupted run's, bit for bit, and
    so does every state tensor afterwards."""
    uninterrupted = _run(model, optimizer, data, range(2, 5))
    continued = _run(resumed_model, resumed, data, range(2, 5))
    for got_step, want_step in zip(continued, uninterrupted, strict=True):
        for got, want in zip(got_step, want_step, strict=True):
            assert np.array_equal(got, want)
    for param, resumed_param in zip(model.parameters(), resumed_model.parameters(),
                                    strict=True):
        for key, value in optimizer.state[param].items():
            assert torch.equal(resumed.state[resumed_param][key], value), key


def _initial(model: nn.Module) -> list[np.ndarray]:
    return [p.detach().cpu().double().numpy().copy() for p in model.parameters()]


def _max_gap(a: list[list[np.ndarray]], b: list[list[np.ndarray]]) -> float:
    return max(float(np.abs(x - y).max()) for xs, ys in zip(a, b, strict=True)
               for x, y in zip(xs, ys, strict=True))


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_three_steps_equal_the_tf_reference(setting: str) -> None:
    lr, alpha, eps, momentum, centered = SETTINGS[setting]
    data = _data()
    model = _model()
    start = _initial(model)
    expected = rmsprop_tf_reference(start, _numpy_grads(data), NUM_STEPS, lr, alpha, eps,
                                    momentum, centered)
    optimizer = RMSpropTF(model.parameters(), lr=lr, alpha=alpha, eps=eps, momentum=momentum,
                          centered=centered)
    actual = _run(model, optimizer, data, range(NUM_STEPS))
    assert _max_gap(actual, expected) < 1e-6
    # The moves are ~lr in size, so also compare them relatively: a 1e-6 absolute gap on
    # the parameters would hide Ape-X's eps put outside the root (a 1e-7 relative change).
    for step in range(NUM_STEPS):
        for got, want, origin in zip(actual[step], expected[step], start, strict=True):
            np.testing.assert_allclose(got - origin, want - origin, rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("setting", ["impala", "apex"])
def test_float32_parameters_track_the_float64_reference(setting: str) -> None:
    lr, alpha, eps, momentum, centered = SETTINGS[setting]
    data = _data(seed=1)
    model = _model(torch.float32, seed=1)
    expected = rmsprop_tf_reference(_initial(model), _numpy_grads(data), NUM_STEPS, lr, alpha,
                                    eps, momentum, centered)
    optimizer = RMSpropTF(model.parameters(), lr=lr, alpha=alpha, eps=eps, momentum=momentum,
                          centered=centered)
    assert _max_gap(_run(model, optimizer, data, range(NUM_STEPS)), expected) < 1e-6


def test_first_step_by_hand_and_torch_first_step_is_nine_times_larger() -> None:
    # One weight, gradient 1. TF, IMPALA: ms = 0.99 * 1 + 0.01 * 1 = 1, step lr / sqrt(1 + 0.01).
    # Ape-X (centered): ms = 0.95 + 0.05 = 1, mg = 0.05, step lr / sqrt(1 - 0.0025 + 1.5e-7).
    # torch, IMPALA: ms = 0.01, step lr / (sqrt(0.01) + 0.01) = lr / 0.11.
    lr = 1e-3
    cases = [(IMPALA, lr / math.sqrt(1.01)), (APEX, lr / math.sqrt(0.9975 + 1.5e-7))]
    for (_, alpha, eps, momentum, centered), step in cases:
        weight = torch.zeros(1, dtype=torch.float64, requires_grad=True)
        optimizer = RMSpropTF([weight], lr=lr, alpha=alpha, eps=eps, momentum=momentum,
                              centered=centered)
        weight.grad = torch.ones(1, dtype=torch.float64)
        optimizer.step()
        assert weight.item() == pytest.approx(-step, rel=1e-12)

    weight = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    torch_rmsprop = torch.optim.RMSprop([weight], lr=lr, alpha=0.99, eps=0.01)
    weight.grad = torch.ones(1, dtype=torch.float64)
    torch_rmsprop.step()
    assert weight.item() == pytest.approx(-lr / 0.11, rel=1e-12)
    assert weight.item() / -(lr / math.sqrt(1.01)) == pytest.approx(math.sqrt(1.01) / 0.11)
    assert math.sqrt(1.01) / 0.11 > 9.1


@pytest.mark.parametrize(("setting", "min_gap"), [("impala", 5e-3), ("apex", 3e-4)])
def test_torch_rmsprop_with_the_same_constants_is_another_optimizer(
    setting: str, min_gap: float
) -> None:
    lr, alpha, eps, momentum, centered = SETTINGS[setting]
    data = _data()
    model = _model()
    expected = rmsprop_tf_reference(_initial(model), _numpy_grads(data), NUM_STEPS, lr, alpha,
                                    eps, momentum, centered)
    optimizer = torch.optim.RMSprop(model.parameters(), lr=lr, alpha=alpha, eps=eps,
                                    momentum=momentum, centered=centered)
    gap = _max_gap(_run(model, optimizer, data, range(NUM_STEPS)), expected)
    # Measured: 1.06e-2 (IMPALA, lr 6e-4) and 6.6e-4 (Ape-X, lr 6.25e-5), against largest
    # reference moves of 2.7e-3 and 2.5e-4 and RMSpropTF's gap of 0 to the reference.
    assert gap > min_gap


def test_state_dict_round_trip_continues_bit_exactly() -> None:
    lr, alpha, eps, momentum, centered = SETTINGS["apex_momentum"]  # every slot in use
    data = _data()
    model = _model()
    optimizer = RMSpropTF(model.parameters(), lr=lr, alpha=alpha, eps=eps, momentum=momentum,
                          centered=centered)
    _run(model, optimizer, data, range(2))
    assert set(optimizer.state[model.weight]) == {"square_avg", "grad_avg", "momentum_buffer"}

    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    resumed_model = _model(seed=123)  # other weights, overwritten by the load
    resumed_model.load_state_dict(saved["model"])
    resumed = RMSpropTF(resumed_model.parameters(), lr=1.0, alpha=0.5, eps=1.0)
    resumed.load_state_dict(saved["optimizer"])

    _assert_continues_identically(model, optimizer, resumed_model, resumed, data)


def _rmsprop_tf_momentum(params) -> RMSpropTF:
    lr, alpha, eps, momentum, centered = SETTINGS["apex_momentum"]
    return RMSpropTF(params, lr=lr, alpha=alpha, eps=eps, momentum=momentum, centered=centered)


@pytest.mark.parametrize("make", [_rmsprop_tf_momentum, lambda params: _adam_tf(params, "r2d2")],
                         ids=["rmsprop_tf", "adam_tf"])
def test_parameters_of_two_dtypes_update_as_if_alone(make) -> None:
    torch.manual_seed(0)
    values = [torch.randn(4, dtype=torch.float64), torch.randn(3, dtype=torch.float32)]
    grads = [[torch.randn(4, dtype=torch.float64), torch.randn(3, dtype=torch.float32)]
             for _ in range(NUM_STEPS)]

    def run(indices: list[int]) -> list[torch.Tensor]:
        params = [values[i].clone().requires_grad_() for i in indices]
        optimizer = make(params)
        for step_grads in grads:
            for param, i in zip(params, indices, strict=True):
                param.grad = step_grads[i].clone()
            optimizer.step()
        return [param.detach() for param in params]

    together = run([0, 1])
    assert torch.equal(together[0], run([0])[0])
    assert torch.equal(together[1], run([1])[0])
    assert together[1].dtype == torch.float32


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("setting", ["impala", "apex_momentum"])
def test_cuda_matches_cpu(setting: str) -> None:
    lr, alpha, eps, momentum, centered = SETTINGS[setting]
    data = _data()
    trajectories = []
    for device in ("cpu", "cuda"):
        model = _model().to(device)
        optimizer = RMSpropTF(model.parameters(), lr=lr, alpha=alpha, eps=eps,
                              momentum=momentum, centered=centered)
        trajectories.append(_run(model, optimizer, data, range(NUM_STEPS)))
        assert optimizer.state[model.weight]["square_avg"].device.type == device
    assert _max_gap(*trajectories) < 1e-12


def test_make_optimizer_builds_rmsprop_tf_with_the_given_constants() -> None:
    params = list(nn.Linear(2, 2).parameters())
    optimizer = make_optimizer(params, "rmsprop_tf", lr=6.25e-5, alpha=0.95, eps=1.5e-7,
                               momentum=0.5, centered=True)
    assert type(optimizer) is RMSpropTF
    group = optimizer.param_groups[0]
    assert (group["lr"], group["alpha"], group["eps"], group["momentum"], group["centered"]) == (
        6.25e-5, 0.95, 1.5e-7, 0.5, True
    )
    assert group["params"] == params
    # make_optimizer's defaults are IMPALA's (Table G.1): decay 0.99, eps 0.01, no momentum.
    group = make_optimizer(params, "rmsprop_tf", lr=6e-4).param_groups[0]
    assert (group["lr"], group["alpha"], group["eps"], group["momentum"], group["centered"]) == (
        6e-4, 0.99, 0.01, 0.0, False
    )


def test_make_optimizer_bad_name_lists_the_allowed_names() -> None:
    with pytest.raises(ValueError, match=r"optimizer.name must be one of rmsprop_tf, rmsprop, "
                                         r"adam, adam_tf; got 'sgd'"):
        make_optimizer(nn.Linear(1, 1).parameters(), "sgd", lr=0.1)


@pytest.mark.parametrize(
    ("argument", "value", "message"),
    [
        ("lr", -1e-3, r"lr must be >= 0.0; got -0.001"),
        ("lr", math.nan, r"lr must be >= 0.0; got nan"),
        ("alpha", 1.5, r"alpha must be in \[0.0, 1.0\]; got 1.5"),
        ("alpha", -0.1, r"alpha must be in \[0.0, 1.0\]; got -0.1"),
        ("eps", -1e-8, r"eps must be >= 0.0; got -1e-08"),
        ("momentum", -0.9, r"momentum must be >= 0.0; got -0.9"),
        ("centered", "yes", r"centered must be a bool; got 'yes'"),
    ],
)
def test_bad_arguments_raise_naming_them(argument: str, value, message: str) -> None:
    kwargs = {"lr": 1e-3, argument: value}
    with pytest.raises(ValueError, match=message):
        RMSpropTF(nn.Linear(1, 1).parameters(), **kwargs)
    with pytest.raises(ValueError, match=message):
        make_optimizer(nn.Linear(1, 1).parameters(), "rmsprop_tf", **kwargs)



# AdamTF. name: (lr, beta1, beta2, eps)
ADAM_STEPS = 20
HIDDEN = 4
R2D2 = (1e-4, 0.9, 0.999, 1e-3)  # Kapturowski et al. 2019, Table 2
ADAM_SETTINGS = {
    "r2d2": R2D2,
    "tf_defaults": (1e-3, 0.9, 0.999, 1e-8),  # tf.compat.v1.train.AdamOptimizer's
    "other_betas": (5e-4, 0.5, 0.9, 1e-4),
}


def _two_layer(dtype: torch.dtype = torch.float64, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUT)).to(dtype)


def _two_layer_numpy_grads(data):
    """The gradient of :func:`_loss` for :func:`_two_layer` by hand: h = tanh(W1 x + b1),
    r = (W2 h + b2 - y) / B; dW2 = r^T h, db2 = sum r, dz = (r W2) (1 - h^2), dW1 = dz^T x,
    db1 = sum dz."""

    def grad_fn(t: int, params: list[np.ndarray]) -> list[np.ndarray]:
        weight1, bias1, weight2, bias2 = params
        x, y = data[t]
        hidden = np.tanh(x @ weight1.T + bias1)
        residual = (hidden @ weight2.T + bias2 - y) / len(x)
        pre = (residual @ weight2) * (1.0 - hidden**2)
        return [pre.T @ x, pre.sum(axis=0), residual.T @ hidden, residual.sum(axis=0)]

    return grad_fn


def _adam_tf_expected(model: nn.Module, data, setting: str) -> list[list[np.ndarray]]:
    lr, beta1, beta2, eps = ADAM_SETTINGS[setting]
    return adam_tf_reference(_initial(model), _two_layer_numpy_grads(data), ADAM_STEPS, lr,
                             beta1, beta2, eps)


def _adam_tf(params, setting: str) -> AdamTF:
    lr, beta1, beta2, eps = ADAM_SETTINGS[setting]
    return AdamTF(params, lr=lr, betas=(beta1, beta2), eps=eps)


@pytest.mark.parametrize("setting", list(ADAM_SETTINGS))
def test_adam_tf_twenty_steps_equal_the_tf_reference(setting: str) -> None:
    data = _data(count=ADAM_STEPS)
    model = _two_layer()
    start = _initial(model)
    expected = _adam_tf_expected(model, data, setting)
    actual = _run(model, _adam_tf(model.parameters(), setting), data, range(ADAM_STEPS))
    assert len(start) == 4
    for step in range(ADAM_STEPS):
        for got, want, origin in zip(actual[step], expected[step], start, strict=True):
            np.testing.assert_allclose(got - origin, want - origin, rtol=1e-9, atol=1e-15)


@pytest.mark.parametrize("setting", list(ADAM_SETTINGS))
def test_adam_tf_float32_parameters_track_the_float64_reference(setting: str) -> None:
    data = _data(seed=1, count=ADAM_STEPS)
    model = _two_layer(torch.float32, seed=1)
    expected = _adam_tf_expected(model, data, setting)
    actual = _run(model, _adam_tf(model.parameters(), setting), data, range(ADAM_STEPS))
    # Measured: 0.8e-7 to 1.2e-7, against torch's Adam's 8.4e-5 (the test below).
    assert _max_gap(actual, expected) < 1e-6


def test_adam_tf_first_step_by_hand_and_torch_first_step_is_sixteen_times_larger() -> None:
    # One weight, gradient g. TF: m = (1 - b1) g, sqrt(v) = sqrt(1 - b2) |g|, lr_1 = lr *
    # sqrt(1 - b2) / (1 - b1). torch: m_hat = g, sqrt(v_hat) = |g|, step lr * g / (|g| + eps).
    lr, beta1, beta2, eps = R2D2
    g = 1e-3
    tf_step = (lr * math.sqrt(1 - beta2) / (1 - beta1)
               * (1 - beta1) * g / (math.sqrt(1 - beta2) * abs(g) + eps))
    torch_step = lr * g / (abs(g) + eps)
    steps = []
    for optimizer_class in (AdamTF, torch.optim.Adam):
        weight = torch.zeros(1, dtype=torch.float64, requires_grad=True)
        optimizer = optimizer_class([weight], lr=lr, betas=(beta1, beta2), eps=eps)
        weight.grad = torch.full((1,), g, dtype=torch.float64)
        optimizer.step()
        steps.append(-weight.item())
    assert steps[0] == pytest.approx(tf_step, rel=1e-12)
    assert steps[1] == pytest.approx(torch_step, rel=1e-12)
    assert torch_step == pytest.approx(lr / 2)
    assert tf_step == pytest.approx(3.0654e-6, rel=1e-4)
    assert steps[1] / steps[0] == pytest.approx(16.31, rel=1e-3)


def test_torch_adam_with_the_same_constants_is_another_optimizer() -> None:
    lr, beta1, beta2, eps = R2D2
    data = _data(count=ADAM_STEPS)
    model = _two_layer()
    start = _initial(model)
    expected = _adam_tf_expected(model, data, "r2d2")
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, betas=(beta1, beta2), eps=eps)
    gap = _max_gap(_run(model, optimizer, data, range(ADAM_STEPS)), expected)
    # Measured: 8.4e-5 against a largest reference move of 1.1e-3 and AdamTF's float64 gap
    # of ~0 (float32: ~1e-7).
    assert gap > 5e-5
    assert _max_gap([start], expected[-1:]) < 2e-3


def test_torch_adam_with_eps_over_root_of_bias_correction_is_adam_tf() -> None:
    lr, beta1, beta2, eps = R2D2
    data = _data(count=ADAM_STEPS)
    model = _two_layer()
    start = _initial(model)
    expected = _adam_tf_expected(model, data, "r2d2")
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, betas=(beta1, beta2), eps=eps)
    actual = []
    for t in range(ADAM_STEPS):
        optimizer.param_groups[0]["eps"] = eps / math.sqrt(1 - beta2 ** (t + 1))
        actual += _run(model, optimizer, data, range(t, t + 1))
    for step in range(ADAM_STEPS):
        for got, want, origin in zip(actual[step], expected[step], start, strict=True):
            np.testing.assert_allclose(got - origin, want - origin, rtol=1e-9, atol=1e-15)


def test_adam_tf_state_dict_round_trip_continues_bit_exactly() -> None:
    data = _data(count=5)
    model = _two_layer()
    optimizer = _adam_tf(model.parameters(), "r2d2")
    _run(model, optimizer, data, range(2))
    first_weight = next(model.parameters())
    assert set(optimizer.state[first_weight]) == {"step", "exp_avg", "exp_avg_sq"}
    assert optimizer.state[first_weight]["step"].item() == 2

    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    resumed_model = _two_layer(seed=123)  # other weights, overwritten by the load
    resumed_model.load_state_dict(saved["model"])
    resumed = AdamTF(resumed_model.parameters(), lr=1.0, betas=(0.5, 0.5), eps=1.0)
    resumed.load_state_dict(saved["optimizer"])
    assert resumed.param_groups[0]["betas"] == (0.9, 0.999)

    _assert_continues_identically(model, optimizer, resumed_model, resumed, data)


def test_adam_tf_skips_a_parameter_without_a_gradient() -> None:
    # As torch's Adam: its step count, and so its bias correction, does not advance.
    used = torch.ones(2, requires_grad=True)
    unused = torch.ones(2, requires_grad=True)
    optimizer = _adam_tf([used, unused], "r2d2")
    used.grad = torch.ones(2)
    optimizer.step()
    assert optimizer.state[used]["step"].item() == 1
    assert len(optimizer.state[unused]) == 0
    assert torch.equal(unused.detach(), torch.ones(2))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("setting", ["r2d2", "tf_defaults"])
def test_adam_tf_cuda_matches_cpu(setting: str) -> None:
    data = _data(count=ADAM_STEPS)
    trajectories = []
    for device in ("cpu", "cuda"):
        model = _two_layer().to(device)
        optimizer = _adam_tf(model.parameters(), setting)
        trajectories.append(_run(model, optimizer, data, range(ADAM_STEPS)))
        state = optimizer.state[next(model.parameters())]
        assert state["exp_avg"].device.type == device
        assert state["step"].device.type == "cpu"
    assert _max_gap(*trajectories) < 1e-12


def test_make_optimizer_builds_adam_tf_with_the_given_constants() -> None:
    params = list(nn.Linear(2, 2).parameters())
    optimizer = make_optimizer(params, "adam_tf", lr=1e-4, eps=1e-3, beta1=0.8, beta2=0.95)
    assert type(optimizer) is AdamTF
    group = optimizer.param_groups[0]
    assert (group["lr"], group["betas"], group["eps"]) == (1e-4, (0.8, 0.95), 1e-3)
    assert group["params"] == params
    # make_optimizer's betas default to Adam's (0.9, 0.999), as for torch's Adam.
    group = make_optimizer(params, "adam_tf", lr=1e-4, eps=1e-3).param_groups[0]
    assert (group["lr"], group["betas"], group["eps"]) == (1e-4, (0.9, 0.999), 1e-3)


@pytest.mark.parametrize(
    ("kwargs", "make_kwargs", "message"),
    [
        ({"lr": -1e-3}, {"lr": -1e-3}, r"AdamTF: lr must be >= 0.0; got -0.001"),
        ({"lr": math.nan}, {"lr": math.nan}, r"AdamTF: lr must be >= 0.0; got nan"),
        ({"betas": (1.0, 0.999)}, {"beta1": 1.0},
         r"AdamTF: betas\[0\] must be in \[0.0, 1.0\); got 1.0"),
        ({"betas": (0.9, -0.1)}, {"beta2": -0.1},
         r"AdamTF: betas\[1\] must be in \[0.0, 1.0\); got -0.1"),
        ({"betas": (0.9, 1.0)}, {"beta2": 1.0},
         r"AdamTF: betas\[1\] must be in \[0.0, 1.0\); got 1.0"),
        ({"eps": -1e-8}, {"eps": -1e-8}, r"AdamTF: eps must be >= 0.0; got -1e-08"),
    ],
)
def test_adam_tf_bad_arguments_raise_naming_them(kwargs, make_kwargs, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AdamTF(nn.Linear(1, 1).parameters(), **kwargs)
    with pytest.raises(ValueError, match=message):
        make_optimizer(nn.Linear(1, 1).parameters(), "adam_tf", **{"lr": 1e-3, **make_kwargs})


def test_adam_tf_betas_must_be_a_pair() -> None:
    with pytest.raises(ValueError, match=r"AdamTF: betas must be a pair \(beta1, beta2\); "
                                         r"got \(0.9,\)"):
        AdamTF(nn.Linear(1, 1).parameters(), betas=(0.9,))
