"""Today's behaviour of every agent, pinned before the code moves: a few seeded updates
of IMPALA, SEED-IMPALA, Ape-X, R2D2 and SEED-R2D2, in one process and with actor (or env
worker) processes, compared with what the code gave when the pin was recorded
(tests/behaviour_pin.json).

Compared: the summary's keys; the checkpoint's entries (nested keys, tensor shapes and
dtypes) and, where the run is deterministic (one process), its integer counters and the
first updates' loss figures (later ones, and the final weights, could drift with another
CPU's float summation order through replay priorities and sampled actions). A change of
behaviour that is meant is recorded anew with ``python tests/test_behaviour_pin.py
--record``, and the diff of the JSON file shows what moved.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from presets import compose_run

import agents
from distrl.run.resume_settings import leaves
from distrl.training.learner import Learner

PIN = Path(__file__).with_name("behaviour_pin.json")
UPDATES_COMPARED = 3
SERIAL = ("distributed.actors=0",)
CARTPOLE = ("env=CartPole", "total_frames=2560", "distributed.envs_per_actor=32",
            "distributed.env_groups=1")
CARTPOLE_IMPALA = (*CARTPOLE, "agent.batch_size=32", "agent.unroll_length=20")
CASES: dict[str, tuple[str, ...]] = {
    "impala": ("agent=impala", *CARTPOLE_IMPALA, *SERIAL),
    "impala_actors": ("agent=impala", *CARTPOLE_IMPALA, "distributed.actors=2",
                      "distributed.envs_per_actor=16", "agent.batch_size=16"),
    "seed_impala_serial": ("agent=seed", *CARTPOLE, *SERIAL, "agent.impala.batch_size=32",
                           "agent.impala.unroll_length=20"),
    "seed_impala_workers": ("agent=seed", "env=CartPole", "total_frames=12800",
                            "distributed.actors=1", "distributed.envs_per_actor=16",
                            "distributed.env_groups=1", "agent.impala.batch_size=16"),
    "apex": ("+experiment=apex_cartpole", "total_frames=1600", "agent.learning_starts=500",
             *SERIAL),
    "apex_actors": ("+experiment=apex_cartpole", "total_frames=1600",
                    "agent.learning_starts=500", "distributed.actors=2",
                    "distributed.envs_per_actor=4"),
    "r2d2": ("+experiment=r2d2_cartpole", "total_frames=3000", "agent.learning_starts=20",
             "agent.batch_size=8", *SERIAL),
    "r2d2_actors": ("+experiment=r2d2_cartpole", "total_frames=3000",
                    "agent.learning_starts=20", "agent.batch_size=8", "distributed.actors=2",
                    "distributed.envs_per_actor=4"),
    "seed_r2d2_serial": ("+experiment=seed_r2d2_cartpole", "total_frames=3000",
                         "agent.r2d2.learning_starts=20", "agent.r2d2.batch_size=8",
                         *SERIAL, "distributed.envs_per_actor=8"),
    "seed_r2d2_workers": ("+experiment=seed_r2d2_cartpole", "total_frames=3000",
                          "agent.r2d2.learning_starts=20", "agent.r2d2.batch_size=8",
                          "distributed.actors=1", "distributed.envs_per_actor=4"),
}
# Figures of a run that vary from run to run however seeded: time, throughput.
VOLATILE = ("counters.elapsed_s", "rng.", "config", "throughput", "run_dir", "checkpoint")


def deterministic(case: str) -> bool:
    """One process steps envs and learner in turn: the run is a function of its seed."""
    return "distributed.actors=0" in CASES[case]


def _describe(value: Any, exact: bool) -> Any:
    """A tensor's shape and dtype; an int or bool itself where the run is deterministic."""
    if torch.is_tensor(value):
        return f"tensor{list(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    if exact and isinstance(value, (bool, int)):
        return value
    return type(value).__name__


def observe(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Run ``case`` and describe what the pin compares."""
    losses: list[dict[str, float]] = []
    step = Learner.step

    def recording_step(self: Learner, batch: Any) -> Any:
        metrics, priorities = step(self, batch)
        if len(losses) < UPDATES_COMPARED:
            losses.append({k: float(v) for k, v in sorted(metrics.items())
                           if not k.endswith("_s")})  # seconds: timing, not behaviour
        return metrics, priorities

    monkeypatch.setattr(Learner, "step", recording_step)
    cfg = compose_run(tmp_path, case, *CASES[case], "seed=3")
    result = agents.get(cfg.agent.name).run(cfg)
    exact = deterministic(case)
    state = torch.load(result["checkpoint"], weights_only=False)
    entries = {key: _describe(value, exact) for key, value in leaves(state).items()
               if not key.startswith(VOLATILE)}
    observed: dict[str, Any] = {"summary_keys": sorted(result), "checkpoint": entries}
    if exact:
        observed["losses"] = losses
        observed["counters"] = {k: result[k] for k in ("frames", "updates")}
    return observed


def _close(recorded: float, now: float) -> bool:
    # Few updates from the same seed: differences come from float summation order only
    # (another CPU's vector width), far below a change of behaviour.
    return math.isclose(recorded, now, rel_tol=1e-4, abs_tol=1e-6)


@pytest.mark.parametrize("case", sorted(CASES))
def test_behaviour_is_what_was_pinned(case: str, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    pinned = json.loads(PIN.read_text())[case]
    now = observe(case, tmp_path, monkeypatch)
    assert now["summary_keys"] == pinned["summary_keys"]
    assert now["checkpoint"] == pinned["checkpoint"]
    if not deterministic(case):
        return
    assert now["counters"] == pinned["counters"]
    assert len(now["losses"]) == len(pinned["losses"]) == UPDATES_COMPARED
    for update, (recorded, measured) in enumerate(zip(pinned["losses"], now["losses"],
                                                      strict=True)):
        assert recorded.keys() == measured.keys(), update
        wrong = {k: (recorded[k], measured[k]) for k in recorded
                 if not _close(recorded[k], measured[k])}
        assert not wrong, f"update {update + 1}: {wrong}"


def record() -> None:
    """Write tests/behaviour_pin.json from today's code."""
    import tempfile

    pins = {}
    with tempfile.TemporaryDirectory() as folder:
        for case in sorted(CASES):
            with pytest.MonkeyPatch.context() as monkeypatch:
                pins[case] = observe(case, Path(folder), monkeypatch)
    PIN.write_text(json.dumps(pins, indent=1, sort_keys=True) + "\n")
    print(f"recorded {len(pins)} cases in {PIN}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: python tests/test_behaviour_pin.py --record")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    record()
