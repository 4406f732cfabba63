"""SequenceWriter (R2D2 sequences) against hand-built episodes."""

from __future__ import annotations

import pytest
import torch

from distrl.replay.sequence_writer import SequenceWriter

# burn-in 2, 4 trained steps, a new sequence every 2 steps (overlap 2), 1 bootstrap step:
# L = 7 slots, slot j of the sequence starting at s is episode step s - 2 + j.
B, M, P, N = 2, 4, 2, 1


def step_env(writer: SequenceWriter, t: int, terminated: bool = False,
             truncated: bool = False, next_value: float | None = None) -> None:
    """Take action t % 2 in the observation of step t (value t), reward t + 1; the
    recurrent state before the next observation is 100 + (t + 1)."""
    value = t + 1 if next_value is None else next_value
    writer.add(torch.tensor([t % 2]), torch.tensor([t + 1.0]), torch.tensor([[float(value)]]),
               torch.tensor([terminated]), torch.tensor([truncated]),
               (torch.tensor([[100.0 + value]]),))


def fresh_writer() -> SequenceWriter:
    writer = SequenceWriter(1, burn_in=B, trace_length=M, period=P, bootstrap=N,
                            frame_stack=None, stream=3)
    writer.begin(torch.tensor([[0.0]]), (torch.tensor([[100.0]]),))
    return writer


def test_hand_built_episode_overlap_padding_mask_and_stored_state():
    """A 9-step episode (steps 0..8) that terminates after step 8. Sequences start at
    s = 0, 2, 4, 6, 8; each covers steps s-2 .. s+4."""
    writer = fresh_writer()
    for t in range(4):
        step_env(writer, t)
    assert writer.flush() is None  # s=0 needs step 4 taken
    step_env(writer, 4)
    first = writer.flush()
    assert first.size == 1 and first.stream == 3 and first.first_frame == 0
    assert first.steps == 5
    # Frames 0..5 are the observations of steps 0..5 (the stream sends all it saw).
    assert first.frames.flatten().tolist() == [0, 1, 2, 3, 4, 5]
    # Slots -2, -1 are padding before the episode: the first real observation repeats.
    assert first.observation_frames[0, :, 0].tolist() == [0, 0, 0, 1, 2, 3, 4]
    assert first.valid[0].tolist() == [False, False, True, True, True, True, True]
    assert first.prev_actions[0].tolist() == [-1, -1, -1, 0, 1, 0, 1]
    assert first.prev_rewards[0].tolist() == [0, 0, 0, 1, 2, 3, 4]
    assert first.actions[0].tolist() == [0, 0, 0, 1, 0, 1, 0]
    assert first.rewards[0].tolist() == [0, 0, 1, 2, 3, 4, 5]
    assert not first.terminated.any()
    assert first.stored_state[0].tolist() == [0.0]  # before the episode: zero state
    assert first.start_state[0].tolist() == [100.0]  # the state at step 0

    step_env(writer, 5)
    step_env(writer, 6)
    second = writer.flush()
    assert second.first_frame == 6 and second.frames.flatten().tolist() == [6, 7]
    assert second.observation_frames[0, :, 0].tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert second.valid[0].all()
    assert second.stored_state[0].tolist() == [100.0]  # state before step 0 = slot 0
    assert second.start_state[0].tolist() == [102.0]  # state before step 2
    assert second.prev_actions[0].tolist() == [-1, 0, 1, 0, 1, 0, 1]

    step_env(writer, 7)
    step_env(writer, 8, terminated=True, next_value=50)  # the next episode starts at 50
    last = writer.flush()
    assert last.size == 3  # s = 4 complete, s = 6 and s = 8 padded at the episode's end
    # frame 8 is step 8's observation, frame 9 the next episode's first observation
    assert last.frames.flatten().tolist() == [8, 50]
    assert last.observation_frames[:, :, 0].tolist() == [
        [2, 3, 4, 5, 6, 7, 8],
        [4, 5, 6, 7, 8, 8, 8],
        [6, 7, 8, 8, 8, 8, 8],
    ]
    assert last.valid.tolist() == [
        [True] * 7,
        [True] * 5 + [False] * 2,
        [True] * 3 + [False] * 4,
    ]
    assert last.terminated.tolist() == [
        [False] * 6 + [True],
        [False] * 4 + [True] + [False] * 2,
        [False] * 2 + [True] + [False] * 4,
    ]
    assert last.rewards[2].tolist() == [7, 8, 9, 0, 0, 0, 0]
    assert last.actions[1].tolist() == [0, 1, 0, 1, 0, 0, 0]
    assert last.prev_actions[2].tolist() == [1, 0, 1, -1, -1, -1, -1]
    assert last.stored_state[:, 0].tolist() == [102.0, 104.0, 106.0]
    assert last.start_state[:, 0].tolist() == [104.0, 106.0, 108.0]
    assert writer.pending() == 1  # the new episode's s = 0

    # The new episode starts from its own state; its first sequence's frames begin at 9.
    for t in range(5):
        step_env(writer, t, next_value=51 + t)
    new = writer.flush()
    assert new.observation_frames[0, :, 0].tolist() == [9, 9, 9, 10, 11, 12, 13]
    assert new.start_state[0].tolist() == [150.0]
    assert new.prev_actions[0, 2].item() == -1


def test_truncation_emits_open_sequences_padded_without_terminal_flags():
    writer = fresh_writer()
    for t in range(2):
        step_env(writer, t)
    step_env(writer, 2, truncated=True, next_value=9)
    batch = writer.flush()
    assert batch.size == 2  # s = 0 and s = 2
    assert batch.valid.tolist() == [[False, False, True, True, True, False, False],
                                    [True, True, True, False, False, False, False]]
    assert not batch.terminated.any()


def test_a_second_begin_ends_the_episode_after_its_last_taken_step():
    """Steps 0-2 taken, then begin again (a new episode, as after an env reset): the open
    sequences end at step 2, the observation of step 3 (no action taken in it) is not a
    real step; the same slots as the truncation above."""
    writer = fresh_writer()
    for t in range(3):
        step_env(writer, t)
    writer.begin(torch.tensor([[9.0]]), (torch.tensor([[109.0]]),))
    batch = writer.flush()
    assert batch.size == 2  # s = 0 and s = 2
    assert batch.valid.tolist() == [[False, False, True, True, True, False, False],
                                    [True, True, True, False, False, False, False]]
    assert batch.actions[:, 4].tolist() == [0, 0]  # step 2's action, then padding
    assert not batch.terminated.any()


def test_as_sample_rebuilds_time_major_observations_from_kept_frames():
    writer = SequenceWriter(2, burn_in=1, trace_length=2, period=1, bootstrap=1, frame_stack=2)
    first = torch.arange(2 * 2 * 3, dtype=torch.uint8).view(2, 2, 3)  # [N, stack, frame]
    writer.begin(first)
    observations = [first]
    for t in range(4):
        newest = torch.full((2, 1, 3), 100 + t, dtype=torch.uint8)
        nxt = torch.cat([observations[-1][:, 1:], newest], dim=1)
        observations.append(nxt)
        writer.add(torch.tensor([0, 1]), torch.zeros(2), nxt, torch.zeros(2, dtype=torch.bool),
                   torch.zeros(2, dtype=torch.bool))
    batch = writer.flush()
    sample = writer.as_sample(batch)
    assert batch.size == 4 and sample.observations.shape == (4, 4, 2, 3)
    # Every valid slot shows the observation the env showed at that step.
    for k in range(batch.size):
        env = k % 2
        start = k // 2  # s = 0 for both envs after step 2, then s = 1 after step 3
        for j in range(4):
            step = start - 1 + j
            if sample.valid[j, k]:
                assert torch.equal(sample.observations[j, k], observations[step][env])


def test_checkpoint_round_trip_continues_identically():
    reference, resumed = fresh_writer(), fresh_writer()
    for t in range(3):
        step_env(reference, t)
        step_env(resumed, t)
    state = resumed.state_dict()
    resumed = SequenceWriter(1, burn_in=B, trace_length=M, period=P, bootstrap=N,
                             frame_stack=None, stream=3)
    resumed.load_state_dict(state)
    for t in range(3, 9):
        step_env(reference, t)
        step_env(resumed, t)
    a, b = reference.flush(), resumed.flush()
    for name in ("frames", "observation_frames", "prev_actions", "actions", "rewards", "valid",
                 "stored_state", "start_state"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    with pytest.raises(ValueError, match="burn_in"):
        SequenceWriter(1, burn_in=0, trace_length=M, period=P, bootstrap=N,
                       frame_stack=None, stream=3).load_state_dict(state)


@pytest.mark.parametrize("kwargs, match", [
    ({"period": 0}, "period"), ({"period": 5}, "period"), ({"burn_in": -1}, "burn_in"),
    ({"trace_length": 0}, "trace_length"), ({"bootstrap": 1.5}, "bootstrap"),
])
def test_bad_settings_name_the_field(kwargs, match):
    settings = {"num_envs": 1, "burn_in": B, "trace_length": M, "period": P, "bootstrap": N,
                "frame_stack": None} | kwargs
    with pytest.raises(ValueError, match=match):
        SequenceWriter(**settings)
