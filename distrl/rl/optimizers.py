"""TensorFlow's optimizers, as TensorFlow ran them: the ones whose constants the papers publish.

IMPALA (Espeholt et al. 2018, Table G.1: decay 0.99, epsilon 0.01, momentum 0) and Ape-X
(Horgan et al. 2018, Appendix: centered, decay 0.95, epsilon 1.5e-7) trained with
``tf.train.RMSPropOptimizer``; R2D2 (Kapturowski et al. 2019, Table 2: lr 1e-4, epsilon 1e-3)
with TensorFlow's Adam. ``torch.optim.RMSprop`` and ``torch.optim.Adam`` given the same
numbers are different optimizers; :class:`RMSpropTF` and :class:`AdamTF` are TensorFlow's, so
the papers' constants mean what the papers meant.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch


class _ForeachOptimizer(torch.optim.Optimizer):
    """Steps each parameter group as one batch of ``_foreach`` kernels per (device, dtype),
    as torch's foreach optimizers do; subclasses write the update (``_update``)."""

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One update of every parameter that has a gradient; returns ``closure()`` if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        name = type(self).__name__
        for group in self.param_groups:
            buckets: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
            for param in group["params"]:
                if param.grad is None:
                    continue
                if param.grad.is_sparse:
                    raise RuntimeError(f"{name} does not support sparse gradients")
                if torch.is_complex(param):
                    raise RuntimeError(f"{name} does not support complex parameters")
                buckets.setdefault((param.device, param.dtype), []).append(param)
            for params in buckets.values():
                self._update(params, group)
        return loss

    def _update(self, params: list[torch.Tensor], group: dict[str, Any]) -> None:
        raise NotImplementedError


class RMSpropTF(_ForeachOptimizer):
    """RMSProp with TensorFlow 1's update (``tf.train.RMSPropOptimizer``, kernels
    ``ApplyRMSProp`` and ``ApplyCenteredRMSProp``), per element of each parameter:

        ms  <- alpha * ms + (1 - alpha) * g^2            ms starts at ONE
        mg  <- alpha * mg + (1 - alpha) * g              centered only; starts at zero
        mom <- momentum * mom + lr * g / sqrt(ms + eps)  (centered: sqrt(ms - mg^2 + eps))
        var <- var - mom                                 mom starts at zero

    ``alpha`` is TensorFlow's ``decay`` (``rho``). State keys follow torch's RMSprop:
    ``square_avg`` is ``ms``, ``grad_avg`` is ``mg``, ``momentum_buffer`` is ``mom``.

    Why not ``torch.optim.RMSprop``: torch starts ``ms`` at zero and adds ``eps`` outside
    the root, ``g / (sqrt(ms) + eps)``. Its first step is ``lr * g / (sqrt(1 - alpha)|g| +
    eps)``, about ``lr * sign(g) / 0.11`` (roughly 9x TensorFlow's ``lr * g / sqrt(1.01)``
    for |g| ~ 1) with IMPALA's constants and ``lr * sign(g) * 4.5`` with Ape-X's, and the
    early steps stay large while ``ms`` warms up. TensorFlow's ``ms = 1`` start and
    ``eps`` inside the root make the first updates SGD-sized, and ``sqrt(eps)`` (0.1 for
    IMPALA) rather than ``eps`` (0.01) floors the denominator when gradients are small.

    As in TensorFlow, with ``momentum == 0`` no momentum buffer is kept (``var -= lr * g /
    sqrt(...)`` is the same update), and the centered denominator is not clamped.

    Args:
      params: parameters or parameter groups.
      lr: learning rate, >= 0.
      alpha: decay of the running averages, in [0, 1] (TensorFlow's ``decay``).
      eps: added to the mean square inside the square root, >= 0.
      momentum: momentum factor, >= 0.
      centered: divide by the root of the variance estimate ``ms - mg^2`` instead of ``ms``.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-10,
        momentum: float = 0.0,
        centered: bool = False,
    ) -> None:
        _check_range("RMSpropTF", "lr", lr, lower=0.0)
        _check_range("RMSpropTF", "alpha", alpha, lower=0.0, upper=1.0)
        _check_range("RMSpropTF", "eps", eps, lower=0.0)
        _check_range("RMSpropTF", "momentum", momentum, lower=0.0)
        if not isinstance(centered, bool):
            raise ValueError(f"RMSpropTF: centered must be a bool; got {centered!r}")
        defaults = dict(lr=lr, alpha=alpha, eps=eps, momentum=momentum, centered=centered)
        super().__init__(params, defaults)

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("momentum", 0.0)
            group.setdefault("centered", False)

    def _update(self, params: list[torch.Tensor], group: dict[str, Any]) -> None:
        lr, alpha, eps = group["lr"], group["alpha"], group["eps"]
        momentum, centered = group["momentum"], group["centered"]
        grads = [param.grad for param in params]
        states = [self.state[param] for param in params]
        for param, state in zip(params, states, strict=True):
            if "square_avg" not in state:
                state["square_avg"] = torch.ones_like(param, memory_format=torch.preserve_format)
            if centered and "grad_avg" not in state:
                state["grad_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            if momentum > 0 and "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(
                    param, memory_format=torch.preserve_format
                )

        square_avgs = [state["square_avg"] for state in states]
        torch._foreach_mul_(square_avgs, alpha)
        torch._foreach_addcmul_(square_avgs, grads, grads, value=1.0 - alpha)
        if centered:
            grad_avgs = [state["grad_avg"] for state in states]
            torch._foreach_mul_(grad_avgs, alpha)
            torch._foreach_add_(grad_avgs, grads, alpha=1.0 - alpha)
            denoms = torch._foreach_addcmul(square_avgs, grad_avgs, grad_avgs, value=-1.0)
            torch._foreach_add_(denoms, eps)
        else:
            denoms = torch._foreach_add(square_avgs, eps)
        torch._foreach_sqrt_(denoms)

        if momentum > 0:
            buffers = [state["momentum_buffer"] for state in states]
            torch._foreach_mul_(buffers, momentum)
            torch._foreach_addcdiv_(buffers, grads, denoms, value=lr)
            torch._foreach_sub_(params, buffers)
        else:
            torch._foreach_addcdiv_(params, grads, denoms, value=-lr)


class AdamTF(_ForeachOptimizer):
    """Adam with TensorFlow's update (``tf.compat.v1.train.AdamOptimizer``, kernel
    ``ApplyAdam``, and ``tf.keras.optimizers.Adam``: the same update), per element of each
    parameter, with ``t`` the parameter's update count:

        t    <- t + 1
        lr_t <- lr * sqrt(1 - beta2^t) / (1 - beta1^t)
        m    <- beta1 * m + (1 - beta1) * g              m and v start at zero
        v    <- beta2 * v + (1 - beta2) * g^2
        var  <- var - lr_t * m / (sqrt(v) + eps)

    This is the "epsilon hat" form given just before Section 2.1 of Kingma and Ba (2014).
    State keys and meanings follow torch's Adam: ``step`` (t, a float32 CPU scalar tensor),
    ``exp_avg`` (m) and ``exp_avg_sq`` (v).

    Why not ``torch.optim.Adam``: torch divides the bias-corrected moments,
    ``lr * m_hat / (sqrt(v_hat) + eps)`` with ``v_hat = v / (1 - beta2^t)``, which is
    TensorFlow's update with ``eps * sqrt(1 - beta2^t)`` in place of ``eps``. So TensorFlow's
    ``eps`` acts as ``eps / sqrt(1 - beta2^t)`` would in torch: about 31.6 * eps at the first
    step with beta2 0.999, 3.2 * eps at step 100, within 3% of ``eps`` only after about 3000
    steps. The first step is ``lr * g / (|g| + eps / sqrt(1 - beta2))`` against torch's
    ``lr * g / (|g| + eps)``; with R2D2's lr 1e-4 and eps 1e-3 at a gradient of 1e-3 that is
    3.07e-6 against torch's 5e-5, 16x smaller. The larger effective ``eps`` damps the early
    updates of parameters with small gradients; once ``beta2^t`` is negligible the two agree.

    TensorFlow counts ``t`` once per optimizer; here, as in torch, each parameter counts its
    own updates. The two agree whenever every parameter has a gradient at every step.

    Args:
      params: parameters or parameter groups.
      lr: learning rate, >= 0.
      betas: decays (beta1, beta2) of the first and second moment averages, each in [0, 1).
      eps: added to ``sqrt(v)`` in the denominator, >= 0 (TensorFlow's ``epsilon``).
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        _check_range("AdamTF", "lr", lr, lower=0.0)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"AdamTF: betas must be a pair (beta1, beta2); got {betas!r}")
        for index, beta in enumerate(betas):
            _check_range("AdamTF", f"betas[{index}]", beta, lower=0.0, upper=1.0,
                         upper_open=True)
        _check_range("AdamTF", "eps", eps, lower=0.0)
        defaults = dict(lr=lr, betas=(float(betas[0]), float(betas[1])), eps=eps)
        super().__init__(params, defaults)

    def _update(self, params: list[torch.Tensor], group: dict[str, Any]) -> None:
        lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
        grads = [param.grad for param in params]
        states = [self.state[param] for param in params]
        for param, state in zip(params, states, strict=True):
            if "step" not in state:
                # On the CPU, as torch keeps a non-capturable Adam's step: reading it for
                # lr_t then costs no device synchronisation.
                state["step"] = torch.tensor(0.0, dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(
                    param, memory_format=torch.preserve_format
                )

        steps = [state["step"] for state in states]
        torch._foreach_add_(steps, 1.0)
        exp_avgs = [state["exp_avg"] for state in states]
        exp_avg_sqs = [state["exp_avg_sq"] for state in states]
        torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1.0 - beta2)

        step_sizes = [
            -lr * math.sqrt(1.0 - beta2 ** step.item()) / (1.0 - beta1 ** step.item())
            for step in steps
        ]
        denoms = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_add_(denoms, eps)
        torch._foreach_addcdiv_(params, exp_avgs, denoms, step_sizes)


def _check_range(
    owner: str,
    name: str,
    value: Any,
    lower: float,
    upper: float | None = None,
    upper_open: bool = False,
) -> None:
    """Raise ValueError naming ``owner`` and ``name`` unless ``value`` is a real number in
    [lower, upper] (or [lower, upper) with ``upper_open``)."""
    if upper is None:
        allowed = f">= {lower}"
    else:
        allowed = f"in [{lower}, {upper}{')' if upper_open else ']'}"
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    # Written so that NaN fails too.
    below_upper = upper is None or (value < upper if upper_open else value <= upper)
    if not (is_number and value >= lower and below_upper):
        raise ValueError(f"{owner}: {name} must be {allowed}; got {value!r}")
