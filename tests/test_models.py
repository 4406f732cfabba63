"""Tests for distrl.nets.models: shapes, parameter counts, pixel scaling, LSTM resets and state,
the dueling network's split point and gradient rescale."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from distrl import config
from distrl.nets import torsos
from distrl.nets.models import (
    ActorCriticNet,
    DuelingHead,
    DuelingQNet,
    LSTMCore,
    RecurrentDuelingQNet,
)
from distrl.nets.torsos import ImpalaResNet, MinAtarCNN, NatureCNN, ShallowCNN, make_torso

T, B, A = 3, 2, 5
IMAGE_SHAPE = (4, 84, 84)
MINATAR_SHAPE = (4, 10, 10)
VECTOR_SHAPE = (4,)


def _observations(obs_shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if len(obs_shape) == 3:
        return torch.randint(0, 256, (T, B, *obs_shape), generator=gen, dtype=torch.uint8)
    return torch.randn(T, B, *obs_shape, generator=gen)


def _reference_lstm(
    core: LSTMCore, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor, resets: torch.Tensor
) -> torch.Tensor:
    """The LSTM equations written out one step at a time, zeroing state on reset."""
    lstm = core.lstm
    outputs = []
    for t in range(x.shape[0]):
        keep = (~resets[t]).float().unsqueeze(-1)
        h, c = h * keep, c * keep
        gates = x[t] @ lstm.weight_ih_l0.T + lstm.bias_ih_l0 + h @ lstm.weight_hh_l0.T
        gates = gates + lstm.bias_hh_l0
        i, f, g, o = gates.chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outputs.append(h)
    return torch.stack(outputs)


@pytest.mark.parametrize("use_lstm", [False, True])
@pytest.mark.parametrize(
    "torso, obs_shape",
    [
        ("shallow", IMAGE_SHAPE),
        ("nature", IMAGE_SHAPE),
        ("resnet", IMAGE_SHAPE),
        ("minatar", MINATAR_SHAPE),
        ("mlp", VECTOR_SHAPE),
        ("auto", IMAGE_SHAPE),
        ("auto", MINATAR_SHAPE),
        ("auto", VECTOR_SHAPE),
    ],
)
def test_output_shapes(torso: str, obs_shape: tuple[int, ...], use_lstm: bool) -> None:
    torch.manual_seed(0)
    net = ActorCriticNet(obs_shape, A, torso=torso, hidden_size=32, use_lstm=use_lstm, lstm_size=16)
    state = net.initial_state(B)
    assert len(state) == (2 if use_lstm else 0)
    with torch.no_grad():
        logits, values, new_state = net(_observations(obs_shape), state)
    assert logits.shape == (T, B, A)
    assert values.shape == (T, B)
    assert [s.shape for s in new_state] == [(B, 16)] * len(state)
    assert torch.isfinite(logits).all() and torch.isfinite(values).all()


def test_torso_widths() -> None:
    assert make_torso("shallow", IMAGE_SHAPE)[1] == 256
    assert make_torso("nature", IMAGE_SHAPE)[1] == 512
    assert make_torso("resnet", IMAGE_SHAPE)[1] == 256
    assert make_torso("mlp", VECTOR_SHAPE, hidden_size=48)[1] == 48
    assert type(make_torso("auto", IMAGE_SHAPE)[0]).__name__ == "NatureCNN"
    assert type(make_torso("auto", VECTOR_SHAPE)[0]).__name__ == "MLP"


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_nature_cnn_parameter_count() -> None:
    # 84 -> (84-8)/4+1 = 20 -> (20-4)/2+1 = 9 -> (9-3)/1+1 = 7.
    expected = (
        (4 * 32 * 8 * 8 + 32)
        + (32 * 64 * 4 * 4 + 64)
        + (64 * 64 * 3 * 3 + 64)
        + (64 * 7 * 7 * 512 + 512)
    )
    assert _count(NatureCNN(4)) == expected == 1_684_128


def test_impala_resnet_parameter_count() -> None:
    def conv(cin: int, cout: int) -> int:
        return cin * cout * 3 * 3 + cout

    expected = 0
    cin = 4
    for cout in (16, 32, 32):
        expected += conv(cin, cout) + 4 * conv(cout, cout)  # section conv + 2 blocks x 2 convs
        cin = cout
    # 84 -> 42 -> 21 -> 11 after the three stride-2 pools (padding 1).
    expected += 32 * 11 * 11 * 256 + 256
    assert _count(ImpalaResNet(4)) == expected


def test_nature_cnn_scales_uint8_once() -> None:
    torch.manual_seed(0)
    net = NatureCNN(4)
    pixels = torch.randint(0, 256, (2, *IMAGE_SHAPE), dtype=torch.uint8)
    with torch.no_grad():
        out = net(pixels)
        scaled = pixels.float() / 255.0
        by_hand = torch.relu(net.fc(net.convs(scaled).flatten(1)))
        unscaled = torch.relu(net.fc(net.convs(pixels.float()).flatten(1)))
    torch.testing.assert_close(out, by_hand)
    assert not torch.allclose(out, unscaled)
    # Raw pixels as float go through the same scaling as uint8 ones.
    torch.testing.assert_close(net(pixels.float()), out)


def test_shallow_cnn_scales_uint8_once() -> None:
    torch.manual_seed(0)
    net = ShallowCNN(4)
    pixels = torch.randint(0, 256, (2, *IMAGE_SHAPE), dtype=torch.uint8)
    with torch.no_grad():
        by_hand = torch.relu(net.fc(net.convs(pixels.float() / 255).flatten(1)))
        torch.testing.assert_close(net(pixels), by_hand)
        torch.testing.assert_close(net(pixels.float()), by_hand)


def test_impala_resnet_scales_uint8_once() -> None:
    torch.manual_seed(0)
    net = ImpalaResNet(4)
    pixels = torch.randint(0, 256, (2, *IMAGE_SHAPE), dtype=torch.uint8)
    with torch.no_grad():
        by_hand = torch.relu(net.fc(torch.relu(net.sections(pixels.float() / 255)).flatten(1)))
        torch.testing.assert_close(net(pixels), by_hand)


@pytest.mark.parametrize("torso", ["shallow", "nature", "resnet"])
def test_a_channels_last_learner_copy_computes_the_same_outputs_and_gradients(torso: str) -> None:
    """channels_last_for_training changes only the layout: the same loss and gradients as
    the plain copy, and its weights load into an actor's plain model unchanged."""
    torch.manual_seed(0)
    plain = ActorCriticNet(IMAGE_SHAPE, 6, torso=torso)
    fast = torsos.channels_last_for_training(copy.deepcopy(plain))
    first_conv = next(m for m in fast.modules() if isinstance(m, nn.Conv2d))
    assert first_conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert not first_conv.weight.is_contiguous()
    pixels = torch.randint(0, 256, (3, 2, *IMAGE_SHAPE), dtype=torch.uint8)
    grads = []
    for net in (plain, fast):
        logits, values, _ = net(pixels, ())
        (logits.square().sum() + values.sum()).backward()
        grads.append([p.grad for p in net.parameters()])
    torch.testing.assert_close(fast(pixels, ())[0], plain(pixels, ())[0])
    for plain_grad, fast_grad in zip(*grads, strict=True):
        torch.testing.assert_close(fast_grad, plain_grad, rtol=1e-4, atol=1e-5)
    actor = ActorCriticNet(IMAGE_SHAPE, 6, torso=torso)
    actor.load_state_dict(fast.state_dict())
    assert all(p.is_contiguous() for p in actor.parameters())
    torch.testing.assert_close(actor(pixels, ())[0], plain(pixels, ())[0])


def test_channels_last_for_training_leaves_minatar_alone() -> None:
    net = torsos.channels_last_for_training(ActorCriticNet((4, 10, 10), 6))
    assert all(p.is_contiguous() for p in net.parameters())


def _core_inputs(steps: int = 6, batch: int = 3, features: int = 5, hidden: int = 7):
    torch.manual_seed(0)
    core = LSTMCore(features, hidden)
    x = torch.randn(steps, batch, features)
    h, c = torch.randn(batch, hidden), torch.randn(batch, hidden)
    return core, x, (h, c)


def test_lstm_matches_reference_equations() -> None:
    core, x, (h, c) = _core_inputs()
    resets = torch.zeros(x.shape[:2], dtype=torch.bool)
    resets[2, 0] = resets[4, 1] = resets[0, 2] = True
    crowded = torch.zeros_like(resets)  # adjacent stretches of one step, one at the end
    crowded[1, 0] = crowded[2, 1] = crowded[3, 0] = crowded[5, 2] = True
    with torch.no_grad():
        # stretches between resets, then one call over all steps without resets
        for r in (resets, crowded, torch.zeros_like(resets)):
            y, (h_n, c_n) = core(x, (h, c), r)
            expected = _reference_lstm(core, x, h, c, r)
            torch.testing.assert_close(y, expected)
            torch.testing.assert_close(h_n, expected[-1])


def test_lstm_gradients_match_reference_equations() -> None:
    """The backward through the stretches between resets is the step-by-step one's."""
    core, x, (h, c) = _core_inputs()
    resets = torch.zeros(x.shape[:2], dtype=torch.bool)
    resets[2, 0] = resets[3, 1] = resets[5, 2] = True
    weights = torch.randn(x.shape[0], x.shape[1], core.hidden_size)
    grads = []
    for forward in (lambda xs: core(xs, (h, c), resets)[0],
                    lambda xs: _reference_lstm(core, xs, h, c, resets)):
        xs = x.clone().requires_grad_(True)
        core.zero_grad()
        (forward(xs) * weights).sum().backward()
        grads.append((xs.grad, core.lstm.weight_hh_l0.grad.clone()))
    torch.testing.assert_close(grads[0][0], grads[1][0])
    torch.testing.assert_close(grads[0][1], grads[1][1])


def test_lstm_reset_starts_fresh() -> None:
    core, x, state = _core_inputs()
    k = 3
    resets = torch.zeros(x.shape[:2], dtype=torch.bool)
    resets[k] = True
    with torch.no_grad():
        y, (h_n, c_n) = core(x, state, resets)
        y_fresh, (h_f, c_f) = core(x[k:], core.initial_state(x.shape[1]))
        y_carried, _ = core(x, state)
    torch.testing.assert_close(y[k:], y_fresh)
    torch.testing.assert_close(h_n, h_f)
    torch.testing.assert_close(c_n, c_f)
    torch.testing.assert_close(y[:k], y_carried[:k])
    # Without the reset, the carried state changes steps >= k: the check above can fail.
    assert not torch.allclose(y_carried[k:], y_fresh, atol=1e-4)


def test_lstm_reset_touches_only_its_column() -> None:
    core, x, state = _core_inputs()
    resets = torch.zeros(x.shape[:2], dtype=torch.bool)
    resets[2, 1] = True
    with torch.no_grad():
        y, _ = core(x, state, resets)
        y_plain, _ = core(x, state)
    torch.testing.assert_close(y[:, [0, 2]], y_plain[:, [0, 2]])
    assert not torch.allclose(y[2:, 1], y_plain[2:, 1], atol=1e-4)


def test_lstm_fast_path_equals_step_by_step() -> None:
    core, x, state = _core_inputs()
    with torch.no_grad():
        y_fast, (h_fast, c_fast) = core(x, state)
        outputs, (h, c) = [], state
        for t in range(x.shape[0]):
            y_t, (h, c) = core(x[t : t + 1], (h, c))
            outputs.append(y_t)
        # A reset at step 0 of a zero state changes nothing but forces the looped path.
        zero = core.initial_state(x.shape[1])
        resets = torch.zeros(x.shape[:2], dtype=torch.bool)
        resets[0] = True
        y_loop, _ = core(x, zero, resets)
        y_zero, _ = core(x, zero)
    torch.testing.assert_close(torch.cat(outputs), y_fast)
    torch.testing.assert_close(h, h_fast)
    torch.testing.assert_close(c, c_fast)
    torch.testing.assert_close(y_loop, y_zero)


@pytest.mark.parametrize("with_resets", [False, True])
def test_lstm_split_in_time_equals_one_pass(with_resets: bool) -> None:
    core, x, state = _core_inputs()
    resets = torch.zeros(x.shape[:2], dtype=torch.bool)
    if with_resets:
        resets[1, 0] = resets[4, 2] = True
    with torch.no_grad():
        y, (h, c) = core(x, state, resets)
        for k in (1, 2, 4):
            y0, mid = core(x[:k], state, resets[:k])
            y1, (h1, c1) = core(x[k:], mid, resets[k:])
            torch.testing.assert_close(torch.cat([y0, y1]), y)
            torch.testing.assert_close(h1, h)
            torch.testing.assert_close(c1, c)


def test_actor_critic_lstm_split_in_time_equals_one_pass() -> None:
    torch.manual_seed(0)
    net = ActorCriticNet(VECTOR_SHAPE, A, hidden_size=16, use_lstm=True, lstm_size=8)
    obs = torch.randn(6, B, *VECTOR_SHAPE)
    resets = torch.zeros(6, B, dtype=torch.bool)
    resets[3, 1] = True
    state = (torch.randn(B, 8), torch.randn(B, 8))
    with torch.no_grad():
        logits, values, (h, c) = net(obs, state, resets)
        l0, v0, mid = net(obs[:2], state, resets[:2])
        l1, v1, (h1, c1) = net(obs[2:], mid, resets[2:])
    torch.testing.assert_close(torch.cat([l0, l1]), logits)
    torch.testing.assert_close(torch.cat([v0, v1]), values)
    torch.testing.assert_close(h1, h)
    torch.testing.assert_close(c1, c)


def test_make_torso_errors() -> None:
    with pytest.raises(ValueError, match="torso") as info:
        make_torso("vgg", IMAGE_SHAPE)
    for allowed in ("auto", "shallow", "nature", "resnet", "minatar", "mlp"):
        assert allowed in str(info.value)
    assert "vgg" in str(info.value)
    for name in ("shallow", "nature", "resnet", "minatar"):
        with pytest.raises(ValueError, match=r"image observations \[C, H, W\]"):
            make_torso(name, VECTOR_SHAPE)
    with pytest.raises(ValueError, match="auto"):
        make_torso("auto", (4, 84))


def test_actor_critic_rejects_wrong_shapes() -> None:
    net = ActorCriticNet(VECTOR_SHAPE, A, hidden_size=8)
    with pytest.raises(ValueError, match=r"\[T, B, 4\]"):
        net(torch.zeros(B, 4), ())
    lstm_net = ActorCriticNet(VECTOR_SHAPE, A, hidden_size=8, use_lstm=True, lstm_size=8)
    with pytest.raises(ValueError, match="resets of shape"):
        lstm_net(torch.zeros(T, B, 4), lstm_net.initial_state(B), torch.zeros(B, T).bool())


@pytest.mark.parametrize("torso, obs_shape", [("nature", IMAGE_SHAPE), ("mlp", VECTOR_SHAPE)])
def test_time_major_no_mixing(torso: str, obs_shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    net = ActorCriticNet(obs_shape, A, torso=torso, hidden_size=32)
    obs = _observations(obs_shape)
    with torch.no_grad():
        logits, values, _ = net(obs, ())
        for t in range(T):
            l_t, v_t, _ = net(obs[t : t + 1], ())
            torch.testing.assert_close(l_t[0], logits[t])
            torch.testing.assert_close(v_t[0], values[t])
            for b in range(B):
                l_tb, v_tb, _ = net(obs[t : t + 1, b : b + 1], ())
                torch.testing.assert_close(l_tb[0, 0], logits[t, b])
                torch.testing.assert_close(v_tb[0, 0], values[t, b])
    # Distinct inputs give distinct outputs, so a mix-up of steps would show.
    assert not torch.allclose(logits[0], logits[1])


# ---------------------------------------------------------------- IMPALA's shallow torso


def test_shallow_cnn_layers_and_parameter_count() -> None:
    net = ShallowCNN(4)
    conv1, conv2 = net.convs[0], net.convs[2]
    assert (conv1.in_channels, conv1.out_channels) == (4, 16)
    assert (conv1.kernel_size, conv1.stride) == ((8, 8), (4, 4))
    assert (conv2.in_channels, conv2.out_channels) == (16, 32)
    assert (conv2.kernel_size, conv2.stride) == ((4, 4), (2, 2))
    # 84 -> (84-8)/4+1 = 20 -> (20-4)/2+1 = 9: 32x9x9 = 2592 conv features.
    assert net.conv_out_size == 32 * 9 * 9 == 2592
    assert (net.fc.in_features, net.fc.out_features) == (2592, 256)
    assert net.out_size == 256
    expected = (4 * 16 * 8 * 8 + 16) + (16 * 32 * 4 * 4 + 32) + (2592 * 256 + 256)
    assert _count(net) == expected == 676_144
    pixels = torch.zeros(3, *IMAGE_SHAPE, dtype=torch.uint8)
    assert net.conv_features(pixels).shape == (3, 2592)
    assert net(pixels).shape == (3, 256)
    convs_only = ShallowCNN(4, fc=False)
    assert convs_only.fc is None and convs_only.out_size == 2592
    assert _count(convs_only) == expected - (2592 * 256 + 256)


def test_auto_image_torso() -> None:
    assert isinstance(ActorCriticNet(IMAGE_SHAPE, A).torso, ShallowCNN)
    assert isinstance(ActorCriticNet(IMAGE_SHAPE, A, image_torso="nature").torso, NatureCNN)
    assert type(ActorCriticNet(VECTOR_SHAPE, A).torso).__name__ == "MLP"
    assert isinstance(make_torso("auto", IMAGE_SHAPE)[0], NatureCNN)
    assert isinstance(make_torso("auto", IMAGE_SHAPE, image_torso="nature")[0], NatureCNN)
    assert isinstance(make_torso("auto", IMAGE_SHAPE, image_torso="shallow")[0], ShallowCNN)
    assert isinstance(make_torso("auto", IMAGE_SHAPE, image_torso="resnet")[0], ImpalaResNet)
    # An explicit torso name wins over image_torso.
    assert isinstance(make_torso("nature", IMAGE_SHAPE, image_torso="shallow")[0], NatureCNN)
    for bad in ("mlp", "auto", "vgg"):
        with pytest.raises(ValueError, match=rf"image_torso must be one of .*; got '{bad}'"):
            make_torso("auto", IMAGE_SHAPE, image_torso=bad)
    with pytest.raises(ValueError, match="image_torso .*shallow, nature, resnet; got 'vgg'"):
        ActorCriticNet(IMAGE_SHAPE, A, image_torso="vgg")


# ---------------------------------------------------------------- dueling network


def test_dueling_streams_split_after_convolutions() -> None:
    net = DuelingQNet(IMAGE_SHAPE, 6)
    assert isinstance(net.torso, NatureCNN)
    assert not any(isinstance(m, nn.Linear) for m in net.torso.modules())
    for stream, outputs in ((net.head.value, 1), (net.head.advantage, 6)):
        assert [(m.in_features, m.out_features) for m in stream if isinstance(m, nn.Linear)] == [
            (64 * 7 * 7, 512),
            (512, outputs),
        ]
    convs = (4 * 32 * 8 * 8 + 32) + (32 * 64 * 4 * 4 + 64) + (64 * 64 * 3 * 3 + 64)
    value = (3136 * 512 + 512) + (512 * 1 + 1)
    advantage = (3136 * 512 + 512) + (512 * 6 + 6)
    assert _count(net) == convs + value + advantage == 3_293_863
    pixels = torch.randint(0, 256, (2, *IMAGE_SHAPE), dtype=torch.uint8)
    with torch.no_grad():
        torch.testing.assert_close(net.torso(pixels), net.torso.conv_features(pixels))
    # Vector observations keep the MLP as the shared trunk.
    mlp_net = DuelingQNet(VECTOR_SHAPE, 3, hidden_size=8, mlp_layers=2, head_size=5)
    assert mlp_net.head.value[0].in_features == 8
    assert _count(mlp_net.torso) == (4 * 8 + 8) + (8 * 8 + 8)


def _dueling_cases():
    torch.manual_seed(0)
    image = DuelingQNet((4, 36, 36), 3, head_size=16)
    pixels = torch.randint(0, 256, (5, 4, 36, 36), dtype=torch.uint8)
    mlp = DuelingQNet(VECTOR_SHAPE, 3, hidden_size=8, head_size=6)
    recurrent = RecurrentDuelingQNet(VECTOR_SHAPE, 3, hidden_size=8, lstm_size=7, head_size=6)
    steps, batch = 4, 2
    recurrent_inputs = (
        torch.randn(steps, batch, *VECTOR_SHAPE),
        torch.randint(-1, 3, (steps, batch)),
        torch.randn(steps, batch),
        recurrent.initial_state(batch),
    )
    return [
        ("nature", image, image.torso, lambda: image(pixels)),
        ("mlp", mlp, mlp.torso, lambda: mlp(torch.randn(5, *VECTOR_SHAPE))),
        ("recurrent", recurrent, recurrent.core, lambda: recurrent(*recurrent_inputs)[0]),
    ]


@pytest.mark.parametrize("case", range(3), ids=["nature", "mlp", "recurrent"])
def test_dueling_gradient_into_trunk_is_rescaled(case: int) -> None:
    _, net, trunk, q_fn = _dueling_cases()[case]
    captured = []

    def keep(module: nn.Module, inputs: object, output: object) -> None:
        features = output[0] if isinstance(output, tuple) else output
        features.retain_grad()
        captured.append(features)

    handle = trunk.register_forward_hook(keep)
    q = q_fn()
    handle.remove()
    (features,) = captured
    weights = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    trunk_params, head_params = list(trunk.parameters()), list(net.head.parameters())
    (q * weights).sum().backward(retain_graph=True)

    # The unscaled gradients: each stream on its own detached leaf copy of the features.
    from_value = features.detach().requires_grad_()
    from_advantage = features.detach().requires_grad_()
    advantages = net.head.advantage(from_advantage)
    q_by_hand = net.head.value(from_value) + advantages - advantages.mean(-1, keepdim=True)
    torch.testing.assert_close(q_by_hand, q, rtol=0, atol=0)
    by_hand = torch.autograd.grad(
        (q_by_hand * weights).sum(), [from_value, from_advantage, *head_params]
    )
    expected = (by_hand[0] + by_hand[1]) / math.sqrt(2)
    assert features.grad.abs().max() > 1e-3
    torch.testing.assert_close(features.grad, expected, rtol=0, atol=1e-6)
    # The streams' own weights are not rescaled; the trunk's get the rescaled gradient.
    for param, want in zip(head_params, by_hand[2:], strict=True):
        torch.testing.assert_close(param.grad, want, rtol=0, atol=1e-6)
    trunk_expected = torch.autograd.grad(features, trunk_params, grad_outputs=expected)
    for param, want in zip(trunk_params, trunk_expected, strict=True):
        torch.testing.assert_close(param.grad, want, rtol=1e-5, atol=1e-6)


def test_dueling_rescale_leaves_forward_unchanged() -> None:
    torch.manual_seed(0)
    net = DuelingQNet(IMAGE_SHAPE, 6)
    pixels = torch.randint(0, 256, (3, *IMAGE_SHAPE), dtype=torch.uint8)
    with torch.no_grad():
        q = net(pixels)
        features = net.torso(pixels)
        value, advantages = net.head.value(features), net.head.advantage(features)
        by_hand = value + advantages - advantages.mean(-1, keepdim=True)
    assert net.head.grad_scale == 1 / math.sqrt(2)
    assert q.shape == (3, 6)
    assert torch.equal(q, by_hand)
    # Eq. 9's centring: the advantages' mean over actions is zero, so V is the mean of Q.
    torch.testing.assert_close(q.mean(-1, keepdim=True), value)


def test_dueling_head_grad_scale_one_is_plain_sum() -> None:
    torch.manual_seed(0)
    head = DuelingHead(4, 3, hidden_size=5, grad_scale=1.0)
    x = torch.randn(6, 4, requires_grad=True)
    head(x).sum().backward()
    leaf_v, leaf_a = x.detach().requires_grad_(), x.detach().requires_grad_()
    a = head.advantage(leaf_a)
    (head.value(leaf_v) + a - a.mean(-1, keepdim=True)).sum().backward()
    torch.testing.assert_close(x.grad, leaf_v.grad + leaf_a.grad)


# ---------------------------------------------------------------- MinAtar's torso


def test_minatar_cnn_layers_and_parameter_count() -> None:
    net = MinAtarCNN(4)
    (conv,) = [m for m in net.convs if isinstance(m, nn.Conv2d)]
    assert (conv.in_channels, conv.out_channels) == (4, 16)
    assert (conv.kernel_size, conv.stride, conv.padding) == ((3, 3), (1, 1), (0, 0))
    # 10 -> 10-3+1 = 8: 16x8x8 = 1024 conv features.
    assert net.conv_out_size == 16 * 8 * 8 == 1024
    assert (net.fc.in_features, net.fc.out_features) == (1024, 128)
    assert net.out_size == 128
    assert _count(net) == (4 * 16 * 9 + 16) + (1024 * 128 + 128) == 592 + 131_200 == 131_792
    grids = torch.zeros(3, *MINATAR_SHAPE, dtype=torch.uint8)
    assert net.conv_features(grids).shape == (3, 1024)
    assert net(grids).shape == (3, 128)
    convs_only = MinAtarCNN(4, fc=False)
    assert convs_only.fc is None and convs_only.out_size == 1024
    assert _count(convs_only) == 592
    assert MinAtarCNN(10).conv_out_size == 1024  # Seaquest's 10 channels: only the conv grows
    assert _count(MinAtarCNN(10)) == (10 * 16 * 9 + 16) + 131_200
    with pytest.raises(ValueError, match="at least 3x3"):
        MinAtarCNN(4, image_size=2)


def test_minatar_cnn_does_not_scale_its_0_1_input() -> None:
    torch.manual_seed(0)
    net = MinAtarCNN(4)
    grids = torch.randint(0, 2, (5, *MINATAR_SHAPE), dtype=torch.uint8)
    conv, fc = net.convs[0], net.fc
    with torch.no_grad():
        hidden = torch.relu(F.conv2d(grids.float(), conv.weight, conv.bias)).flatten(1)
        by_hand = torch.relu(hidden @ fc.weight.T + fc.bias)
        torch.testing.assert_close(net(grids), by_hand)
        torch.testing.assert_close(net(grids.bool()), by_hand)
        torch.testing.assert_close(net(grids.float()), by_hand)
        scaled = torch.relu(fc(torch.relu(conv(grids.float() / 255)).flatten(1)))
    assert not torch.allclose(by_hand, scaled)


def test_minatar_torso_is_known_to_the_config() -> None:
    assert config.TORSOS == torsos.TORSOS
    assert config.ModelConfig(torso="minatar").torso == "minatar"


def test_auto_picks_minatar_for_10x10_images_in_every_network() -> None:
    for image_torso in torsos.IMAGE_TORSOS:
        torso, width = make_torso("auto", MINATAR_SHAPE, image_torso=image_torso)
        assert isinstance(torso, MinAtarCNN) and width == 128
    # Only 10x10: other small images keep image_torso (the ResNet takes any size).
    assert isinstance(make_torso("auto", (4, 11, 11), image_torso="resnet")[0], ImpalaResNet)
    # IMPALA's actor-critic: torso fc 128, then the policy and value heads (the paper's AC).
    ac = ActorCriticNet(MINATAR_SHAPE, 6)
    assert isinstance(ac.torso, MinAtarCNN) and ac.torso.fc is not None
    assert (ac.head.policy.in_features, ac.head.baseline.in_features) == (128, 128)
    # Ape-X's dueling net: the streams split after the conv, each reading 1024 features.
    dueling = DuelingQNet(MINATAR_SHAPE, 6)
    assert isinstance(dueling.torso, MinAtarCNN) and dueling.torso.fc is None
    assert dueling.head.value[0].in_features == dueling.head.advantage[0].in_features == 1024
    assert _count(dueling) == 592 + (1024 * 512 + 512 + 512 + 1) + (
        1024 * 512 + 512 + 512 * 6 + 6)
    # R2D2: torso fc 128, then the LSTM over [features, previous action, previous reward].
    recurrent = RecurrentDuelingQNet(MINATAR_SHAPE, 6)
    assert isinstance(recurrent.torso, MinAtarCNN) and recurrent.torso_size == 128
    assert recurrent.core.input_size == 128 + 6 + 1
    grids = torch.randint(0, 2, (T, B, *MINATAR_SHAPE), dtype=torch.uint8)
    with torch.no_grad():
        assert dueling(grids[0]).shape == (B, 6)
        q, _ = recurrent(grids, torch.zeros(T, B, dtype=torch.int64), torch.zeros(T, B),
                         recurrent.initial_state(B))
        assert q.shape == (T, B, 6)


def test_orthogonal_init_gives_ppos_gains_and_zero_biases():
    """agent.model.init=orthogonal: every torso layer's weight rows are orthogonal with norm
    sqrt(2) (W W^T = 2 I, the conv's flattened per output channel), the policy head's with
    norm 0.01, the value head's 1; all biases 0. The default leaves PyTorch's init."""
    from agents import impala
    from distrl.config import ModelConfig

    torch.manual_seed(0)
    net = impala.make_network((4, 84, 84), 6, ModelConfig(init="orthogonal"))
    layers = [m for m in net.torso.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    assert len(layers) == 3  # IMPALA's shallow torso: conv, conv, fc
    for layer, gain in [*((m, 2.0 ** 0.5) for m in layers), (net.head.policy, 0.01),
                        (net.head.baseline, 1.0)]:
        rows = layer.weight.detach().flatten(1)
        torch.testing.assert_close(rows @ rows.T, gain ** 2 * torch.eye(rows.shape[0]),
                                   atol=1e-5 * gain ** 2, rtol=0)
        assert torch.count_nonzero(layer.bias) == 0
    default = impala.make_network((4, 84, 84), 6, ModelConfig())
    assert torch.count_nonzero(default.head.policy.bias) > 0  # PyTorch's uniform bias


@pytest.mark.parametrize("agent", ["apex", "r2d2"])
def test_orthogonal_init_is_refused_for_the_q_networks(agent):
    import importlib

    from distrl.config import ConfigError, ModelConfig

    module = importlib.import_module(f"agents.{agent}")
    config = {"apex": "ApexConfig", "r2d2": "R2D2Config"}[agent]
    with pytest.raises(ConfigError, match=rf"agent.model.init must be default for {agent}"):
        getattr(module, config)(model=ModelConfig(init="orthogonal"))


def test_model_init_must_be_a_known_choice():
    from distrl.config import ConfigError, ModelConfig

    with pytest.raises(ConfigError, match=r"agent.model.init"):
        ModelConfig(init="xavier")
