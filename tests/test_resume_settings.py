"""Resume keeps the run: the checkpoint's settings are the run's, a
differing command-line value is refused by name unless ``resume_overrides`` names it, a
named change is applied for real (the lr schedule and the optimizer follow it) and logged.

The merge rules are tested on plain dicts; four runs of ``python run.py`` (CartPole, one
process) and one Ape-X resume through the Python API check the whole path.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf
from presets import compose_preset, compose_run, run_py

from agents import apex, impala
from distrl.config import ConfigError, RunConfig
from distrl.run import checkpoint
from distrl.run.resume_settings import (
    given_leaves,
    merge_resumed,
    stored_config,
)
from distrl.training.learner import rebase_lr_schedule

RUN_DIR = Path("moved/run1")  # where the stored run's checkpoint is now

# ---------------------------------------------------------------- the merge, on plain dicts


def stored_run() -> dict[str, Any]:
    """A stored config, shaped as RunConfig's (trimmed to the fields the cases use)."""
    return {
        "agent": {"name": "impala", "batch_size": 32, "device": "auto",
                  "optimizer": {"lr": 0.004, "lr_schedule": "linear"}},
        "distributed": {"actors": 2, "envs_per_actor": 16, "learner_threads": 0},
        "log": {"dir": "runs", "name": "run1", "interval_s": 5.0},
        "eval": {"episodes": 30},
        "total_frames": 5120, "seed": 0, "resume": None, "resume_overrides": [],
    }


def composed_run(**changes: Any) -> dict[str, Any]:
    """The command line's composition: the defaults (unlike the stored run), with ``changes``
    (dotted keys) applied."""
    tree = {
        "agent": {"name": "impala", "batch_size": 32, "device": "auto",
                  "optimizer": {"lr": 0.0012, "lr_schedule": "linear"}},
        "distributed": {"actors": 0, "envs_per_actor": 32, "learner_threads": 0},
        "log": {"dir": "runs", "name": "", "interval_s": 5.0},
        "eval": {"episodes": 0},
        "total_frames": 1_200_000, "seed": 0, "resume": "runs/run1", "resume_overrides": [],
    }
    for path, value in changes.items():
        node = tree
        *parents, last = path.split(".")
        for key in parents:
            node = node[key]
        node[last] = value
    return tree


def merge(given: set[str], overrides: tuple[str, ...] = (), **changes: Any
          ) -> tuple[dict[str, Any], list[str]]:
    composed = composed_run(resume_overrides=list(overrides), **changes)
    return merge_resumed(stored_run(), composed, stored_run(), given, list(overrides), RUN_DIR)


def test_settings_the_command_line_does_not_give_are_the_stored_ones() -> None:
    merged, lines = merge(set())
    expected = stored_run()
    expected["resume"] = "runs/run1"
    expected["log"].update(dir="moved", name="run1")  # where the checkpoint is
    assert merged == expected
    assert lines == []


def test_a_given_value_equal_to_the_stored_one_is_no_conflict() -> None:
    merged, lines = merge({"total_frames", "agent.optimizer.lr"}, total_frames=5120,
                          **{"agent.optimizer.lr": 0.004})
    assert merged["total_frames"] == 5120 and lines == []


def test_a_differing_value_is_refused_with_both_values_and_the_override_to_use() -> None:
    with pytest.raises(ConfigError) as info:
        merge({"total_frames"}, total_frames=200_000)
    assert str(info.value) == (
        "total_frames: this run was started with 5120, the command line gives 200000; to "
        "change it on resume add it to resume_overrides, e.g. resume_overrides=[total_frames]")


def test_several_differing_values_are_named_on_one_line() -> None:
    with pytest.raises(ConfigError) as info:
        merge({"total_frames", "distributed.actors"}, total_frames=200_000)
    assert str(info.value) == (
        "distributed.actors: this run was started with 2, the command line gives 0 (also "
        "differing: total_frames); to change them on resume add them to resume_overrides, "
        "e.g. resume_overrides=[distributed.actors,total_frames]")


def test_auto_keeps_the_sizes_auto_chose_at_the_runs_start() -> None:
    # An Atari run stores the numbers auto sizing chose; the command that started it gives
    # auto again (an env preset sets it), and resumes it with the same topology.
    merged, lines = merge({"distributed.actors", "distributed.envs_per_actor"},
                          **{"distributed.actors": "auto", "distributed.envs_per_actor": "auto"})
    assert merged["distributed"] == stored_run()["distributed"]
    assert lines == [
        "[distrl] resume: distributed.actors 2 (auto chose it at the run's start)",
        "[distrl] resume: distributed.envs_per_actor 16 (auto chose it at the run's start)",
    ]
    # A number other than the stored one is still a change to name.
    with pytest.raises(ConfigError, match=r"^distributed.actors: this run was started with 2, "
                                          r"the command line gives 1;"):
        merge({"distributed.actors"}, **{"distributed.actors": 1})


def test_a_named_value_is_taken_and_logged() -> None:
    merged, lines = merge({"total_frames", "agent.optimizer.lr"},
                          ("total_frames", "agent.optimizer.lr"), total_frames=200_000,
                          **{"agent.optimizer.lr": 0.002})
    assert merged["total_frames"] == 200_000
    assert merged["agent"]["optimizer"]["lr"] == 0.002
    assert merged["distributed"] == stored_run()["distributed"]  # not given: stored
    assert merged["resume_overrides"] == ["total_frames", "agent.optimizer.lr"]
    assert lines == [
        "[distrl] resume: agent.optimizer.lr 0.004 -> 0.002 (resume_overrides)",
        "[distrl] resume: total_frames 5120 -> 200000 (resume_overrides)",
    ]


def test_a_group_name_in_the_override_list_covers_its_fields() -> None:
    merged, _ = merge({"agent.optimizer.lr"}, ("agent.optimizer",),
                      **{"agent.optimizer.lr": 0.002})
    assert merged["agent"]["optimizer"]["lr"] == 0.002


def test_free_settings_change_without_being_named_and_are_logged() -> None:
    merged, lines = merge({"eval.episodes", "log.interval_s", "distributed.learner_threads",
                           "agent.device"},
                          **{"eval.episodes": 5, "log.interval_s": 1.0,
                             "distributed.learner_threads": 2, "agent.device": "cpu"})
    assert (merged["eval"]["episodes"], merged["log"]["interval_s"]) == (5, 1.0)
    assert merged["distributed"]["learner_threads"] == 2 and merged["agent"]["device"] == "cpu"
    assert lines[0] == "[distrl] resume: agent.device 'auto' -> 'cpu' (may change on resume)"
    assert len(lines) == 4


def test_an_unknown_override_name_is_refused_by_name() -> None:
    with pytest.raises(ConfigError) as info:
        merge({"agent.optimizer.lr"}, ("agent.optimizer.lrr",), **{"agent.optimizer.lr": 0.1})
    assert str(info.value) == (
        "resume_overrides: 'agent.optimizer.lrr' is not a setting; name settings by their "
        "dotted path, e.g. total_frames, agent.optimizer.lr")


def test_an_override_name_without_a_command_line_value_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        merge(set(), ("total_frames",))
    assert str(info.value) == ("resume_overrides names total_frames but the command line "
                               "gives no value for it; add e.g. total_frames=<value>")


@pytest.mark.parametrize("name", ["agent.name", "log.name", "log.dir"])
def test_fixed_settings_cannot_be_named(name: str) -> None:
    with pytest.raises(ConfigError, match=rf"^resume_overrides: {name} cannot change on "
                                          "resume: "):
        merge({name}, (name,))
    with pytest.raises(ConfigError, match=r"^resume_overrides: 'resume' is always taken from "
                                          "the command line"):
        merge(set(), ("resume",))


def test_another_agent_is_refused_with_the_reason() -> None:
    with pytest.raises(ConfigError) as info:
        merge({"agent.name"}, **{"agent.name": "apex"})
    assert str(info.value) == (
        "agent.name: this run was started with 'impala', the command line gives 'apex'; "
        "agent.name cannot change on resume: the checkpoint holds this agent's learner; "
        "start a new run (another log.name) for another agent")


def test_a_group_named_in_resume_overrides_does_not_free_the_agent_name() -> None:
    """resume_overrides=[agent] frees the agent's settings, but not agent.name."""
    with pytest.raises(ConfigError) as info:
        merge({"agent.name"}, ("agent",), **{"agent.name": "apex"})
    assert str(info.value) == (
        "agent.name: this run was started with 'impala', the command line gives 'apex'; "
        "agent.name cannot change on resume: the checkpoint holds this agent's learner; "
        "start a new run (another log.name) for another agent")


def test_log_dir_and_name_are_where_the_checkpoint_is() -> None:
    merged, lines = merge({"log.dir", "log.name"}, **{"log.dir": "moved/../moved",
                                                     "log.name": "run1"})
    assert merged["log"] == {"dir": "moved", "name": "run1", "interval_s": 5.0}
    assert lines == []
    with pytest.raises(ConfigError) as info:
        merge({"log.name"}, **{"log.name": "other"})
    assert str(info.value) == (
        "log.name: a resumed run writes into its checkpoint's directory 'moved/run1', the "
        "command line gives log.name='other'; leave log.name out, or resume the run you mean")
    with pytest.raises(ConfigError, match=r"^log.dir: a resumed run writes into its "
                                          r"checkpoint's directory 'moved/run1', the command "
                                          r"line gives log.dir='runs';"):
        merge({"log.dir"})


def test_a_setting_the_stored_agent_does_not_have_is_refused() -> None:
    composed = composed_run(**{"agent.unroll_length": 5})
    with pytest.raises(ConfigError) as info:
        merge_resumed(stored_run(), composed, stored_run(), {"agent.unroll_length"}, [],
                      RUN_DIR)
    assert str(info.value) == ("agent.unroll_length is not a setting of this run (agent "
                               "'impala', as its checkpoint stores it)")


def test_a_setting_newer_than_the_checkpoint_takes_the_given_value() -> None:
    stored = stored_run()
    del stored["seed"]
    schema = stored_run()
    merged, lines = merge_resumed(stored, composed_run(seed=3), schema, {"seed"}, [], RUN_DIR)
    assert merged["seed"] == 3 and lines == []


def test_seed_agents_nested_optimizer_is_walked() -> None:
    stored = stored_run()
    stored["agent"] = {"name": "seed", "device": "auto",
                       "impala": {"device": "auto", "optimizer": {"lr": 0.003}}}
    composed = composed_run()
    composed["agent"] = {"name": "seed", "device": "auto",
                         "impala": {"device": "cuda", "optimizer": {"lr": 0.001}}}
    given = {"agent.name", "agent.impala.optimizer.lr", "agent.impala.device"}
    with pytest.raises(ConfigError, match=r"^agent.impala.optimizer.lr: this run was started "
                                          r"with 0.003, the command line gives 0.001;"):
        merge_resumed(stored, composed, stored, given, [], RUN_DIR)
    merged, lines = merge_resumed(stored, composed, stored, given,
                                  ["agent.impala.optimizer.lr"], RUN_DIR)
    assert merged["agent"]["impala"] == {"device": "cuda", "optimizer": {"lr": 0.001}}
    assert lines == [
        "[distrl] resume: agent.impala.device 'auto' -> 'cuda' (may change on resume)",
        "[distrl] resume: agent.impala.optimizer.lr 0.003 -> 0.001 (resume_overrides)",
    ]


def test_given_leaves_are_named_keys_and_what_differs_from_the_agents_defaults() -> None:
    baseline = {"a": 1, "b": {"c": 2, "d": [1]}, "e": {"f": 0}}
    composed = {"a": 5, "b": {"c": 2, "d": [1]}, "e": {"f": 0}, "g": 3}
    assert given_leaves(composed, baseline, ["b", "e.f", "hydra.run.dir"]) == {
        "a", "b.c", "b.d", "e.f", "g"}
    assert given_leaves(composed, baseline, ["e"]) == {"a", "e.f", "g"}


def test_resume_overrides_without_resume_or_with_a_non_name_are_refused() -> None:
    with pytest.raises(ConfigError) as info:
        RunConfig(agent=impala.ImpalaConfig(), resume_overrides=["total_frames"])
    assert str(info.value) == (
        "resume_overrides names total_frames but resume is not set; it applies only when "
        "resuming (resume=<run dir or checkpoint>)")
    with pytest.raises(ConfigError, match=r"^resume_overrides must list settings by their "
                                          r"dotted path, e.g. \[total_frames\]; got ''$"):
        RunConfig(agent=impala.ImpalaConfig(), resume="x", resume_overrides=[""])


# ---------------------------------------------------------------- the lr after a restore


def linear_schedule(lr: float, total: int) -> tuple[torch.optim.Optimizer, Any]:
    params = [torch.nn.Parameter(torch.zeros(2))]
    optimizer = torch.optim.SGD(params, lr=lr)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda update: max(1.0 - update / total, 0.0))


def test_rebase_gives_the_uninterrupted_lr_and_follows_a_new_lr_and_total() -> None:
    optimizer, scheduler = linear_schedule(0.004, 8)
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    saved = optimizer.state_dict(), scheduler.state_dict()
    assert optimizer.param_groups[0]["lr"] == 0.004 * (1 - 3 / 8)

    same_opt, same = linear_schedule(0.004, 8)
    same_opt.load_state_dict(saved[0])
    same.load_state_dict(saved[1])
    rebase_lr_schedule(same, 0.004)
    assert same_opt.param_groups[0]["lr"] == 0.004 * (1 - 3 / 8)

    new_opt, new = linear_schedule(0.002, 16)
    new_opt.load_state_dict(saved[0])
    new.load_state_dict(saved[1])
    assert new_opt.param_groups[0]["lr"] == 0.004 * (1 - 3 / 8)  # the checkpoint's, stale
    rebase_lr_schedule(new, 0.002)
    assert new_opt.param_groups[0]["lr"] == pytest.approx(0.002 * (1 - 3 / 16), rel=1e-12)
    assert new.get_last_lr() == [new_opt.param_groups[0]["lr"]]
    new_opt.step()
    new.step()
    assert new_opt.param_groups[0]["lr"] == pytest.approx(0.002 * (1 - 4 / 16), rel=1e-12)
    assert new.base_lrs == [0.002]


def test_rebase_refuses_another_scheduler() -> None:
    optimizer, _ = linear_schedule(0.1, 2)
    step = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    with pytest.raises(TypeError, match="^rebase_lr_schedule takes a LambdaLR, got StepLR$"):
        rebase_lr_schedule(step, 0.1)


def test_stored_config_reads_the_checkpoint_config(tmp_path: Path) -> None:
    text = OmegaConf.to_yaml(OmegaConf.create({"total_frames": 5120, "agent": {"name": "x"}}))
    checkpoint.save({"format": 1, "config": text, "weights": torch.ones(3)}, tmp_path, 7)
    assert stored_config(str(tmp_path)) == {"total_frames": 5120, "agent": {"name": "x"}}
    path = checkpoint.save({"format": 1}, tmp_path / "bare", 1)
    with pytest.raises(checkpoint.CheckpointError) as info:
        stored_config(str(path))
    assert str(info.value) == f"resume: checkpoint '{path}' holds no config"
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(bytes(range(256)))
    with pytest.raises(checkpoint.CheckpointError, match="^resume: cannot read checkpoint"):
        stored_config(str(garbage))


# ---------------------------------------------------------------- whole runs

FRAMES_PER_UPDATE = 20 * 32  # T=20 x B=32 CartPole steps (one frame each)
STORED = ("agent=impala", "env=CartPole", "total_frames=5120",  # 8 updates
          "distributed.envs_per_actor=16", "agent.optimizer.lr=0.004")
# Free settings: a checkpoint after every update, all kept, so each update's lr can be read.
EVERY_UPDATE = ("checkpoint.interval_s=1e-9", "checkpoint.keep=100")


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run with non-default total_frames, lr and envs_per_actor, stopped after 3 of its 8
    updates (its checkpoint holds update 3)."""
    root = tmp_path_factory.mktemp("stopped")
    cfg = compose_run(root, "run", *STORED)
    result = impala.run(cfg, should_stop=lambda updates: updates >= 3)
    assert result["updates"] == 3
    return Path(result["run_dir"])


@pytest.fixture
def run_dir(stopped_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(stopped_run, tmp_path / "run"))


def checkpoints_by_update(run_dir: Path) -> dict[int, dict[str, Any]]:
    return {int(p.stem.split("-")[1]): checkpoint.load(p)
            for p in checkpoint.list_checkpoints(run_dir / "checkpoints")}


def stored_settings(state: dict[str, Any]) -> tuple[int, float, int]:
    cfg = OmegaConf.create(state["config"])
    return cfg.total_frames, cfg.agent.optimizer.lr, cfg.distributed.envs_per_actor


def lr_of(state: dict[str, Any]) -> float:
    return state["learner"]["optimizer"]["param_groups"][0]["lr"]


def test_resume_alone_continues_with_the_stored_settings_and_schedule(
        run_dir: Path, tmp_path: Path) -> None:
    result = run_py(tmp_path, f"resume={run_dir}", *EVERY_UPDATE)
    assert result.returncode == 0, result.stderr
    assert "actors=0 envs_per_actor=16 env_groups=1" in result.stdout
    assert ("[distrl] resume: checkpoint.interval_s 3600.0 -> 1e-09 (may change on resume)"
            in result.stdout.splitlines())
    states = checkpoints_by_update(run_dir)
    assert sorted(states) == [3, 4, 5, 6, 7, 8]  # the stored budget: 8 updates, not 1.2M frames
    for update, state in states.items():
        # An uninterrupted run's lr after `update` updates: 0.004 decaying to 0 over 8.
        assert lr_of(state) == pytest.approx(0.004 * (1 - update / 8), rel=1e-12, abs=0)
        assert state["counters"]["frames"] == update * FRAMES_PER_UPDATE
        assert stored_settings(state) == (5120, 0.004, 16)
    # The copied run writes into its new place, and its config says so from then on.
    log = OmegaConf.create(states[8]["config"]).log
    assert (log.dir, log.name) == (str(tmp_path), "run")


def test_a_differing_total_frames_is_refused_and_the_run_dir_is_untouched(
        run_dir: Path, tmp_path: Path) -> None:
    def snapshot() -> dict[str, tuple[str, int]]:
        return {str(p): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
                for p in sorted(run_dir.rglob("*")) if p.is_file()}

    before = snapshot()
    result = run_py(tmp_path, f"resume={run_dir}", "total_frames=10240")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        "distrl: error: total_frames: this run was started with 5120, the command line gives "
        "10240; to change it on resume add it to resume_overrides, e.g. "
        "resume_overrides=[total_frames]"]
    assert snapshot() == before


def test_named_overrides_move_the_schedule_and_reach_the_optimizer(
        run_dir: Path, tmp_path: Path) -> None:
    result = run_py(tmp_path, f"resume={run_dir}", "total_frames=10240",
                    "agent.optimizer.lr=0.002",
                    "resume_overrides=[total_frames,agent.optimizer.lr]", *EVERY_UPDATE)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "[distrl] resume: agent.optimizer.lr 0.004 -> 0.002 (resume_overrides)" in lines
    assert "[distrl] resume: total_frames 5120 -> 10240 (resume_overrides)" in lines
    states = checkpoints_by_update(run_dir)
    assert sorted(states) == list(range(3, 17))  # 10240 frames: 16 updates
    assert lr_of(states[3]) == pytest.approx(0.004 * (1 - 3 / 8), rel=1e-12)  # before resuming
    for update in range(4, 17):
        # The new lr, decaying over the new budget from the resumed frame on.
        assert lr_of(states[update]) == pytest.approx(0.002 * (1 - update / 16), rel=1e-12,
                                                      abs=0)
        assert states[update]["learner"]["scheduler"]["base_lrs"] == [0.002]
        assert stored_settings(states[update]) == (10240, 0.002, 16)


def test_an_unknown_override_name_is_refused_on_the_command_line(
        run_dir: Path, tmp_path: Path) -> None:
    result = run_py(tmp_path, f"resume={run_dir}", "resume_overrides=[agent.optimizer.lrr]")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "distrl: error: resume_overrides: 'agent.optimizer.lrr' is not a setting; name "
        "settings by their dotted path, e.g. total_frames, agent.optimizer.lr"]


def test_a_new_lr_reaches_a_resumed_replay_learner(tmp_path: Path) -> None:
    """Ape-X (constant schedule) resumed through the Python API with another lr: the
    replay family's restored optimizer takes it from the next update on."""
    common = ("agent.learning_starts=100", "agent.actor_buffer=50", "agent.replay_ratio=4.0",
              "distributed.envs_per_actor=4", "total_frames=1000000",
              "agent.optimizer.lr_schedule=constant")
    part = apex.run(compose_preset(tmp_path, "apex_cartpole", "part", *common),
                    should_stop=lambda updates: updates >= 2)
    assert lr_of(checkpoint.load(part["checkpoint"])) == 0.001  # the preset's
    resumed = compose_preset(tmp_path, "apex_cartpole", "part", *common,
                             "agent.optimizer.lr=0.0005")
    resumed.resume = part["checkpoint"]
    result = apex.run(resumed, should_stop=lambda updates: updates >= 3)
    state = checkpoint.load(result["checkpoint"])
    assert state["learner"]["updates"] == 3
    assert lr_of(state) == 0.0005
    assert state["learner"]["scheduler"]["base_lrs"] == [0.0005]


def test_resume_auto_keeps_its_resume_overrides_only_when_it_resumes(tmp_path, capsys):
    """A launcher's one command (``resume=auto log.name=job resume_overrides=[...]``) on its
    first start, with no checkpoint yet, starts the run without the overrides (which apply
    only to a resume, and would be refused without one); once the run has a checkpoint the
    same command resumes it, its overrides kept."""
    from distrl.run import checkpoint
    from distrl.run.resume_settings import resolve_auto_resume

    cfg = OmegaConf.create({"log": {"dir": str(tmp_path), "name": "job"}, "resume": "auto",
                            "resume_overrides": ["total_frames"]})
    first = resolve_auto_resume(cfg, {})
    assert (first.resume, list(first.resume_overrides), first.log.name) == (None, [], "job")
    checkpoint.save({"format": 1}, tmp_path / "job" / "checkpoints", 1)
    again = resolve_auto_resume(cfg, {})
    assert (again.resume, list(again.resume_overrides)) == (str(tmp_path / "job"),
                                                             ["total_frames"])
    assert capsys.readouterr().out.splitlines() == [
        f"[distrl] resume=auto: no checkpoint in {tmp_path / 'job'}, starting the run there",
        f"[distrl] resume=auto: continuing {tmp_path / 'job'} from its newest intact checkpoint"]
