"""Torsos: the networks that map an observation to features. IMPALA's shallow CNN and
deep ResNet (Espeholt et al. 2018, Fig. 3), the Nature CNN (Mnih et al. 2015), MinAtar's
one-conv network (Young & Tian 2019) and an MLP, built by name with :func:`make_torso`.

Image observations are raw pixels (uint8 ``[.., C, H, W]``, C = frame stack) and are
scaled by 1/255 inside the CNN torsos, except MinAtar's 0/1 channels, which are only cast
to float; vector observations are float.

Two things make the pixel torsos cheaper on a CPU without changing what they compute: the
1/255 is folded into the first convolution's weights (:func:`_conv_on_pixels`), and a CPU
learner keeps its copy channels-last (:func:`channels_last_for_training`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

TORSOS = ("auto", "shallow", "nature", "resnet", "minatar", "mlp")
IMAGE_TORSOS = ("shallow", "nature", "resnet")  # what ``auto`` may pick for images
MINATAR_FRAME = (10, 10)  # ``auto`` picks the MinAtar torso for images of this size


def _pair(size: int | Sequence[int]) -> tuple[int, int]:
    """``size`` as ``(height, width)``; an int means a square image."""
    if isinstance(size, int):
        return size, size
    height, width = size
    return int(height), int(width)


def _conv_out(size: int, kernel: int, stride: int, padding: int = 0) -> int:
    """Spatial size after a convolution or pooling layer (floor division, as torch)."""
    return (size + 2 * padding - kernel) // stride + 1


PIXEL_SCALE = 1.0 / 255.0  # raw pixel values in [0, 255] -> [0, 1]


def _conv_on_pixels(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``conv(x / 255)`` for raw pixels ``x`` (any dtype), computed as ``conv`` with its
    weight scaled by 1/255 on ``x`` cast to float: a convolution is linear in its input, and
    this saves a whole pass over the largest tensor of the update (a Pong IMPALA learner
    step: 330 -> 310 ms on one core). ``x`` is cast straight into the memory format of
    ``conv``'s weight, so a channels-last learner converts its batch once.
    """
    weight = conv.weight
    channels_last = weight.is_contiguous(memory_format=torch.channels_last) and not (
        weight.is_contiguous())
    # Under bfloat16 autocast the convolution casts its input to bfloat16 anyway: cast the
    # pixels there directly (0..255 are exact in bfloat16), one pass instead of two.
    dtype = (torch.get_autocast_dtype(x.device.type)
             if torch.is_autocast_enabled(x.device.type) else weight.dtype)
    x = x.to(dtype, memory_format=torch.channels_last if channels_last
             else torch.contiguous_format)
    return F.conv2d(x, weight * PIXEL_SCALE, conv.bias, conv.stride, conv.padding,
                    conv.dilation, conv.groups)


def channels_last_for_training(model: nn.Module) -> nn.Module:
    """``model`` with the convolutions of its pixel torsos stored channels-last, in place.

    oneDNN's convolution backward runs much faster on channels-last tensors (a Pong
    IMPALA learner step, shallow torso, batch 32 x 20: 310 -> 210 ms on one core), but
    small-batch inference runs slower (an actor's batch of 16: 1.6 -> 2.1 ms), so only a
    CPU learner's copy is converted; actors load its weights into their own layout.
    MinAtar's tiny convolution is left alone.
    """
    for module in model.modules():
        if isinstance(module, (ShallowCNN, NatureCNN, ImpalaResNet)):
            module.to(memory_format=torch.channels_last)
    return model


class _ConvTorso(nn.Module):
    """Convolutions ``self.convs`` then, with ``fc``, one fc + ReLU layer.

    Plain conv stacks call :meth:`_build` with their layers; others build ``self.convs``
    (ending in a ReLU), or override :meth:`conv_features`, and call :meth:`_finish` with
    the flattened conv width. ``fc=False`` leaves the fc out:
    the torso then outputs the flattened conv features, as the dueling network's streams
    need (Wang et al. 2016, Fig. 1: they split right after the convolutions).
    """

    def _build(self, in_channels: int, image_size: int | Sequence[int],
               layers: Sequence[tuple[int, int, int]], out_size: int, fc: bool) -> None:
        """``self.convs``: a conv of ``(channels, kernel, stride)`` then a ReLU per layer
        (no padding); refuses images too small for them, naming the smallest size."""
        height, width = _pair(image_size)
        modules: list[nn.Module] = []
        smallest = 1
        for channels, kernel, stride in layers:
            modules += [nn.Conv2d(in_channels, channels, kernel_size=kernel, stride=stride),
                        nn.ReLU()]
            in_channels = channels
            height, width = _conv_out(height, kernel, stride), _conv_out(width, kernel, stride)
        for _, kernel, stride in reversed(layers):
            smallest = (smallest - 1) * stride + kernel
        if height < 1 or width < 1:
            raise ValueError(f"{type(self).__name__} needs images of at least "
                             f"{smallest}x{smallest}, got {image_size}")
        self.convs = nn.Sequential(*modules)
        self._finish(in_channels * height * width, out_size, fc)

    def _finish(self, conv_out_size: int, out_size: int, fc: bool) -> None:
        self.conv_out_size = conv_out_size
        self.fc = nn.Linear(conv_out_size, out_size) if fc else None
        self.out_size = out_size if fc else conv_out_size

    def conv_features(self, x: torch.Tensor) -> torch.Tensor:
        """Raw pixels ``[N, C, H, W]`` -> flattened conv features ``[N, conv_out_size]``."""
        return self.convs[1:](_conv_on_pixels(self.convs[0], x)).flatten(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Raw pixels ``[N, C, H, W]`` -> features ``[N, out_size]``."""
        x = self.conv_features(x)
        return x if self.fc is None else torch.relu(self.fc(x))


class ShallowCNN(_ConvTorso):
    """IMPALA's shallow torso (Espeholt et al. 2018, Fig. 3 left).

    conv 16 8x8 stride 4, ReLU, conv 32 4x4 stride 2, ReLU, fc ``out_size`` (256), ReLU.
    Input: raw pixels ``[N, C, H, W]`` in [0, 255]; output ``[N, out_size]``, or the
    flattened conv features ``[N, conv_out_size]`` (32x9x9 = 2592 on 84x84) with
    ``fc=False``.
    """

    def __init__(
        self,
        in_channels: int,
        image_size: int | Sequence[int] = 84,
        out_size: int = 256,
        fc: bool = True,
    ) -> None:
        super().__init__()
        self._build(in_channels, image_size, ((16, 8, 4), (32, 4, 2)), out_size, fc)


class NatureCNN(_ConvTorso):
    """The DQN convolutional torso (Mnih et al. 2015, "Methods: Model architecture").

    conv 32 8x8 stride 4, conv 64 4x4 stride 2, conv 64 3x3 stride 1, fc ``out_size``
    (512 in the paper), ReLU after each. IMPALA's shallow model is :class:`ShallowCNN`,
    not this. Input: raw pixels ``[N, C, H, W]`` in [0, 255]; output ``[N, out_size]``,
    or the flattened conv features ``[N, conv_out_size]`` (64x7x7 = 3136 on 84x84) with
    ``fc=False``.
    """

    def __init__(
        self,
        in_channels: int,
        image_size: int | Sequence[int] = 84,
        out_size: int = 512,
        fc: bool = True,
    ) -> None:
        super().__init__()
        self._build(in_channels, image_size, ((32, 8, 4), (64, 4, 2), (64, 3, 1)), out_size,
                    fc)


class MinAtarCNN(_ConvTorso):
    """The MinAtar network's torso (Young & Tian 2019, Section 4: the DQN and actor-critic
    networks share it).

    conv 16 3x3 stride 1 (no padding), ReLU, fc ``out_size`` (128), ReLU. Input: MinAtar's
    0/1 channels ``[N, C, H, W]`` (10x10), cast to float and not scaled; output ``[N,
    out_size]``, or the flattened conv features ``[N, conv_out_size]`` (16x8x8 = 1024 on
    10x10) with ``fc=False``.
    """

    def __init__(
        self,
        in_channels: int,
        image_size: int | Sequence[int] = 10,
        out_size: int = 128,
        fc: bool = True,
    ) -> None:
        super().__init__()
        self._build(in_channels, image_size, ((16, 3, 1),), out_size, fc)

    def conv_features(self, x: torch.Tensor) -> torch.Tensor:
        """0/1 channels ``[N, C, H, W]`` -> flattened conv features ``[N, conv_out_size]``."""
        # No 1/255: the channels are already 0 or 1, as the paper feeds them.
        return self.convs(x.to(self.convs[0].weight.dtype)).flatten(1)


class _ResidualBlock(nn.Module):
    """ReLU, conv 3x3, ReLU, conv 3x3, plus the input (Espeholt et al. 2018, Fig. 3)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Not in-place: the first ReLU would otherwise overwrite the skip input.
        out = self.conv0(torch.relu(x))
        out = self.conv1(torch.relu(out))
        return x + out


class ImpalaResNet(_ConvTorso):
    """IMPALA's deep residual torso (Espeholt et al. 2018, Fig. 3 right).

    Three sections with ``channels`` (16, 32, 32); each is conv 3x3 stride 1, max-pool
    3x3 stride 2 (padding 1) and two residual blocks. Then ReLU, flatten, fc ``out_size``
    (256), ReLU. Input: raw pixels ``[N, C, H, W]`` in [0, 255]; output ``[N, out_size]``,
    or the flattened conv features ``[N, conv_out_size]`` with ``fc=False``.
    """

    def __init__(
        self,
        in_channels: int,
        image_size: int | Sequence[int] = 84,
        channels: Sequence[int] = (16, 32, 32),
        out_size: int = 256,
        fc: bool = True,
    ) -> None:
        super().__init__()
        height, width = _pair(image_size)
        sections: list[nn.Module] = []
        for out_channels in channels:
            sections += [
                nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1),
                nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
                _ResidualBlock(out_channels),
                _ResidualBlock(out_channels),
            ]
            in_channels = out_channels
            height, width = _conv_out(height, 3, 2, 1), _conv_out(width, 3, 2, 1)
        self.sections = nn.Sequential(*sections)
        self._finish(in_channels * height * width, out_size, fc)

    def conv_features(self, x: torch.Tensor) -> torch.Tensor:
        """Raw pixels ``[N, C, H, W]`` -> flattened conv features ``[N, conv_out_size]``."""
        # The residual sections end on a skip sum; this ReLU closes them (Fig. 3 right).
        x = self.sections[1:](_conv_on_pixels(self.sections[0], x))
        return torch.relu(x).flatten(1)


class MLP(nn.Module):
    """``num_layers`` of Linear + ReLU, each ``hidden_size`` wide.

    Input ``[N, in_size]`` (trailing dims are flattened); output ``[N, hidden_size]``.
    """

    def __init__(self, in_size: int, hidden_size: int, num_layers: int) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"MLP num_layers must be >= 1, got {num_layers}")
        layers: list[nn.Module] = []
        for i in range(num_layers):
            layers += [nn.Linear(in_size if i == 0 else hidden_size, hidden_size), nn.ReLU()]
        self.layers = nn.Sequential(*layers)
        self.out_size = hidden_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[N, in_size]`` -> ``[N, hidden_size]``."""
        return self.layers(x.flatten(1).to(self.layers[0].weight.dtype))


def make_torso(
    name: str,
    obs_shape: tuple[int, ...],
    hidden_size: int = 256,
    mlp_layers: int = 2,
    *,
    image_torso: str = "nature",
    image_fc: bool = True,
) -> tuple[nn.Module, int]:
    """Build a torso by name for observations of shape ``obs_shape``.

    Args:
        name: one of ``auto`` (``minatar`` for MinAtar's 10x10 images, whatever the
            agent; ``image_torso`` for other images ``[C, H, W]``; mlp for vector ``[F]``
            observations), ``shallow``, ``nature``, ``resnet``, ``minatar``, ``mlp``
            (flattens any shape).
        obs_shape: shape of one observation, without time and batch.
        hidden_size: width of each MLP layer. The CNN torsos keep their papers' widths
            (256 for shallow, 512 for Nature, 256 for ResNet, 128 for MinAtar).
        mlp_layers: number of MLP layers.
        image_torso: what ``auto`` picks for images other than 10x10: ``shallow``,
            ``nature`` or ``resnet`` (IMPALA: shallow; the DQN agents: nature). Those need
            at least 20x20 (shallow) or 36x36 (nature), so a 10x10 image, MinAtar's,
            gets MinAtar's own network instead.
        image_fc: False: an image torso stops after its convolutions and outputs their
            flattened features (no fc layer). The MLP has no convolutions and is unchanged.
    Returns:
        ``(torso, out_size)``: the module and the width of its output features.
    """
    if name not in TORSOS:
        raise ValueError(f"torso must be one of {', '.join(TORSOS)}; got {name!r}")
    if image_torso not in IMAGE_TORSOS:
        raise ValueError(
            f"image_torso must be one of {', '.join(IMAGE_TORSOS)}; got {image_torso!r}"
        )
    obs_shape = tuple(int(d) for d in obs_shape)
    if name == "auto":
        if len(obs_shape) == 3:
            name = "minatar" if obs_shape[1:] == MINATAR_FRAME else image_torso
        elif len(obs_shape) == 1:
            name = "mlp"
        else:
            raise ValueError(
                f"torso 'auto' handles image [C, H, W] or vector [F] observations, got "
                f"obs_shape {obs_shape}; pick torso 'mlp' to flatten them"
            )
    if name == "mlp":
        torso: nn.Module = MLP(math.prod(obs_shape), hidden_size, mlp_layers)
        return torso, hidden_size
    if len(obs_shape) != 3:
        raise ValueError(
            f"torso {name!r} needs image observations [C, H, W], got obs_shape {obs_shape}; "
            "use torso 'mlp' or 'auto' for vector observations"
        )
    channels, height, width = obs_shape
    cnn = {"shallow": ShallowCNN, "nature": NatureCNN, "resnet": ImpalaResNet,
           "minatar": MinAtarCNN}[name]
    torso = cnn(channels, (height, width), fc=image_fc)
    return torso, torso.out_size
