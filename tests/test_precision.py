"""``agent.precision=bfloat16``: the learner's loss runs under bfloat16 autocast, its
target pass in the side thread too; weights, gradients and optimizer state stay float32;
the pixels reach the first convolution exactly; a bad name is refused naming the field;
a CPU without native bfloat16 products gets a warning naming the setting."""

from __future__ import annotations

import pytest
import torch
from target_pass import call_loss
from torch.nn import functional as F

from agents.apex import ApexConfig, ApexLoss
from agents.impala import ImpalaConfig
from agents.r2d2 import R2D2Config, R2D2Loss
from distrl.config import ConfigError
from distrl.nets.models import DuelingQNet, RecurrentDuelingQNet
from distrl.nets.side_thread import SideThread
from distrl.nets.torsos import PIXEL_SCALE, _conv_on_pixels, channels_last_for_training
from distrl.training import learner as learner_module
from distrl.training.learner import Learner, make_lr_schedule, make_optimizer
from distrl.types import SampleBatch, SequenceSample


def apex_batch(size: int = 8, actions: int = 6) -> SampleBatch:
    g = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (2, size, 4, 84, 84), dtype=torch.uint8, generator=g)
    return SampleBatch(
        indices=torch.arange(size), observations=pixels[0],
        actions=torch.randint(0, actions, (size,), generator=g),
        returns=torch.randn(size, generator=g), discounts=torch.full((size,), 0.97),
        weights=torch.rand(size, generator=g) + 0.5, next_observations=pixels[1])


def sequence_batch(steps: int = 12, size: int = 3, actions: int = 6,
                   state: int = 2 * 32) -> SequenceSample:
    g = torch.Generator().manual_seed(0)
    return SequenceSample(
        indices=torch.arange(size), weights=torch.rand(size, generator=g) + 0.5,
        observations=torch.randint(0, 256, (steps, size, 4, 84, 84), dtype=torch.uint8,
                                   generator=g),
        prev_actions=torch.randint(0, actions, (steps, size), generator=g),
        prev_rewards=torch.randn(steps, size, generator=g),
        actions=torch.randint(0, actions, (steps, size), generator=g),
        rewards=torch.randn(steps, size, generator=g),
        terminated=torch.zeros(steps, size, dtype=torch.bool),
        valid=torch.ones(steps, size, dtype=torch.bool),
        stored_state=torch.randn(size, state, generator=g) * 0.1,
        start_state=torch.zeros(size, state))


def apex_step(precision: str) -> tuple[Learner, dict[str, float]]:
    torch.manual_seed(1)
    model = channels_last_for_training(DuelingQNet((4, 84, 84), 6, head_size=32))
    optimizer = make_optimizer(model.parameters(), "rmsprop_tf", 1e-4, alpha=0.95,
                               eps=1.5e-7, centered=True)
    learner = Learner(model, ApexLoss(model, target_update_interval=10), optimizer,
                      make_lr_schedule(optimizer, "constant", 10), 40.0, precision=precision)
    metrics, _ = learner.step(apex_batch())
    return learner, metrics


def test_a_bfloat16_update_is_the_float32_one_rounded_and_keeps_float32_state(
        intra_op_threads):
    intra_op_threads(1)
    (_, exact), (learner, mixed) = apex_step("float32"), apex_step("bfloat16")
    # bfloat16 keeps 8 bits of mantissa: the loss moves, but by well under a percent.
    gap = abs(mixed["learner/loss"] - exact["learner/loss"]) / abs(exact["learner/loss"])
    assert 0 < gap < 1e-2
    assert all(p.dtype == p.grad.dtype == torch.float32 for p in learner.model.parameters())
    state = learner.optimizer.state_dict()["state"]
    assert state and all(t.dtype == torch.float32 for s in state.values() for t in s.values()
                         if isinstance(t, torch.Tensor) and t.is_floating_point())


def test_the_side_thread_runs_under_the_callers_autocast(intra_op_threads):
    intra_op_threads(1)
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(16, 64, generator=g), torch.randn(32, 64, generator=g)

    def linear() -> torch.Tensor:
        return F.linear(x, w)

    side = SideThread("probe")
    assert side.submit(linear, torch.device("cpu")).result().dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = side.submit(linear, torch.device("cpu")).result()
        assert mixed.dtype == torch.bfloat16 and torch.equal(mixed, linear())


@pytest.mark.parametrize("agent", ["apex", "r2d2"])
def test_bfloat16_target_pass_in_the_side_thread_changes_no_number(intra_op_threads, agent):
    """The target network's pass runs in the side thread: without the caller's autocast
    there it would run in float32 and the priorities would differ from the one-thread
    order's."""
    intra_op_threads(1)
    results = {}
    for in_thread in (False, True):
        torch.manual_seed(1)
        if agent == "apex":
            model = DuelingQNet((4, 84, 84), 6, head_size=32)
            loss_fn = ApexLoss(model, target_update_interval=10)
            batch = apex_batch()
        else:
            model = RecurrentDuelingQNet((4, 84, 84), 6, lstm_size=32, head_size=32)
            loss_fn = R2D2Loss(model, 10, burn_in=4, trace_length=6, n_step=2, discount=0.99,
                               rescale_epsilon=1e-3, priority_eta=0.9)
            batch = sequence_batch()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _, priorities = call_loss(loss_fn, model, batch, in_thread)
        results[in_thread] = (loss, priorities)
    assert torch.equal(results[False][0], results[True][0])
    assert torch.equal(results[False][1], results[True][1])


def test_pixels_reach_the_first_convolution_exactly_in_bfloat16():
    """0..255 are exact in bfloat16: the one cast from uint8 gives what bfloat16 arithmetic
    on the float pixels would."""
    g = torch.Generator().manual_seed(0)
    conv = torch.nn.Conv2d(4, 8, 8, stride=4)
    pixels = torch.randint(0, 256, (2, 4, 84, 84), dtype=torch.uint8, generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = _conv_on_pixels(conv, pixels)
    bf16 = torch.bfloat16
    expected = F.conv2d(pixels.to(bf16), (conv.weight * PIXEL_SCALE).to(bf16),
                        conv.bias.to(bf16), stride=4)
    assert out.dtype == bf16 and torch.equal(out, expected)


@pytest.mark.parametrize("config", [ApexConfig, R2D2Config, ImpalaConfig])
def test_an_unknown_precision_is_refused_naming_the_field(config):
    with pytest.raises(ConfigError, match=r"agent.precision must be one of float32, "
                                          r"bfloat16; got 'float16'"):
        config(precision="float16")


def test_the_learner_refuses_an_unknown_precision():
    model = torch.nn.Linear(2, 1)
    optimizer = make_optimizer(model.parameters(), "adam", 1e-3)
    with pytest.raises(ConfigError, match="agent.precision must be one of"):
        Learner(model, lambda m, b: None, optimizer, make_lr_schedule(optimizer, "constant", 1),
                1.0, precision="half")


@pytest.mark.parametrize(("precision", "native", "warns"), [
    ("bfloat16", False, True), ("bfloat16", True, False), ("float32", False, False)])
def test_a_bfloat16_learner_without_native_bfloat16_warns_naming_the_setting(
        monkeypatch, recwarn, precision, native, warns):
    """On a CPU without AVX512-BF16 or AMX autocast emulates bfloat16 (3.1x float32's time
    for Ape-X's Pong update on an AVX2-only CPU): the learner says so at start-up."""
    monkeypatch.setattr(learner_module, "native_bfloat16", lambda device: native)
    model = torch.nn.Linear(2, 1)
    optimizer = make_optimizer(model.parameters(), "adam", 1e-3)
    Learner(model, lambda m, b: None, optimizer, make_lr_schedule(optimizer, "constant", 1),
            1.0, precision=precision)
    messages = [str(w.message) for w in recwarn.list if w.category is RuntimeWarning]
    expected = [m for m in messages if m.startswith("agent.precision=bfloat16: this cpu has no "
                                                    "native bfloat16")]
    assert len(expected) == (1 if warns else 0), messages


def test_native_bfloat16_asks_onednn_on_a_cpu(monkeypatch):
    for answer in (True, False):
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda a=answer: a)
        assert learner_module.native_bfloat16(torch.device("cpu")) is answer
