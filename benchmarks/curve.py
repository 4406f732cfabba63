"""A run's raw episode-return curve from its tensorboard events, binned by frames: a
Markdown table on stdout and a PNG beside it.

    python benchmarks/curve.py runs/<run name> [--bins 10] [--png out.png] \
        [--reach 0 18] [--csv episodes.csv] [--max-epsilon 0.01]

The PNG (default ``<run dir>/curve.png``) has frames on x and the raw return of each
bin's episodes: their mean as a line, the 25-75% quantiles as a dark band and min-max as
a light one, over the episodes themselves as faint dots.

``--reach 0 18`` prints, for each level, the first episode at which the mean of the last
20 episodes (the console's ``mean_return_20``, and ``stop_at_return``'s test) reaches it:
its frames and the run time to it. The run time is the time inside the run's attempts up
to it, from the first attempt's start, where ``reproduce.py`` recorded every attempt (the
summary.json or attempts.jsonl beside the events or the csv); else (a run started by hand)
the wall time since the first episode less every gap of more than 5 minutes between two
episodes (a run stopped and resumed later). ``--csv`` writes every episode's frames, raw
return and wall time (and epsilon, where the run logged ``episode/epsilon``), a file small
enough to commit; ``curve.py`` reads such a file in place of the run directory.
``--max-epsilon`` keeps the episodes of the envs exploring at most that epsilon (Ape-X's
and R2D2's near-greedy envs).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from suite import event_files, read_scalars, spans_beside


@dataclass
class Bin:
    """The episodes that ended in frames ``[start, end)``."""

    start: int
    end: int
    returns: np.ndarray

    @property
    def mean(self) -> float:
        return float(self.returns.mean())


CSV_HEADER = "frames,return,wall_time"  # then ",epsilon" where the run logged it
RETURN_TAG, EPSILON_TAG = "episode/return", "episode/epsilon"
WINDOW = 20  # episodes in the trailing mean --reach tests (distrl.training.loop's mean_return_20)
GAP_S = 300.0  # a longer pause between two episodes is a stopped run, not run time
# an attempt's start is recorded to the whole second, its events' wall times to the ms
SPAN_SLACK_S = 5.0


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
    columns = episode_columns(run_dir)
    return None if columns is None else columns[:3]


def episode_columns(run_dir: Path
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None] | None:
    """(frames, raw return, wall time, epsilon or None) of every training episode in
    ``run_dir``'s events or in a file ``--csv`` wrote, by frames; None where there is none.
    The epsilons are NaN for episodes written before the run logged them, and None where
    it logged none (an agent without an epsilon per env, or a run before
    ``episode/epsilon``).
    ``episode/epsilon`` is written right after its episode's return, so a run's epsilons
    belong to its last returns (a run resumed by code that logs them has them for the
    episodes after the resume only)."""
    if run_dir.is_file():
        table = np.loadtxt(run_dir, delimiter=",", skiprows=1, ndmin=2)
        return (table[:, 0].astype(np.int64), table[:, 1], table[:, 2],
                table[:, 3] if table.shape[1] > 3 else None)
    scalars = read_scalars(event_files(run_dir), as_one_run=True)
    if RETURN_TAG not in scalars:
        return None
    points = scalars[RETURN_TAG]  # in the order written: frames never go back
    epsilons = None
    if EPSILON_TAG in scalars:
        logged = [e.value for e in scalars[EPSILON_TAG]][-len(points):]
        epsilons = np.full(len(points), np.nan)
        epsilons[len(points) - len(logged):] = logged
    order = np.argsort([p.step for p in points], kind="stable")
    return (np.array([points[i].step for i in order], dtype=np.int64),
            np.array([points[i].value for i in order], dtype=np.float64),
            np.array([points[i].wall_time for i in order], dtype=np.float64),
            None if epsilons is None else epsilons[order])


def write_csv(path: Path, frames: np.ndarray, returns: np.ndarray, wall: np.ndarray,
              epsilons: np.ndarray | None = None) -> None:
    """Every episode's frames, raw return and wall time, and its epsilon where given."""
    if epsilons is None:
        np.savetxt(path, np.column_stack([frames, returns, wall]), delimiter=",",
                   fmt=["%d", "%g", "%.3f"], header=CSV_HEADER, comments="")
    else:
        np.savetxt(path, np.column_stack([frames, returns, wall, epsilons]), delimiter=",",
                   fmt=["%d", "%g", "%.3f", "%.6g"], header=f"{CSV_HEADER},epsilon",
                   comments="")


def at_most(epsilons: np.ndarray, max_epsilon: float) -> np.ndarray:
    """Which episodes were played at epsilon at most ``max_epsilon`` (NaN: not known, so
    not kept). Tensorboard keeps float32: 0.4 comes back as 0.40000001, still "at most
    0.4"."""
    return epsilons <= max_epsilon * (1 + 1e-6)


def near_greedy(columns: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None],
                max_epsilon: float, source: Path, clock: np.ndarray | None = None
                ) -> tuple[Episodes, int]:
    """The episodes played by envs with epsilon at most ``max_epsilon`` (their frames,
    returns and run seconds on the run's clock, ``clock`` of every episode, else
    :func:`run_time`'s) and how many of the run's episodes have no epsilon recorded (NaN:
    before the run logged it)."""
    epsilons = columns[3]
    if epsilons is None:
        raise SystemExit(f"curve: {source} records no episode/epsilon: --max-epsilon needs a "
                         "run of an agent with an epsilon per env (Ape-X, R2D2, SEED-R2D2)")
    kept = near_greedy_episodes(columns[:3], epsilons, max_epsilon, clock)
    if not len(kept[1]):
        raise SystemExit(f"curve: no episode of {source} was played at epsilon <= "
                         f"{max_epsilon:g}")
    return kept, int(np.isnan(epsilons).sum())


def near_greedy_episodes(episodes: Episodes, epsilons: np.ndarray, max_epsilon: float,
                         clock: np.ndarray | None = None) -> Episodes:
    """The frames, returns and run seconds of the episodes played at epsilon at most
    ``max_epsilon``, the seconds on the run's clock: ``clock`` of every episode
    (:func:`run_clock`'s), else :func:`run_time`'s of every episode (these alone are
    sparser than its gaps)."""
    frames, returns, wall = episodes
    keep = at_most(epsilons, max_epsilon)
    return frames[keep], returns[keep], (run_time(wall) if clock is None else clock)[keep]


def attempt_clock(wall: np.ndarray, spans: list[tuple[float, float]]) -> np.ndarray | None:
    """Seconds of running up to each episode's end on the record of the run's attempts
    (``spans``: the (start, seconds) of each, as ``reproduce.py`` keeps them): the time
    inside the attempts from the first one's start, start-up and evaluation included, so a
    pause between episodes inside an attempt counts and the time between attempts does
    not. None where no attempt is recorded or an episode ended outside every recorded
    attempt (by more than ``SPAN_SLACK_S``: an attempt started by hand)."""
    if not spans or not len(wall):
        return None
    starts = np.array([start for start, _ in spans], dtype=np.float64)
    seconds = np.array([length for _, length in spans], dtype=np.float64)
    since = wall[:, None] - starts[None, :]
    inside = (since >= -SPAN_SLACK_S) & (since <= seconds + SPAN_SLACK_S)
    if not inside.any(axis=1).all():
        return None
    return np.clip(since, 0.0, seconds).sum(axis=1)


def run_clock(wall: np.ndarray, spans: list[tuple[float, float]]
              ) -> tuple[np.ndarray, bool]:
    """Each episode's seconds of running and whether the attempts' record gave them
    (:func:`attempt_clock`); where it cannot, :func:`run_time`'s gap rule."""
    clock = attempt_clock(wall, spans)
    return (run_time(wall), False) if clock is None else (clock, True)


def run_time(wall: np.ndarray) -> np.ndarray:
    """Seconds of running up to each episode: wall time since the first episode, less every
    gap over ``GAP_S`` between consecutive episodes (the run was stopped then)."""
    steps = np.diff(wall, prepend=wall[:1])
    return np.cumsum(np.where(steps > GAP_S, 0.0, steps))


def reached(frames: np.ndarray, returns: np.ndarray, wall: np.ndarray, level: float,
            clock: np.ndarray | None = None) -> tuple[int, float] | None:
    """(frames, run seconds) at the first episode where the mean of the last ``WINDOW``
    episodes is at least ``level``; None if it never is. ``clock``: the episodes' run
    seconds (:func:`run_clock`'s, or some of them where the episodes are some of a run's,
    :func:`near_greedy`), else ``run_time(wall)``."""
    at = first_reaching(returns, level)
    seconds = run_time(wall) if clock is None else clock
    return None if at is None else (int(frames[at]), float(seconds[at]))


def first_reaching(returns: np.ndarray, level: float) -> int | None:
    """The index of the first episode where the mean of the last ``WINDOW`` is at least
    ``level``; None if there is none."""
    with np.errstate(invalid="ignore"):
        hits = np.flatnonzero(trailing_mean(returns) >= level)
    return int(hits[0]) if len(hits) else None


def reach_record(frames: np.ndarray, returns: np.ndarray, wall: np.ndarray,
                 levels: list[float], clock: np.ndarray | None = None
                 ) -> list[dict[str, float | int | None]]:
    """:func:`reached` at each level (run seconds on ``clock``, else the gap rule) as a
    run's summary.json keeps it: ``{"level", "frames", "run_time_s"}``, the last two None
    where the level was not reached."""
    out: list[dict[str, float | int | None]] = []
    for level in levels:
        hit = reached(frames, returns, wall, level, clock)
        out.append({"level": float(level), "frames": None if hit is None else hit[0],
                    "run_time_s": None if hit is None else hit[1]})
    return out


def mean_past(frames: np.ndarray, returns: np.ndarray, at_frames: int, window: int = WINDOW
              ) -> tuple[int, float, int] | None:
    """A tuning rule's reading "the 20-game mean at ``at_frames``": ``(frames, mean,
    index)`` at the first episode past ``at_frames``, the mean of its last ``window``
    episodes (fewer where the run has fewer); None until an episode has ended past it."""
    past = np.flatnonzero(frames > at_frames)
    if not len(past):
        return None
    at = int(past[0])
    return int(frames[at]), float(np.mean(returns[max(0, at - window + 1):at + 1])), at


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
                levels: list[float], clock: np.ndarray | None = None) -> list[str]:
    lines = []
    for level in levels:
        hit = reached(frames, returns, wall, level, clock)
        if hit is None:
            best = (np.nanmax(trailing_mean(returns)) if len(returns) >= WINDOW
                    else float("nan"))
            lines.append(f"reach {level:g}: not reached (best {WINDOW}-episode mean "
                         f"{best:.2f} by {int(frames[-1]):,} frames)")
        else:
            lines.append(f"reach {level:g}: {hit[0]:,} frames, {duration(hit[1])} of run "
                         f"time ({WINDOW}-episode mean)")
    return lines


def duration(seconds: float) -> str:
    """``9m12s`` under an hour, ``1h05m`` from one on (whole minutes of the rounded seconds:
    7,199.4 s is 1h59m, never 1h60m); the run times of this file and of the reports."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


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
                        help="also write every episode's frames, return and wall time "
                             "(and epsilon, where the run logged it)")
    parser.add_argument("--max-epsilon", type=float, default=None, metavar="EPS",
                        help="only the episodes of envs exploring at most this epsilon "
                             "(Ape-X's and R2D2's near-greedy end of the ladder)")
    args = parser.parse_args(argv)
    if args.bins < 1:
        parser.error(f"--bins must be at least 1, got {args.bins}")
    columns = episode_columns(args.run_dir)
    if columns is None:
        raise SystemExit(f"no episode/return scalars in {args.run_dir}")
    frames, returns, wall = columns[:3]
    clock, recorded = run_clock(wall, spans_beside(args.run_dir))
    if args.max_epsilon is not None:
        (frames, returns, clock), unknown = near_greedy(columns, args.max_epsilon,
                                                         args.run_dir, clock)
        print(f"episodes at epsilon <= {args.max_epsilon:g}: {len(returns)} "
              f"({unknown} of the run's episodes have no epsilon recorded)")
    binned = bin_returns(frames, returns, args.bins)
    print("\n".join(markdown(binned) + reach_lines(frames, returns, wall, args.reach, clock)))
    if args.reach:
        print("run time: " + ("inside the attempts reproduce.py recorded, from the first "
                              "one's start" if recorded else
                              f"since the first episode, less every gap over {GAP_S / 60:g} "
                              "minutes between two (no record of every attempt beside it)"))
    if args.csv:  # every episode, whatever --max-epsilon kept
        write_csv(args.csv, *columns)
        print(f"episodes: {args.csv}")
    default = args.run_dir.with_suffix(".png") if args.run_dir.is_file() else (
        args.run_dir / "curve.png")
    png = args.png or default
    plot(frames, returns, binned, png, args.run_dir.resolve().stem)
    print(f"curve: {png}")


if __name__ == "__main__":
    main()
