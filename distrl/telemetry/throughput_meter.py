"""A live run's throughput figures, gathered at each report: the seconds the actors and
the learner measured (summed by the logger since the last report), what the feed knows
(frames learned, replay counts, slot occupancy), and the CPU and memory of the learner
process and its children. Each report's :class:`~distrl.telemetry.throughput.Figures` go to
tensorboard; their combination over the whole run is the summary's diagnosis."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any, TextIO

import yaml

from distrl.envs import is_atari
from distrl.telemetry.logging import MetricLogger
from distrl.telemetry.process_usage import ProcessUsage, usable_cores
from distrl.telemetry.throughput import Diagnosis, Figures, RunContext, combine, diagnose, steady


def run_context(config_text: str, distributed: Mapping[str, Any] | None = None,
                env_id: str | None = None) -> RunContext:
    """The settings the advice names, from the run's resolved config text (the YAML logged
    as the ``config`` text tag, possibly inside a Markdown code fence); ``distributed``
    fills in the topology where the text has none. Atari envs step in threads, so only
    they gain from a second env group."""
    text = config_text.strip().removeprefix("```").removesuffix("```")
    config = yaml.safe_load(text) if text.strip() else {}
    config = config if isinstance(config, dict) else {}
    if distributed is not None and not config.get("distributed"):
        config["distributed"] = dict(distributed)
    env = env_id if env_id is not None else str((config.get("env") or {}).get("id", ""))
    return RunContext.from_config(config, async_envs=bool(env) and is_atari(env))


class ThroughputMeter:
    """Builds each report's figures and keeps them for the whole run's diagnosis.

    Args:
        context: the run's settings, for the advice.
        serial: actors and learner take turns in one process (``distributed.actors=0``).
        learner_threads: the learner's torch threads (the resolved value).
        learner_gpu: the learner trains on a GPU.
        usage: the CPU and memory sampler (a new one for this process by default).
    """

    def __init__(self, context: RunContext, serial: bool, learner_threads: int,
                 learner_gpu: bool, usage: ProcessUsage | None = None):
        self.context = context
        self.serial, self.learner_threads, self.learner_gpu = serial, learner_threads, learner_gpu
        self.usage = usage if usage is not None else ProcessUsage()
        self.cores = usable_cores()
        self.reports: list[Figures] = []

    def measure(self, span_s: float, logger: MetricLogger, feed: Mapping[str, float],
                updates: int) -> tuple[Figures, Diagnosis]:
        """The figures of the report now due (read before the logger resets its sums) and
        their diagnosis. ``feed`` holds what the feed knows (``learned_frames``,
        ``sampled``, ``inserted``, ``replay_ratio_target``, ``replay_fill``,
        ``slots_full``); ``updates``: the learner's updates in the span."""
        used = self.usage.sample()
        total = logger.interval_sum
        inserting = total("learner/insert_s")
        figures = Figures(
            span_s=span_s, actor_frames=total("actor/frames"),
            learned_frames=feed.get("learned_frames", 0.0), updates=float(updates),
            env_s=total("actor/env_wait_s"), forward_s=total("actor/policy_s"),
            actor_copy_s=total("actor/copy_s"), actor_wait_s=total("actor/slot_wait_s"),
            step_s=total("learner/step_s"),
            learner_copy_s=(total("learner/copy_s") + inserting + total("learner/replay_wait_s")
                            + total("learner/draw_wait_s")),
            batch_wait_s=total("learner/batch_wait_s"),
            ratio_wait_s=max(total("learner/data_wait_s") - inserting, 0.0),
            sampled=feed.get("sampled", 0.0), inserted=feed.get("inserted", 0.0),
            learner_cpu_s=used.learner_cpu_s, actors_cpu_s=used.children_cpu_s,
            machine_cpu_s=used.machine_cpu_s,
            serial=float(self.serial),
            replay_ratio_target=feed.get("replay_ratio_target", math.nan),
            replay_fill=feed.get("replay_fill", math.nan),
            slots_full=feed.get("slots_full", math.nan), cores=float(self.cores),
            learner_rss=used.learner_rss, actors_rss=used.children_rss,
            learner_threads=float(self.learner_threads), learner_gpu=float(self.learner_gpu))
        self.reports.append(figures)
        return figures, diagnose(figures, self.context)

    def recent(self, reports: int = 3) -> tuple[Figures, Diagnosis]:
        """The figures of the last ``reports`` reports (never the first, which spans the
        start, once there is another) and their diagnosis: what the progress line shows,
        steadier than one report's (the last before a stop may last an instant)."""
        after_start = self.reports[1:] or self.reports  # the first spans the start
        figures = combine(after_start[-reports:])
        return figures, diagnose(figures, self.context)

    def whole_run(self) -> Diagnosis:
        """The diagnosis over this process's run (since its resume), its start left out
        (:func:`~distrl.telemetry.throughput.steady`)."""
        return diagnose(combine(steady(self.reports)), self.context)

    def finish(self, stream: TextIO | None) -> dict[str, Any]:
        """Print the whole run's diagnosis to ``stream`` (None: stdout) and return it for
        the run's summary (``"throughput"``)."""
        diagnosis = self.whole_run()
        out = stream or sys.stdout
        print(f"[distrl] throughput over the run: {diagnosis.short}", file=out)
        for line in diagnosis.lines:
            print(f"[distrl]   {line}", file=out)
        for advice in diagnosis.advice:
            print(f"[distrl]   advice: {advice}", file=out)
        out.flush()
        return diagnosis.to_dict()
