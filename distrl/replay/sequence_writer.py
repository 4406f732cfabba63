"""Sequence writer: an actor's batched step stream in, R2D2 sequences out.

R2D2 (Kapturowski et al. 2019, Section 3 and Table 2) replays fixed-length sequences of
``m = 80`` steps; adjacent sequences overlap by 40 steps, so one starts every
``period = 40`` steps of an episode. Each is preceded by a burn-in prefix of ``l = 40``
steps, on which the learner only unrolls its LSTM to refresh the recurrent state, and
is stored with the actor's recurrent state at its first step (the "stored state"
strategy). This writer also keeps the ``n`` steps after the trained ones, whose
observations the n-step targets of the last trained steps bootstrap from, so a stored
sequence covers ``L = burn_in + m + n`` steps of one episode:

    slot j  ->  episode step  s - burn_in + j,   s = 0, period, 2 period, ...

Slots before the episode's first step or after its last are padding: ``valid`` is False,
the action and rewards are 0, the previous action is -1 and the observation repeats the
nearest real one (so padding stores no frames). A sequence is emitted when its last
step was taken, or, padded, when the episode ends (terminated or truncated). The
learner tells what a padded slot may train on from ``valid`` and ``terminated``. A lost
life made terminal (``EnvConfig.terminal_on_life_loss``) arrives as ``terminated`` and
ends the episode here like a game over; the next one starts with previous action -1.

Frames and streams. Observations are frames (a stack of ``frame_stack`` frames, oldest
first, or one vector). Within an episode consecutive observations share all but their
newest frame (an episode's first observation stores all its frames, even where, after a
lost life, they continue the same game's stack), and overlapping sequences share most
steps, so frames are sent once: the writer numbers every frame it sees (its *stream*
ids, from 0) and each batch carries the frames that arrived since the previous batch,
whether or not a sequence of that batch refers to them yet. Sequences refer to frames by
stream id, and the replay keeps a map from stream ids to its own frame slots
(:mod:`distrl.replay.sequence_storage`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Optional

import torch

from distrl.replay.frames import check_step_inputs
from distrl.types import SequenceBatch, SequenceSample
from distrl.validation import check_count

FrameIds = tuple[int, ...]


@dataclass
class _Record:
    """One step of an episode, as far as it is known."""

    observation: FrameIds  # stream frame ids, oldest first
    prev_action: int  # -1 at the episode's first step
    prev_reward: float
    state: Optional[torch.Tensor]  # [S] recurrent state before this step, where a sequence needs it
    action: int = 0
    reward: float = 0.0
    terminated: bool = False
    q: Optional[torch.Tensor] = None  # [A] the actor's Q values on this step, if recorded


_MISSING = torch.empty(0)  # a trained or bootstrap step whose Q values were not recorded


def _stack_q(q_values: list[Optional[torch.Tensor]]) -> Optional[torch.Tensor]:
    """``[L, A]`` one sequence's acting Q values, zeros where a slot needs none (burn-in,
    padding); None where a slot that needs them has none."""
    if any(q is _MISSING for q in q_values):
        return None
    known = [q for q in q_values if q is not None]
    if not known:
        return None
    zeros = torch.zeros_like(known[0])
    return torch.stack([zeros if q is None else q for q in q_values])


def _check_non_negative_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")


def flatten_state(core_state: tuple[torch.Tensor, ...], num_envs: int) -> torch.Tensor:
    """``[N, S]`` float32: the tensors of a recurrent state side by side (``S = 0`` for a
    feed-forward policy)."""
    if not core_state:
        return torch.zeros(num_envs, 0)
    return torch.cat([s.detach().reshape(num_envs, -1).float() for s in core_state], dim=1)


class SequenceWriter:
    """Turns ``N`` envs' steps into overlapping R2D2 sequences with stored state.

    Call :meth:`begin` once with the first observations and recurrent state, then
    :meth:`add` after every batched env step, and :meth:`flush` whenever a batch is
    wanted.

    Args:
      num_envs: ``N``, envs stepped together.
      burn_in: steps before the trained ones (R2D2: 40; 0 = no burn-in).
      trace_length: ``m``, trained steps per sequence (R2D2: 80).
      period: steps between the starts of adjacent sequences, ``m`` minus the overlap
        (R2D2: 40), in ``[1, m]``.
      bootstrap: steps kept after the trained ones for the n-step targets (``n``).
      frame_stack: None when an observation is one frame (a vector); else ``k``, an
        observation is ``[k, *frame_shape]`` and within an episode observation ``t+1`` is
        ``observation_t[1:]`` followed by one new frame (assumed, not checked).
      stream: this writer's stream number (the replay maps its frame ids per stream).
    """

    def __init__(self, num_envs: int, burn_in: int, trace_length: int, period: int,
                 bootstrap: int, frame_stack: Optional[int], stream: int = 0) -> None:
        check_count("num_envs", num_envs)
        check_count("trace_length", trace_length)
        _check_non_negative_int("burn_in", burn_in)
        _check_non_negative_int("bootstrap", bootstrap)
        _check_non_negative_int("stream", stream)
        if (isinstance(period, bool) or not isinstance(period, int)
                or not 1 <= period <= trace_length):
            raise ValueError(f"period must be an int in [1, trace_length={trace_length}], "
                             f"got {period!r}")
        if frame_stack is not None:
            check_count("frame_stack", frame_stack)
        self.num_envs = num_envs
        self.burn_in = burn_in
        self.trace_length = trace_length
        self.period = period
        self.bootstrap = bootstrap
        self.frame_stack = frame_stack
        self.stream = stream
        self.length = burn_in + trace_length + bootstrap
        self._reset()

    def _reset(self) -> None:
        self._observation_shape: Optional[tuple[int, ...]] = None
        self._dtype: Optional[torch.dtype] = None
        self._state_size: Optional[int] = None
        self._frames: dict[int, torch.Tensor] = {}  # stream id -> frame, while still needed
        self._next_frame = 0
        self._sent = 0  # frames below this stream id went out in a batch
        self._episodes: list[deque[_Record]] = [deque() for _ in range(self.num_envs)]
        self._first: list[int] = [0] * self.num_envs  # episode step of _episodes[env][0]
        self._open: list[list[int]] = [[] for _ in range(self.num_envs)]  # starts s, oldest first
        self._emitted: list[dict[str, Any]] = []
        self._steps = 0  # env steps since the last flush
        # [K, L, A] the Q values the actor computed while acting on the last flushed
        # batch's steps (zeros on burn-in and padding slots), or None where some trained or
        # bootstrap step of it had none recorded
        self.acting_q: Optional[torch.Tensor] = None

    # ------------------------------------------------------------------ stepping

    def begin(self, observations: torch.Tensor, core_state: tuple[torch.Tensor, ...] = ()) -> None:
        """Start an episode in every env.

        A second call first ends every env's episode as a truncation would (its open
        sequences are emitted, padded); shapes must stay those of the first call.

        Args:
          observations: [N, *obs_shape] first observations.
          core_state: the policy's recurrent state before them, each tensor [N, ...].
        """
        self._check_observations(observations)
        states = self._check_state(core_state)
        if self._observation_shape is None:
            self._observation_shape = tuple(observations.shape[1:])
            self._dtype = observations.dtype
        else:
            for env in range(self.num_envs):
                self._end_episode(env)
        kept = observations.clone()  # the caller may reuse its buffer
        for env in range(self.num_envs):
            self._start_episode(env, kept[env], states[env])

    def add(
        self,
        actions: torch.Tensor,
        rewards: torch.Tensor,
        observations: torch.Tensor,
        terminated: torch.Tensor,
        truncated: torch.Tensor,
        core_state: tuple[torch.Tensor, ...] = (),
        q_values: Optional[torch.Tensor] = None,
    ) -> None:
        """Record one batched env step.

        Args:
          actions: [N] integer ``a_t``.
          rewards: [N] float ``r_t``.
          observations: [N, *obs_shape] what the step returned; where the episode ended,
            the next episode's first observation (same-step autoreset).
          terminated, truncated: [N] bool.
          core_state: the policy's recurrent state before acting on ``observations``
            (already reset where an episode ended), each tensor [N, ...].
          q_values: [N, A] the Q values ``a_t`` was chosen from, or None; kept with the
            step, so a flushed batch's initial priorities need no second forward pass
            (:attr:`acting_q`).
        """
        if self._observation_shape is None:
            raise RuntimeError("SequenceWriter.add before begin")
        check_step_inputs(self.num_envs, actions, rewards, terminated, truncated)
        self._check_observations(observations)
        states = self._check_state(core_state)

        ended = (terminated | truncated).tolist()
        terminal = terminated.tolist()
        action_list = actions.tolist()
        reward_list = [float(r) for r in rewards.tolist()]
        newest = (observations if self.frame_stack is None else observations[:, -1]).clone()
        restarted = observations.clone() if any(ended) else None
        self._steps += self.num_envs
        q_rows = None if q_values is None else q_values.detach().float().cpu().unbind(0)

        for env in range(self.num_envs):
            records = self._episodes[env]
            record = records[-1]
            record.action, record.reward = action_list[env], reward_list[env]
            record.terminated = terminal[env]
            record.q = None if q_rows is None else q_rows[env].clone()
            if ended[env]:
                self._end_episode(env, last_step_taken=True)
                self._start_episode(env, restarted[env], states[env])
                continue
            step = self._first[env] + len(records) - 1
            opened = self._open[env]
            # Emit what step was the last slot of (at most one with period >= 1).
            while opened and opened[0] - self.burn_in + self.length - 1 == step:
                self._emit(env, opened.pop(0), step)
            next_step = step + 1
            needs_state = next_step % self.period == 0 or \
                (next_step + self.burn_in) % self.period == 0
            records.append(_Record(record.observation[1:] + (self._store(newest[env]),),
                                   action_list[env], reward_list[env],
                                   states[env].clone() if needs_state else None))
            if next_step % self.period == 0:
                opened.append(next_step)
            self._forget(env, next_step)

    def _start_episode(self, env: int, observation: torch.Tensor, state: torch.Tensor) -> None:
        if self.frame_stack is None:
            ids: FrameIds = (self._store(observation),)
        else:
            ids = tuple(self._store(frame) for frame in observation.unbind(0))
        self._episodes[env] = deque([_Record(ids, -1, 0.0, state.clone())])
        self._first[env] = 0
        self._open[env] = [0]

    def _end_episode(self, env: int, last_step_taken: bool = False) -> None:
        """Emit the env's open sequences, padded after its last taken step."""
        last = self._first[env] + len(self._episodes[env]) - (1 if last_step_taken else 2)
        for start in self._open[env]:
            if start <= last:
                self._emit(env, start, last)
        self._open[env] = []

    def _forget(self, env: int, step: int) -> None:
        """Drop the records no open or later sequence reaches back to."""
        opened = self._open[env]
        next_start = opened[0] if opened else -(-step // self.period) * self.period
        needed_from = next_start - self.burn_in
        records = self._episodes[env]
        while self._first[env] < needed_from and len(records) > 1:
            records.popleft()
            self._first[env] += 1

    def _emit(self, env: int, start: int, last: int) -> None:
        """Queue the sequence whose trained steps begin at ``start``; episode steps after
        ``last`` (the last step taken) are padding."""
        records, first = self._episodes[env], self._first[env]
        zero_state = torch.zeros(self._state_size)
        first_slot = start - self.burn_in
        observation, prev_action, prev_reward, action, reward, terminated, valid = \
            [], [], [], [], [], [], []
        q_values: list[Optional[torch.Tensor]] = []
        for slot, step in enumerate(range(first_slot, first_slot + self.length)):
            real = 0 <= step <= last
            record = records[min(max(step, 0), last) - first]
            needs_q = real and slot >= self.burn_in  # a trained or bootstrap step
            q_values.append((_MISSING if record.q is None else record.q) if needs_q else None)
            observation.append(record.observation)
            prev_action.append(record.prev_action if real else -1)
            prev_reward.append(record.prev_reward if real else 0.0)
            action.append(record.action if real else 0)
            reward.append(record.reward if real else 0.0)
            terminated.append(record.terminated if real else False)
            valid.append(real)
        stored = records[first_slot - first].state if first_slot >= 0 else zero_state
        self._emitted.append({
            "observation_frames": observation, "prev_actions": prev_action,
            "prev_rewards": prev_reward, "actions": action, "rewards": reward,
            "terminated": terminated, "valid": valid, "stored_state": stored,
            "start_state": records[start - first].state, "q": _stack_q(q_values),
        })

    def _store(self, frame: torch.Tensor) -> int:
        frame_id = self._next_frame
        self._frames[frame_id] = frame
        self._next_frame += 1
        return frame_id

    # ------------------------------------------------------------------ output

    def flush(self) -> Optional[SequenceBatch]:
        """Every sequence emitted since the last flush, with every frame that arrived since
        the last batch, or None when no sequence was emitted (frames then wait)."""
        if not self._emitted:
            return None
        emitted, self._emitted = self._emitted, []

        def stacked(name: str, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor([e[name] for e in emitted], dtype=dtype)

        batch = SequenceBatch(
            frames=torch.stack([self._frames[f] for f in range(self._sent, self._next_frame)]),
            observation_frames=stacked("observation_frames", torch.int64),
            prev_actions=stacked("prev_actions", torch.int64),
            prev_rewards=stacked("prev_rewards", torch.float64).float(),
            actions=stacked("actions", torch.int64),
            rewards=stacked("rewards", torch.float64).float(),
            terminated=stacked("terminated", torch.bool),
            valid=stacked("valid", torch.bool),
            stored_state=torch.stack([e["stored_state"] for e in emitted]),
            start_state=torch.stack([e["start_state"] for e in emitted]),
            stream=self.stream, first_frame=self._sent, steps=self._steps,
        )
        qs = [e.get("q") for e in emitted]
        self.acting_q = None if any(q is None for q in qs) else torch.stack(qs)
        self._sent, self._steps = self._next_frame, 0
        # Keep the frames open records still use, and this batch's (see as_sample).
        live = {f for records in self._episodes for r in records for f in r.observation}
        live.update(batch.observation_frames.unique().tolist())
        self._frames = {f: frame for f, frame in self._frames.items() if f in live}
        return batch

    def as_sample(self, batch: SequenceBatch) -> SequenceSample:
        """The last flushed batch as the learner sees a sample (time-major, observations
        rebuilt, weights 1), for the actor to compute its initial priorities."""
        frames = torch.stack([self._frames[f] for f in batch.observation_frames.flatten().tolist()])
        observations = frames.view(*batch.observation_frames.shape, *frames.shape[1:])
        if self.frame_stack is None:
            observations = observations[:, :, 0]
        k = batch.size
        return SequenceSample(
            indices=torch.full((k,), -1, dtype=torch.int64), weights=torch.ones(k),
            observations=observations.transpose(0, 1),
            prev_actions=batch.prev_actions.t(), prev_rewards=batch.prev_rewards.t(),
            actions=batch.actions.t(), rewards=batch.rewards.t(),
            terminated=batch.terminated.t(), valid=batch.valid.t(),
            stored_state=batch.stored_state, start_state=batch.start_state,
        )

    def pending(self) -> int:
        """Sequences open (not yet emitted), summed over envs."""
        return sum(len(opened) for opened in self._open)

    # ------------------------------------------------------------------ checkpointing

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly, as plain containers and tensors."""
        frame_ids = sorted(self._frames)
        return {
            "settings": [self.num_envs, self.burn_in, self.trace_length, self.period,
                         self.bootstrap, self.frame_stack, self.stream],
            "observation_shape": (None if self._observation_shape is None
                                  else list(self._observation_shape)),
            "dtype": self._dtype, "state_size": self._state_size,
            "next_frame": self._next_frame, "sent": self._sent, "steps": self._steps,
            "frame_ids": frame_ids,
            "frames": torch.stack([self._frames[f] for f in frame_ids]) if frame_ids else None,
            "episodes": [[(list(r.observation), r.prev_action, r.prev_reward, r.state, r.action,
                           r.reward, r.terminated, r.q) for r in records]
                         for records in self._episodes],
            "first": list(self._first), "open": [list(o) for o in self._open],
            "emitted": [dict(e) for e in self._emitted],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output into a writer with the same settings."""
        mine = [self.num_envs, self.burn_in, self.trace_length, self.period, self.bootstrap,
                self.frame_stack, self.stream]
        if list(state["settings"]) != mine:
            raise ValueError(f"the writer state was saved with (num_envs, burn_in, "
                             f"trace_length, period, bootstrap, frame_stack, stream) = "
                             f"{state['settings']}, this writer has {mine}")
        self._reset()
        shape = state["observation_shape"]
        self._observation_shape = None if shape is None else tuple(shape)
        self._dtype, self._state_size = state["dtype"], state["state_size"]
        self._next_frame, self._sent = int(state["next_frame"]), int(state["sent"])
        self._steps = int(state["steps"])
        if state["frames"] is not None:
            self._frames = dict(zip(state["frame_ids"], state["frames"].clone().unbind(0),
                                    strict=True))
        # a record saved before the Q values were kept has 7 fields (no Q values)
        self._episodes = [deque(_Record(tuple(obs), *fields) for obs, *fields in records)
                          for records in state["episodes"]]
        self._first = list(state["first"])
        self._open = [list(o) for o in state["open"]]
        self._emitted = [dict(e) for e in state["emitted"]]

    # ------------------------------------------------------------------ checks

    def _check_state(self, core_state: tuple[torch.Tensor, ...]) -> torch.Tensor:
        states = flatten_state(core_state, self.num_envs)
        if self._state_size is None:
            self._state_size = states.shape[1]
        elif states.shape[1] != self._state_size:
            raise ValueError(f"core_state must have {self._state_size} values per env "
                             f"(as in begin), got {states.shape[1]}")
        return states

    def _check_observations(self, observations: torch.Tensor) -> None:
        if not isinstance(observations, torch.Tensor):
            raise ValueError(f"observations must be a torch.Tensor, "
                             f"got {type(observations).__name__}")
        shape = list(observations.shape)
        if self._observation_shape is not None:
            expected = [self.num_envs, *self._observation_shape]
            if shape != expected or observations.dtype != self._dtype:
                raise ValueError(f"observations must be {expected} {self._dtype} (as in begin), "
                                 f"got {shape} {observations.dtype}")
            return
        if not shape or shape[0] != self.num_envs:
            raise ValueError(f"observations must have shape [{self.num_envs}, *obs_shape] "
                             f"(num_envs first), got {shape}")
        if self.frame_stack is not None and (len(shape) < 2 or shape[1] != self.frame_stack):
            raise ValueError(f"observations must have shape [{self.num_envs}, "
                             f"{self.frame_stack}, *frame_shape] (frame_stack="
                             f"{self.frame_stack}), got {shape}")
