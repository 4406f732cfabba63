"""What every replay writer shares about frames and steps: the checks of one batched env
step's inputs and of the frame-stack setting, and a transition batch's observations
rebuilt from its frames (each frame stored once, observations as frame ids; see
:mod:`distrl.replay.writers`)."""

from __future__ import annotations

from typing import Any

import torch

from distrl.types import TransitionBatch


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def check_frame_stack(frame_stack: int | None) -> None:
    """``frame_stack``: None (vector observations) or the frames per observation."""
    if frame_stack is not None and (not _is_int(frame_stack) or frame_stack < 1):
        raise ValueError(f"frame_stack must be None or an int >= 1, got {frame_stack!r}")


def check_step_inputs(num_envs: int, actions: torch.Tensor, rewards: torch.Tensor,
                      terminated: torch.Tensor, truncated: torch.Tensor) -> None:
    """One batched env step's per-env inputs, as every writer's ``add`` takes them: ``[N]``
    tensors, integer actions, bool end flags; a ValueError names the argument."""
    for name, x, dtype in (("actions", actions, None), ("rewards", rewards, None),
                           ("terminated", terminated, torch.bool),
                           ("truncated", truncated, torch.bool)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if tuple(x.shape) != (num_envs,):
            raise ValueError(f"{name} must have shape [{num_envs}] (one per env), "
                             f"got {list(x.shape)}")
        if dtype is not None and x.dtype != dtype:
            raise ValueError(f"{name} must be {dtype}, got {x.dtype}")
        if name == "actions" and (x.is_floating_point() or x.is_complex()
                                  or x.dtype == torch.bool):
            raise ValueError(f"actions must be an integer tensor, got {x.dtype}")



def rebuild_observations(
    batch: TransitionBatch, frame_stack: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The observations of a batch, rebuilt from its frames.

    Args:
      batch: a :class:`TransitionBatch` of ``K`` transitions.
      frame_stack: as given to the :class:`NStepWriter` that wrote it.

    Returns:
      ``(observations, next_observations)``, each [K, *obs_shape]: ``s_t`` and ``s_{t+n}``
      (``s_t`` again where the discount is 0).
    """
    check_frame_stack(frame_stack)
    stack = 1 if frame_stack is None else frame_stack
    for name in ("observation_frames", "next_observation_frames"):
        rows = getattr(batch, name)
        if rows.dim() != 2 or rows.shape[1] != stack:
            raise ValueError(f"batch.{name} must have shape [K, {stack}] for "
                             f"frame_stack={frame_stack}, got {list(rows.shape)}")
    observations = batch.frames[batch.observation_frames]
    next_observations = batch.frames[batch.next_observation_frames]
    if frame_stack is None:
        return observations[:, 0], next_observations[:, 0]
    return observations, next_observations
