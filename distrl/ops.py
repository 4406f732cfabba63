"""The compiled ops ``distrl._C``: loaded once, typed wrappers, fake kernels, path choice.

csrc/ declares ``torch.ops.distrl.{sum_tree_update, sum_tree_sample, vtrace}`` and
registers CPU kernels, plus CUDA kernels where the build had CUDA. Each op has a
pure-torch twin (``distrl/rl/vtrace.py``, ``distrl/replay/sum_tree.py``), the *reference*
path. The ``kernel`` setting picks between them:

- ``auto``: the compiled op where it is built for the tensors' device, else the reference;
- ``compiled``: the compiled op, and an error if it is missing;
- ``reference``: always the pure-torch path.

:func:`kernel_summary` gives the one line a run logs to say which path it took.
"""

from __future__ import annotations

import importlib
import os
from typing import Optional

import torch

KERNEL_CHOICES = ("auto", "compiled", "reference")
OPS = ("sum_tree_update", "sum_tree_sample", "vtrace")
BUILD_HINT = "build it with `pip install --no-build-isolation -e .` (needs a C++17 compiler)"


class KernelError(RuntimeError):
    """``kernel=compiled`` was asked for an op that is not built for that device."""


OPT_OUT = "DISTRL_NO_EXTENSION"  # =1: run without distrl._C, on the reference ops


def _load() -> Optional[str]:
    """Import distrl._C (which registers the ops); why not, when it is not loaded.

    Three cases read differently: an explicit opt-out (``DISTRL_NO_EXTENSION=1``), a
    package with no ``_C`` file (never built), and a ``_C`` file that fails to load (a
    bad dlopen, an ABI mismatch with this torch), the one that hides a broken install.
    """
    if os.environ.get(OPT_OUT) == "1":
        return f"disabled by {OPT_OUT}=1"
    try:
        importlib.import_module("distrl._C")
    except ModuleNotFoundError as error:
        if error.name != "distrl._C":
            return f"distrl._C failed to load: {error}"
        return "No module named 'distrl._C' (not built)"
    except (ImportError, OSError) as error:
        return f"distrl._C failed to load: {error}"
    return None


_LOAD_ERROR = _load()
_PATHS: dict[tuple[str, str, str, Optional[str]], bool] = {}  # use_compiled's answers


def has_extension() -> bool:
    """Whether ``distrl._C`` was built and loaded, so ``torch.ops.distrl`` has its ops."""
    return _LOAD_ERROR is None


def extension_error() -> Optional[str]:
    """Why ``distrl._C`` did not load, or None when it did."""
    return _LOAD_ERROR


def extension_opted_out() -> bool:
    """Whether ``DISTRL_NO_EXTENSION=1`` asked to run without ``distrl._C``."""
    return os.environ.get(OPT_OUT) == "1"


def has_kernel(op: str, device: torch.device | str) -> bool:
    """Whether the compiled op ``op`` has a kernel for ``device``'s type (cpu, cuda)."""
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if not has_extension():
        return False
    key = {"cpu": "CPU", "cuda": "CUDA"}.get(torch.device(device).type)
    return key is not None and torch._C._dispatch_has_kernel_for_dispatch_key(
        f"distrl::{op}", key
    )


def check_kernel_choice(kernel: str) -> None:
    if kernel not in KERNEL_CHOICES:
        raise ValueError(f"kernel must be one of {'|'.join(KERNEL_CHOICES)}, got {kernel!r}")


def _missing(op: str, device_type: str) -> str:
    if not has_extension():
        return f"kernel=compiled but distrl._C is not loaded ({_LOAD_ERROR}); {BUILD_HINT}"
    return (
        f"kernel=compiled but distrl._C has no {device_type} kernel for {op} (was it built "
        f"without CUDA?); rebuild it where torch and the CUDA toolkit are present, or set "
        f"kernel=auto|reference"
    )


def use_compiled(kernel: str, op: str, device: torch.device | str) -> bool:
    """Whether ``op`` on ``device`` runs compiled under the setting ``kernel``.

    Raises:
        ValueError: ``kernel`` is not auto|compiled|reference.
        KernelError: ``kernel == "compiled"`` and the op is not built for ``device``.
    """
    device_type = device.type if isinstance(device, torch.device) else torch.device(device).type
    key = (kernel, op, device_type, _LOAD_ERROR)
    cached = _PATHS.get(key)  # asked on every V-trace call: keep it off the hot path
    if cached is not None:
        return cached
    check_kernel_choice(kernel)
    if kernel == "reference":
        return False
    available = has_kernel(op, device_type)
    if kernel == "compiled" and not available:
        raise KernelError(_missing(op, device_type))
    _PATHS[key] = available
    return available


def kernel_summary(kernel: str, device: torch.device | str) -> str:
    """The one log line that names the path ``kernel`` takes on ``device`` for every op.

    Raises the same errors as :func:`use_compiled`, so calling it at the start of a run
    refuses ``kernel=compiled`` before anything is written.
    """
    paths = {op: use_compiled(kernel, op, device) for op in OPS}
    device_type = torch.device(device).type
    if all(paths.values()):
        return f"kernel={kernel}: compiled distrl._C ops on {device_type} ({', '.join(OPS)})"
    if not any(paths.values()):
        why = "as asked" if kernel == "reference" else (
            f"distrl._C not loaded: {_LOAD_ERROR}; {BUILD_HINT}"
            if not has_extension()
            else f"distrl._C has no {device_type} kernels"
        )
        return f"kernel={kernel}: pure-torch reference ops on {device_type} ({why})"
    parts = [f"{op}={'compiled' if on else 'reference'}" for op, on in paths.items()]
    return f"kernel={kernel} on {device_type}: {', '.join(parts)}"


def _require(op: str) -> None:
    if not has_extension():
        raise KernelError(f"distrl::{op} needs distrl._C, which is not loaded "
                          f"({_LOAD_ERROR}); {BUILD_HINT}")


# ------------------------------------------------------------------ typed wrappers


def sum_tree_update(
    tree: torch.Tensor, capacity: int, indices: torch.Tensor, priorities: torch.Tensor
) -> None:
    """Set leaves ``indices`` of ``tree`` to ``priorities`` in place (last write wins).

    Args:
      tree: [2, width] 8-ary sum tree of ``capacity`` leaves (row 0 sums, row 1 minima;
        layout in csrc/sum_tree.h and :func:`distrl.replay.sum_tree.tree_layout`).
      capacity: number of leaves.
      indices: [N] int64 leaf indices in ``[0, capacity)``.
      priorities: [N] finite, non-negative, the tree's dtype.

    The CPU kernel checks indices and priorities; the CUDA kernel does not (a check would
    synchronise), so validate first, as :meth:`distrl.replay.sum_tree.SumTree.update` does.
    """
    _require("sum_tree_update")
    torch.ops.distrl.sum_tree_update(tree, capacity, indices, priorities)


def sum_tree_sample(
    tree: torch.Tensor, capacity: int, uniforms: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Stratified proportional draws (Schaul et al. 2016, Appendix B.2.1).

    Draw ``i`` of ``N`` takes the leaf holding mass ``(i + uniforms[i]) * total / N``.

    Args:
      tree: [2, width] sum tree of ``capacity`` leaves with a positive total.
      capacity: number of leaves.
      uniforms: [N] in ``[0, 1)``, the tree's dtype.

    Returns:
      ``(indices [N] int64, probabilities [N])`` with ``P(i) = p_i / total``. The CPU
      kernel raises on a total that is zero or infinite; the CUDA kernel returns index -1.
    """
    _require("sum_tree_sample")
    return torch.ops.distrl.sum_tree_sample(tree, capacity, uniforms)


def vtrace(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    clip_rho_threshold: Optional[float],
    clip_c_threshold: Optional[float],
    clip_pg_rho_threshold: Optional[float],
    lambda_: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets and advantages (IMPALA eq. 1, Section 4.2, Remark 1), compiled.

    Same contract as :func:`distrl.rl.vtrace.from_importance_weights`; inputs ``[T, B]``
    time-major, ``bootstrap_value`` ``[B]``. Returns ``(vs, pg_advantages)``, ``[T, B]``.
    The op has no autograd formula: its outputs are targets, so pass detached tensors.
    """
    _require("vtrace")
    return torch.ops.distrl.vtrace(
        log_rhos, discounts, rewards, values, bootstrap_value,
        clip_rho_threshold, clip_c_threshold, clip_pg_rho_threshold, lambda_,
    )


# ------------------------------------------------------------------ fake kernels

if has_extension():

    @torch.library.register_fake("distrl::sum_tree_update")
    def _sum_tree_update_fake(tree: torch.Tensor, capacity: int, indices: torch.Tensor,
                              priorities: torch.Tensor) -> None:
        torch._check(indices.dim() == 1 and priorities.shape == indices.shape,
                     lambda: "sum_tree_update: indices and priorities must be [N]")

    @torch.library.register_fake("distrl::sum_tree_sample")
    def _sum_tree_sample_fake(
        tree: torch.Tensor, capacity: int, uniforms: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        torch._check(uniforms.dim() == 1, lambda: "sum_tree_sample: uniforms must be [N]")
        return (uniforms.new_empty(uniforms.shape, dtype=torch.int64),
                uniforms.new_empty(uniforms.shape, dtype=tree.dtype))

    @torch.library.register_fake("distrl::vtrace")
    def _vtrace_fake(
        log_rhos: torch.Tensor, discounts: torch.Tensor, rewards: torch.Tensor,
        values: torch.Tensor, bootstrap_value: torch.Tensor,
        clip_rho_threshold: Optional[float], clip_c_threshold: Optional[float],
        clip_pg_rho_threshold: Optional[float], lambda_: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        torch._check(log_rhos.dim() == 2, lambda: "vtrace: log_rhos must be [T, B]")
        return torch.empty_like(log_rhos), torch.empty_like(log_rhos)
