"""A run's raw episode-return curve from its tensorboard events, binned by frames: a
Markdown table on stdout and a PNG beside it.

    python benchmarks/curve.py runs/<run name> [--bins 10] [--png out.png] \
        [--reach 0 18] [--csv episodes.csv]

The PNG (default ``<run dir>/curve.png``) has frames on x and the raw return of each
bin's episodes: their mean as a line, the 25-75% quantiles as a dark band and min-max as
a light one, over the episodes themselves as faint dots.

``--reach 0 18`` prints, for each level, the first episode at which the mean of the last
20 episodes (the console's ``mean_return_20``, and ``stop_at_return``'s test) reaches it:
its frames and the run time to it. The run time is the wall time since the first episode
less every gap of more than 5 minutes between two episodes (a run stopped and resumed
later). ``--csv`` writes every episode's frames, raw return and wall time, a file small
enough to commit; ``curve.py`` reads such a file in place of the run directory.
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


CSV_HEADER = "frames,return,wall_time"
WINDOW = 20  # episodes in the trailing mean --reach tests (distrl.training.loop's mean_return_20)
GAP_S = 300.0  # a longer pause between two episodes is a stopped run, not run time


Episodes = tuple[np.ndarray, np.ndarray, np.ndarray]  # frames, raw return, wall time


def read_returns(run_dir: Path) -> Episodes:
    """(frames, raw return, wall time) of every training episode in ``run_dir``'s events
    (or in a file ``--csv`` wrote), by frames."""
    episodes = episode_table(run_dir)
    if episodes is None:
        raise SystemExit(f"no episode/return scalars in {run_dir}")
    return episodes


def episode_table(run_dir: Path) -> Episodes | None:
    """:func:`read_returns`'s arrays, None where ``run_dir`` logged no episode."""
    if run_dir.is_file():
        table = np.loadtxt(run_dir, delimiter=",", skiprows=1, ndmin=2)
        return table[:, 0].astype(np.int64), table[:, 1], table[:, 2]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logging.getLogger("tensorboard").setLevel(logging.ERROR)  # a resume's purge warns
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    if "episode/return" not in events.Tags().get("scalars", []):
        return None
    points = sorted((e.step, e.wall_time, e.value) for e in events.Scalars("episode/return"))
    return (np.array([s for s, _, _ in points], dtype=np.int64),
            np.array([v for _, _, v in points], dtype=np.float64),
            np.array([w for _, w, _ in points], dtype=np.float64))


def write_csv(path: Path, frames: np.ndarray, returns: np.ndarray, wall: np.ndarray) -> None:
    np.savetxt(path, np.column_stack([frames, returns, wall]), delimiter=",",
               fmt=["%d", "%g", "%.3f"], header=CSV_HEADER, comments="")


def run_time(wall: np.ndarray) -> np.ndarray:
    """Seconds of running up to each episode: wall time since the first episode, less every
    gap over ``GAP_S`` between consecutive episodes (the run was stopped then)."""
    steps = np.diff(wall, prepend=wall[:1])
    return np.cumsum(np.where(steps > GAP_S, 0.0, steps))


def reached(frames: np.ndarray, returns: np.ndarray, wall: np.ndarray, level: float
            ) -> tuple[int, float] | None:
    """(frames, run seconds) at the first episode where the mean of the last ``WINDOW``
    episodes is at least ``level``; None if it never is."""
    with np.errstate(invalid="ignore"):
        hits = np.flatnonzero(trailing_mean(returns) >= level)
    if not len(hits):
        return None
    at = int(hits[0])
    return int(frames[at]), float(run_time(wall)[at])


def reach_record(frames: np.ndarray, returns: np.ndarray, wall: np.ndarray,
                 levels: list[float]) -> list[dict[str, float | int | None]]:
    """:func:`reached` at each level as a run's summary.json keeps it: ``{"level",
    "frames", "run_time_s"}``, the last two None where the level was not reached."""
    out: list[dict[str, float | int | None]] = []
    for level in levels:
        hit = reached(frames, returns, wall, level)
        out.append({"level": float(level), "frames": None if hit is None else hit[0],
                    "run_time_s": None if hit is None else hit[1]})
    return out


def trailing_mean(returns: np.ndarray) -> np.ndarray:
    """The mean of the last ``WINDOW`` episodes at each episode, as :func:`reached` tests
    it: NaN at the first ``WINDOW - 1`` episodes, which have fewer before them. A sum over
    the window, then one division: whole returns summing to ``WINDOW * level`` give the
    level exactly (a convolution with ``1 / WINDOW`` weights can fall a bit short)."""
    out = np.full(len(returns), np.nan)
    if len(returns) >= WINDOW:
        sums = np.concatenate([[0.0], np.cumsum(returns, dtype=np.float64)])
        out[WINDOW - 1:] = (sums[WINDOW:] - sums[:-WINDOW]) / WINDOW
    return out


def reach_lines(frames: np.ndarray, returns: np.ndarray, wall: np.ndarray,
                levels: list[float]) -> list[str]:
    lines = []
    for level in levels:
        hit = reached(frames, returns, wall, level)
        if hit is None:
            best = (np.nanmax(trailing_mean(returns)) if len(returns) >= WINDOW
                    else float("nan"))
            lines.append(f"reach {level:g}: not reached (best {WINDOW}-episode mean "
                         f"{best:.2f} by {int(frames[-1]):,} frames)")
        else:
            minutes = hit[1] / 60
            lines.append(f"reach {level:g}: {hit[0]:,} frames, {minutes // 60:.0f}h"
                         f"{minutes % 60:02.0f}m of run time ({WINDOW}-episode mean)")
    return lines


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
    parser.add_argument("--reach", type=float, nargs="+", default=[], metavar="RETURN",
                        help=f"frames and run time to a {WINDOW}-episode mean of each")
    parser.add_argument("--csv", type=Path, default=None, metavar="FILE",
                        help="also write every episode's frames, return and wall time")
    args = parser.parse_args(argv)
    if args.bins < 1:
        parser.error(f"--bins must be at least 1, got {args.bins}")
    frames, returns, wall = read_returns(args.run_dir)
    binned = bin_returns(frames, returns, args.bins)
    print("\n".join(markdown(binned) + reach_lines(frames, returns, wall, args.reach)))
    if args.csv:
        write_csv(args.csv, frames, returns, wall)
        print(f"episodes: {args.csv}")
    default = args.run_dir.with_suffix(".png") if args.run_dir.is_file() else (
        args.run_dir / "curve.png")
    png = args.png or default
    plot(frames, returns, binned, png, args.run_dir.resolve().stem)
    print(f"curve: {png}")


if __name__ == "__main__":
    main()
