"""n-step transition writer: an actor's batched step stream in, :class:`TransitionBatch` out.

Ape-X (Horgan et al. 2018, "Distributed Prioritized Experience Replay", Section 3.1, with
n = 3 in the Atari experiments) learns from n-step transitions
``(s_t, a_t, R_t^(n), discount, s_{t+n})``. With ``r_{t+k}`` the reward that followed
action ``a_{t+k}`` (the paper's ``R_{t+k+1}``) and ``gamma`` the discount,

    R_t = sum_{k=0}^{m-1} gamma^k r_{t+k}
    discount = gamma^n,  next observation s_{t+n}    if the episode goes on past step t+n-1
    discount = 0,        next observation s_t        if it ended at step t+m-1, m <= n

so the learner's target ``R_t + discount * Q(s_next, .)`` is the n-step return of Sutton &
Barto (2018, Section 7.1) and Hessel et al. (2018, Rainbow, "Multi-step learning"), cut at
the episode's end. With a discount of 0 the next observation is never read, so ``s_t``
stands in for it and nothing extra is stored.

Episode ends. A window of n steps is emitted as a full n-step transition only if its n-th
step did not end the episode. When a step *terminates* the episode, every pending step of
that env is emitted with discount 0, including a window whose n-th step is the one that
ended it: the observation after that step belongs to the next episode. When a step
*truncates* the episode (a time limit), the pending steps are dropped instead: the envs
autoreset in the same step (see :class:`distrl.types.EnvStep`), so the observation to
bootstrap from is never seen, and a discount of 0 would teach the network that a time
limit is a terminal state, the bias Pardo et al. (2018, "Time Limits in Reinforcement
Learning") describe. Dropping costs at most ``n - 1`` steps per truncated episode (on
CartPole-v1's 500-step limit, the terminal treatment made Ape-X oscillate).

Frames. An observation is ``stack`` frames, oldest first (``stack = frame_stack``, or 1
when an observation is a single vector). Within an episode consecutive observations share
``stack - 1`` frames, so only the newest frame of each step is stored; the first
observation of an episode stores all of its frames, whatever they hold: a fresh game's
stack, or, after a lost life made terminal (``EnvConfig.terminal_on_life_loss``), frames
of the same game from before the loss. Either way it is rebuilt exactly as the env
returned it, at the cost of ``stack - 1`` repeated frames per lost life. A flushed batch
holds every frame its
transitions point to, each once, in the order the frames arrived; frames that steps still
pending will need are kept and appear again in a later batch.

A lost life made terminal arrives as ``terminated`` (see :class:`distrl.types.EnvStep`),
so no n-step return reaches past it: the lost life is the episode end for this writer.

Order. Transitions are emitted in the order they become known: by :meth:`NStepWriter.add`
call, within one call by env index ascending, and within one env by time ascending (an
episode end emits all of that env's pending steps at once).
"""

from __future__ import annotations

from collections import deque
from typing import Any, NamedTuple, Optional

import torch

from distrl.replay.frames import check_frame_stack, check_step_inputs
from distrl.types import TransitionBatch
from distrl.validation import check_count

FrameIds = tuple[int, ...]  # ids of the frames of one observation, oldest first


class _Step(NamedTuple):
    """One step waiting in an env's window: acted in ``observation``, then got ``reward``."""

    observation: FrameIds
    action: int
    reward: float
    q_taken: Optional[float] = None  # the actor's Q(observation, action), if recorded


class _Transition(NamedTuple):
    observation: FrameIds
    next_observation: FrameIds
    action: int
    return_: float
    discount: float
    q_taken: Optional[float] = None  # the actor's Q(s_t, a_t) while acting, if recorded
    # max_a Q(s_{t+n}, a) while acting on s_{t+n} (0 with discount 0), if recorded
    bootstrap: Optional[float] = None


class NStepWriter:
    """Turns ``num_envs`` batched env steps into n-step transitions (see the module docstring).

    Call :meth:`begin` once with the first observations, :meth:`add` after every env
    step, and :meth:`flush` whenever a batch is wanted.

    Args:
      num_envs: ``N``, the envs stepped together; an int >= 1.
      n: steps per transition; an int >= 1 (Ape-X uses 3).
      discount: ``gamma`` in ``[0, 1]``.
      frame_stack: None when an observation is one frame (a vector); else ``k``, an
        observation is ``[k, *frame_shape]``, frames oldest first, and within an episode
        observation ``t+1`` is ``observation_t[1:]`` followed by one new frame (assumed,
        not checked).
    """

    def __init__(self, num_envs: int, n: int, discount: float, frame_stack: int | None) -> None:
        check_count("num_envs", num_envs)
        check_count("n", n)
        if (not isinstance(discount, (int, float)) or isinstance(discount, bool)
                or not 0.0 <= discount <= 1.0):
            raise ValueError(f"discount must be a float in [0, 1], got {discount!r}")
        check_frame_stack(frame_stack)
        self.num_envs = num_envs
        self.n = n
        self.discount = float(discount)
        self.frame_stack = frame_stack
        self._powers = [self.discount ** k for k in range(n + 1)]
        self._reset()

    def _reset(self) -> None:
        self._observation_shape: tuple[int, ...] | None = None  # per env, set by begin
        self._dtype: torch.dtype | None = None
        # Every frame still referenced by a pending step, an env's current observation or
        # an emitted transition not yet flushed. Ids grow in arrival order.
        self._frames: dict[int, torch.Tensor] = {}
        self._next_frame_id = 0
        self._windows: list[deque[_Step]] = [deque() for _ in range(self.num_envs)]
        self._current: list[FrameIds] = [() for _ in range(self.num_envs)]
        self._emitted: list[_Transition] = []
        # Full transitions waiting for the acting Q values of their next observation, which
        # come with the next step (only while the steps bring Q values).
        self._waiting: list[list[_Transition]] = [[] for _ in range(self.num_envs)]
        # (q_taken [K], bootstrap [K]) of the last flushed batch, from the actor's acting Q
        # values; None where some transition of it had none recorded
        self.acting_values: Optional[tuple[torch.Tensor, torch.Tensor]] = None

    # ------------------------------------------------------------------ stepping

    def begin(self, observations: torch.Tensor, core_state: tuple[torch.Tensor, ...] = ()
              ) -> None:
        """Start an episode in every env (``core_state`` is accepted and ignored: an n-step
        transition keeps no recurrent state).

        A second call ends every env's current episode first, like a truncation (its
        pending steps are dropped); the observation shape and dtype must stay those of
        the first call.

        Args:
          observations: [N, *obs_shape] the envs' first observations; ``obs_shape`` is
            ``[frame_stack, *frame_shape]`` when frames are stacked.
        """
        self._check_observations(observations)
        if self._observation_shape is None:
            self._observation_shape = tuple(observations.shape[1:])
            self._dtype = observations.dtype
        else:
            for env in range(self.num_envs):
                self._windows[env].clear()
                self._release_waiting(env, None)  # their next observation is never acted on
        kept = observations.clone()  # the caller may reuse its buffer
        for env in range(self.num_envs):
            self._current[env] = self._store_first(kept[env])

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
        """Record one batched env step (``core_state`` is ignored, as in :meth:`begin`).

        Args:
          actions: [N] integer ``a_t``, taken in each env's previous observation.
          rewards: [N] float ``r_t``, raw (clipping is the learner's business).
          observations: [N, *obs_shape] what the step returned; where the episode ended,
            already the next episode's first observation (same-step autoreset).
          terminated: [N] bool, the episode reached a terminal state.
          truncated: [N] bool, the episode was cut (a time limit): its pending steps are
            dropped (where ``terminated`` is also set, termination wins).
          q_values: [N, A] the Q values ``a_t`` was chosen from, or None. Kept with the
            step; a full transition then waits for the next step's, its bootstrap, before
            it is emitted, so that a flushed batch's initial priorities need no forward
            pass (:attr:`acting_values`).
        """
        if self._observation_shape is None:
            raise RuntimeError("NStepWriter.add before begin")
        check_step_inputs(self.num_envs, actions, rewards, terminated, truncated)
        self._check_observations(observations)

        ended_mask = terminated | truncated
        ended = ended_mask.tolist()
        cut = (truncated & ~terminated).tolist()
        action_list = actions.tolist()
        reward_list = [float(r) for r in rewards.tolist()]
        taken: list[Optional[float]] = [None] * self.num_envs
        best: list[Optional[float]] = [None] * self.num_envs
        if q_values is not None:
            q = q_values.detach().float().cpu()
            taken = q.gather(1, actions.view(-1, 1).cpu()).squeeze(1).tolist()
            best = q.max(dim=1).values.tolist()
        for env in range(self.num_envs):  # the last step's full transitions bootstrap here
            self._release_waiting(env, best[env])
        # One copy per call, not per frame: the stored frames are views into these clones.
        if self.frame_stack is None:
            newest = observations.clone()
        else:
            newest = observations[:, -1].clone()
        restarted: dict[int, torch.Tensor] = {}
        if any(ended):
            restarted = dict(zip(torch.nonzero(ended_mask).flatten().tolist(),
                                 observations[ended_mask].clone().unbind(0), strict=True))

        for env in range(self.num_envs):
            window = self._windows[env]
            window.append(_Step(self._current[env], action_list[env], reward_list[env],
                                taken[env]))
            if ended[env]:
                if cut[env]:
                    window.clear()  # no bootstrap observation: see the module docstring
                else:
                    self._end_episode(env)
                self._current[env] = self._store_first(restarted[env])
                continue
            self._current[env] = self._current[env][1:] + (self._store(newest[env]),)
            if len(window) == self.n:
                # The n-th step did not end the episode: a full n-step transition.
                return_ = self._discounted_sum([step.reward for step in window])
                step = window.popleft()
                done = _Transition(step.observation, self._current[env], step.action, return_,
                                   self._powers[self.n], step.q_taken)
                if step.q_taken is None:
                    self._emitted.append(done)
                else:
                    self._waiting[env].append(done)

    def _end_episode(self, env: int) -> None:
        """Emit every pending step of terminated ``env`` with discount 0, oldest first."""
        window = self._windows[env]
        rewards = [step.reward for step in window]
        for j, step in enumerate(window):
            self._emitted.append(_Transition(step.observation, step.observation, step.action,
                                             self._discounted_sum(rewards[j:]), 0.0,
                                             step.q_taken, 0.0))
        window.clear()

    def _release_waiting(self, env: int, bootstrap: Optional[float]) -> None:
        """Emit ``env``'s full transitions with their bootstrap value (None: unknown)."""
        self._emitted += [t._replace(bootstrap=bootstrap) for t in self._waiting[env]]
        self._waiting[env] = []

    def _discounted_sum(self, rewards: list[float]) -> float:
        """``sum_k gamma^k r_k`` in float64 (Python floats), left to right."""
        total = 0.0
        for k, reward in enumerate(rewards):
            total += self._powers[k] * reward
        return total

    def _store(self, frame: torch.Tensor) -> int:
        frame_id = self._next_frame_id
        self._frames[frame_id] = frame
        self._next_frame_id += 1
        return frame_id

    def _store_first(self, observation: torch.Tensor) -> FrameIds:
        """Store every frame of an episode's first observation (one env's, already copied)."""
        if self.frame_stack is None:
            return (self._store(observation),)
        return tuple(self._store(frame) for frame in observation.unbind(0))

    # ------------------------------------------------------------------ output

    def pending(self) -> int:
        """Steps recorded whose transitions are not emitted yet (summed over envs)."""
        return sum(len(window) for window in self._windows) + sum(map(len, self._waiting))

    def flush(self) -> TransitionBatch | None:
        """Everything emitted since the last flush as one self-contained batch, or None.

        ``frames`` holds each frame the transitions refer to once, in arrival order.
        Transitions are in emission order (see the module docstring).
        """
        if not self._emitted:
            return None
        emitted, self._emitted = self._emitted, []
        frame_ids = sorted({f for t in emitted for f in t.observation + t.next_observation})
        row = {frame_id: i for i, frame_id in enumerate(frame_ids)}
        batch = TransitionBatch(
            frames=torch.stack([self._frames[f] for f in frame_ids]),
            observation_frames=torch.tensor([[row[f] for f in t.observation] for t in emitted],
                                            dtype=torch.int64),
            next_observation_frames=torch.tensor(
                [[row[f] for f in t.next_observation] for t in emitted], dtype=torch.int64),
            actions=torch.tensor([t.action for t in emitted], dtype=torch.int64),
            returns=torch.tensor([t.return_ for t in emitted], dtype=torch.float64).float(),
            discounts=torch.tensor([t.discount for t in emitted], dtype=torch.float32),
        )
        self.acting_values = None
        if all(t.q_taken is not None and t.bootstrap is not None for t in emitted):
            self.acting_values = (torch.tensor([t.q_taken for t in emitted]),
                                  torch.tensor([t.bootstrap for t in emitted]))
        # Keep only the frames that pending steps and current observations still need.
        live = {f for ids in self._current for f in ids}
        live.update(f for window in self._windows for step in window for f in step.observation)
        live.update(f for waiting in self._waiting for t in waiting
                    for f in t.observation + t.next_observation)
        self._frames = {f: frame for f, frame in self._frames.items() if f in live}
        return batch

    # ------------------------------------------------------------------ checkpointing

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: windows, their frames, unflushed output.

        Plain Python containers and tensors only (loadable with ``weights_only=True``);
        the frames are copied into one ``[F, *frame_shape]`` tensor.
        """
        frame_ids = sorted(self._frames)
        return {
            "num_envs": self.num_envs,
            "n": self.n,
            "discount": self.discount,
            "frame_stack": self.frame_stack,
            "observation_shape": (None if self._observation_shape is None
                                  else list(self._observation_shape)),
            "dtype": self._dtype,
            "next_frame_id": self._next_frame_id,
            "frame_ids": torch.tensor(frame_ids, dtype=torch.int64),
            "frames": (torch.stack([self._frames[f] for f in frame_ids]) if frame_ids
                       else None),
            "windows": [[(list(s.observation), s.action, s.reward, s.q_taken) for s in window]
                        for window in self._windows],
            "current": [list(ids) for ids in self._current],
            "emitted": [_saved(t) for t in self._emitted],
            "waiting": [[_saved(t) for t in waiting] for waiting in self._waiting],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a writer saved by :meth:`state_dict`; its settings must equal this one's."""
        for key in ("num_envs", "n", "discount", "frame_stack"):
            if state.get(key) != getattr(self, key):
                raise ValueError(f"the state was saved with {key}={state.get(key)!r}, "
                                 f"this writer has {key}={getattr(self, key)!r}")
        self._reset()
        shape = state["observation_shape"]
        self._observation_shape = None if shape is None else tuple(shape)
        self._dtype = state["dtype"]
        self._next_frame_id = int(state["next_frame_id"])
        if state["frames"] is not None:
            frames = state["frames"].clone()  # do not alias the caller's state
            ids = state["frame_ids"].tolist()
            self._frames = dict(zip(ids, frames.unbind(0), strict=True))
        # a state saved before the acting Q values were kept has none (3- and 5-tuples)
        for env, window in enumerate(state["windows"]):
            self._windows[env].extend(_Step(tuple(obs), int(action), float(reward), *rest)
                                      for obs, action, reward, *rest in window)
        self._current = [tuple(ids) for ids in state["current"]]
        self._emitted = [_loaded(t) for t in state["emitted"]]
        for env, waiting in enumerate(state.get("waiting", [])):
            self._waiting[env] = [_loaded(t) for t in waiting]

    # ------------------------------------------------------------------ checks

    def _check_observations(self, observations: torch.Tensor) -> None:
        if not isinstance(observations, torch.Tensor):
            raise ValueError(f"observations must be a torch.Tensor, "
                             f"got {type(observations).__name__}")
        shape = list(observations.shape)
        if self._observation_shape is not None:
            expected = [self.num_envs, *self._observation_shape]
            if shape != expected:
                raise ValueError(f"observations must have shape {expected} (as in begin), "
                                 f"got {shape}")
            if observations.dtype != self._dtype:
                raise ValueError(f"observations must be {self._dtype} (as in begin), "
                                 f"got {observations.dtype}")
            return
        if not shape or shape[0] != self.num_envs:
            raise ValueError(f"observations must have shape [{self.num_envs}, *obs_shape] "
                             f"(num_envs first), got {shape}")
        if self.frame_stack is not None and (len(shape) < 2 or shape[1] != self.frame_stack):
            raise ValueError(f"observations must have shape [{self.num_envs}, "
                             f"{self.frame_stack}, *frame_shape] (frame_stack={self.frame_stack})"
                             f", got {shape}")


def _saved(t: _Transition) -> tuple:
    return (list(t.observation), list(t.next_observation), t.action, t.return_, t.discount,
            t.q_taken, t.bootstrap)


def _loaded(saved: Any) -> _Transition:
    obs, next_obs, action, return_, discount, *acting = saved
    return _Transition(tuple(obs), tuple(next_obs), int(action), float(return_),
                       float(discount), *acting)
