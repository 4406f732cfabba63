"""The experiment grids' suites (MinAtar, Atari: :class:`SuiteSpec`), MinAtar's reference
scores and the run-directory reader, shared by ``benchmarks/reproduce.py`` (runs the grid) and
``benchmarks/report.py`` (tables, curves).

A run directory ``<suite>/<agent>-<game>-s<seed>`` holds what ``run.py`` writes (tensorboard
event files, ``checkpoints/``) and what ``reproduce.py`` adds: ``stdout.log``,
``attempts.jsonl`` (one line per attempt) and, once the run ended on its own,
``summary.json``. Returns are read from the event files alone, so a resumed run reads as one
curve (tensorboard drops the events a resume purged).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import lzma
import math
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import OmegaConf


@dataclass(frozen=True)
class SuiteSpec:
    """What sets one suite's runs apart from another's: its agents, the override that picks
    a game, how a record names the env, the levels whose first reaching its records keep
    and whether an archive keeps every episode. ``reproduce.py --suite NAME`` runs
    ``SUITES[NAME]``; its ``grid.json`` records the name."""

    name: str
    # agent name -> (Hydra preset under experiments/experiment/, the baseline its report
    # compares it with; None where the suite's report compares with none)
    agents: dict[str, tuple[str, str | None]]
    env_override: str  # run.py's override that picks the game, with ``{game}`` in it
    env_label: str  # the record's "env", with ``{game}`` in it
    games_help: str  # the games, as --help names them
    reach: tuple[float, ...] = ()  # reproduce.py --reach's default levels
    keeps_episodes: bool = False  # each ended run's episodes beside its summary.json

    def preset(self, agent: str) -> str:
        return self.agents[agent][0]

    def preset_path(self, agent: str) -> Path:
        """The agent's preset file (read at call time: tests point PRESETS elsewhere)."""
        return PRESETS / f"{self.preset(agent)}.yaml"

    def game_override(self, game: str) -> str:
        return self.env_override.format(game=game)

    def env_name(self, game: str) -> str:
        return self.env_label.format(game=game)


# Value-based agents meet DQN, actor-critic agents AC(lambda=0.8).
MINATAR = SuiteSpec(
    name="minatar",
    agents={
        "impala": ("minatar_impala", "AC(0.8)"),
        "apex": ("minatar_apex", "DQN"),
        "r2d2": ("minatar_r2d2", "DQN"),
        "seed": ("minatar_seed", "AC(0.8)"),  # SEED-IMPALA
        "seed_r2d2": ("minatar_seed_r2d2", "DQN"),
    },
    env_override="env=MinAtar-{game}",
    env_label="MinAtar-{game}",
    games_help="MinAtar games: Asterix Breakout Freeway Seaquest SpaceInvaders",
)
# The presets pick Pong's env group (DeepMind's conventions, no per-game setting) and
# env.id swaps the game, so one preset runs any ALE game. The reach levels are Pong's:
# 0 is halfway from a random policy's -21, +18 near the best score, 21.
ATARI = SuiteSpec(
    name="atari",
    agents={
        "appo": ("atari_short_appo", None),
        "impala": ("atari_short_impala", None),
        "apex": ("atari_short_apex", None),
        "r2d2": ("atari_short_r2d2", None),
        "seed_appo": ("atari_short_seed_appo", None),
        "seed_r2d2": ("atari_short_seed_r2d2", None),
    },
    env_override="env.id={game}",
    env_label="{game}",
    games_help="Atari games by ALE name: Pong Breakout Qbert ...",
    reach=(0.0, 18.0),
    keeps_episodes=True,
)
SUITES: dict[str, SuiteSpec] = {spec.name: spec for spec in (MINATAR, ATARI)}
DEFAULT_SUITE = MINATAR.name  # also that of a grid.json without "suite" (written before it)
AGENTS = MINATAR.agents  # the MinAtar report's agents and baselines

# Mean training return at 5M frames, read off the MinAtar README figure (Young & Tian 2019,
# https://github.com/kenjyoung/MinAtar): approximate, to two significant figures.
REFERENCE_FRAMES = 5_000_000
REFERENCES: dict[str, dict[str, float]] = {
    "DQN": {"Asterix": 17.0, "Breakout": 10.0, "Freeway": 50.0, "Seaquest": 20.0,
            "SpaceInvaders": 43.0},
    "AC(0.8)": {"Asterix": 19.0, "Breakout": 17.5, "Freeway": 47.0, "Seaquest": 15.0,
                "SpaceInvaders": 185.0},
}
RANDOM: dict[str, float] = {"Breakout": 0.5}  # uniform random play, where known
NORMALISER = "DQN"  # IQM scores are return / DQN's return at 5M frames

FINAL_EPISODES = 100  # the final return: mean of the last 100 training episodes
CONFIDENCE = 0.95  # of the report's bootstrap intervals and the curves' bands
TRAILING_POINTS = 500  # an archived learning curve: the trailing mean at this many frames
THROUGHPUT_PREFIX = "throughput/raw/"  # distrl.telemetry.diagnose.RAW: each report's figures
RETURN_TAG = "episode/return"  # distrl.telemetry.logging.MetricLogger.episode, step = env frames
EVAL_PREFIX = "eval/"  # distrl.acting.evaluation: eval/return_mean, ... at the last frame
SUMMARY = "summary.json"
EPISODES = "episodes.csv"  # every episode's frames, return, wall time (curve.py --csv's)
ATTEMPTS = "attempts.jsonl"
# A run that can neither go on nor be run again: its machine went, and with it everything
# but what its summary.json records (its seed was reported, so it is never re-run).
LOST = "lost"
# A tuning run stopped by its registered rule (reproduce.py --rule-out-at): never resumed;
# its summary.json's ``ruled_out`` holds the rule and its reading.
RULED_OUT = "ruled_out"
CARRY = "carry"  # an archived run's carry (carry.py): what another machine resumes it from
CARRY_MANIFEST = "carry.json"
KEPT_EVENTS = "events"  # a finished run's event files, xz-compressed, in its archive (carry.py)
STDOUT = "stdout.log"
GRID = "grid.json"
PRESETS = Path(__file__).resolve().parents[1] / "experiments" / "experiment"
_NAME = re.compile(r"^(?P<agent>.+)-(?P<game>[^-]+)-s(?P<seed>\d+)$")
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)\.pt$")  # distrl.run.checkpoint's names


def run_name(agent: str, game: str, seed: int) -> str:
    """``<agent>-<game>-s<seed>``: the run's directory under the suite and its log.name."""
    return f"{agent}-{game}-s{seed}"


# Earlier fingerprints of a preset whose settings, as the run saw them, equal today's: the
# preset has since come to name a value that was the agent's default when those runs ran,
# because the default moved. preset -> {fingerprint: what the preset now names}.
SAME_SETTINGS_AS_TODAY: dict[str, dict[str, str]] = {
    "minatar_apex": {"f5234848dd8e": "torch's RMSProp, greedy evaluation and recomputed "
                                     "initial priorities, Ape-X's defaults until 2026-11-27"},
    "minatar_r2d2": {"b28a346b59fd": "torch's Adam, weight pulls every 100 steps, greedy "
                                     "evaluation and recomputed initial priorities, R2D2's "
                                     "defaults until 2026-11-27"},
    "minatar_seed_r2d2": {"2d455160bad6": "torch's Adam, greedy evaluation and recomputed "
                                          "initial priorities, R2D2's defaults until "
                                          "2026-11-27"},
}


def same_settings(preset: str, fingerprint: str, today: str | None) -> bool:
    """Whether a run recorded with ``fingerprint`` ran with today's settings of ``preset``."""
    return fingerprint == today or fingerprint in SAME_SETTINGS_AS_TODAY.get(preset, {})


def preset_fingerprint(agent: str, spec: SuiteSpec = MINATAR) -> str | None:
    """The first 12 hex digits of the SHA-256 of ``agent``'s preset in ``spec``'s suite as
    parsed: its settings, not its comments or layout. A finished run records it, so a run
    made with other settings of the preset is not taken for one of today's. None: no such
    file."""
    path = spec.preset_path(agent)
    if not path.is_file():
        return None
    settings = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    text = json.dumps(settings, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def parse_run_name(name: str) -> tuple[str, str, int] | None:
    """``(agent, game, seed)`` of a run directory's name, None for another name."""
    match = _NAME.match(name)
    return (match["agent"], match["game"], int(match["seed"])) if match else None


def suite_of_grid(grid: dict[str, Any]) -> str:
    """The suite a ``grid.json`` holds (one written before it said so holds MinAtar's)."""
    return grid.get("suite", DEFAULT_SUITE)


def games_by_agent(grid: dict[str, Any]) -> dict[str, list[str]]:
    """The games each agent was asked to run, from a ``grid.json``: its ``games_by_agent``
    (one invocation of reproduce.py may run SEED on two games, another IMPALA on five), or,
    in a grid.json written before that key, every agent on every game."""
    if "games_by_agent" in grid:
        return {agent: list(games) for agent, games in grid["games_by_agent"].items()}
    return {agent: list(grid.get("games", [])) for agent in grid.get("agents", [])}


def newest_checkpoint(run_dir: Path) -> Path | None:
    """The run's newest checkpoint by step (the names distrl.run.checkpoint writes; importing
    it would pull in torch), None where it has none."""
    directory = run_dir / "checkpoints"
    if not directory.is_dir():
        return None
    found = [(int(m[1]), p) for p in directory.iterdir() if (m := _CHECKPOINT.match(p.name))]
    return max(found)[1] if found else None


def has_checkpoint(run_dir: Path) -> bool:
    """Whether ``run.py resume=<run_dir>`` has a checkpoint to continue from."""
    return newest_checkpoint(run_dir) is not None


def event_files(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("events.out.tfevents.*"))


def archived_event_files(archive_run: Path) -> list[Path]:
    """An archived run's xz-compressed event files: a finished run's kept ones, else those
    of its carry (a run still going)."""
    kept = sorted((archive_run / KEPT_EVENTS).glob("events.out.tfevents.*.xz"))
    return kept or sorted((archive_run / CARRY).glob("events.out.tfevents.*.xz"))


def run_event_files(run_dir: Path, tool: str) -> list[Path]:
    """A run's event files: its own directory's, else (an archive directory) the archive's
    xz-compressed ones; a directory with neither is refused, the message led by ``tool``."""
    files = event_files(run_dir) or archived_event_files(run_dir)
    if not files:
        raise SystemExit(f"{tool}: {run_dir} holds no tensorboard event file (nor an "
                         "archive's, xz-compressed)")
    return files


def read_scalars(paths: list[Path], as_one_run: bool) -> dict[str, list[Any]]:
    """Every scalar of the event files, by tag: tensorboard's events (``wall_time``,
    ``step``, ``value``). A file may be plain or xz-compressed, as an archive keeps it
    (tensorboard reads plain files only, so it is unpacked into a temporary directory).

    ``as_one_run``: the files are read as one stream in name (start time) order, as
    tensorboard shows a run, so a resume drops the events that the attempt before it wrote
    past the checkpoint it resumed from (each frame's value once, as a curve wants);
    otherwise each file is read on its own and keeps every event it holds (the work done
    in clock time, as a throughput wants)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logging.getLogger("tensorboard").setLevel(logging.ERROR)  # a resume's purge warns
    scalars: dict[str, list[Any]] = {}

    def read(where: Path) -> None:
        events = EventAccumulator(str(where), size_guidance={"scalars": 0})
        events.Reload()
        for tag in events.Tags().get("scalars", []):
            scalars.setdefault(tag, []).extend(events.Scalars(tag))

    with tempfile.TemporaryDirectory() as scratch:
        plain_files = []
        for path in sorted(paths, key=lambda p: p.name) if as_one_run else paths:
            plain = Path(scratch) / path.name.removesuffix(".xz")
            if path.suffix == ".xz":
                with lzma.open(path, "rb") as packed, open(plain, "wb") as out:
                    shutil.copyfileobj(packed, out)
            else:
                plain.symlink_to(path.resolve())
            plain_files.append(plain)
        if as_one_run:
            read(Path(scratch))
        else:
            for plain in plain_files:
                read(plain)
    return scalars


def read_json(path: Path) -> Any:
    """A JSON file's content, None when it is absent or unreadable (e.g. cut by a crash)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def attempt_spans(summary: dict, attempts: list[dict]) -> tuple[list[tuple[float, float]],
                                                                 float]:
    """When a run's attempts ran, as (start, seconds), and the seconds of attempts whose
    start is not known: from the summary's ``spans``, else the run directory's attempts,
    else (an archive made before the spans) the last attempt's start and the rest
    unplaced."""
    def span(started: str | None, wall: float | None) -> tuple[float, float] | None:
        if not started or not wall:
            return None
        return datetime.datetime.fromisoformat(started).timestamp(), float(wall)

    records = summary.get("spans") or [[a.get("started"), a.get("wall_s")] for a in attempts]
    if not records and summary.get("wall_s"):
        records = [[summary.get("started"), summary["wall_s"]]]
    spans = [sp for sp in (span(*r) for r in records) if sp is not None]
    placed = sum(wall for _, wall in spans)
    total = summary.get("wall_s_total") or sum(r[1] or 0.0 for r in records)
    return spans, max(total - placed, 0.0)


def spans_beside(path: Path) -> list[tuple[float, float]]:
    """The recorded (start, seconds) of the attempts of the run whose episodes ``path``
    holds (a run directory, or an ``episodes.csv`` in one, an archive's or a carry's): its
    summary.json's spans, else its attempts file's; [] where neither is there."""
    directory = path.parent if path.is_file() else path
    summary = read_json(directory / SUMMARY)
    summary = summary if isinstance(summary, dict) else {}
    attempts = [] if "spans" in summary else (
        read_attempts(directory) or read_attempts(directory / CARRY))
    return attempt_spans(summary, attempts)[0]


def read_attempts(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / ATTEMPTS).read_text().splitlines() if (run_dir / ATTEMPTS).exists() else []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:  # a line cut by a crash of reproduce.py itself
            continue
    return out


@dataclass
class RunEvents:
    """What a run's tensorboard events say. ``frames``/``returns``: one entry per finished
    training episode, in the order written (after tensorboard's resume purge)."""

    frames: np.ndarray
    returns: np.ndarray
    last_frame: int  # the largest step of any scalar: env frames reached
    fps_mean: float | None  # mean of perf/fps reports
    evaluation: dict[str, float] = field(default_factory=dict)  # eval/* without the prefix
    # the run logged its throughput figures (python -m distrl.diagnose can read them)
    has_throughput: bool = False

    @property
    def episodes(self) -> int:
        return len(self.returns)


def read_events(run_dir: Path) -> RunEvents | None:
    """Episode returns, frames reached and evaluation figures from ``run_dir``'s event
    files; None when it has none."""
    if not event_files(run_dir):
        return None
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # Its warning on a resumed run's purge of the events past the checkpoint is expected.
    logging.getLogger("tensorboard").setLevel(logging.ERROR)
    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags().get("scalars", [])
    points = events.Scalars(RETURN_TAG) if RETURN_TAG in tags else []
    order = np.argsort([p.step for p in points], kind="stable")  # frames never go back
    frames = np.array([points[i].step for i in order], dtype=np.int64)
    returns = np.array([points[i].value for i in order], dtype=np.float64)
    last_frame = 0
    evaluation: dict[str, float] = {}
    fps_mean = None
    for tag in tags:
        scalars = events.Scalars(tag)
        if scalars:
            last_frame = max(last_frame, max(s.step for s in scalars))
        if tag.startswith(EVAL_PREFIX) and scalars:
            evaluation[tag.removeprefix(EVAL_PREFIX)] = float(scalars[-1].value)
        if tag == "perf/fps" and scalars:
            fps_mean = float(np.mean([s.value for s in scalars]))
    has_throughput = any(tag.startswith(THROUGHPUT_PREFIX) for tag in tags)
    return RunEvents(frames, returns, int(last_frame), fps_mean, evaluation, has_throughput)


def final_return(returns: np.ndarray, last: int = FINAL_EPISODES) -> float | None:
    """Mean of the last ``last`` training episodes (fewer when fewer finished); None if none."""
    return float(np.mean(returns[-last:])) if len(returns) else None


def interval_returns(frames: np.ndarray, returns: np.ndarray, width: int
                     ) -> list[dict[str, float]]:
    """Training returns per interval of ``width`` frames: ``{"frames": interval end,
    "return_mean", "episodes"}`` for each interval with an episode ending in it."""
    out = []
    if not len(frames):
        return out
    bins = frames // max(width, 1)
    for b in np.unique(bins):
        chunk = returns[bins == b]
        out.append({"frames": int((b + 1) * width), "return_mean": float(chunk.mean()),
                    "episodes": int(len(chunk))})
    return out


def smoothed(returns: np.ndarray, window: int = FINAL_EPISODES) -> np.ndarray:
    """Trailing mean over the last ``window`` episodes at each episode (fewer at the start)."""
    if not len(returns):
        return returns.astype(np.float64)
    sums = np.concatenate([[0.0], np.cumsum(returns, dtype=np.float64)])
    ends = np.arange(1, len(returns) + 1)
    starts = np.maximum(ends - window, 0)
    return (sums[ends] - sums[starts]) / (ends - starts)


def curve_at(frames: np.ndarray, values: np.ndarray, last_frame: int, grid: np.ndarray
             ) -> np.ndarray:
    """``values`` (one per episode, at ``frames``) as a step function sampled at ``grid``:
    the latest value at or before each point, NaN before the first episode and past the
    frames the run reached."""
    out = np.full(len(grid), np.nan)
    if not len(frames):
        return out
    index = np.searchsorted(frames, grid, side="right") - 1
    inside = (index >= 0) & (grid <= max(last_frame, int(frames[-1])))
    out[inside] = values[index[inside]]
    return out


def trailing_curve(frames: np.ndarray, returns: np.ndarray, last_frame: int,
                   points: int = TRAILING_POINTS) -> dict[str, list]:
    """The trailing ``FINAL_EPISODES``-episode mean (:func:`smoothed`) sampled at ``points``
    evenly spaced frames up to ``last_frame``, without the points before the first episode:
    ``{"frames": [...], "return_mean": [...]}``, the curve report.py draws, small enough to
    keep in a run's summary.json."""
    grid = np.linspace(0, last_frame, points + 1)[1:].round().astype(np.int64)
    values = curve_at(frames, smoothed(returns), last_frame, grid)
    keep = ~np.isnan(values)
    return {"frames": grid[keep].tolist(), "return_mean": np.round(values[keep], 4).tolist()}


def finite_or_none(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)
