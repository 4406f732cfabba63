"""Throughput diagnosis: which side of a run, the actors or the learner, bounds its frames
per second, by how much, and what to change, in the run's own settings.

A run is two workloads that feed each other (ARCHITECTURE.md, "The one idea"): actors
(or SEED's env workers and inference server) turn the policy into frames, the learner
turns frames into updates. Each side's time splits into work and waiting for the other:

- actors: stepping envs, the forward pass, copying (into slots or replay writers, weight
  pulls), and waiting for a free slot, i.e. for the learner;
- learner: its update step, building a batch (gathering slots, inserting into the
  replay, the prefetched sample), and waiting for a batch or for the replay ratio's
  credit, i.e. for the actors.

The **capacity** of a side is its rate divided by its busy fraction: the frames/s it
would reach if it never waited. The side with the lower capacity bounds the run; the
margin is the ratio of the capacities (within 15%: balanced). In one process
(``distributed.actors=0``) the sides take turns, so a side's busy fraction is its share
of the loop and the same rule names the side that takes longer. When both sides are
busy and the cores are all in use, the run is also **CPU-bound**: the sides compete for
cores, and moving work between them gains little.

Everything here is a pure function of :class:`Figures` (sums over a span of the run)
and a :class:`RunContext` (the run's settings); the live run (:mod:`distrl.training.loop`) and
``python -m distrl.diagnose`` (which reads the figures back from tensorboard) share it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from distrl.telemetry.throughput_figures import (  # noqa: F401 - the figures, re-exported
    BALANCED_WITHIN,
    BOUND_CODES,
    BUSY,
    CPU_FULL,
    NAN,
    Figures,
    RunContext,
    _finite,
    _margin_text,
    combine,
    derive,
    steady,
)
from distrl.telemetry.throughput_text import advise, describe, verdict


@dataclass
class Diagnosis:
    """Which side bounds the run (``bound``: learner, actors, balanced or unknown), by how
    much (``margin``: the faster side's capacity over the slower's, >= 1), whether the
    cores are the limit (``cpu_bound``), the figures as text lines, and advice."""

    bound: str
    margin: float
    cpu_bound: bool
    lines: list[str]
    advice: list[str]
    figures: dict[str, float]  # rates, fractions, capacities, cores (see :func:`derive`)

    @property
    def code(self) -> int:
        """-1 actor-bound, 0 balanced (or unknown), 1 learner-bound."""
        return BOUND_CODES[self.bound]

    @property
    def short(self) -> str:
        """``learner x2.3``, ``actors x1.6``, ``balanced`` or ``?``, ``+cpu`` if CPU-bound."""
        text = {"balanced": "balanced", "unknown": "?"}.get(self.bound)
        if text is None:
            text = f"{self.bound} x{_margin_text(self.margin)}"
        return text + (" +cpu" if self.cpu_bound else "")

    def scalars(self) -> dict[str, float]:
        """The diagnosis as tensorboard scalars under ``throughput/``."""
        return {"throughput/bound_code": float(self.code),
                "throughput/margin": _finite(self.margin),
                "throughput/cpu_bound": float(self.cpu_bound),
                **{f"throughput/{k}": _finite(v) for k, v in self.figures.items()}}

    def to_dict(self) -> dict[str, Any]:
        """For the run's summary (JSON-friendly: no NaN or inf)."""
        return {"bound": self.bound, "margin": _finite(self.margin, None),
                "cpu_bound": self.cpu_bound, "lines": list(self.lines),
                "advice": list(self.advice),
                "figures": {k: _finite(v, None) for k, v in self.figures.items()}}


def diagnose(fig: Figures, ctx: RunContext) -> Diagnosis:
    """Which side bounds the run the figures describe, and advice in ``ctx``'s settings."""
    d = derive(fig)
    serial = fig.serial >= 0.5
    capacities = d["actor_capacity"], d["learner_capacity"]
    if fig.updates == 0 or fig.actor_frames == 0 or any(
            math.isnan(c) or c <= 0 for c in capacities):
        bound, margin = "unknown", NAN
    else:
        ratio = capacities[0] / capacities[1]
        margin = max(ratio, 1 / ratio)
        bound = ("balanced" if margin < BALANCED_WITHIN
                 else "learner" if ratio > 1 else "actors")
    saturated = d["machine_busy"] >= CPU_FULL * fig.cores
    cpu_bound = (not serial and saturated and d["actor_busy"] >= BUSY
                 and d["learner_busy"] >= BUSY)
    lines = describe(fig, d, ctx)
    lines.append("verdict  " + verdict(bound, margin, cpu_bound, serial, fig, d, ctx))
    return Diagnosis(bound, margin, cpu_bound, lines,
                     advise(bound, margin, cpu_bound, saturated, serial, fig, d, ctx), d)
