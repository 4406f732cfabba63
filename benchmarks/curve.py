"""A run's raw episode-return curve from its tensorboard events, binned by frames: a
Markdown table on stdout and a PNG beside it.

    python benchmarks/curve.py runs/<run name> [--bins 10] [--png out.png]

The PNG (default ``<run dir>/curve.png``) has frames on x and the raw return of each
bin's episodes: their mean as a line, the 25-75% quantiles as a dark band and min-max as
a light one, over the episodes themselves as faint dots.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass
class Bin:
    """The episodes that ended in frames ``[start, end)``."""

    start: int
    end: int
    returns: np.ndarray

    @property
    def mean(self) -> float:
        return float(self.returns.mean())


def read_returns(run_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """(frames, raw return) of every training episode in ``run_dir``'s events, by frames."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logging.getLogger("tensorboard").setLevel(logging.ERROR)  # a resume's purge warns
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    if "episode/return" not in events.Tags().get("scalars", []):
        raise SystemExit(f"no episode/return scalars in {run_dir}")
    points = sorted((e.step, e.value) for e in events.Scalars("episode/return"))
    return (np.array([s for s, _ in points], dtype=np.int64),
            np.array([v for _, v in points], dtype=np.float64))


def bin_returns(frames: np.ndarray, returns: np.ndarray, bins: int) -> list[Bin]:
    """Episodes grouped into ``bins`` equal spans of frames up to the last one; the last
    span holds the episodes at the last frame (and the remainder of an uneven split), so
    no bin reaches past the run. Empty bins are left out."""
    last = int(frames.max())
    width = max(last // bins, 1)
    index = np.minimum(frames // width, bins - 1)
    return [Bin(int(b * width), last if b == bins - 1 else int((b + 1) * width),
                returns[index == b])
            for b in np.unique(index)]


def markdown(binned: list[Bin]) -> list[str]:
    episodes = sum(len(b.returns) for b in binned)
    lines = [f"{episodes} episodes up to {binned[-1].end:,} frames",
             "| frames | episodes | mean raw return | min | max |", "|---|---|---|---|---|"]
    lines += [f"| {b.start:,}-{b.end:,} | {len(b.returns)} | {b.mean:.2f} | "
              f"{b.returns.min():.0f} | {b.returns.max():.0f} |" for b in binned]
    return lines


def plot(frames: np.ndarray, returns: np.ndarray, binned: list[Bin], path: Path,
         title: str) -> None:
    """The learning curve as a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    centres = np.array([(b.start + b.end) / 2 for b in binned])
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.scatter(frames, returns, s=2, alpha=0.15, color="grey", label="episodes")
    ax.fill_between(centres, [b.returns.min() for b in binned],
                    [b.returns.max() for b in binned], alpha=0.15, color="C0", label="min-max")
    ax.fill_between(centres, [np.quantile(b.returns, 0.25) for b in binned],
                    [np.quantile(b.returns, 0.75) for b in binned], alpha=0.35, color="C0",
                    label="25-75%")
    ax.plot(centres, [b.mean for b in binned], color="C0", marker="o", markersize=3,
            label="mean")
    ax.set_xlabel("env frames")
    ax.set_ylabel("raw episode return")
    ax.set_title(title)
    ax.legend(loc="best", fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--bins", type=int, default=10)
    parser.add_argument("--png", type=Path, default=None,
                        help="where to write the PNG (default: <run dir>/curve.png)")
    args = parser.parse_args(argv)
    if args.bins < 1:
        parser.error(f"--bins must be at least 1, got {args.bins}")
    frames, returns = read_returns(args.run_dir)
    binned = bin_returns(frames, returns, args.bins)
    print("\n".join(markdown(binned)))
    png = args.png or args.run_dir / "curve.png"
    plot(frames, returns, binned, png, args.run_dir.resolve().name)
    print(f"curve: {png}")


if __name__ == "__main__":
    main()
