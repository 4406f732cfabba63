"""A MinAtar suite's runs as their directories show them: each planned run's status,
final return, learning curve and wall time, for ``benchmarks/report.py``'s tables and
``benchmarks/report_plot.py``'s curves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from curve import episode_table
from suite import (
    CARRY,
    CARRY_MANIFEST,
    EPISODES,
    GRID,
    LOST,
    RULED_OUT,
    SUMMARY,
    attempt_spans,
    final_return,
    games_by_agent,
    has_checkpoint,
    parse_run_name,
    read_attempts,
    read_events,
    read_json,
    smoothed,
)


def frames(n: int | float) -> str:
    return f"{n / 1e6:.1f}M frames" if n >= 1e5 else f"{int(n):,} frames"


@dataclass
class RunResult:
    """One planned run as its directory shows it."""

    agent: str
    game: str
    seed: int
    status: str  # finished | failed | unfinished | lost | ruled_out | missing
    exit_code: int | None = None
    frames: int = 0
    final: float | None = None  # mean of the last 100 training episodes
    episodes: int = 0
    eval_return: float | None = None
    # the learning curve: the trailing 100-episode mean at each episode's end (from the
    # event files) or at the points an archived summary.json kept (its trailing_curve)
    curve_frames: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    curve_returns: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # wall-clock seconds of every attempt (start-up and evaluation included), and frames
    # per second of wall clock over the whole run (reproduce.py's record, finished runs)
    wall_s: float | None = None
    fps: float | None = None
    jobs: int | None = None  # runs at a time in the invocation that finished it
    # when each attempt ran: (start, seconds) on the clock of time.time(); attempts whose
    # start no record kept (archives made before the spans were) count in unplaced_s
    spans: list[tuple[float, float]] = field(default_factory=list)
    unplaced_s: float = 0.0
    # an attempt trained its learner on a GPU (agent.device=cuda in its command): a grid
    # may run partly on a GPU machine's cores, and its table says which runs did
    gpu_learner: bool = False

    @property
    def counted(self) -> bool:
        return self.status == "finished" and self.final is not None

    def describe(self) -> str:
        """``s0 12.3`` for a finished run, else the seed and what became of it; ``(GPU
        learner)`` after either where an attempt trained on a GPU."""
        text = self._outcome()
        return f"{text} (GPU learner)" if self.gpu_learner else text

    def _outcome(self) -> str:
        value = "no episodes" if self.final is None else f"{self.final:.1f}"
        if self.status == "finished":
            return f"s{self.seed} {value}"
        if self.status == "missing":
            return f"s{self.seed} missing"
        if self.status == "lost":
            return f"s{self.seed} lost ({frames(self.frames)}, {value})"
        if self.status == RULED_OUT:
            return f"s{self.seed} ruled out ({frames(self.frames)}, {value})"
        if self.status == "failed":
            return f"s{self.seed} failed (exit {self.exit_code}, {frames(self.frames)}, {value})"
        return f"s{self.seed} unfinished ({frames(self.frames)}, {value})"


@dataclass
class Suite:
    agents: list[str]
    games: list[str]
    seeds: list[int]
    runs: dict[tuple[str, str, int], RunResult]  # the planned cells' runs only
    planned: dict[str, list[str]]  # agent -> the games it was asked for (or ran)

    def is_planned(self, agent: str, game: str) -> bool:
        return game in self.planned.get(agent, [])

    def games_of(self, agent: str) -> list[str]:
        """``agent``'s planned games, in the suite's order of games."""
        return [game for game in self.games if self.is_planned(agent, game)]

    def cell(self, agent: str, game: str) -> list[RunResult]:
        return [self.runs[agent, game, seed] for seed in self.seeds]


def read_run(run_dir: Path, agent: str, game: str, seed: int) -> RunResult:
    summary = read_json(run_dir / SUMMARY)
    summary = summary if isinstance(summary, dict) else {}
    if superseded_failure(summary, run_dir):
        summary = {}  # the carry holds the run now; the failed attempt stays in its record
    status = summary.get("status")
    if status not in ("finished", "failed", LOST, RULED_OUT):
        status = "unfinished"  # stopped, running, or killed before reproduce.py could record
    result = RunResult(agent, game, seed, status, exit_code=summary.get("exit_code"))
    result.wall_s = summary.get("wall_s_total")
    # a summary with spans (finished or failed, since the spans were recorded) holds all
    # that the attempts file would give
    carried = read_json(run_dir / CARRY / CARRY_MANIFEST) if not summary else None
    # a run carried to the next machine (carry.py): its attempts and episodes so far
    attempts = [] if "spans" in summary else read_attempts(
        run_dir / CARRY if carried is not None else run_dir)
    if result.wall_s is None:  # not finished: the attempts so far
        result.wall_s = sum(a.get("wall_s") or 0.0 for a in attempts) if attempts else None
    result.spans, result.unplaced_s = attempt_spans(summary, attempts)
    commands = [summary.get("command") or [], *(a.get("command") or [] for a in attempts)]
    result.gpu_learner = any(learner_on_gpu(command) for command in commands)
    result.fps = summary.get("fps") if status == "finished" else None
    result.jobs = summary.get("jobs", 1) if status == "finished" else None
    events = read_events(run_dir)
    if events is not None:
        result.frames, result.episodes = events.last_frame, events.episodes
        result.final = final_return(events.returns)
        result.eval_return = events.evaluation.get("return_mean")
        result.curve_frames, result.curve_returns = events.frames, smoothed(events.returns)
    elif carried is not None:
        table = (episode_table(run_dir / CARRY / EPISODES)
                 if (run_dir / CARRY / EPISODES).is_file() else None)
        result.frames = carried.get("frames") or 0
        if table is not None:
            episode_frames, returns, _ = table
            result.episodes, result.final = len(returns), final_return(returns)
            result.curve_frames, result.curve_returns = episode_frames, smoothed(returns)
    else:  # an archived run, or no event files (log.tensorboard=false): reproduce.py's record
        result.frames = summary.get("frames") or 0
        result.final = summary.get("final_return_100")
        result.episodes = summary.get("episodes") or 0
        result.eval_return = (summary.get("eval") or {}).get("return_mean")
        curve = summary.get("trailing_curve") or {}
        result.curve_frames = np.asarray(curve.get("frames", []), dtype=np.int64)
        result.curve_returns = np.asarray(curve.get("return_mean", []), dtype=np.float64)
    return result


def superseded_failure(summary: object, run_dir: Path) -> bool:
    """Whether ``summary`` (an archived run's summary.json) records a failed attempt that
    a later one has resumed: a failed attempt's summary.json (and episodes.csv) stay in
    the archive until the run ends again, while each stopped attempt after it
    (``reproduce.py`` resumes a failed run) replaces the carry, whose attempts file lists
    every attempt, the failed one among them."""
    if not isinstance(summary, dict) or summary.get("status") != "failed":
        return False
    if read_json(run_dir / CARRY / CARRY_MANIFEST) is None:
        return False
    carried = [a.get("attempt") or 0 for a in read_attempts(run_dir / CARRY)]
    return max(carried, default=0) > (summary.get("attempt") or 0)


def learner_on_gpu(command: list[str]) -> bool:
    """Whether a ``run.py`` command line put its learner on a GPU (``agent.device=cuda``,
    ``cuda:N``)."""
    return any(arg.startswith("agent.device=cuda") for arg in command)


def busy_seconds(spans: list[tuple[float, float]]) -> float:
    """The length of the union of the intervals (start, start + seconds): time in which
    at least one of them ran, runs side by side counted once."""
    total, end = 0.0, -np.inf
    for start, wall in sorted(spans):
        stop = start + wall
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def most_at_once(spans: list[tuple[float, float]], every: list[tuple[float, float]]) -> int:
    """The largest number of the intervals ``every`` (start, seconds) going at one moment
    within ``spans``: how many runs of the suite, this one among them, shared the machine
    at the busiest point of this run's attempts (0 where ``spans`` is empty)."""
    most = 0
    for start, wall in spans:
        moments = [start] + [s for s, _ in every if start <= s < start + wall]
        most = max(most, *(sum(s <= t < s + w for s, w in every) for t in moments))
    return most


def collect(suite_dir: Path) -> Suite:
    """Every run asked for (grid.json) or seen, each read from its directory: each agent
    on the games it was asked for or ran, never on another agent's games."""
    found: dict[tuple[str, str, int], Path] = {}
    for path in sorted(p for p in suite_dir.iterdir() if p.is_dir()):
        summary = read_json(path / SUMMARY)
        key = ((summary["agent"], summary["game"], int(summary["seed"]))
               if isinstance(summary, dict) and {"agent", "game", "seed"} <= summary.keys()
               else parse_run_name(path.name))
        ran = (path / SUMMARY).exists() or has_checkpoint(path) or any(
            path.glob("events.out.tfevents.*")) or (path / "stdout.log").exists() or (
            path / CARRY / CARRY_MANIFEST).exists()
        if key is not None and ran:
            found[key] = path
    grid = read_json(suite_dir / GRID) or {}
    planned = games_by_agent(grid)
    for agent, game, _ in found:
        planned.setdefault(agent, [])
        if game not in planned[agent]:
            planned[agent].append(game)
    agents = list(dict.fromkeys([*grid.get("agents", []), *planned]))
    games = list(dict.fromkeys([*grid.get("games", []), *(g for gs in planned.values()
                                                           for g in gs)]))
    seeds = sorted({*grid.get("seeds", []), *(k[2] for k in found)})
    runs = {}
    for agent in agents:
        for game in planned.get(agent, []):
            for seed in seeds:
                path = found.get((agent, game, seed))
                runs[agent, game, seed] = (read_run(path, agent, game, seed) if path else
                                           RunResult(agent, game, seed, "missing"))
    return Suite(agents, games, seeds, runs, planned)


def pooled(suite: Suite, extra: Suite) -> Suite:
    """The cells that ``extra`` (more seeds of the same presets, run apart) ran, each over
    the seeds of both: the suite's runs and ``extra``'s together. A run that both hold is
    an error: the pooled figures would count one seed twice."""
    seeds = sorted({*suite.seeds, *extra.seeds})
    agents = list(dict.fromkeys([*suite.agents, *extra.agents]))
    games = list(dict.fromkeys([*suite.games, *extra.games]))
    runs: dict[tuple[str, str, int], RunResult] = {}
    for agent, agent_games in extra.planned.items():
        for game in agent_games:
            for seed in seeds:
                key = (agent, game, seed)
                mine, theirs = suite.runs.get(key), extra.runs.get(key)
                ran = [r for r in (mine, theirs) if r is not None and r.status != "missing"]
                if len(ran) == 2:
                    raise ValueError(f"{agent} {game} seed {seed} is in both the suite and "
                                     "the supplement: a pooled seed must come from one")
                runs[key] = ran[0] if ran else RunResult(agent, game, seed, "missing")
    planned = {agent: [g for g in games if g in extra.planned.get(agent, [])]
               for agent in agents if extra.planned.get(agent)}
    return Suite([a for a in agents if a in planned], games, seeds, runs, planned)
