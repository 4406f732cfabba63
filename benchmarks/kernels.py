"""Microseconds per call of the compiled ops next to their references, on CPU and CUDA.

    python benchmarks/kernels.py [--repeats 5] [--calls 300] [--warmup 30] [--json FILE]

Single thread (``torch.set_num_threads(1)``). After ``--warmup`` calls each, the
methods of a case take turns in blocks of 25 calls until each has made ``--calls``
calls (side by side, same process); a method's figure is the median over ``--repeats``
of its per-repeat median. Ratios are
taken between those figures. Sum-tree calls cycle through 1,000 pre-drawn random
batches, so the tree is not cache-hot from reusing one batch.

Cases (their targets in brackets):
- sum tree, capacity 2^20, batch 512, float32: sample and update with the compiled op,
  the public ``SumTree`` methods (random draws and checks included), distrl's torch
  reference path, a vectorised numpy sum tree (sum only, and sum + min as ours), and
  cpprb / TorchRL's C++ segment tree when they are installed [sample >= 4x and update
  >= 1.5x faster than numpy; sample+update >= 2.5x faster than TorchRL and cpprb];
- V-trace T=80 B=32 and T=20 B=1024, float32: the op through ``torch.ops`` (dispatch
  included), the public ``vtrace.from_importance_weights``, distrl's reference path and
  a TorchBeast-style loop over time in torch [>= 30x and >= 5x faster than the loop];
- on CUDA, when present: V-trace T=80 B=256 and sampling 4096 from 2^22 leaves, op vs
  the torch reference on the same GPU (each call synchronised);
- last, with freed memory kept as runs keep it (``distributed.keep_freed_memory``): an
  R2D2 Atari batch's observations gathered from the replay's frame ring (32 sequences of
  125 steps of 4 stacked 84x84 uint8 frames, 113 MB, from 60,000 frames),
  ``distrl.replay.storage.gather_rows`` against the advanced indexing it replaced; one
  block of 25 calls per repeat.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from distrl import ops  # noqa: E402
from distrl.replay.storage import gather_rows  # noqa: E402
from distrl.replay.sum_tree import (  # noqa: E402
    SumTree,
    empty_tree,
    sample_reference,
    update_reference,
)
from distrl.rl import vtrace  # noqa: E402
from distrl.run import malloc  # noqa: E402

POOL = 1000  # pre-drawn random batches per sum-tree method


# ------------------------------------------------------------------ references


class NumpySumTree:
    """The usual vectorised numpy sum tree: power-of-two layout, the batch descends one
    level per numpy op, parents recomputed level by level (optionally a min tree too)."""

    def __init__(self, capacity: int, dtype=np.float32, with_min: bool = False) -> None:
        self.leaves = 1 << (capacity - 1).bit_length()
        self.depth = self.leaves.bit_length() - 1
        self.sums = np.zeros(2 * self.leaves, dtype)
        self.mins = np.full(2 * self.leaves, np.inf, dtype) if with_min else None

    def update(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        nodes = indices + self.leaves
        self.sums[nodes] = priorities
        if self.mins is not None:
            self.mins[nodes] = np.where(priorities > 0, priorities, np.inf)
        for _ in range(self.depth):
            nodes = np.unique(nodes >> 1)
            self.sums[nodes] = self.sums[2 * nodes] + self.sums[2 * nodes + 1]
            if self.mins is not None:
                self.mins[nodes] = np.minimum(self.mins[2 * nodes], self.mins[2 * nodes + 1])

    def sample(self, uniforms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        total = float(self.sums[1])
        batch = uniforms.shape[0]
        mass = (np.arange(batch) + uniforms) * (total / batch)
        node = np.ones(batch, np.int64)
        for _ in range(self.depth):
            left = self.sums[2 * node]
            go_right = mass >= left
            mass = mass - left * go_right
            node = 2 * node + go_right
        return node - self.leaves, self.sums[node] / total


def vtrace_python_loop(
    log_rhos: torch.Tensor, discounts: torch.Tensor, rewards: torch.Tensor,
    values: torch.Tensor, bootstrap_value: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace the way TorchBeast-style PyTorch code computes it: tensor ops per step and
    a Python loop over time (rho-bar = c-bar = pg-rho-bar = 1)."""
    with torch.no_grad():
        rhos = torch.exp(log_rhos)
        clipped_rhos = torch.clamp(rhos, max=1.0)
        cs = torch.clamp(rhos, max=1.0)
        values_t_plus_1 = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
        deltas = clipped_rhos * (rewards + discounts * values_t_plus_1 - values)
        acc = torch.zeros_like(bootstrap_value)
        result = []
        for t in range(discounts.shape[0] - 1, -1, -1):
            acc = deltas[t] + discounts[t] * cs[t] * acc
            result.append(acc)
        result.reverse()
        vs = torch.add(torch.stack(result), values)
        vs_t_plus_1 = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
        pg_advantages = torch.clamp(rhos, max=1.0) * (rewards + discounts * vs_t_plus_1 - values)
    return vs, pg_advantages


# ------------------------------------------------------------------ timing


def time_calls(fn: Callable[[], object], calls: int, sync: bool) -> list[float]:
    """Microseconds of each of ``calls`` calls of ``fn`` (CUDA synchronised after each)."""
    times = []
    for _ in range(calls):
        start = time.perf_counter_ns()
        fn()
        if sync:
            torch.cuda.synchronize()
        times.append((time.perf_counter_ns() - start) / 1e3)
    return times


BLOCK = 25  # calls of one method before the next method's turn


def measure(methods: dict[str, Callable[[], object]], args: argparse.Namespace,
            sync: bool = False) -> dict[str, float]:
    """Median over repeats of each method's median call time.

    Within a repeat the methods take turns in blocks of ``BLOCK`` calls, so a slow spell
    of this shared machine (a noisy neighbour, a busy memory bus) falls on all of them
    alike and the ratios stay side by side.
    """
    for fn in methods.values():
        for _ in range(args.warmup):
            fn()
    runs: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(args.repeats):
        times: dict[str, list[float]] = {name: [] for name in methods}
        for _ in range(0, args.calls, BLOCK):
            for name, fn in methods.items():
                times[name] += time_calls(fn, BLOCK, sync)
        for name in methods:
            runs[name].append(statistics.median(times[name]))
    return {name: statistics.median(values) for name, values in runs.items()}


def cycler(pool: list) -> Callable[[], object]:
    state = {"i": -1}

    def next_item() -> object:
        state["i"] = (state["i"] + 1) % len(pool)
        return pool[state["i"]]

    return next_item


# ------------------------------------------------------------------ sum tree


def optional_peers(capacity: int, priorities: np.ndarray, batch: int,
                   index_pool: list, priority_pool: list) -> tuple[dict, dict, dict[str, str]]:
    """cpprb and TorchRL sum trees filled like ours, when they import; else a note why not."""
    samplers, updaters, notes = {}, {}, {}
    try:
        import cpprb

        buffer = cpprb.PrioritizedReplayBuffer(capacity, {"i": {"dtype": np.int8}},
                                               alpha=1.0, eps=0.0)
        chunk = 65536
        for start in range(0, capacity, chunk):
            buffer.add(i=np.zeros(min(chunk, capacity - start), np.int8),
                       priorities=priorities[start:start + chunk])
        next_i, next_p = cycler([i.numpy() for i in index_pool]), cycler(
            [p.numpy() for p in priority_pool])
        samplers["cpprb (incl. IS weights + gather)"] = lambda: buffer.sample(batch, beta=0.4)
        updaters["cpprb (incl. IS weights + gather)"] = lambda: buffer.update_priorities(
            next_i(), next_p())
        notes["cpprb"] = f"cpprb {importlib.metadata.version('cpprb')}"
    except ImportError as error:
        notes["cpprb"] = f"not measured ({error})"
    try:
        import torchrl
        from torchrl._torchrl import MinSegmentTreeFp32, SumSegmentTreeFp32

        sums, mins = SumSegmentTreeFp32(capacity), MinSegmentTreeFp32(capacity)
        all_indices, values = torch.arange(capacity), torch.from_numpy(priorities)
        sums.update(all_indices, values)
        mins.update(all_indices, values)
        next_i, next_p = cycler(index_pool), cycler(priority_pool)

        def torchrl_sample() -> object:
            return sums.scan_lower_bound(torch.rand(batch) * sums.query(0, capacity))

        def torchrl_update() -> None:
            indices, new = next_i(), next_p()
            sums.update(indices, new)
            mins.update(indices, new)

        samplers["TorchRL segment trees (sum + min)"] = torchrl_sample
        updaters["TorchRL segment trees (sum + min)"] = torchrl_update
        notes["torchrl"] = f"torchrl {torchrl.__version__}"
    except (ImportError, TypeError) as error:  # TypeError: the classes are None when unbuilt
        notes["torchrl"] = f"not measured ({error})"
    return samplers, updaters, notes


def bench_sum_tree_cpu(args: argparse.Namespace) -> dict:
    capacity, batch = 2**20, 512
    g = torch.Generator().manual_seed(0)
    priorities = torch.rand(capacity, generator=g) + 1e-3
    index_pool = [torch.randint(0, capacity, (batch,), generator=g) for _ in range(POOL)]
    priority_pool = [torch.rand(batch, generator=g) + 1e-3 for _ in range(POOL)]
    uniform_pool = [torch.rand(batch, generator=g) for _ in range(POOL)]
    everything = torch.arange(capacity)

    compiled_tree, reference_tree = empty_tree(capacity), empty_tree(capacity)
    update_reference(compiled_tree, capacity, everything, priorities)
    update_reference(reference_tree, capacity, everything, priorities)
    public = SumTree(capacity, kernel="compiled")
    public.update(everything, priorities)
    numpy_sum = NumpySumTree(capacity)
    numpy_both = NumpySumTree(capacity, with_min=True)
    for tree in (numpy_sum, numpy_both):
        tree.update(everything.numpy(), priorities.numpy())

    # all paths draw the same leaves from the same tree and uniforms
    u = uniform_pool[0]
    want = ops.sum_tree_sample(compiled_tree, capacity, u)[0]
    assert torch.equal(sample_reference(compiled_tree, capacity, u)[0], want)
    # The binary numpy tree rounds its float32 partial sums differently from our 8-ary
    # one, so a draw within round-off of a leaf edge may take the neighbouring leaf.
    agree = np.mean(numpy_sum.sample(u.numpy().astype(np.float64))[0] == want.numpy())
    assert agree > 0.9, agree

    def numpy_pools() -> tuple:
        return (cycler([i.numpy() for i in index_pool]), cycler([p.numpy() for p in priority_pool]),
                cycler([x.numpy().astype(np.float64) for x in uniform_pool]))

    nu = cycler(uniform_pool)
    ni, np_ = cycler(index_pool), cycler(priority_pool)
    ri, rp, ru = cycler(index_pool), cycler(priority_pool), cycler(uniform_pool)
    pi, pp = cycler(index_pool), cycler(priority_pool)
    si, sp, su = numpy_pools()
    bi, bp, bu = numpy_pools()
    samplers = {
        "distrl op (torch.ops.distrl.sum_tree_sample)": lambda: ops.sum_tree_sample(
            compiled_tree, capacity, nu()),
        "distrl SumTree.sample (rand + checks + op)": lambda: public.sample(batch),
        "distrl torch reference": lambda: sample_reference(reference_tree, capacity, ru()),
        "numpy vectorised (sum)": lambda: numpy_sum.sample(su()),
        "numpy vectorised (sum + min)": lambda: numpy_both.sample(bu()),
    }
    updaters = {
        "distrl op (torch.ops.distrl.sum_tree_update)": lambda: ops.sum_tree_update(
            compiled_tree, capacity, ni(), np_()),
        "distrl SumTree.update (checks + op)": lambda: public.update(pi(), pp()),
        "distrl torch reference": lambda: update_reference(reference_tree, capacity, ri(), rp()),
        "numpy vectorised (sum)": lambda: numpy_sum.update(si(), sp()),
        "numpy vectorised (sum + min)": lambda: numpy_both.update(bi(), bp()),
    }
    peer_samplers, peer_updaters, notes = optional_peers(
        capacity, priorities.numpy(), batch, index_pool, priority_pool)
    samplers.update(peer_samplers)
    updaters.update(peer_updaters)
    return {"case": f"sum tree cpu float32, capacity 2^20, batch {batch}",
            "sample_us": measure(samplers, args), "update_us": measure(updaters, args),
            "peers": notes}


# ------------------------------------------------------------------ V-trace


def vtrace_inputs(steps: int, batch: int, device: str) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    tensors = [
        torch.randn(steps, batch, generator=g) * 0.5,
        0.99 * (torch.rand(steps, batch, generator=g) > 0.01).float(),
        torch.randn(steps, batch, generator=g),
        torch.randn(steps, batch, generator=g),
        torch.randn(batch, generator=g),
    ]
    return [t.to(device) for t in tensors]


def bench_vtrace(steps: int, batch: int, device: str, args: argparse.Namespace) -> dict:
    inputs = vtrace_inputs(steps, batch, device)
    op_vs, op_pg = ops.vtrace(*inputs, 1.0, 1.0, 1.0, 1.0)
    loop_vs, loop_pg = vtrace_python_loop(*inputs)
    torch.testing.assert_close(op_vs, loop_vs, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(op_pg, loop_pg, rtol=1e-5, atol=1e-5)
    methods = {
        "distrl op (torch.ops.distrl.vtrace)": lambda: ops.vtrace(*inputs, 1.0, 1.0, 1.0, 1.0),
        "distrl from_importance_weights(kernel=compiled)": lambda: vtrace.from_importance_weights(
            *inputs, kernel="compiled"),
        "distrl torch reference (kernel=reference)": lambda: vtrace.from_importance_weights(
            *inputs, kernel="reference"),
        "TorchBeast-style loop over time": lambda: vtrace_python_loop(*inputs),
    }
    return {"case": f"vtrace {device} float32, T={steps} B={batch}",
            "us": measure(methods, args, sync=device == "cuda")}


def bench_sum_tree_cuda(args: argparse.Namespace) -> dict:
    capacity, batch = 2**22, 4096
    g = torch.Generator().manual_seed(0)
    priorities = (torch.rand(capacity, generator=g) + 1e-3).cuda()
    tree = empty_tree(capacity, device="cuda")
    update_reference(tree, capacity, torch.arange(capacity, device="cuda"), priorities)
    uniforms = [torch.rand(batch, generator=g).cuda() for _ in range(100)]
    indices = [torch.randint(0, capacity, (batch,), generator=g).cuda() for _ in range(100)]
    new = [(torch.rand(batch, generator=g) + 1e-3).cuda() for _ in range(100)]
    assert torch.equal(ops.sum_tree_sample(tree, capacity, uniforms[0])[0],
                       sample_reference(tree, capacity, uniforms[0])[0])
    cu, ru = cycler(uniforms), cycler(uniforms)
    ci, cp, ri, rp = cycler(indices), cycler(new), cycler(indices), cycler(new)
    reference_tree = tree.clone()
    samplers = {"distrl op": lambda: ops.sum_tree_sample(tree, capacity, cu()),
                "distrl torch reference": lambda: sample_reference(reference_tree, capacity, ru())}
    updaters = {"distrl op": lambda: ops.sum_tree_update(tree, capacity, ci(), cp()),
                "distrl torch reference": lambda: update_reference(reference_tree, capacity,
                                                                   ri(), rp())}
    return {"case": f"sum tree cuda float32, capacity 2^22, batch {batch}",
            "sample_us": measure(samplers, args, sync=True),
            "update_us": measure(updaters, args, sync=True)}


# ------------------------------------------------------------------ replay gather


def bench_replay_gather(args: argparse.Namespace) -> dict:
    g = torch.Generator().manual_seed(0)
    ring = 60_000
    frames = torch.randint(0, 256, (ring, 84, 84), dtype=torch.uint8, generator=g)
    starts = torch.randint(0, ring - 130, (32, 1), generator=g)
    # each step's stack is 4 consecutive frames of its sequence, as the writer stores them
    ids = (starts + torch.arange(125))[:, :, None] + torch.arange(4)
    assert torch.equal(gather_rows(frames, ids), frames[ids])
    methods = {
        "distrl gather_rows (index_select of whole rows)": lambda: gather_rows(frames, ids),
        "advanced indexing frames[ids] (before)": lambda: frames[ids],
    }
    few = argparse.Namespace(**{**vars(args), "calls": BLOCK, "warmup": min(args.warmup, 2)})
    return {"case": "replay gather cpu, R2D2 batch of 32 x 125 steps x 4 frames of 84x84 uint8",
            "us": measure(methods, few)}


# ------------------------------------------------------------------ report


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def print_table(title: str, figures: dict[str, float], baseline: str | None = None) -> None:
    print(f"  {title}")
    for name, us in figures.items():
        ratio = f"  {figures[baseline] / us:6.1f}x vs {baseline}" if baseline else ""
        print(f"    {us:10.1f} us  {name}{ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    for name in ("repeats", "calls", "warmup"):
        if getattr(args, name) < (0 if name == "warmup" else 1):
            parser.error(f"--{name} must be positive")
    if not ops.has_extension():
        sys.exit(f"benchmarks/kernels.py needs distrl._C: {ops.extension_error()}; "
                 f"{ops.BUILD_HINT}")
    torch.set_num_threads(1)
    cuda = torch.cuda.is_available() and ops.has_kernel("vtrace", "cuda")
    hardware = {
        "cpu": cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__,
        "numpy": np.__version__, "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name() if cuda else None,
    }
    print(f"hardware: {hardware}")
    print(f"path: {ops.kernel_summary('compiled', 'cpu')}")
    if cuda:
        print(f"path: {ops.kernel_summary('compiled', 'cuda')}")
    print(f"median over {args.repeats} repeats of the median of {args.calls} calls "
          f"(after {args.warmup} warm-up calls)\n")

    results = {"hardware": hardware, "repeats": args.repeats, "calls": args.calls, "cases": []}
    tree = bench_sum_tree_cpu(args)
    results["cases"].append(tree)
    print(tree["case"], "|", ", ".join(tree["peers"].values()))
    print_table("sample", tree["sample_us"], "numpy vectorised (sum)")
    print_table("update", tree["update_us"], "numpy vectorised (sum)")
    ours = "distrl op (torch.ops.distrl.sum_tree_"
    both = tree["sample_us"][ours + "sample)"] + tree["update_us"][ours + "update)"]
    print(f"  sample + update: distrl op {both:.1f} us")
    for peer in tree["sample_us"]:
        if peer.startswith(("cpprb", "TorchRL")):
            theirs = tree["sample_us"][peer] + tree["update_us"][peer]
            print(f"  sample + update: {peer} {theirs:.1f} us -> {theirs / both:.1f}x")
    for steps, batch in [(80, 32), (20, 1024)]:
        case = bench_vtrace(steps, batch, "cpu", args)
        results["cases"].append(case)
        print(f"\n{case['case']}")
        print_table("per call", case["us"], "TorchBeast-style loop over time")
    if cuda:
        case = bench_vtrace(80, 256, "cuda", args)
        results["cases"].append(case)
        print(f"\n{case['case']}")
        print_table("per call", case["us"], "distrl torch reference (kernel=reference)")
        gpu_tree = bench_sum_tree_cuda(args)
        results["cases"].append(gpu_tree)
        print(f"\n{gpu_tree['case']}")
        print_table("sample", gpu_tree["sample_us"], "distrl torch reference")
        print_table("update", gpu_tree["update_us"], "distrl torch reference")
    else:
        print("\nno CUDA device (or no CUDA kernels in distrl._C): GPU cases skipped")
    print(f"\n{malloc.apply(True)}: freed memory kept, as a run keeps it")
    case = bench_replay_gather(args)
    results["cases"].append(case)
    print(case["case"])
    print_table("per call", case["us"], "advanced indexing frames[ids] (before)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
