"""Time the LSTM core over sequences with episode resets: forward and backward of
:class:`distrl.nets.models.LSTMCore` (one fused call per stretch between resets) against the
one-call-per-step loop it replaced, side by side in one process, on an R2D2 learner
batch (MinAtar preset: 32 sequences of 60 steps, an LSTM of 128 over the 128 torso
features, the 6-action one-hot and the reward).

    python benchmarks/lstm_resets.py [--repeats 30] [--episode-lengths 30 100 300]

Resets are drawn as episode ends of the given mean length; prints, per length, the
median milliseconds of each path and their ratio (medians over interleaved repeats).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from distrl.nets.models import LSTMCore


def per_step(core: LSTMCore, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor],
             resets: torch.Tensor) -> torch.Tensor:
    """The previous path: one LSTM call per step, the state zeroed where a column resets."""
    h, c = state
    outputs = []
    for t in range(x.shape[0]):
        keep = resets[t].unsqueeze(-1)
        h, c = h.masked_fill(keep, 0.0), c.masked_fill(keep, 0.0)
        y, (h_n, c_n) = core.lstm(x[t:t + 1], (h.unsqueeze(0), c.unsqueeze(0)))
        h, c = h_n.squeeze(0), c_n.squeeze(0)
        outputs.append(y)
    return torch.cat(outputs)


def time_ms(fn, x: torch.Tensor) -> float:
    """Milliseconds of one forward and backward of ``fn(x)``."""
    x = x.detach().requires_grad_(True)
    start = time.perf_counter()
    fn(x).sum().backward()
    return (time.perf_counter() - start) * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--episode-lengths", type=int, nargs="+", default=[30, 100, 300])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--inputs", type=int, default=128 + 6 + 1)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    core = LSTMCore(args.inputs, args.hidden)
    state = core.initial_state(args.batch)
    x = torch.randn(args.steps, args.batch, args.inputs)
    print(f"LSTMCore forward + backward, [T={args.steps}, B={args.batch}] x {args.inputs} -> "
          f"{args.hidden}, {args.threads} thread(s), median of {args.repeats} interleaved repeats")
    print("| mean episode length | steps with a reset | per-step loop ms | stretches ms | ratio |")
    print("|---|---|---|---|---|")
    for length in args.episode_lengths:
        resets = torch.rand(args.steps, args.batch) < 1.0 / length
        stretch = lambda xs, r=resets: core(xs, state, r)[0]  # noqa: E731
        loop = lambda xs, r=resets: per_step(core, xs, state, r)  # noqa: E731
        for fn in (stretch, loop):  # warm up both
            time_ms(fn, x)
        old, new = [], []
        for _ in range(args.repeats):
            old.append(time_ms(loop, x))
            new.append(time_ms(stretch, x))
        o, n = statistics.median(old), statistics.median(new)
        print(f"| {length} | {int(resets.any(1).sum())} of {args.steps} | {o:.1f} | {n:.1f} | "
              f"{o / n:.2f}x |")


if __name__ == "__main__":
    main()
