"""A stand-in for :class:`distrl.telemetry.throughput_meter.ThroughputMeter` with fixed
figures, for tests of the training loop's reports that sample no CPU or memory."""

from __future__ import annotations

from types import SimpleNamespace


def fixed_meter() -> SimpleNamespace:
    """``measure`` and ``recent`` as the loop's Reporter calls them: 2 cores, 1 busy, a
    second each of env, forward and learning, no copying, no diagnosis."""
    figures = SimpleNamespace(as_scalars=dict, cores=2.0, learner_rss=0.0, actors_rss=0.0)
    split = SimpleNamespace(env_s=1.0, forward_s=1.0, step_s=1.0, actor_copy_s=0.0,
                            learner_copy_s=0.0)
    return SimpleNamespace(
        measure=lambda *args: (figures, SimpleNamespace(scalars=dict)),
        recent=lambda: (split, SimpleNamespace(figures={"cpu_busy": 1.0}, short="?")))
