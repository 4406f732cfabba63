"""SideThread: a one-thread CPU learner's computation runs in the named worker thread
without gradient, its error reaches the caller; disabled, off the CPU or with several
intra-op threads it runs at once in the caller."""

from __future__ import annotations

import threading

import pytest
import torch

from distrl.nets.side_thread import SideThread


def where_and_grad() -> tuple[str, bool]:
    return threading.current_thread().name, torch.is_grad_enabled()


def test_cpu_work_of_a_one_thread_learner_runs_in_the_worker_without_gradient(
        intra_op_threads):
    intra_op_threads(1)
    name, grad = SideThread("probe").submit(where_and_grad, torch.device("cpu")).result()
    assert name.startswith("probe") and not grad


@pytest.mark.parametrize("enabled, device, threads", [
    (False, "cpu", 1), (True, "cuda", 1), (True, "cpu", 2)])
def test_disabled_off_the_cpu_or_with_several_threads_runs_now_in_the_caller(
        intra_op_threads, enabled, device, threads):
    intra_op_threads(threads)
    pending = SideThread("probe", enabled=enabled).submit(where_and_grad, torch.device(device))
    assert pending.done()
    assert pending.result() == (threading.current_thread().name, False)


def test_an_error_in_the_worker_reaches_the_caller(intra_op_threads):
    intra_op_threads(1)

    def fails() -> None:
        raise ValueError("target pass failed")

    with pytest.raises(ValueError, match="target pass failed"):
        SideThread("probe").submit(fails, torch.device("cpu")).result()


def test_the_workers_matmul_sums_as_the_callers_bit_for_bit(intra_op_threads):
    """torch's thread count reaches MKL per thread: a worker that did not set it ran this
    linear layer on every core, in another summation order (it differed in the last bit)."""
    intra_op_threads(1)
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(128, 1024, generator=g), torch.randn(128, 1024, generator=g),
               torch.randn(128, generator=g))

    def linear() -> torch.Tensor:
        return torch.nn.functional.linear(x, w, b)

    assert torch.equal(SideThread("probe").submit(linear, torch.device("cpu")).result(),
                       linear())
