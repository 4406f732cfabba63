"""The final-policy evaluation: each env's first episode only, the final weights, greedy
for the Q agents, and clear errors for a setting that does not apply."""

from __future__ import annotations

import pytest
import torch
from fake_envs import CounterEnv
from presets import compose_preset, compose_run
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from agents import impala, r2d2
from distrl.acting.actor import PolicyOutput
from distrl.acting.evaluation import EVAL_SEED_OFFSET, evaluate_policy
from distrl.config import ConfigError
from distrl.envs import make_envs
from distrl.run.checkpoint import load


class EnvIndexPolicy:
    """Acts with the env's index (the first observation entry) in every step."""

    def __init__(self) -> None:
        self.first_last_actions: torch.Tensor | None = None

    def initial_state(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        return ()

    def __call__(self, observations, core_state, last_actions=None, last_rewards=None):
        if self.first_last_actions is None:
            self.first_last_actions = last_actions.clone()
        return PolicyOutput(observations[:, 0].long(), {}, core_state)


def test_each_env_counts_its_first_episode_only():
    """Env i's episodes last (1, 3, 7)[i] steps and pay i + 1 per step: env 0 ends seven
    episodes while env 2 plays its first, and only each env's first one counts."""
    policy = EnvIndexPolicy()
    with CounterEnv([1, 3, 7]) as envs:
        result = evaluate_policy(policy, envs)
    assert result.returns == [1.0, 6.0, 21.0]
    assert result.lengths == [1, 3, 7]
    assert result.mean_return == pytest.approx(28 / 3)
    assert policy.first_last_actions.tolist() == [-1, -1, -1]  # episodes start fresh


def test_an_episode_outlasting_max_steps_is_an_error_not_a_shorter_evaluation():
    with CounterEnv([2, 10]) as envs, pytest.raises(
            RuntimeError, match="1 of 2 episodes still running after 5 steps"):
        evaluate_policy(EnvIndexPolicy(), envs, max_steps=5)


def test_r2d2_run_evaluates_its_final_weights_greedily_on_unseen_env_seeds(tmp_path, capsys):
    """The run's eval_returns are what the checkpointed weights score with epsilon 0 (the
    preset's eval.epsilon) on envs seeded from seed + EVAL_SEED_OFFSET, and they are
    logged under eval/ at the run's last frame."""
    cfg = compose_preset(tmp_path, "r2d2_cartpole", "run", "total_frames=3000",
                         "agent.learning_starts=20", "eval.episodes=4", "seed=3")
    cfg.log.tensorboard = True
    result = r2d2.run(cfg)
    returns = result["eval_returns"]
    assert len(returns) == 4
    assert result["eval_return"] == pytest.approx(sum(returns) / 4)
    assert "eval: 4 episodes (epsilon=0): return mean" in capsys.readouterr().out
    events = EventAccumulator(str(result["run_dir"]), size_guidance={"scalars": 0})
    events.Reload()
    logged = {tag: events.Scalars(tag) for tag in ("eval/return_mean", "eval/return_max",
                                                    "eval/episodes")}
    assert [e.value for e in logged["eval/return_mean"]] == pytest.approx([sum(returns) / 4])
    assert [e.value for e in logged["eval/return_max"]] == [max(returns)]
    assert [e.value for e in logged["eval/episodes"]] == [4]
    assert logged["eval/episodes"][0].step == result["frames"]

    model = r2d2.make_network((2,), 2, cfg.agent.model)
    model.load_state_dict(load(result["checkpoint"])["learner"]["model"])
    policy = r2d2.RecurrentEpsilonGreedyPolicy(model.eval(), torch.zeros(4))
    with make_envs(cfg.env, 4, 3 + EVAL_SEED_OFFSET) as envs:
        again = evaluate_policy(policy, envs)
    assert again.returns == result["eval_returns"]


def test_eval_epsilon_is_refused_for_impala_with_the_setting_named(tmp_path):
    cfg = compose_run(tmp_path, "run", "total_frames=640", "eval.episodes=2",
                      "eval.epsilon=0.05")
    with pytest.raises(ConfigError, match=r"eval.epsilon applies to the Q-learning agents "
                                          r"\(apex, r2d2\); impala is evaluated sampling"):
        impala.run(cfg)
    assert not (tmp_path / "run").exists()  # refused before the run directory was made


@pytest.mark.parametrize("override, message", [
    ("eval.episodes=-1", "eval.episodes must be a number >= 0, got -1"),
    ("eval.epsilon=1.5", r"eval.epsilon must lie in \[0, 1\], got 1.5"),
])
def test_bad_eval_settings_are_refused_with_the_field_named(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        compose_run(tmp_path, "run", override)
