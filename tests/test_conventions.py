"""Each agent's paper's conventions where a run leaves the choice open: the Atari action
set and the final evaluation's epsilon (life loss: tests/test_life_loss.py)."""

from __future__ import annotations

import pytest
from presets import compose_run

import agents
from agents import seed
from distrl.envs import make_envs
from distrl.run.run_settings import RunSettings


def _settings(tmp_path, agent: str, *overrides: str) -> RunSettings:
    cfg = compose_run(tmp_path, agent, f"agent={agent}", "env=Pong", *overrides)
    module = agents.get(agent)
    conventions = seed.conventions(cfg.agent) if agent == "seed" else module.CONVENTIONS
    return RunSettings.from_config(cfg, conventions)


@pytest.mark.parametrize("agent, overrides, actions", [
    ("impala", (), 6),  # Espeholt et al. 2018: single-game agents on the minimal set
    ("seed", (), 6),  # SEED-IMPALA, as IMPALA
    ("apex", (), 18),  # Kapturowski et al. 2019, Section 2.3: "Like Ape-X, ... 18-action set"
    ("r2d2", (), 18),
    ("seed", ("agent.learner=r2d2",), 18),  # SEED-R2D2, as R2D2 and seed_rl's Atari env
    ("apex", ("env.full_action_space=false",), 6),  # a run's own choice wins
    ("impala", ("env.protocol=machado",), 18),  # so does the Machado protocol's
])
def test_each_agent_acts_on_its_papers_action_set_on_pong(tmp_path, agent, overrides,
                                                          actions):
    settings = _settings(tmp_path, agent, *overrides)
    envs = make_envs(settings.env, 1, seed=0)
    try:
        assert envs.num_actions == actions
    finally:
        envs.close()


def test_minatar_keeps_its_own_action_set_under_every_agent(tmp_path):
    for agent in ("impala", "apex"):
        cfg = compose_run(tmp_path, agent, f"agent={agent}", "env=MinAtar-Breakout")
        settings = RunSettings.from_config(cfg, agents.get(agent).CONVENTIONS)
        assert settings.env.full_action_space is None  # MinAtar's own default: all 6


@pytest.mark.parametrize("agent, overrides, epsilon", [
    ("apex", (), 0.001),
    ("r2d2", (), 0.001),  # seed_rl's Atari R2D2 eval_epsilon
    ("seed", ("agent.learner=r2d2",), 0.001),
    ("impala", (), None),  # samples its policy
    ("apex", ("eval.epsilon=0",), 0.0),  # greedy when asked
])
def test_evaluation_epsilon_follows_the_agents_protocol(tmp_path, agent, overrides, epsilon):
    assert _settings(tmp_path, agent, *overrides).evaluation.epsilon == epsilon


class _Recorded(Exception):
    """Raised by the recording from_config: the run stops before anything starts."""


@pytest.mark.parametrize(("agent", "overrides", "learner"), [
    ("impala", ("agent=impala",), "impala"),
    ("apex", ("agent=apex",), "apex"),
    ("r2d2", ("agent=r2d2",), "r2d2"),
    ("seed", ("agent=seed",), "impala"),
    ("seed", ("agent=seed", "agent.learner=r2d2"), "r2d2"),
])
def test_each_agents_run_hands_its_papers_conventions_to_the_run_settings(
        tmp_path, monkeypatch, agent, overrides, learner):
    """What a run settles from its paper (life loss, action set, evaluation epsilon) comes
    from the agent's own CONVENTIONS, a SEED run's from its learner's."""
    seen = []

    def recording(cls, cfg, conventions=None):
        seen.append(conventions)
        raise _Recorded

    monkeypatch.setattr(RunSettings, "from_config", classmethod(recording))
    with pytest.raises(_Recorded):
        agents.get(agent).run(compose_run(tmp_path, agent, *overrides, "env=Pong"))
    assert len(seen) == 1 and seen[0] is agents.get(learner).CONVENTIONS

