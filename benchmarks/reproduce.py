"""Run a grid of agents x games x seeds (MinAtar or Atari), one ``run.py`` per run, resumably.

    python benchmarks/reproduce.py --out runs/minatar --agents impala apex r2d2 \
        --games Breakout SpaceInvaders --seeds 0 1 2 --frames 5000000 \
        [--suite minatar|atari] [--jobs N] [--set key=value ...] [--dry-run] \
        [--run-cmd "python run.py"] [--reach RETURN ...] \
        [--no-start-after MINUTES] [--stop-after MINUTES]

    python benchmarks/reproduce.py --suite atari --out runs/pong \
        --archive benchmarks/atari_runs --agents appo --games Pong --seeds 1 \
        --frames 20000000 --set stop_at_return=19 log.progress=lines

``--suite`` (``suite.SUITES``) says which presets and games a run takes. ``minatar`` (the
default): ``run.py +experiment=minatar_<agent> env=MinAtar-<Game> seed=<s>
total_frames=<frames> log.dir=<out> log.name=<agent>-<Game>-s<seed>``. ``atari``: games
by ALE name (Pong, Breakout, Qbert, ...), ``run.py +experiment=atari_short_<agent>
env.id=<Game> ...`` likewise, for the agents appo, impala, apex, r2d2, seed_appo and
seed_r2d2. A run also gets the ``--set`` overrides, in its own process (its own session,
output to ``<run dir>/stdout.log``), so a crash or an OOM kill ends that run only;
``--jobs`` runs go at a time. An agent whose preset file is missing, or an ``--out`` or
``--archive`` whose ``grid.json`` holds the other suite's grid, is refused (exit 2) before
anything starts.

Invoking it again continues the grid: a run whose ``summary.json`` says it finished is
skipped; one with checkpoints and no such summary (stopped, killed, failed midway) is
resumed with ``resume=<run dir>``; one with neither starts afresh (event files of an
attempt that left no checkpoint are moved to ``discarded/``). A run directory that a
``run.py`` is still running in (its ``distrl.lock`` held: a run started by hand with the
grid's ``log.dir`` and ``log.name``) is skipped; once that run has stopped, the grid resumes
it from its checkpoints, its next attempt numbered past the ``hydra/attempt-N`` it left. A
finished run records its preset's fingerprint (``preset_sha``: its settings, not its
comments); one skipped under a preset whose settings have changed since, or under another
budget, is named as such on its skip line, so that a changed preset is never taken for the
one its runs used. Ctrl-C or SIGTERM forwards one SIGTERM to every run (distrl then
checkpoints and exits), waits up to ``--stop-timeout`` seconds, kills what is left of each
run's process group, and exits 128 + the signal; a second Ctrl-C kills at once.

For a time-limited allocation (a SLURM job, a shared machine's session) ``--no-start-after
M`` starts no run once M minutes have passed since the grid began (runs going on finish), and
``--stop-after M`` stops every run at M minutes as SIGTERM does (checkpoint and exit, to be
resumed by the next invocation) and exits 0, or 1 when a run failed.

A tuning candidate's rule, registered before its run, is ``--rule-out-at FRAMES BELOW``: at
the first episode past FRAMES, a mean of the last 20 episodes (``--rule-window``) below
BELOW stops the run as SIGTERM does and records it as ``ruled_out`` (its summary's
``ruled_out`` holds the reading; the archive keeps its episodes and events, as a finished
run's); it is skipped from then on, like a lost run. A run at or above BELOW goes on. A
shell ``;`` after the command can start the next registered candidate in the freed slot.

Each attempt appends a record to ``<out>/summary.jsonl`` and ``<run dir>/attempts.jsonl``;
an attempt that ended on its own (finished or failed) also writes ``<run dir>/summary.json``.
A record holds the run's throughput diagnosis (``throughput``: which side bounded it and
what to change, as ``python -m distrl.diagnose`` prints it), read from its events, and its
``reach``: for each level of ``--reach`` (default 0 and 18 for atari, none for minatar), the
frames and run time at the first episode where the mean of the last 20 episodes reached it,
as ``curve.py --reach`` finds them (run time: the time inside the run's recorded attempts,
``spans``, from the first one's start), or None where it never did. An Atari run also keeps
every episode's frames, raw return and wall time in ``episodes.csv`` beside its
``summary.json`` (``curve.py --csv``'s file; a few thousand episodes on Pong), and, for
each attempt, ale-py's frames/s alone on the machine it ran on (``ale_alone``: timed by
``ale_speed.py`` for ``--ale-seconds`` on each game before the invocation's first run
starts, with the cores other processes kept busy meanwhile, ``busy_elsewhere``; above 0.25
the line says the figure was not alone, and the report leaves it out). The exit code is 1
when a run failed, and the last line lists the failed runs.

``--archive DIR`` (the MinAtar suite of docs/results.md uses ``results/minatar/suite``, which is
committed)
keeps a copy of each ended run's ``summary.json`` (with its learning curve, the trailing
100-episode mean at 500 points), its ``episodes.csv`` where it has one, and ``grid.json``
under ``DIR/<run>/``: enough for ``report.py DIR`` to rebuild the table and the curves without
the run directories, whose checkpoints and event files are too large to commit. A run the
archive holds as finished is skipped too, so a grid continues on a fresh checkout where
``--out`` is empty. A run that stopped or failed is carried there as well (``carry.py``:
its newest checkpoint, event files and attempt records, compressed, in
``DIR/<run>/carry/``), and a run whose directory has no checkpoint is put back from its
carry and resumed, so a run also continues on another machine from where it stopped; a
finished run's carry is deleted, and in the Atari suite its event files stay, compressed, in
``DIR/<run>/events/``. A run whose archived ``summary.json`` says ``"status": "lost"`` (its
machine went before runs were carried; ``lost`` says how, and the summary keeps what is known
of it) is skipped: a reported seed is never run again.

This file starts, watches and stops the runs; ``grid_plan.py`` says what the grid holds
(each run's settings, command and state, ``grid.json``), ``attempt_record.py`` builds an
attempt's record from the run's events and ``suite.py`` describes each suite.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import carry  # noqa: E402
from ale_speed import BUSY_ELSEWHERE_LIMIT, ale_alone  # noqa: E402
from attempt_record import (  # noqa: E402
    read_episodes,
    read_episodes_and_epsilons,
    summarise,
    write_episodes,
)
from curve import WINDOW, mean_past  # noqa: E402
from grid_plan import (  # noqa: E402
    Run,
    append_line,
    closed_summary,
    command_for,
    differences,
    finished_summary,
    missing_presets,
    next_attempt,
    plan,
    run_lock_holder,
    state_of,
    suite_conflict,
    update_grid,
    write_atomic,
)
from suite import (  # noqa: E402
    ATTEMPTS,
    DEFAULT_SUITE,
    EPISODES,
    LOST,
    RULED_OUT,
    STDOUT,
    SUITES,
    SUMMARY,
    event_files,
    read_attempts,
    read_json,
)

ROOT = Path(__file__).resolve().parents[1]
JUDGE_EVERY_S = 300.0  # --rule-out-at: how often a running run's events are read
# distrl.training.loop.StopFlag's line: the run checkpointed and exited 0
SIGNALLED = "[distrl] received signal"


@dataclass
class Child:
    run: Run
    proc: subprocess.Popen
    command: list[str]
    attempt: int
    resumed: bool
    started: float
    stdout_offset: int
    lock: IO[str]
    stop_sent: bool = False
    judged: bool = False  # --rule-out-at: its rule has been read (it stays or it went)
    ruled_out: dict[str, Any] | None = None  # the reading that stopped it
    next_judgement: float = 0.0  # time.monotonic() of the next look at its episodes


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it if reproduce.py dies (even by SIGKILL), so no
    run outlives the grid that started it (Linux; elsewhere the signal forwarding only)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Grid:
    """Launches runs up to ``jobs`` at a time, records each attempt, forwards stops."""

    def __init__(self, args: argparse.Namespace, runs: list[Run]):
        self.args = args
        self.pending = list(runs)
        self.running: list[Child] = []
        self.records: list[dict[str, Any]] = []
        self.stop_signal = 0
        self.stopping = False  # on a signal or at --stop-after: no run starts, all stop
        self.deadline = float("inf")
        began = time.monotonic()
        self.start_until = began + 60.0 * args.no_start_after if args.no_start_after is not None \
            else float("inf")
        self.stop_at = began + 60.0 * args.stop_after if args.stop_after is not None \
            else float("inf")
        self.start_window_closed = False
        # ale-py alone on each game, timed once before the first run starts (--ale-seconds)
        self.ale: dict[str, Any] | None = None
        self.ale_timed = False

    def on_signal(self, signum: int, frame: Any) -> None:
        if self.stop_signal:  # a second Ctrl-C: now
            print(f"[reproduce] signal {signum} again: killing every run now", flush=True)
            for child in self.running:
                self.kill_group(child)
            return
        self.stop_signal = signum
        self.stop(f"signal {signum}")

    def stop(self, reason: str) -> None:
        """SIGTERM every run (it checkpoints and exits) and start no other."""
        if self.stopping:
            return
        self.stopping = True
        self.deadline = time.monotonic() + self.args.stop_timeout
        print(f"[reproduce] {reason}: stopping {len(self.running)} run(s) (SIGTERM: "
              f"checkpoint and exit), {len(self.pending)} not started", flush=True)
        for child in self.running:
            self.terminate(child)

    def may_start(self) -> bool:
        if self.stopping or not self.pending:
            return False
        if time.monotonic() >= self.start_until:
            if not self.start_window_closed:
                self.start_window_closed = True
                print(f"[reproduce] --no-start-after {self.args.no_start_after:g} min reached: "
                      f"{len(self.pending)} run(s) not started, {len(self.running)} running on",
                      flush=True)
            return False
        return True

    def terminate(self, child: Child) -> None:
        child.stop_sent = True
        with contextlib.suppress(ProcessLookupError):
            child.proc.send_signal(signal.SIGTERM)

    @staticmethod
    def kill_group(child: Child) -> None:
        """SIGKILL what is left of the run's session (its own process group, never reused
        while its leader is unreaped)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.proc.pid, signal.SIGKILL)

    def launch(self, run: Run) -> None:
        state = state_of(run, self.args.archive)
        if state == "finished":
            where = finished_summary(run, self.args.archive)
            print(f"[reproduce] skip {run.name}: finished ({where})"
                  f"{differences(read_json(where), run, self.args)}", flush=True)
            return
        if state in (LOST, RULED_OUT):
            print(f"[reproduce] skip {run.name}: {closed_line(run, self.args.archive)}",
                  flush=True)
            return
        run.run_dir.mkdir(parents=True, exist_ok=True)
        lock = open(run.run_dir / ".reproduce.lock", "w")  # noqa: SIM115 - held while it runs
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            print(f"[reproduce] skip {run.name}: another reproduce.py is running it", flush=True)
            return
        holder = run_lock_holder(run.run_dir)
        if holder is not None:
            lock.close()
            print(f"[reproduce] skip {run.name}: a run.py is running in it ({holder}); "
                  "invoke again once it has stopped", flush=True)
            return
        if state == "fresh" and event_files(run.run_dir):  # no checkpoint: its curve starts again
            discarded = run.run_dir / "discarded" / f"attempt-{next_attempt(run.run_dir)}"
            discarded.mkdir(parents=True, exist_ok=True)
            for path in event_files(run.run_dir):
                path.rename(discarded / path.name)
        if state == "fresh" and self.args.archive is not None:
            try:
                restored = carry.restore(self.args.archive / run.name, run.run_dir)
            except carry.CarryError as error:  # never start afresh over a run carried here
                lock.close()
                self.records.append({"run": run.name, "status": "failed", "exit_code": 2})
                print(f"[reproduce] failed {run.name}: its carry cannot be restored: {error}",
                      flush=True)
                return
            if restored is not None:
                print(f"[reproduce] {run.name}: {restored}", flush=True)
                state = "resume"
        if not self.ale_timed:  # before the first run starts: nothing else on the cores
            self.ale_timed = True
            self.ale = time_ale(self.args, [run, *self.pending])
        attempt = next_attempt(run.run_dir)
        resumed = state == "resume"
        # A new attempt: a failed one's summary.json stays in summary.jsonl and attempts.jsonl.
        (run.run_dir / SUMMARY).unlink(missing_ok=True)
        command = command_for(run, self.args.run_cmd, self.args.frames, self.args.set, resumed,
                              attempt)
        with open(run.run_dir / STDOUT, "ab") as log:
            log.write(f"\n=== reproduce.py attempt {attempt} {time.strftime('%Y-%m-%d %H:%M:%S')}"
                      f": {shlex.join(command)}\n".encode())
            log.flush()
            offset = log.tell()
            try:
                proc = subprocess.Popen(
                    command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True, preexec_fn=_die_with_parent,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
            except OSError as error:  # e.g. a --run-cmd that does not exist: the run failed
                log.write(f"reproduce.py: cannot start the run: {error}\n".encode())
                lock.close()
                self.records.append({"run": run.name, "status": "failed", "exit_code": 127})
                print(f"[reproduce] failed {run.name}: cannot start it: {error}", flush=True)
                return
        how = f"resume={run.run_dir}" if resumed else "fresh"
        print(f"[reproduce] start {run.name} (attempt {attempt}, {how}, pid {proc.pid})",
              flush=True)
        self.running.append(Child(run, proc, command, attempt, resumed, time.monotonic(),
                                  offset, lock))

    def judge(self, child: Child) -> None:
        """``--rule-out-at FRAMES BELOW``: once an episode has ended past FRAMES, the mean of
        the last ``--rule-window`` (20) there (``curve.mean_past``) below BELOW stops the run
        for good (SIGTERM: it checkpoints; it is recorded as ruled out and never resumed); at
        or above it, the run goes on and is not judged again. Its events are read every
        JUDGE_EVERY_S."""
        rule = self.args.rule_out_at
        if rule is None or child.judged or child.stop_sent:
            return
        now = time.monotonic()
        if now < child.next_judgement:
            return
        child.next_judgement = now + JUDGE_EVERY_S
        at_frames, below = int(rule[0]), float(rule[1])
        episodes = read_episodes(child.run.run_dir)
        window = self.args.rule_window
        reading = (None if episodes is None
                   else mean_past(episodes[0], episodes[1], at_frames, window))
        if reading is None:
            return
        child.judged = True
        episode_frames, mean, _ = reading
        result = {"at_frames": at_frames, "below": below, "window": window,
                  "episode_frames": episode_frames, "mean": round(mean, 4)}
        if mean < below:
            child.ruled_out = result
            print(f"[reproduce] {child.run.name}: {ruled_out_text(result)}; stopping it "
                  "(SIGTERM: checkpoint and exit)", flush=True)
            self.terminate(child)
        else:
            print(f"[reproduce] {child.run.name}: its {window}-game mean at {episode_frames:,} "
                  f"frames, the first episode past {at_frames:,}, was {mean:.2f}, not below "
                  f"{below:g}: it goes on", flush=True)

    def exited(self, child: Child) -> int | None:
        """The child's exit code once it has exited; what is left of its group is killed
        first, while the unreaped leader still holds the group id."""
        try:
            done = os.waitid(os.P_PID, child.proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            done = True
        if not done:
            return None
        self.kill_group(child)
        return child.proc.wait()

    def finish(self, child: Child, code: int) -> None:
        run, wall = child.run, time.monotonic() - child.started
        with open(run.run_dir / STDOUT, "rb") as log:
            log.seek(child.stdout_offset)
            text = log.read().decode(errors="replace")
        if child.ruled_out is not None:
            status = RULED_OUT
        elif child.stop_sent or (code in (0, 130, 138, 143) and SIGNALLED in text):  # 128 + signal
            status = "stopped"
        else:
            status = "finished" if code == 0 else "failed"
        previous = read_attempts(run.run_dir)
        wall_total = wall + sum(a.get("wall_s", 0.0) for a in previous)
        episodes, epsilons = (read_episodes_and_epsilons(run.run_dir)
                              if self.args.reach or run.suite.keeps_episodes else (None, None))
        record = summarise(run, child.command, child.attempt, child.resumed, code, status,
                           wall, wall_total, text, self.args, episodes, previous)
        # attempts started without reproduce.py (by hand): their wall time is in no record,
        # so wall_s_total and fps leave them out
        record["unrecorded_attempts"] = child.attempt - 1 - len(previous)
        if child.ruled_out is not None:
            record["ruled_out"] = child.ruled_out
        ale = self.ale_of(run.game, child.attempt)
        record["ale_alone"] = [*(a["ale_alone"] for a in previous if a.get("ale_alone")),
                               *([ale] if ale is not None else [])]
        append_line(run.run_dir / ATTEMPTS, {
            **{key: record[key] for key in ("attempt", "status", "exit_code", "resumed",
                                            "wall_s", "frames", "started", "command")},
            "ale_alone": ale})
        append_line(self.args.out / "summary.jsonl", record)
        if status != "stopped":
            kept = [run.run_dir, *([self.args.archive / run.name]
                                   if self.args.archive is not None else [])]
            for directory in kept:
                directory.mkdir(parents=True, exist_ok=True)
                if run.suite.keeps_episodes and episodes is not None:
                    write_episodes(directory / EPISODES, episodes, epsilons)
                write_atomic(directory / SUMMARY, json.dumps(record, indent=1) + "\n")
        if self.args.archive is not None:  # what another machine needs to continue it
            archived = self.args.archive / run.name
            if status in ("finished", RULED_OUT) and run.suite.keeps_episodes:  # hours of it
                kept = carry.keep_events(run.run_dir, archived)
                print(f"[reproduce] {run.name}: {status.replace('_', ' ')}, {kept}", flush=True)
            elif status in ("finished", RULED_OUT):
                if carry.discard(archived):
                    print(f"[reproduce] {run.name}: finished, its carry deleted", flush=True)
            else:
                if episodes is None:
                    episodes, epsilons = read_episodes_and_epsilons(run.run_dir)
                saved = carry.save(run.run_dir, archived, record["frames"], episodes, epsilons)
                print(f"[reproduce] {run.name}: {saved}", flush=True)
        child.lock.close()
        self.records.append(record)
        final = record["final_return_100"]
        shown = "no episodes" if final is None else (
            f"final return {final:.2f} (last {record['final_return_episodes']} episodes)")
        print(f"[reproduce] {status} {run.name}: {describe_exit(code)}, {wall:.0f} s, "
              f"{record['frames'] or 0:,} frames, {shown}", flush=True)

    def ale_of(self, game: str, attempt: int) -> dict[str, Any] | None:
        """This invocation's ale-py figure for ``game``, as an attempt's record keeps it."""
        if self.ale is None or game not in self.ale["frames_per_s"]:
            return None
        return {**{k: v for k, v in self.ale.items() if k != "frames_per_s"},
                "frames_per_s": self.ale["frames_per_s"][game], "attempt": attempt}

    def abort(self) -> None:
        """On an error of reproduce.py itself: leave no run behind."""
        for child in self.running:
            self.kill_group(child)
            child.proc.wait()

    def loop(self) -> None:
        while self.running or self.may_start():
            if time.monotonic() >= self.stop_at:
                self.stop(f"--stop-after {self.args.stop_after:g} min reached")
            while self.may_start() and len(self.running) < self.args.jobs:
                self.launch(self.pending.pop(0))
            for child in self.running:  # a stop that came while it was being launched
                if self.stopping and not child.stop_sent:
                    self.terminate(child)
            for child in self.running:
                self.judge(child)
            for child in list(self.running):
                code = self.exited(child)
                if code is not None:
                    self.running.remove(child)
                    self.finish(child, code)
            if self.stopping and time.monotonic() > self.deadline:
                for child in self.running:
                    print(f"[reproduce] {child.run.name} still running after "
                          f"{self.args.stop_timeout:g} s: killing it", flush=True)
                    self.kill_group(child)
                self.deadline = float("inf")
            if self.running:
                time.sleep(0.1)


def time_ale(args: argparse.Namespace, runs: list[Run]) -> dict[str, Any] | None:
    """ale-py alone on each game of ``runs`` (``ale_speed.ale_alone``), for an Atari grid
    with ``--ale-seconds`` above 0; printed, and None otherwise."""
    if args.suite != "atari" or args.ale_seconds == 0:
        return None
    games = list(dict.fromkeys(run.game for run in runs))
    figures = ale_alone(games, args.ale_seconds)
    busy = figures.get("busy_elsewhere", 0.0)
    print(f"[reproduce] ale-py alone on {figures['machine']} ({figures['envs']} envs, "
          f"{figures['threads']} threads, random actions, {args.ale_seconds:g} s each): "
          + ", ".join(f"{game} {fps:,.0f} frames/s"
                      for game, fps in figures["frames_per_s"].items())
          + (f" (not alone: other processes kept {busy:.2f} cores busy)"
             if busy > BUSY_ELSEWHERE_LIMIT else ""), flush=True)
    return figures


def closed_line(run: Run, archive: Path | None) -> str:
    """Why a lost or ruled-out run is skipped, from its summary."""
    summary = closed_summary(run, archive) or {}
    if summary.get("status") == RULED_OUT:
        return f"{ruled_out_text(summary['ruled_out'])}; a ruled-out run is not resumed"
    where = archive / run.name / SUMMARY if archive is not None else run.run_dir / SUMMARY
    return (f"lost at {summary.get('frames') or 0:,} frames ({summary.get('lost', 'no reason')}"
            f"; {where}); a reported seed is not run again")


def ruled_out_text(reading: dict[str, Any]) -> str:
    return (f"ruled out: its {reading['window']}-game mean at {reading['episode_frames']:,} "
            f"frames, the first episode past {reading['at_frames']:,}, was "
            f"{reading['mean']:.2f}, below {reading['below']:g}")


def describe_exit(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit {code}"


def dry_run(runs: list[Run], args: argparse.Namespace) -> None:
    for run in runs:
        state = state_of(run, args.archive)
        if state == "finished":
            print(f"# skip {run.name}: finished ({finished_summary(run, args.archive)})")
            continue
        if state in (LOST, RULED_OUT):
            print(f"# skip {run.name}: {closed_line(run, args.archive)}")
            continue
        holder = run_lock_holder(run.run_dir)
        if holder is not None:
            print(f"# skip {run.name}: a run.py is running in it ({holder}); invoke again "
                  "once it has stopped")
            continue
        attempt, resumed, note = next_attempt(run.run_dir), state == "resume", state
        carried = (carry.carried_attempts(args.archive / run.name)
                   if state == "fresh" and args.archive is not None else None)
        if carried is not None:
            attempt, resumed = max(attempt, carried + 1), True
            note = f"resume, once {args.archive / run.name / carry.CARRY} is restored"
        print(f"# {run.name}: {note}")
        print(shlex.join(command_for(run, args.run_cmd, args.frames, args.set, resumed,
                                     attempt)))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    # --suite first: the agents it offers are --agents' choices
    which = argparse.ArgumentParser(add_help=False)
    which.add_argument("--suite", choices=sorted(SUITES), default=DEFAULT_SUITE)
    spec = SUITES[which.parse_known_args(argv)[0].suite]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default=DEFAULT_SUITE,
                        help="minatar (MinAtar-<game>, minatar_<agent> presets) or atari "
                             "(env.id=<game>, atari_short_<agent> presets)")
    parser.add_argument("--out", type=Path, required=True, help="suite directory")
    parser.add_argument("--agents", nargs="+", required=True, choices=sorted(spec.agents),
                        help=f"agents of --suite {spec.name}")
    parser.add_argument("--games", nargs="+", required=True, help=spec.games_help)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--frames", type=int, default=5_000_000, help="total_frames per run")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
    parser.add_argument("--set", nargs="+", default=[], action="extend", metavar="KEY=VALUE",
                        help="run.py overrides added to every run")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run none")
    parser.add_argument("--run-cmd", default=shlex.join([sys.executable, str(ROOT / "run.py")]),
                        help="the command a run's overrides are appended to")
    parser.add_argument("--archive", type=Path, metavar="DIR",
                        help="also keep each ended run's summary.json (with its curve) in "
                             "DIR/<run>/, small enough to commit; runs finished there are "
                             "skipped")
    defaults = "; ".join(f"{name}: {' '.join(f'{x:g}' for x in suite.reach) or 'none'}"
                         for name, suite in SUITES.items())
    parser.add_argument("--reach", type=float, nargs="*", metavar="RETURN",
                        help="levels of the 20-episode mean return: each record keeps the "
                             f"frames and run time to the first reaching (default {defaults})")
    parser.add_argument("--ale-seconds", type=float, default=5.0, metavar="S",
                        help="--suite atari: before the first run starts, time ale-py alone "
                             "on each game for S seconds (random actions, every core) and "
                             "keep the figure and the machine's name in each attempt's "
                             "record, for the report; 0: not timed")
    parser.add_argument("--stop-timeout", type=float, default=300.0,
                        help="seconds a stopped run may take to checkpoint before SIGKILL")
    parser.add_argument("--no-start-after", type=float, metavar="MINUTES",
                        help="start no run once this many minutes have passed since the grid "
                             "began; runs going on finish")
    parser.add_argument("--rule-out-at", type=float, nargs=2, metavar=("FRAMES", "BELOW"),
                        help="a tuning run's registered rule: at the first episode past "
                             "FRAMES, a mean of the last 20 episodes below BELOW stops the "
                             "run for good (recorded as ruled out, never resumed)")
    parser.add_argument("--rule-window", type=int, default=WINDOW, metavar="EPISODES",
                        help="--rule-out-at's mean is over this many episodes (default "
                             "%(default)s; 100 for a rule on the last-100 mean)")
    parser.add_argument("--stop-after", type=float, metavar="MINUTES",
                        help="at this many minutes, stop every run as SIGTERM does "
                             "(checkpoint, resumable) and exit")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.frames < 1:
        parser.error("--jobs and --frames must be positive")
    if not args.ale_seconds >= 0:
        parser.error(f"--ale-seconds must be a number of seconds >= 0, got {args.ale_seconds}")
    for name in ("no_start_after", "stop_after"):
        if getattr(args, name) is not None and not getattr(args, name) >= 0:
            parser.error(f"--{name.replace('_', '-')} must be a number of minutes >= 0, "
                         f"got {getattr(args, name)}")
    args.out = args.out.resolve()
    args.archive = args.archive.resolve() if args.archive is not None else None
    args.run_cmd = shlex.split(args.run_cmd)
    args.reach = list(spec.reach) if args.reach is None else args.reach
    return args


def refusal(args: argparse.Namespace) -> str | None:
    """Why the grid cannot start at all (before any run or file): an agent's preset file is
    missing, or --out's or --archive's grid.json holds another suite's runs."""
    spec = SUITES[args.suite]
    missing = missing_presets(args.agents, spec)
    if missing:
        return (f"no run started: no such preset file of --suite {spec.name}: "
                + ", ".join(f"{path} (--agents {agent})" for agent, path in missing.items()))
    for directory in (args.out, *([args.archive] if args.archive is not None else [])):
        conflict = suite_conflict(directory, args.suite)
        if conflict is not None:
            return conflict
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    refused = refusal(args)
    if refused is not None:
        print(f"reproduce.py: error: {refused}", file=sys.stderr, flush=True)
        return 2
    runs = plan(args.out, args.agents, args.games, args.seeds, SUITES[args.suite])
    if args.dry_run:
        dry_run(runs, args)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    update_grid(args.out, args)
    grid = Grid(args, runs)
    previous = {sig: signal.signal(sig, grid.on_signal)
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        grid.loop()
    except BaseException:
        grid.abort()
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    records = grid.records
    failed = [r for r in records if r["status"] == "failed"]
    counts = {s: sum(r["status"] == s for r in records) for s in ("finished", "stopped")}
    print(f"[reproduce] {len(runs)} runs: {counts['finished']} finished now, "
          f"{len(runs) - len(records) - len(grid.pending)} skipped or finished before, "
          f"{counts['stopped']} stopped, {len(failed)} failed, {len(grid.pending)} not started; "
          f"records in {args.out / 'summary.jsonl'}", flush=True)
    if failed:
        print("[reproduce] failed: " + ", ".join(
            f"{r['run']} ({describe_exit(r['exit_code'])})" for r in failed), flush=True)
    if grid.stop_signal:
        return 128 + grid.stop_signal
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
