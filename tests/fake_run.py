"""A stand-in for ``run.py`` in tests of ``benchmarks/reproduce.py``: it trains nothing but
writes what a distrl run writes (``episode/return`` events against frames, checkpoints in
``<run dir>/checkpoints/``), resumes from ``resume=``, and on SIGTERM prints distrl's line,
checkpoints and exits 0.

Takes run.py's ``key=value`` overrides (log.dir, log.name, seed, total_frames, resume) and,
from the environment: FAKE_STEP_S (seconds per step of total_frames / 20 frames),
FAKE_FAIL (comma-separated run names that exit 3 halfway), FAKE_ACTOR=1 (start a child
process, as distrl's actors, and stop it on exit), FAKE_EVAL=1 (log eval/return_mean),
FAKE_IGNORE_TERM=1 (a run that hangs on SIGTERM), FAKE_EPSILON=1 (each episode's
``episode/epsilon``, as a replay agent's run writes it).
Each run appends its argv, pid, actor pid and start/end times to
``<run dir>/invocations.jsonl``. Two episodes end in each step, each returning ``seed +
frames / total_frames``; a stopped run leaves one more (999) past its checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.event_file_writer import EventFileWriter

STEPS = 20
EPSILONS = (0.4, 0.001)  # FAKE_EPSILON=1: each step's two episodes' epsilons, in order


def scalar(writer: EventFileWriter, tag: str, value: float, step: int) -> None:
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
    writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))


def main() -> int:
    args = dict(a.lstrip("+").split("=", 1) for a in sys.argv[1:] if "=" in a)
    run_dir = Path(args["resume"]) if "resume" in args else (
        Path(args["log.dir"]) / args["log.name"])
    total, seed = int(args["total_frames"]), int(args["seed"])
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoints = run_dir / "checkpoints"
    checkpoints.mkdir(exist_ok=True)
    start = 0
    if "resume" in args:
        start = max(int(p.stem.split("-")[1]) for p in checkpoints.glob("checkpoint-*.pt"))
    # Event files sort by their name's whole second: a resume must land in a later one.
    while any(f"tfevents.{int(time.time()):010d}." in p.name
              for p in run_dir.glob("events.out.tfevents.*")):
        time.sleep(0.05)
    stop = []
    signal.signal(signal.SIGTERM, signal.SIG_IGN if os.environ.get("FAKE_IGNORE_TERM") == "1"
                  else lambda *_: stop.append(1))
    actor = (subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
             if os.environ.get("FAKE_ACTOR") == "1" else None)
    record = {"argv": sys.argv[1:], "pid": os.getpid(),
              "actor_pid": actor.pid if actor else None, "start": time.time()}
    with open(run_dir / "invocations.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    writer = EventFileWriter(str(run_dir))
    if start:  # as torch's SummaryWriter(purge_step=start): later events are dropped
        writer.add_event(event_pb2.Event(step=start, file_version="brain.Event:2"))
        writer.add_event(event_pb2.Event(step=start, session_log=event_pb2.SessionLog(
            status=event_pb2.SessionLog.START)))
    fail = args.get("log.name") in os.environ.get("FAKE_FAIL", "").split(",")
    step_s = float(os.environ.get("FAKE_STEP_S", "0"))
    epsilons = os.environ.get("FAKE_EPSILON") == "1"
    frames, code = start, 0
    while frames < total:
        time.sleep(step_s)
        frames = min(frames + total // STEPS, total)
        for k in range(2):  # episodes end inside the step: before its checkpoint's frames
            scalar(writer, "episode/return", seed + frames / total, frames - 1)
            if epsilons:
                scalar(writer, "episode/epsilon", EPSILONS[k], frames - 1)
        scalar(writer, "perf/fps", 1000.0, frames)
        writer.flush()
        if stop:
            print("[distrl] received signal 15: checkpointing and stopping", flush=True)
            (checkpoints / f"checkpoint-{frames:012d}.pt").write_text(str(frames))
            # an event past the checkpoint, as a crash leaves: the resume's purge drops it
            scalar(writer, "episode/return", 999.0, frames + 1)
            if epsilons:
                scalar(writer, "episode/epsilon", EPSILONS[0], frames + 1)
            break
        if fail and frames >= total // 2:
            print("fake failure", flush=True)
            code = 3
            break
        for old in checkpoints.glob("checkpoint-*.pt"):
            old.unlink()
        (checkpoints / f"checkpoint-{frames:012d}.pt").write_text(str(frames))
    if code == 0 and not stop and os.environ.get("FAKE_EVAL") == "1":
        scalar(writer, "eval/return_mean", 10.0 + seed, frames)
    writer.close()
    if actor is not None:
        actor.terminate()
        actor.wait()
    with open(run_dir / "invocations.jsonl", "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "end": time.time(), "code": code}) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
