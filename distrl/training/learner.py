"""The generic learner step: batch -> loss_fn -> backward -> clip -> optimizer step -> publish.

No algorithm lives here: an agent passes ``loss_fn(model, batch) -> (loss, metrics,
priorities)``; a loss with a target network may also offer its target pass
(:class:`TargetPassLoss`), which the step then runs beside the online pass. Also the
optimizers and learning-rate schedules the papers use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from distrl.config import PRECISIONS
from distrl.nets.side_thread import SideThread
from distrl.rl.optimizers import AdamTF, RMSpropTF
from distrl.transport.weights import WeightStore
from distrl.validation import ConfigError

LossFn = Callable[[nn.Module, Any], tuple[torch.Tensor, dict[str, float], Any]]


@runtime_checkable
class TargetPassLoss(Protocol):
    """A loss whose target network's pass over a batch needs nothing of the online pass
    (Ape-X's ``Q_target(s_{t+n})``, R2D2's target unroll), so the learner step may run it
    beside the online pass (:class:`~distrl.nets.side_thread.SideThread`). Called without
    ``target``, the loss runs that pass itself, in the caller's thread."""

    def target_pass(self, model: nn.Module, batch: Any) -> Callable[[], Any]:
        """The no-grad target computation for ``batch`` (the target synced first if due)."""

    def __call__(self, model: nn.Module, batch: Any, target: Future | None = None
                 ) -> tuple[torch.Tensor, dict[str, float], Any]:
        """``(loss, metrics, priorities)``; ``target``: the pending target pass."""


class Diverged(RuntimeError):
    """Training diverged: too many non-finite updates in a row, or non-finite weights.
    Raised before anything non-finite is published or checkpointed."""


def make_optimizer(
    params: Iterable[torch.nn.Parameter],
    name: str,
    lr: float,
    alpha: float = 0.99,
    eps: float = 0.01,
    momentum: float = 0.0,
    centered: bool = False,
    beta1: float = 0.9,
    beta2: float = 0.999,
) -> torch.optim.Optimizer:
    """The optimizer ``name`` over ``params``.

    ``rmsprop_tf``: TensorFlow 1's RMSProp (:class:`distrl.rl.optimizers.RMSpropTF`), the one
    the papers' constants are for (IMPALA Table G.1: decay 0.99, eps 0.01, momentum 0;
    Ape-X: centered, decay 0.95, eps 1.5e-7). ``rmsprop``: ``torch.optim.RMSprop``, whose
    mean square starts at 0 and whose eps sits outside the root, so the same constants
    give other updates. ``adam_tf``: TensorFlow's Adam (:class:`distrl.rl.optimizers.AdamTF`),
    the one R2D2's constants are for (Table 2: lr 1e-4, eps 1e-3), eps added to the root of
    the uncorrected second moment. ``adam``: ``torch.optim.Adam``, eps added to the root of
    the bias-corrected one, so the same eps damps the first few thousand updates less.
    ``alpha`` is RMSProp's decay; ``beta1``/``beta2`` are Adam's only.
    """
    if name == "rmsprop_tf":
        return RMSpropTF(
            params, lr=lr, alpha=alpha, eps=eps, momentum=momentum, centered=centered
        )
    if name == "rmsprop":
        return torch.optim.RMSprop(
            params, lr=lr, alpha=alpha, eps=eps, momentum=momentum, centered=centered
        )
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=(beta1, beta2), eps=eps)
    if name == "adam_tf":
        return AdamTF(params, lr=lr, betas=(beta1, beta2), eps=eps)
    raise ValueError(
        f"optimizer.name must be one of rmsprop_tf, rmsprop, adam, adam_tf; got {name!r}"
    )


def make_lr_schedule(
    optimizer: torch.optim.Optimizer, schedule: str, total_updates: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """``linear``: lr decays linearly to 0 over ``total_updates`` (IMPALA); ``constant``."""
    if schedule == "linear":
        total = max(int(total_updates), 1)
        return torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda update: max(1.0 - update / total, 0.0)
        )
    if schedule == "constant":
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda update: 1.0)
    raise ValueError(f"optimizer.lr_schedule must be one of linear, constant; got {schedule!r}")


def rebase_lr_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR, lr: float) -> None:
    """After a checkpoint restore: the schedule's base lr becomes ``lr`` (this run's
    ``agent.optimizer.lr``) and every group's lr its value at the restored step under this
    run's schedule (so a new ``total_frames`` or lr takes effect from the next update).

    The optimizer's and scheduler's state dicts hold the old base lr and the old current lr;
    the schedule's lambda is this run's (torch does not store a lambda), so recomputing
    gives an uninterrupted run's lr when nothing changed."""
    if not isinstance(scheduler, torch.optim.lr_scheduler.LambdaLR):
        raise TypeError(f"rebase_lr_schedule takes a LambdaLR, got {type(scheduler).__name__}")
    groups = scheduler.optimizer.param_groups
    scheduler.base_lrs = [lr] * len(groups)
    for group, factor in zip(groups, scheduler.lr_lambdas, strict=True):
        group["initial_lr"] = lr
        group["lr"] = lr * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in groups]  # what get_last_lr() reports


def resolve_device(name: str, local_rank: int | None = None) -> torch.device:
    """The learner's device for ``agent.device``.

    ``auto``: the GPU when torch sees one, else the CPU; ``cuda``: a GPU, refused when
    there is none. Under torchrun (``local_rank`` given) both mean ``cuda:LOCAL_RANK``, each
    rank on its host a GPU of its own; ``cuda:N`` names one GPU; ``cpu``.
    """
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        if name == "auto":
            return torch.device("cpu")
        raise ConfigError(f"agent.device is {name!r} but torch sees no CUDA device; "
                          "use auto or cpu")
    count = torch.cuda.device_count()
    if name.startswith("cuda:"):
        index = int(name.removeprefix("cuda:"))
        if index >= count:
            raise ConfigError(f"agent.device is {name!r} but torch sees {count} CUDA devices "
                              f"(cuda:0 .. cuda:{count - 1})")
        return torch.device("cuda", index)
    index = torch.cuda.current_device() if local_rank is None else local_rank
    if index >= count:
        raise ConfigError(f"agent.device is {name!r} but this rank's LOCAL_RANK {index} has no "
                          f"GPU of its own (torch sees {count}); run at most {count} ranks per "
                          "host or set agent.device=cpu")
    return torch.device("cuda", index)


def _map_tensors(batch: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``batch`` with ``fn`` applied to every tensor in it (dataclass fields, tuples,
    lists, dicts); anything else unchanged."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return dataclasses.replace(batch, **{
            f.name: _map_tensors(getattr(batch, f.name), fn)
            for f in dataclasses.fields(batch) if f.init})
    if isinstance(batch, (tuple, list)):
        return type(batch)(_map_tensors(item, fn) for item in batch)
    if isinstance(batch, dict):
        return {key: _map_tensors(value, fn) for key, value in batch.items()}
    return batch


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor in it on ``device`` (non-blocking: a copy from pinned
    memory overlaps with the work queued before it)."""
    return _map_tensors(batch, lambda t: t.to(device, non_blocking=True))


def pin_for(batch: Any, device: torch.device) -> Any:
    """``batch`` in page-locked memory when it is bound for a GPU, so the copy there runs
    asynchronously; unchanged for a CPU learner, which would pay the copy for nothing."""
    if device.type != "cuda":
        return batch
    return _map_tensors(batch, lambda t: t if t.device.type != "cpu" else t.pin_memory())


def native_bfloat16(device: torch.device) -> bool:
    """Whether ``device`` multiplies bfloat16 in hardware: a GPU that reports it, or a CPU
    on which oneDNN finds AVX512-BF16 or AMX. Elsewhere autocast still runs, emulated."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(supported()) if supported is not None else False


def warn_if_emulated(precision: str, device: torch.device) -> None:
    """A bfloat16 learner on hardware without bfloat16 products runs, but many times
    slower than float32 (Ape-X's Pong update took 3.1x float32's time on an AVX2-only CPU,
    ``benchmarks/precision.py``): say so at start-up, naming the setting."""
    if precision == "bfloat16" and not native_bfloat16(device):
        warnings.warn(
            f"agent.precision=bfloat16: this {device.type} has no native bfloat16 products "
            "(AVX512-BF16 or AMX on a CPU), so they are emulated and the learner runs many "
            "times slower than with agent.precision=float32", RuntimeWarning, stacklevel=3)


def precision_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """Where a learner computes its loss: ``float32`` as is; ``bfloat16`` under
    ``torch.autocast``, so convolutions, matrix products and the LSTM take bfloat16 inputs
    and accumulate in float32 (oneDNN with AVX512-BF16 or AMX on a CPU, tensor cores on a
    GPU) while the weights, their gradients, the optimizer and the loss's reductions stay
    float32. That is close to a TPU's default arithmetic for float32 products (one
    bfloat16 pass, float32 accumulation; google/jax#1856), which SEED's TPU learners ran
    with (Espeholt et al. 2020); one difference: autocast also rounds each layer's output
    to bfloat16, where a TPU keeps it float32 until the next product reads it."""
    if precision not in PRECISIONS:
        raise ConfigError(f"agent.precision must be one of {', '.join(PRECISIONS)}; "
                          f"got {precision!r}")
    if precision == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)


class Learner:
    """Applies ``passes`` gradient updates per batch (one unless an agent reuses its
    samples) and publishes the new weights after each.

    Args:
        model: the network being trained.
        loss_fn: ``(model, batch) -> (loss, metrics, priorities)``.
        optimizer, scheduler: stepped once per update.
        max_grad_norm: global-norm gradient clipping threshold.
        weights: where new versions are published for actors, or None.
        sync_gradients: called after backward, before clipping, to average gradients
            across learner ranks (:class:`distrl.transport.distributed.GradientAverager`); its
            ``last_s`` is logged as ``learner/allreduce_s``.
        device: the model's device; each batch moves there (None: it is already there).
        max_skipped_updates: the divergence guard. An update whose loss or gradient norm is
            not finite is skipped (no optimizer step, nothing published, its priorities
            not written back) and counted as ``learner/skipped_updates``; this many in a
            row raise :class:`Diverged`. Weights made non-finite by a step raise at once.
        optimizer_path: where the optimizer's settings sit in the config, for messages.
        passes: gradient updates per batch, each recomputing the loss with the weights
            the previous one left (IMPALA's ``agent.passes``: sample reuse, V-trace
            correcting for the policy the earlier passes moved). Each pass counts as an
            update (weight version, lr schedule); the metrics are the last pass's.
        precision: ``agent.precision``, the loss's arithmetic (:func:`precision_context`);
            the backward pass follows the forward's, the optimizer step is float32.
        target_beside: run a :class:`TargetPassLoss`'s target pass in a worker thread
            beside the online pass (a one-thread CPU learner only; elsewhere it runs in
            this thread, see :mod:`distrl.nets.side_thread`); the numbers are the same.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        max_grad_norm: float,
        weights: WeightStore | None = None,
        sync_gradients: Any = None,
        device: torch.device | None = None,
        max_skipped_updates: int = 10,
        optimizer_path: str = "agent.optimizer",
        passes: int = 1,
        precision: str = "float32",
        target_beside: bool = True,
    ):
        if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
            raise ValueError(f"Learner: passes must be a whole number >= 1, got {passes!r}")
        self.model = model
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.max_grad_norm = max_grad_norm
        self.weights = weights
        self.sync_gradients = sync_gradients
        self.device = device  # where the model is: batches move there, priorities back
        self.updates = 0
        self.max_skipped_updates = max_skipped_updates
        self.optimizer_path = optimizer_path  # the config path the messages name
        self.skipped_in_a_row = self.skipped_updates = 0
        self.passes = passes
        self.precision = precision
        self.side = SideThread("learner-target", enabled=target_beside)
        where = device or torch.device("cpu")
        precision_context(precision, where)  # refuses a bad name now
        warn_if_emulated(precision, where)

    @property
    def version(self) -> int:
        """The weight version: one per update."""
        return self.updates

    def step(self, batch: Any) -> tuple[dict[str, float], Any]:
        """``passes`` updates on ``batch``. Returns (metrics, priorities from loss_fn) of the
        last; priorities are None when that update was skipped for a non-finite loss or
        gradient norm. ``learner/step_s`` times all the passes."""
        start = time.perf_counter()
        self.model.train()
        if self.device is not None and self.device.type != "cpu":
            batch = to_device(batch, self.device)
        for _ in range(self.passes - 1):
            self._update(batch)
        metrics, priorities = self._update(batch)
        metrics["learner/step_s"] = time.perf_counter() - start
        if self.sync_gradients is not None:
            metrics["learner/allreduce_s"] = self.sync_gradients.last_s
        return metrics, priorities

    def _update(self, batch: Any) -> tuple[dict[str, float], Any]:
        """One gradient update on ``batch`` (already on the model's device)."""
        with precision_context(self.precision, self.device or torch.device("cpu")):
            if isinstance(self.loss_fn, TargetPassLoss):
                target = self.side.submit(self.loss_fn.target_pass(self.model, batch),
                                          self.device or torch.device("cpu"))
                loss, metrics, priorities = self.loss_fn(self.model, batch, target)
            else:
                loss, metrics, priorities = self.loss_fn(self.model, batch)
        if isinstance(priorities, torch.Tensor):
            priorities = priorities.detach().cpu()  # the replay's sum tree is on the CPU
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.sync_gradients is not None:
            self.sync_gradients(self.model)
        grad_norm = nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        metrics = dict(metrics)
        metrics["learner/lr"] = self.optimizer.param_groups[0]["lr"]
        loss_value, norm_value = float(loss.detach()), float(grad_norm)
        skipped = not (math.isfinite(loss_value) and math.isfinite(norm_value))
        if skipped:
            self._skip(loss_value, norm_value)
            priorities = None
        else:
            self.skipped_in_a_row = 0
            self.optimizer.step()
            self._refuse_non_finite_weights()
            self.scheduler.step()
            self.updates += 1
            if self.weights is not None:
                self.weights.publish(self.model, self.updates)
        metrics["learner/skipped_updates"] = float(skipped)
        metrics["learner/loss"] = loss_value
        metrics["learner/grad_norm"] = norm_value
        return metrics, priorities

    def _skip(self, loss: float, grad_norm: float) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.skipped_in_a_row += 1
        self.skipped_updates += 1
        if self.skipped_in_a_row >= self.max_skipped_updates:
            lr = self.optimizer.param_groups[0]["lr"]
            raise Diverged(
                f"training diverged: {self.skipped_in_a_row} updates in a row had a non-finite "
                f"loss or gradient norm (last: loss {loss:g}, grad norm {grad_norm:g}, lr "
                f"{lr:g}) and were skipped; {self.optimizer_path}.max_skipped_updates="
                f"{self.max_skipped_updates}. Lower {self.optimizer_path}.lr; the newest "
                "checkpoint holds the last good weights")

    def _refuse_non_finite_weights(self) -> None:
        norms = torch._foreach_norm([p.detach() for p in self.model.parameters()])
        if not bool(torch.isfinite(torch.stack(norms)).all()):
            raise Diverged(
                f"training diverged: update {self.updates + 1} made the weights non-finite "
                f"(lr {self.optimizer.param_groups[0]['lr']:g}); nothing was published or "
                f"checkpointed from it. Lower {self.optimizer_path}.lr; the newest checkpoint "
                "holds the last good weights")

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.updates = int(state["updates"])
