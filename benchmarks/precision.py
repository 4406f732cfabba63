"""Milliseconds per Ape-X learner update in float32 and in bfloat16 (``agent.precision``).

    python benchmarks/precision.py [--batch 128] [--updates 5] [--repeats 3] [--threads 2]

One process, the library's own parts: Ape-X's dueling Nature-CNN network (18 actions,
stored channels-last as a run stores it), its loss with the target pass in the side
thread, TF's centered RMSProp and the :class:`~distrl.training.learner.Learner`, stepped
on a random batch of ``--batch`` Pong transitions (uint8 pixels, as replay holds them).
The two precisions take turns, one block of ``--updates`` updates each per repeat, after
one warm-up update each; a precision's figure is the median over its repeats of the
block's mean. The ratio is bfloat16's over float32's. Whether the CPU multiplies
bfloat16 natively (AVX512-BF16 or AMX, as oneDNN reports it) is printed beside it:
without it autocast emulates bfloat16 and the learner warns at start-up.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.apex import ApexLoss  # noqa: E402
from distrl.nets.models import DuelingQNet  # noqa: E402
from distrl.nets.torsos import channels_last_for_training  # noqa: E402
from distrl.training.learner import (  # noqa: E402
    Learner,
    make_lr_schedule,
    make_optimizer,
    native_bfloat16,
)
from distrl.types import SampleBatch  # noqa: E402

PRECISIONS = ("float32", "bfloat16")


def pong_batch(size: int, actions: int = 18) -> SampleBatch:
    """Random transitions shaped as Ape-X's Pong replay gives them."""
    g = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (2, size, 4, 84, 84), dtype=torch.uint8, generator=g)
    return SampleBatch(
        indices=torch.arange(size), observations=pixels[0],
        actions=torch.randint(0, actions, (size,), generator=g),
        returns=torch.randn(size, generator=g), discounts=torch.full((size,), 0.97),
        weights=torch.rand(size, generator=g), next_observations=pixels[1])


def apex_learner(precision: str) -> Learner:
    torch.manual_seed(0)
    model = channels_last_for_training(DuelingQNet((4, 84, 84), 18))
    optimizer = make_optimizer(model.parameters(), "rmsprop_tf", 0.00025 / 4, alpha=0.95,
                               eps=1.5e-7, centered=True)
    with warnings.catch_warnings():  # the emulation warning: printed once below instead
        warnings.simplefilter("ignore", RuntimeWarning)
        return Learner(model, ApexLoss(model, target_update_interval=2500), optimizer,
                       make_lr_schedule(optimizer, "constant", 1_000_000), 40.0,
                       precision=precision)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=128, help="transitions per update")
    parser.add_argument("--updates", type=int, default=5, help="updates per timed block")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batch = pong_batch(args.batch)
    learners = {p: apex_learner(p) for p in PRECISIONS}
    for learner in learners.values():
        learner.step(batch)
    blocks: dict[str, list[float]] = {p: [] for p in PRECISIONS}
    for _ in range(args.repeats):
        for precision, learner in learners.items():
            start = time.perf_counter()
            for _ in range(args.updates):
                learner.step(batch)
            blocks[precision].append((time.perf_counter() - start) / args.updates * 1e3)
    native = native_bfloat16(torch.device("cpu"))
    print(f"cpu: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{args.threads} threads, native bfloat16: {'yes' if native else 'no'}")
    print(f"Ape-X update, batch {args.batch}, 18 actions: ms per update, median of "
          f"{args.repeats} blocks of {args.updates}")
    medians = {p: statistics.median(b) for p, b in blocks.items()}
    for precision in PRECISIONS:
        runs = ", ".join(f"{v:.0f}" for v in blocks[precision])
        print(f"  {precision:9s} {medians[precision]:8.0f}   ({runs})")
    print(f"  bfloat16 / float32: {medians['bfloat16'] / medians['float32']:.2f}x the time")


if __name__ == "__main__":
    main()
