"""The agents' networks: a torso (:mod:`distrl.nets.torsos`), an optional LSTM core, and an
actor-critic or (dueling) Q head.

No RL logic lives here: these modules map observations to features, features to a
recurrent state, and features to policy logits and a state value or action values.
Sequence inputs are time-major ``[T, B, ...]``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from distrl.nets.torsos import make_torso

LSTMState = tuple[torch.Tensor, torch.Tensor]


class LSTMCore(nn.Module):
    """One-layer LSTM over time-major sequences with per-step episode resets.

    The recurrent core of IMPALA (Espeholt et al. 2018, Fig. 3) and R2D2 (Kapturowski et
    al. 2019). Where ``resets[t, b]`` the state of column ``b`` is zeroed before step
    ``t``, so no information crosses an episode boundary inside an unroll.
    """

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size)
        self.input_size = input_size
        self.hidden_size = hidden_size

    def initial_state(self, batch_size: int) -> LSTMState:
        """Zero ``(h, c)``, each ``[B, hidden_size]``, on the module's device and dtype."""
        weight = self.lstm.weight_ih_l0
        zeros = weight.new_zeros(batch_size, self.hidden_size)
        return zeros, zeros.clone()

    def forward(
        self, x: torch.Tensor, state: LSTMState, resets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, LSTMState]:
        """Run the core over a sequence.

        Args:
            x: ``[T, B, input_size]`` inputs.
            state: ``(h, c)``, each ``[B, hidden_size]``, the state before step 0.
            resets: ``[T, B]`` bool, or None for no resets; where True the state of that
                column is zeroed before that step (an episode starts there).
        Returns:
            ``y`` ``[T, B, hidden_size]`` and the state ``(h, c)`` after step ``T-1``.
        """
        if x.dim() != 3 or x.shape[-1] != self.input_size:
            raise ValueError(
                f"LSTMCore expects x of shape [T, B, {self.input_size}], got {tuple(x.shape)}"
            )
        steps, batch = x.shape[:2]
        h, c = state
        expected = (batch, self.hidden_size)
        if tuple(h.shape) != expected or tuple(c.shape) != expected:
            raise ValueError(
                f"LSTMCore expects state (h, c) each of shape {list(expected)}, "
                f"got {tuple(h.shape)} and {tuple(c.shape)}"
            )
        if resets is not None and tuple(resets.shape) != (steps, batch):
            raise ValueError(
                f"LSTMCore expects resets of shape [{steps}, {batch}], got {tuple(resets.shape)}"
            )
        # One fused (cuDNN on a GPU) call per stretch of steps in which no column resets,
        # the state zeroed where a stretch starts; without resets, one call over all T
        # steps. Stepping one step at a time costs a call (and its backward) per step; an
        # R2D2 update on MinAtar spent most of its time there.
        if resets is not None:
            resets = resets.to(torch.bool)
        starts = set() if resets is None else set(
            torch.nonzero(resets.any(dim=1)).flatten().tolist())
        bounds = sorted({0} | starts) + [steps]
        outputs = []
        for start, stop in zip(bounds[:-1], bounds[1:], strict=True):
            if start in starts:
                keep = resets[start].unsqueeze(-1)
                h, c = h.masked_fill(keep, 0.0), c.masked_fill(keep, 0.0)
            y, (h_n, c_n) = self.lstm(x[start:stop], (h.unsqueeze(0), c.unsqueeze(0)))
            h, c = h_n.squeeze(0), c_n.squeeze(0)
            outputs.append(y)
        return (outputs[0] if len(outputs) == 1 else torch.cat(outputs)), (h, c)


def flatten_rnn_weights(model: nn.Module) -> nn.Module:
    """``model`` with each LSTM's weights put back into one contiguous cuDNN buffer. A
    ``copy.deepcopy`` of a CUDA LSTM holds them in separate tensors, which cuDNN then
    compacts on every call, with a warning each time; on the CPU this does nothing."""
    for module in model.modules():
        if isinstance(module, nn.RNNBase):
            module.flatten_parameters()
    return model


class PolicyValueHead(nn.Module):
    """Linear policy logits and a linear state value over shared features.

    The actor-critic output of A3C (Mnih et al. 2016) and IMPALA (Espeholt et al. 2018).
    """

    def __init__(self, in_size: int, num_actions: int) -> None:
        super().__init__()
        self.policy = nn.Linear(in_size, num_actions)
        self.baseline = nn.Linear(in_size, 1)

    def forward(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``features [..., F]`` -> ``(logits [..., A], values [...])``."""
        return self.policy(features), self.baseline(features).squeeze(-1)


class ActorCriticNet(nn.Module):
    """Torso -> optional LSTM core -> policy logits and value (IMPALA, Espeholt et al. 2018).

    Works on time-major ``[T, B, *obs_shape]`` observations; without the LSTM each step
    is independent, with it the core carries state across steps and unrolls. ``torso``
    ``auto`` on images is ``image_torso``, by default IMPALA's shallow model (Fig. 3 left),
    or MinAtar's network on 10x10 images;
    the other arguments are :func:`make_torso`'s and the LSTM's width (256 in Fig. 3).
    """

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        num_actions: int,
        torso: str = "auto",
        hidden_size: int = 256,
        mlp_layers: int = 2,
        use_lstm: bool = False,
        lstm_size: int = 256,
        image_torso: str = "shallow",
    ) -> None:
        super().__init__()
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.num_actions = num_actions
        self.use_lstm = use_lstm
        self.torso, features = make_torso(
            torso, self.obs_shape, hidden_size, mlp_layers, image_torso=image_torso
        )
        self.torso_size = features
        self.core: LSTMCore | None = None
        if use_lstm:
            self.core = LSTMCore(features, lstm_size)
            features = lstm_size
        self.head = PolicyValueHead(features, num_actions)

    def initial_state(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        """``()`` without an LSTM, else zero ``(h, c)`` each ``[B, lstm_size]``."""
        if self.core is None:
            return ()
        return self.core.initial_state(batch_size)

    def forward(
        self,
        observations: torch.Tensor,
        core_state: tuple[torch.Tensor, ...],
        resets: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        """Evaluate the network on a time-major batch.

        Args:
            observations: ``[T, B, *obs_shape]``, raw pixels (uint8) or float vectors.
            core_state: from :meth:`initial_state` or a previous call; ``()`` without LSTM.
            resets: ``[T, B]`` bool or None; where True the core state is zeroed before
                that step. Ignored without an LSTM.
        Returns:
            ``(logits [T, B, A], values [T, B], new_core_state)``.
        """
        if observations.dim() < 2 or tuple(observations.shape[2:]) != self.obs_shape:
            raise ValueError(
                f"ActorCriticNet expects observations of shape [T, B, "
                f"{', '.join(map(str, self.obs_shape))}], got {tuple(observations.shape)}"
            )
        steps, batch = observations.shape[:2]
        features = self.torso(observations.flatten(0, 1)).view(steps, batch, self.torso_size)
        if self.core is None:
            if len(core_state) != 0:
                raise ValueError("ActorCriticNet without LSTM expects core_state ()")
            new_state: tuple[torch.Tensor, ...] = ()
        else:
            if len(core_state) != 2:
                raise ValueError(
                    f"ActorCriticNet with LSTM expects core_state (h, c), got "
                    f"{len(core_state)} tensors"
                )
            h, c = core_state
            features, new_state = self.core(features, (h, c), resets)
        logits, values = self.head(features)
        return logits, values, new_state


def orthogonal_init_(model: ActorCriticNet) -> ActorCriticNet:
    """PPO's initialisation of an actor-critic net, in place: orthogonal weights (Saxe et
    al. 2014) with gain sqrt(2) in the torso's conv and linear layers (ReLU follows them),
    0.01 in the policy head (a near-uniform first policy), 1 in the value head, and zero
    biases. The LSTM core keeps PyTorch's initialisation."""
    def init(layer: nn.Module, gain: float) -> None:
        nn.init.orthogonal_(layer.weight, gain)
        nn.init.zeros_(layer.bias)

    for layer in model.torso.modules():
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            init(layer, math.sqrt(2.0))
    init(model.head.policy, 0.01)
    init(model.head.baseline, 1.0)
    return model


class _ScaleGradient(torch.autograd.Function):
    """Identity forward; the backward multiplies the incoming gradient by ``scale``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


def scale_gradient(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``x`` unchanged forward; the gradient flowing back through it is multiplied by ``scale``.

    Args:
        x: any tensor.
        scale: the gradient's factor.
    Returns:
        a tensor equal to ``x`` (the same values, exactly).
    """
    if scale == 1.0:
        return x
    return _ScaleGradient.apply(x, scale)


class DuelingHead(nn.Module):
    """The dueling streams (Wang et al. 2016, Section 3 and Fig. 1).

    A value stream and an advantage stream, each a hidden layer of ``hidden_size`` (512)
    + ReLU then a linear output (1 and ``num_actions``), combined by eq. 9:
    Q(s, a) = V(s) + A(s, a) - mean_a' A(s, a'). Both streams backpropagate into the
    shared trunk, so the gradient entering it is rescaled by ``grad_scale`` = 1/sqrt(2)
    (Section 4.2); the forward value is unchanged.
    """

    def __init__(
        self,
        in_size: int,
        num_actions: int,
        hidden_size: int = 512,
        grad_scale: float = 1.0 / math.sqrt(2.0),
    ) -> None:
        super().__init__()
        self.value = nn.Sequential(nn.Linear(in_size, hidden_size), nn.ReLU(),
                                   nn.Linear(hidden_size, 1))
        self.advantage = nn.Sequential(nn.Linear(in_size, hidden_size), nn.ReLU(),
                                       nn.Linear(hidden_size, num_actions))
        self.grad_scale = grad_scale

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """``features [..., in_size]`` (the trunk's output) -> ``q [..., A]``."""
        features = scale_gradient(features, self.grad_scale)
        advantages = self.advantage(features)
        return self.value(features) + advantages - advantages.mean(dim=-1, keepdim=True)


class DuelingQNet(nn.Module):
    """Trunk -> dueling head: ``[B, *obs_shape] -> [B, A]`` action values (Wang et al.
    2016, Fig. 1; Ape-X DQN, Horgan et al. 2018).

    On images the streams split right after the convolutions, as in the paper (Section
    4.2: the Nature CNN's three conv layers, then each stream's fc 512): the CNN torso is
    built without its fc, so on 84x84 each stream's first layer reads the 64x7x7 = 3136
    conv features. Vector observations have no convolutions, so the MLP torso is the shared
    trunk before the streams. The gradient entering the trunk is rescaled by 1/sqrt(2)
    (:class:`DuelingHead`).

    Args:
        obs_shape, num_actions: the env's.
        torso, hidden_size, mlp_layers: see :func:`make_torso` (``auto``: Nature CNN on
            images, MinAtar's conv layer on 10x10 images, so each stream reads its
            16x8x8 = 1024 features; MLP on vectors).
        head_size: hidden width of each dueling stream (512).
    """

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        num_actions: int,
        torso: str = "auto",
        hidden_size: int = 256,
        mlp_layers: int = 2,
        head_size: int = 512,
    ) -> None:
        super().__init__()
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.num_actions = num_actions
        self.torso, features = make_torso(
            torso, self.obs_shape, hidden_size, mlp_layers, image_torso="nature", image_fc=False
        )
        self.head = DuelingHead(features, num_actions, head_size)

    def forward(self, observations: torch.Tensor) -> torch.Tensor:
        """``observations [B, *obs_shape]`` -> ``q [B, A]``."""
        if tuple(observations.shape[1:]) != self.obs_shape:
            raise ValueError(
                f"DuelingQNet expects observations of shape [B, "
                f"{', '.join(map(str, self.obs_shape))}], got {tuple(observations.shape)}"
            )
        return self.head(self.torso(observations))


class RecurrentDuelingQNet(nn.Module):
    """Torso -> LSTM -> dueling head over time-major sequences (R2D2, Kapturowski et al.
    2019, Section 3: the Ape-X dueling network with an LSTM after the convolutions, fed
    the torso's features, the previous action one-hot and the previous reward).

    The torso keeps its fc (512 for Nature) before the LSTM, as seed_rl's R2D2 network
    does; the dueling streams split after the LSTM, and :class:`DuelingHead` rescales the
    gradient entering the LSTM output by 1/sqrt(2) (Wang et al. 2016, Section 4.2).

    ``use_lstm=False`` puts a ReLU layer of the same width in the LSTM's place: the
    feed-forward baseline with the same inputs.

    Args:
        obs_shape, num_actions: the env's.
        torso, hidden_size, mlp_layers: see :func:`make_torso`.
        use_lstm: the recurrent core (False: feed-forward).
        lstm_size: LSTM width (R2D2: 512).
        head_size: hidden width of each dueling stream (512).
    """

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        num_actions: int,
        torso: str = "auto",
        hidden_size: int = 256,
        mlp_layers: int = 2,
        use_lstm: bool = True,
        lstm_size: int = 512,
        head_size: int = 512,
    ) -> None:
        super().__init__()
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.num_actions = num_actions
        self.torso, features = make_torso(torso, self.obs_shape, hidden_size, mlp_layers)
        self.torso_size = features
        core_input = features + num_actions + 1
        self.core: LSTMCore | None = LSTMCore(core_input, lstm_size) if use_lstm else None
        self.feed_forward = None if use_lstm else nn.Sequential(
            nn.Linear(core_input, lstm_size), nn.ReLU())
        self.head = DuelingHead(lstm_size, num_actions, head_size)

    def initial_state(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        """Zero ``(h, c)`` each ``[B, lstm_size]``; ``()`` when feed-forward."""
        return () if self.core is None else self.core.initial_state(batch_size)

    def state_from_flat(self, flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Split ``[B, 2 lstm_size]`` (``h`` then ``c``, as stored in replay) into ``(h, c)``."""
        if self.core is None:
            return ()
        h, c = flat.split(self.core.hidden_size, dim=-1)
        return h.contiguous(), c.contiguous()

    def forward(
        self,
        observations: torch.Tensor,
        prev_actions: torch.Tensor,
        prev_rewards: torch.Tensor,
        core_state: tuple[torch.Tensor, ...],
        resets: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Q values of a time-major batch.

        Args:
            observations: ``[T, B, *obs_shape]``.
            prev_actions: ``[T, B]`` int64, the action before each observation; -1: none
                (an episode's first step), which gives an all-zero one-hot.
            prev_rewards: ``[T, B]`` float, the reward before each observation.
            core_state: from :meth:`initial_state`, :meth:`state_from_flat` or a
                previous call.
            resets: ``[T, B]`` bool or None; where True the state is zeroed before that
                step (an episode starts there).
        Returns:
            ``(q [T, B, A], core_state after step T-1)``.
        """
        if observations.dim() < 2 or tuple(observations.shape[2:]) != self.obs_shape:
            raise ValueError(
                f"RecurrentDuelingQNet expects observations of shape [T, B, "
                f"{', '.join(map(str, self.obs_shape))}], got {tuple(observations.shape)}"
            )
        steps, batch = observations.shape[:2]
        features = self.torso(observations.flatten(0, 1)).view(steps, batch, self.torso_size)
        one_hot = F.one_hot(prev_actions.clamp(min=0), self.num_actions).to(features.dtype)
        one_hot = one_hot * (prev_actions >= 0).unsqueeze(-1).to(features.dtype)
        x = torch.cat([features, one_hot, prev_rewards.unsqueeze(-1).to(features.dtype)], dim=-1)
        if self.core is None:
            return self.head(self.feed_forward(x)), ()
        h, c = core_state
        y, state = self.core(x, (h, c), resets)
        return self.head(y), state
