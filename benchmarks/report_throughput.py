"""The throughput table of a MinAtar suite's report: each agent's frames/s of wall clock
over its finished runs, and the wall time of the runs and of the whole suite."""

from __future__ import annotations

import numpy as np
from curve import duration
from suite_runs import Suite, busy_seconds, most_at_once


def throughput_table(suite: Suite) -> str:
    """Per agent: frames/s of wall clock of its finished runs (median and range), how many
    runs shared the machine, and their wall time; then the wall time of the whole suite so
    far (unfinished attempts too), runs that ran side by side counted once."""
    lines = [
        "Throughput: frames per second of wall clock over a whole finished run (start-up, "
        "checkpoints and the final evaluation included), as `reproduce.py` recorded it; "
        "at a time: the most runs of the suite going at once while it ran, from its "
        "attempts' start times (for an attempt without one, `reproduce.py --jobs`); "
        "wall time: every attempt of every run, finished or not.",
        "",
        "| agent | finished runs | at a time | frames/s, median | range "
        "| wall time per run, median | wall time, all runs |",
        "|---|---:|---|---:|---|---:|---:|",
    ]
    total = 0.0
    every_span = [sp for r in suite.runs.values() for sp in r.spans]
    for agent in suite.agents:
        runs = [r for r in suite.runs.values() if r.agent == agent]
        spent = sum(r.wall_s or 0.0 for r in runs)
        total += spent
        timed = [r for r in runs if r.counted and r.fps and r.wall_s]
        if not timed:
            lines.append(f"| {agent} | 0 | — | — | — | — | {duration(spent)} |")
            continue
        fps = np.array([r.fps for r in timed])
        wall = np.median([r.wall_s for r in timed])
        at_once = {most_at_once(r.spans, every_span) if r.spans and not r.unplaced_s
                   else r.jobs for r in timed}
        jobs = ", ".join(str(j) for j in sorted(at_once))
        lines.append(f"| {agent} | {len(timed)} | {jobs} | {np.median(fps):,.0f} | "
                     f"{fps.min():,.0f}-{fps.max():,.0f} | {duration(wall)} | "
                     f"{duration(spent)} |")
    runs = suite.runs.values()
    clock = busy_seconds([sp for r in runs for sp in r.spans]) + sum(r.unplaced_s for r in runs)
    so_far = "" if all(r.status == "finished" for r in runs) else " so far"
    if round(clock) >= round(total):
        summary = f"Wall time of the suite{so_far}: {duration(total)}, one run at a time."
    else:
        summary = (f"Wall time of the suite{so_far}: {duration(clock)} of clock time in which "
                   f"at least one run was going (an hour of two runs side by side counts "
                   f"once); its runs took {duration(total)} between them.")
    lines += ["", summary]
    return "\n".join(lines) + "\n"

