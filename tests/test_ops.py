"""Tests for distrl/ops.py and the compiled V-trace op (csrc/vtrace.cpp, csrc/cuda/vtrace.cu).

The op is checked against the naive eq. 1 sum in tests/reference.py and against the
vectorised torch path of distrl/rl/vtrace.py, on CPU and (where present) CUDA, plus
``torch.library.opcheck`` and its error messages. The sum-tree ops are tested in
test_sum_tree.py. Also here: how ``kernel=auto|compiled|reference`` resolves, including
when the extension is missing.
"""

from __future__ import annotations

import importlib.machinery
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from marks import needs_extension
from reference import vtrace_naive

from distrl import ops
from distrl.config import KERNELS
from distrl.rl import vtrace

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
    ]),
]

# (clip_rho_threshold, clip_c_threshold, clip_pg_rho_threshold, lambda_)
SETTINGS = {
    "paper": (1.0, 1.0, 1.0, 1.0),
    "none": (None, None, None, 1.0),
    "mixed": (2.0, 0.5, None, 0.9),
    "lambda0": (1.0, 1.0, 1.0, 0.0),
}


def _inputs(seq_len: int, batch: int, dtype: torch.dtype, device: str, seed: int = 0) -> list:
    """Random V-trace inputs with episode ends mid-trace (zero discounts)."""
    g = torch.Generator().manual_seed(seed)
    not_done = (torch.rand(seq_len, batch, generator=g) > 0.2).double()
    tensors = [
        torch.randn(seq_len, batch, generator=g, dtype=torch.float64),  # log_rhos
        0.99 * not_done,  # discounts
        torch.randn(seq_len, batch, generator=g, dtype=torch.float64),  # rewards
        torch.randn(seq_len, batch, generator=g, dtype=torch.float64),  # values
        torch.randn(batch, generator=g, dtype=torch.float64),  # bootstrap_value
    ]
    return [t.to(dtype=dtype, device=device) for t in tensors]


def _naive(inputs: list, setting: tuple) -> tuple:
    rho, c, pg, lambda_ = setting
    return vtrace_naive(*(t.double().cpu().numpy() for t in inputs), clip_rho_threshold=rho,
                        clip_c_threshold=c, clip_pg_rho_threshold=pg, lambda_=lambda_)


def _compiled(inputs: list, setting: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    return ops.vtrace(*inputs, *setting)


def _reference(inputs: list, setting: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    rho, c, pg, lambda_ = setting
    out = vtrace.from_importance_weights(*inputs, rho, c, pg, lambda_, kernel="reference")
    return out.vs, out.pg_advantages


# ------------------------------------------------------------------ V-trace op: values


@needs_extension
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("shape", [(1, 1), (1, 7), (13, 5), (80, 32)], ids=str)
def test_vtrace_op_matches_naive_and_reference_float64(device, setting, shape):
    inputs = _inputs(*shape, torch.float64, device)
    vs, pg = _compiled(inputs, SETTINGS[setting])
    want_vs, want_pg = _naive(inputs, SETTINGS[setting])
    torch.testing.assert_close(vs.cpu(), torch.from_numpy(want_vs), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(pg.cpu(), torch.from_numpy(want_pg), rtol=1e-10, atol=1e-10)
    ref_vs, ref_pg = _reference(inputs, SETTINGS[setting])
    torch.testing.assert_close(vs, ref_vs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(pg, ref_pg, rtol=1e-12, atol=1e-12)


@needs_extension
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("setting", ["paper", "mixed"])
def test_vtrace_op_float32_matches_reference(device, setting):
    inputs = _inputs(20, 64, torch.float32, device, seed=1)
    vs, pg = _compiled(inputs, SETTINGS[setting])
    assert vs.dtype == pg.dtype == torch.float32
    ref_vs, ref_pg = _reference(inputs, SETTINGS[setting])
    torch.testing.assert_close(vs, ref_vs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pg, ref_pg, rtol=1e-5, atol=1e-5)
    want_vs, _ = _naive(inputs, SETTINGS[setting])
    torch.testing.assert_close(vs.cpu().double(), torch.from_numpy(want_vs), rtol=1e-4, atol=1e-4)


@needs_extension
@pytest.mark.parametrize("device", DEVICES)
def test_vtrace_op_all_discounts_zero_is_one_step(device):
    """With gamma_t = 0 everywhere each step stands alone: v_s = V + rho_s (r_s - V),
    and the advantage is rho_pg_s (r_s - V(x_s)) (eq. 1 with every trace cut)."""
    log_rhos, _, rewards, values, bootstrap = _inputs(6, 4, torch.float64, device, seed=2)
    discounts = torch.zeros_like(rewards)
    vs, pg = ops.vtrace(log_rhos, discounts, rewards, values, bootstrap, 1.0, 1.0, 1.0, 1.0)
    rho = log_rhos.exp().clamp(max=1.0)
    torch.testing.assert_close(vs, values + rho * (rewards - values), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(pg, rho * (rewards - values), rtol=1e-12, atol=1e-12)


@needs_extension
def test_vtrace_op_hand_computed():
    """T=2, B=1, on-policy (rho = c = 1), gamma = 0.5: the 2-step bootstrapped return.

    v_1 = r_1 + 0.5 * 10 = 2 + 5 = 7; v_0 = r_0 + 0.5 * v_1 = 1 + 3.5 = 4.5;
    advantages r_s + gamma v_{s+1} - V(x_s): 4.5 - 3 = 1.5 and 7 - 4 = 3."""
    t = torch.tensor
    vs, pg = ops.vtrace(t([[0.0], [0.0]]), t([[0.5], [0.5]]), t([[1.0], [2.0]]),
                        t([[3.0], [4.0]]), t([10.0]), 1.0, 1.0, 1.0, 1.0)
    assert vs.flatten().tolist() == [4.5, 7.0]
    assert pg.flatten().tolist() == [1.5, 3.0]


@needs_extension
def test_vtrace_op_non_contiguous_and_threads():
    """Transposed (non-contiguous) inputs and a multi-threaded split over columns give
    the reference's numbers."""
    inputs = _inputs(8, 4096, torch.float64, "cpu", seed=3)
    strided = [t.t().contiguous().t() if t.dim() == 2 else t for t in inputs]
    assert not strided[0].is_contiguous()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        vs, pg = _compiled(strided, SETTINGS["mixed"])
    finally:
        torch.set_num_threads(threads)
    ref_vs, ref_pg = _reference(inputs, SETTINGS["mixed"])
    torch.testing.assert_close(vs, ref_vs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(pg, ref_pg, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ V-trace op: contract


@needs_extension
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("setting", ["paper", "none"])
def test_vtrace_opcheck(device, setting):
    for shape in [(1, 1), (5, 3)]:
        inputs = _inputs(*shape, torch.float32, device, seed=4)
        torch.library.opcheck(torch.ops.distrl.vtrace.default, (*inputs, *SETTINGS[setting]))


@needs_extension
@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: a.__setitem__(4, a[4][:-1]), r"bootstrap_value must have shape \[B\]"),
        (lambda a: a.__setitem__(2, a[2][1:]), r"rewards must have shape \[T, B\]"),
        (lambda a: a.__setitem__(3, a[3].double()), "values must have the dtype of log_rhos"),
        (lambda a: a.__setitem__(0, a[0][0]), r"log_rhos must have shape \[T, B\]"),
        (lambda a: a.__setitem__(0, a[0].half()), "log_rhos must be float32 or float64"),
        (lambda a: a.__setitem__(5, -1.0), "clip_rho_threshold must be positive or None"),
        (lambda a: a.__setitem__(8, 1.5), r"lambda_ must be in \[0, 1\]"),
    ],
)
def test_vtrace_op_errors_name_the_argument(change, message):
    args = [*_inputs(4, 3, torch.float32, "cpu"), *SETTINGS["paper"]]
    change(args)
    with pytest.raises(RuntimeError, match=message):
        torch.ops.distrl.vtrace(*args)


# ------------------------------------------------------------------ kernel path choice


def test_kernel_choice_is_validated():
    refusal = "^" + re.escape("kernel must be one of auto|compiled|reference, got 'fast'") + "$"
    with pytest.raises(ValueError, match=refusal):
        ops.use_compiled("fast", "vtrace", "cpu")
    with pytest.raises(ValueError, match=refusal):
        vtrace.from_importance_weights(*_inputs(2, 2, torch.float32, "cpu"), kernel="fast")
    with pytest.raises(ValueError, match="op must be one of"):
        ops.has_kernel("vtrace2", "cpu")


def test_config_offers_the_kernel_choices_of_ops():
    """config.py may not import ops (same layer), so it keeps its own copy of the tuple."""
    assert KERNELS == ops.KERNEL_CHOICES


def test_reference_is_always_reference():
    assert ops.use_compiled("reference", "vtrace", "cpu") is False
    assert ops.kernel_summary("reference", "cpu") == (
        "kernel=reference: pure-torch reference ops on cpu (as asked)"
    )


@needs_extension
def test_auto_and_compiled_take_the_built_cpu_kernels():
    for op in ops.OPS:
        assert ops.has_kernel(op, "cpu")
        assert ops.use_compiled("auto", op, "cpu") and ops.use_compiled("compiled", op, "cpu")
    assert ops.kernel_summary("auto", "cpu") == (
        "kernel=auto: compiled distrl._C ops on cpu (sum_tree_update, sum_tree_sample, vtrace)"
    )


@needs_extension
def test_a_device_with_some_kernels_gets_each_op_named_by_its_path(monkeypatch):
    """A build with a cuda V-trace and no cuda sum tree: auto names each op's path, and
    compiled refuses the first op without a kernel."""
    monkeypatch.setattr(ops, "_PATHS", {})
    monkeypatch.setattr(ops, "has_kernel", lambda op, device: op == "vtrace")
    assert ops.kernel_summary("auto", "cuda") == (
        "kernel=auto on cuda: sum_tree_update=reference, sum_tree_sample=reference, "
        "vtrace=compiled")
    with pytest.raises(ops.KernelError, match="has no cuda kernel for sum_tree_update"):
        ops.kernel_summary("compiled", "cuda")


@pytest.fixture
def without_extension(monkeypatch):
    """Pretend distrl._C failed to load, as on a machine where the build was skipped."""
    monkeypatch.setattr(ops, "_LOAD_ERROR", "No module named 'distrl._C'")


def test_missing_extension_auto_says_reference_and_why(without_extension):
    assert not ops.has_extension()
    assert ops.use_compiled("auto", "vtrace", "cpu") is False
    line = ops.kernel_summary("auto", "cpu")
    assert line.startswith("kernel=auto: pure-torch reference ops on cpu (distrl._C not loaded")
    assert "pip install --no-build-isolation -e ." in line
    # and auto V-trace still computes, on the reference path
    inputs = _inputs(3, 2, torch.float64, "cpu")
    got = vtrace.from_importance_weights(*inputs)
    want_vs, _ = _naive(inputs, SETTINGS["paper"])
    torch.testing.assert_close(got.vs, torch.from_numpy(want_vs), rtol=1e-10, atol=1e-10)


def test_missing_extension_compiled_is_refused(without_extension):
    message = r"kernel=compiled but distrl._C is not loaded \(No module named 'distrl._C'\)"
    with pytest.raises(ops.KernelError, match=message):
        ops.kernel_summary("compiled", "cpu")
    with pytest.raises(ops.KernelError, match=message):
        vtrace.from_importance_weights(*_inputs(2, 2, torch.float32, "cpu"), kernel="compiled")
    with pytest.raises(ops.KernelError, match="distrl::vtrace needs distrl._C"):
        ops.vtrace(*_inputs(2, 2, torch.float32, "cpu"), *SETTINGS["paper"])


@needs_extension
@pytest.mark.skipif(ops.has_kernel("vtrace", "cuda"), reason="this build has CUDA kernels")
def test_compiled_without_cuda_kernels_is_refused_for_cuda():
    with pytest.raises(ops.KernelError, match="has no cuda kernel for vtrace"):
        ops.use_compiled("compiled", "vtrace", "cuda")
    assert ops.use_compiled("auto", "vtrace", "cuda") is False
    assert "distrl._C has no cuda kernels" in ops.kernel_summary("auto", "cuda")


def _suite_copy(tmp_path, so_bytes: bytes):
    """distrl's Python files and tests/conftest.py in ``tmp_path``, with ``so_bytes`` as
    the extension's file, and one trivial test beside the conftest."""
    package = Path(ops.__file__).parent
    shutil.copytree(package, tmp_path / "distrl",
                    ignore=shutil.ignore_patterns("__pycache__", "_C*"))
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    (tmp_path / "distrl" / f"_C{suffix}").write_bytes(so_bytes)
    (tmp_path / "tests").mkdir()
    shutil.copy(Path(__file__).parent / "conftest.py", tmp_path / "tests" / "conftest.py")
    (tmp_path / "tests" / "test_one.py").write_text("def test_one():\n    assert True\n")


def _pytest_in(tmp_path, **env_extra: str):
    env = {name: value for name, value in os.environ.items() if name != ops.OPT_OUT}
    env.update(PYTHONPATH=str(tmp_path), **env_extra)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )


def test_a_corrupted_extension_stops_the_suite_naming_the_load_error(tmp_path):
    _suite_copy(tmp_path, so_bytes=b"not an ELF file")
    result = _pytest_in(tmp_path)
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "distrl._C did not load: distrl._C failed to load:" in out
    assert "invalid ELF header" in out or "file too short" in out
    # The explicit opt-out runs the suite without it.
    opted_out = _pytest_in(tmp_path, DISTRL_NO_EXTENSION="1")
    assert opted_out.returncode == 0, opted_out.stdout + opted_out.stderr
    assert "1 passed" in opted_out.stdout

