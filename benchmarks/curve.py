"""Print a run's raw episode-return curve from its tensorboard events, binned by frames.

    python benchmarks/curve.py runs/<run name> [--bins 10]
"""

from __future__ import annotations

import argparse

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--bins", type=int, default=10)
    args = parser.parse_args()
    events = EventAccumulator(args.run_dir, size_guidance={"scalars": 0})
    events.Reload()
    points = [(e.step, e.value) for e in events.Scalars("episode/return")]
    if not points:
        raise SystemExit(f"no episode/return scalars in {args.run_dir}")
    last = max(step for step, _ in points)
    width = max(last // args.bins, 1)
    print(f"{len(points)} episodes up to {last:,} frames")
    print("| frames | episodes | mean raw return | min | max |")
    print("|---|---|---|---|---|")
    for b in range(args.bins + 1):
        chunk = [v for s, v in points if b * width <= s < (b + 1) * width]
        if chunk:
            print(f"| {b * width:,}-{(b + 1) * width:,} | {len(chunk)} | "
                  f"{sum(chunk) / len(chunk):.2f} | {min(chunk):.0f} | {max(chunk):.0f} |")


if __name__ == "__main__":
    main()
