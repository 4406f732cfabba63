"""Any tensorboard scalar of a run, its mean in bins of env frames: the measurements behind
a diagnosis (policy entropy, episode length, the value estimate, gradient norms), read
from the run's own events.

    python benchmarks/scalars.py results/atari/atari5_appo/appo-BattleZone-s0 \
        --tags policy/entropy episode/length --bins 5 [--frames 10000000]

A run is given by its directory or by its archive directory, whose event files are kept
xz-compressed (a finished run's, or its carry's for a run still going). The bins split 0 to
``--frames`` (default: the largest step of the tags asked for) into equal widths; a bin
holds the points whose step is at least its start and below its end (the last one's end
included), and a bin without one is shown as "—". The attempts' files are read as one
run, as tensorboard shows it: a resume drops what the attempt before it wrote past the
checkpoint it resumed from, so each frame's value counts once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from suite import read_scalars, run_event_files  # noqa: E402


def binned_means(steps: np.ndarray, values: np.ndarray, edges: np.ndarray) -> list[float]:
    """The mean of ``values`` whose step falls in each bin of ``edges`` (NaN where none):
    ``[edges[i], edges[i + 1])``, the last bin closed."""
    index = np.clip(np.searchsorted(edges, steps, side="right") - 1, 0, len(edges) - 2)
    inside = (steps >= edges[0]) & (steps <= edges[-1])
    means = []
    for b in range(len(edges) - 1):
        chosen = values[inside & (index == b)]
        means.append(float(chosen.mean()) if len(chosen) else float("nan"))
    return means


def run_points(run_dir: Path, tags: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each tag's (steps, values) in the run's event files; a tag the run never wrote is
    refused with the tags it did write."""
    files = run_event_files(run_dir, "scalars")
    scalars = read_scalars(files, as_one_run=True)
    missing = [tag for tag in tags if tag not in scalars]
    if missing:
        raise SystemExit(f"scalars: {run_dir} has no {', '.join(missing)}; its tags: "
                         f"{', '.join(sorted(scalars))}")
    return {tag: (np.array([e.step for e in scalars[tag]], dtype=np.int64),
                  np.array([e.value for e in scalars[tag]], dtype=np.float64))
            for tag in tags}


def frames_text(n: float) -> str:
    """A bin edge: millions of frames, or the count where that is below 0.1M."""
    return f"{n / 1e6:.1f}M" if n >= 1e5 else f"{int(n):,}"


def value_text(mean: float) -> str:
    """A bin's mean: whole numbers from 100 up (episode lengths, returns), else 3
    significant digits; "—" for a bin without a point."""
    if np.isnan(mean):
        return "—"
    return f"{mean:,.0f}" if abs(mean) >= 100 else f"{mean:.3g}"


def table(runs: list[Path], tags: list[str], bins: int, total: int | None) -> str:
    """One markdown row per run and tag, one column per bin of env frames."""
    points = {run: run_points(run, tags) for run in runs}
    end = total or max(int(steps.max()) for per_tag in points.values()
                       for steps, _ in per_tag.values() if len(steps))
    edges = np.linspace(0, end, bins + 1)
    heads = [f"{frames_text(lo)}-{frames_text(hi)}" for lo, hi in zip(edges, edges[1:],
                                                                       strict=False)]
    lines = [f"| run | tag | {' | '.join(heads)} |", "|---|---|" + "---:|" * bins]
    for run, per_tag in points.items():
        for tag, (steps, values) in per_tag.items():
            cells = [value_text(m) for m in binned_means(steps, values, edges)]
            lines.append(f"| {run.name} | {tag} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="run or archive directories")
    parser.add_argument("--tags", nargs="+", required=True,
                        help="scalar tags, e.g. policy/entropy episode/length")
    parser.add_argument("--bins", type=int, default=5)
    parser.add_argument("--frames", type=int, help="the bins' end (default: the last step)")
    args = parser.parse_args(argv)
    if args.bins < 1:
        parser.error(f"--bins must be at least 1, not {args.bins}")
    print(table(args.runs, args.tags, args.bins, args.frames), end="")


if __name__ == "__main__":
    main()
