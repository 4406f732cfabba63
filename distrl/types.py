"""Records that cross module and process boundaries.

Everything is time-major: a leading ``[T, B]`` (time, batch) on every per-step field.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class EnvStep:
    """What one batched env step returns, for ``N`` environments.

    Autoreset happens in the same step: where ``dones[i]``, ``observations[i]`` is
    already the first observation of the next episode, and ``episode_returns[i]`` /
    ``episode_lengths[i]`` describe the episode that just ended.
    """

    observations: np.ndarray  # [N, *obs_shape], uint8 for Atari, float32 otherwise
    rewards: np.ndarray  # [N] float32, raw game score (never clipped here)
    terminated: np.ndarray  # [N] bool, the MDP reached a terminal state
    truncated: np.ndarray  # [N] bool, cut by a time limit
    episode_returns: np.ndarray  # [N] float64, raw return of the episode ending here, NaN elsewhere
    episode_lengths: np.ndarray  # [N] int64, agent steps of the episode ending here, 0 elsewhere

    @property
    def dones(self) -> np.ndarray:
        """[N] bool: the episode ended at this step, by termination or truncation."""
        return self.terminated | self.truncated


@dataclass
class Unroll:
    """A batch of ``T``-step trajectories as the learner sees it (IMPALA's unit of work).

    Step ``t`` holds the observation acted on, the action taken, the reward that
    followed and whether the episode ended after it. ``observations`` has one more
    step: ``observations[T]`` is where the next unroll starts, used to bootstrap.
    """

    observations: torch.Tensor  # [T+1, B, *obs_shape]
    actions: torch.Tensor  # [T, B] int64
    rewards: torch.Tensor  # [T, B] float32, raw
    dones: torch.Tensor  # [T, B] bool: observations[t+1] starts a new episode
    behaviour_logits: torch.Tensor  # [T, B, A] logits of the acting policy
    policy_versions: torch.Tensor  # [T, B] int64 weight version that acted
    core_state: tuple[torch.Tensor, ...]  # recurrent state before observations[0], each [B, H]

    @property
    def unroll_length(self) -> int:
        return self.actions.shape[0]

    @property
    def batch_size(self) -> int:
        return self.actions.shape[1]


@dataclass
class TransitionBatch:
    """n-step transitions ``(s_t, a_t, R_t^(n), gamma^n or 0, s_{t+n})`` of one actor, with
    every observation frame they need stored once (Horgan et al. 2018, Ape-X).

    An observation is ``stack`` frames, oldest first; for vector observations ``stack``
    is 1 and a frame is the whole observation. Consecutive observations of one env share
    ``stack - 1`` frames, so ``frames`` holds each distinct frame once and transitions
    point into it by row. A batch is self-contained: every row it refers to is in it.
    """

    frames: torch.Tensor  # [M, *frame_shape], uint8 for Atari, float32 otherwise
    observation_frames: torch.Tensor  # [K, stack] int64 rows of frames: s_t
    next_observation_frames: torch.Tensor  # [K, stack] int64 rows of frames: s_{t+n}
    actions: torch.Tensor  # [K] int64 a_t
    returns: torch.Tensor  # [K] float32 R_t^(n) = sum_{k<m} gamma^k r_{t+k}, m <= n steps
    discounts: torch.Tensor  # [K] float32 gamma^m to apply to s_{t+m}, 0 if the episode ended

    @property
    def size(self) -> int:
        return self.actions.shape[0]


@dataclass
class SampleBatch:
    """Transitions drawn from a replay buffer, with their observations rebuilt."""

    indices: torch.Tensor  # [B] int64 replay slots, to write priorities back
    observations: torch.Tensor  # [B, *obs_shape] s_t
    actions: torch.Tensor  # [B] int64
    returns: torch.Tensor  # [B] float32 R_t^(n)
    discounts: torch.Tensor  # [B] float32 gamma^m or 0
    next_observations: torch.Tensor  # [B, *obs_shape] s_{t+n}
    weights: torch.Tensor  # [B] float32 importance-sampling weights (1 for uniform)
