"""Evaluation of a trained policy: whole games on fresh environments, no learning.

Training returns (``episode/return``) come from the actors' exploring policies, and a run
that stops the first time their 20-episode mean crosses a threshold stops at a high
point of a noisy curve. What a paper's score table reports is the trained policy played
on its own: the Q agents greedily (or with a small epsilon), IMPALA sampling from its
softmax. :func:`evaluate_policy` plays one whole episode in each of ``N`` environments
and counts each env's first episode only, so long and short episodes weigh alike
(counting the first ``N`` episodes to end would favour the short ones). An episode here
is a whole game: where a lost life ends the learner's episode
(``EnvConfig.terminal_on_life_loss``) the game goes on and is scored over all its lives.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from distrl.acting.actor import Actor, ActorStats, EnvGroup, Policy, PolicyOutput
from distrl.config import EnvConfig, EvalConfig
from distrl.envs import VectorEnv, make_envs
from distrl.telemetry.logging import MetricLogger
from distrl.types import EnvStep

# Evaluation envs are seeded from the run seed plus this, far from every training env's
# seed (distrl.envs.env_seed), so the policy is scored on episodes it never trained on.
EVAL_SEED_OFFSET = 500_000_000


@dataclass(frozen=True)
class Evaluation:
    """Raw (unclipped) returns and lengths of the evaluation episodes, one per env."""

    returns: list[float]
    lengths: list[int]

    @property
    def mean_return(self) -> float:
        return sum(self.returns) / len(self.returns)

    def metrics(self) -> dict[str, float]:
        """The scalars logged under ``eval/``."""
        return {"eval/return_mean": self.mean_return,
                "eval/return_median": float(np.median(self.returns)),
                "eval/return_min": min(self.returns), "eval/return_max": max(self.returns),
                "eval/length_mean": sum(self.lengths) / len(self.lengths),
                "eval/episodes": len(self.returns)}


class FirstEpisodes:
    """A sink that keeps each env's first finished game and stores nothing else."""

    def __init__(self, num_envs: int) -> None:
        self.returns = np.full(num_envs, np.nan)
        self.lengths = np.zeros(num_envs, np.int64)

    @property
    def complete(self) -> bool:
        return not np.isnan(self.returns).any()

    def begin(self, observations: torch.Tensor, core_state: tuple[torch.Tensor, ...]) -> None:
        pass

    def act(self, output: PolicyOutput, version: int) -> None:
        pass

    def observe(self, step: EnvStep, core_state: tuple[torch.Tensor, ...]) -> None:
        first = step.game_over & np.isnan(self.returns)  # whole games, not lives
        self.returns[first] = step.episode_returns[first]
        self.lengths[first] = step.episode_lengths[first]


def evaluate_policy(policy: Policy, envs: VectorEnv, max_steps: int | None = None
                    ) -> Evaluation:
    """Play ``policy`` until every env of ``envs`` has finished its first game (all lives).

    Envs that finish early keep stepping (their later episodes are ignored) so that the
    batch keeps its shape. ``max_steps`` bounds the loop for envs without a time limit;
    an episode still running then is an error, never a silently shorter evaluation.
    The caller owns ``envs`` (this leaves them open).
    """
    sink = FirstEpisodes(envs.num_envs)
    actor = Actor([EnvGroup(envs, sink)], policy, pull_weights=lambda: 0, stats=ActorStats())
    steps = 0
    while not sink.complete:
        if max_steps is not None and steps >= max_steps:
            running = int(np.isnan(sink.returns).sum())
            raise RuntimeError(f"evaluation: {running} of {envs.num_envs} episodes still "
                               f"running after {max_steps} steps")
        actor.step()
        steps += 1
    return Evaluation([float(r) for r in sink.returns], [int(n) for n in sink.lengths])


def frozen_cpu_copy(model: nn.Module) -> nn.Module:
    """The model to evaluate: a CPU copy in eval mode, so evaluation neither touches the
    learner's parameters nor competes with it for the accelerator."""
    return copy.deepcopy(model).cpu().eval().requires_grad_(False)


def describe(evaluation: Evaluation, epsilon: float | None) -> str:
    """One console line: how many episodes, with which policy, and the return figures."""
    how = "sampling its policy" if epsilon is None else f"epsilon={epsilon:g}"
    returns = evaluation.returns
    spread = 0.0 if len(returns) < 2 else float(np.std(returns, ddof=1))
    return (f"[distrl] eval: {len(returns)} episodes ({how}): return mean "
            f"{evaluation.mean_return:.1f} (sd {spread:.1f}, median "
            f"{float(np.median(returns)):.1f}, min {min(returns):.1f}, max "
            f"{max(returns):.1f})")


def evaluate_final_policy(cfg: EvalConfig, env: EnvConfig, seed: int,
                          make_policy: Callable[[], Policy], logger: MetricLogger, frames: int,
                          epsilon: float | None) -> dict[str, Any]:
    """Play ``cfg.episodes`` evaluation episodes with ``make_policy()``, log them under
    ``eval/`` at ``frames`` and print one line; returns the run summary's ``eval_return``
    and ``eval_returns`` (nothing, and no policy built, when ``cfg.episodes`` is 0).

    The envs are seeded apart from every training env and keep ``env``'s settings, so a
    lost life resets a recurrent policy's state as it did in training
    (``env.terminal_on_life_loss``); each env's first whole game is scored, all lives, as
    the papers score it. ``epsilon`` is what the policy explores with (None: it samples
    its own distribution).
    """
    if cfg.episodes == 0:
        return {}
    with make_envs(env, cfg.episodes, seed + EVAL_SEED_OFFSET) as envs:
        # no episode may outlast env.max_episode_frames; without a time limit it is an error
        max_steps = env.max_episode_frames // envs.frames_per_step + 1
        evaluation = evaluate_policy(make_policy(), envs, max_steps=max_steps)
    logger.add_many(evaluation.metrics())
    logger.report(frames, {"eval/return_mean": evaluation.mean_return})
    print(describe(evaluation, epsilon), flush=True)
    return {"eval_return": evaluation.mean_return, "eval_returns": evaluation.returns}
