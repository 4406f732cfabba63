"""SequenceStorage: frames shared across batches and streams, rebuilt exactly; eviction."""

from __future__ import annotations

import pytest
import torch

from distrl.replay.buffer import ReplayBuffer
from distrl.replay.samplers import PrioritizedSampler
from distrl.replay.sequence_storage import SequenceStorage
from distrl.replay.sequence_writer import SequenceWriter

STEP_FIELDS = ("observations", "prev_actions", "prev_rewards", "actions", "rewards",
               "terminated", "valid")


STATE_FIELDS = ("stored_state", "start_state")


def run_streams(storage: SequenceStorage, steps: int, seed: int = 0,
                check_every_add: bool = True) -> dict[int, dict[str, torch.Tensor]]:
    """Two writers (streams), two envs each, stacks of 2 frames whose bytes are unique;
    random episode ends; actions, rewards and recurrent states that differ by step and
    env. Returns {storage id: every field of the sequence as its writer made it}."""
    generator = torch.Generator().manual_seed(seed)
    writers = [SequenceWriter(2, burn_in=3, trace_length=4, period=2, bootstrap=2,
                              frame_stack=2, stream=s) for s in range(2)]
    counter = [0]

    def new_frames(n: int) -> torch.Tensor:
        values = torch.arange(counter[0], counter[0] + n)
        counter[0] += n
        # Frame bytes carry the counter: (low byte, high byte, stream-independent).
        return torch.stack([values % 251, values // 251, values % 7], dim=1).to(torch.uint8)

    observations = []
    for writer in writers:
        first = new_frames(4).view(2, 2, 3)
        writer.begin(first, (torch.zeros(2, 1),))
        observations.append(first)
    expected: dict[int, dict[str, torch.Tensor]] = {}
    for t in range(steps):
        for s, writer in enumerate(writers):
            ended = torch.rand(2, generator=generator) < 0.08
            nxt = torch.cat([observations[s][:, 1:], new_frames(2).view(2, 1, 3)], dim=1)
            if ended.any():
                nxt[ended] = new_frames(int(ended.sum()) * 2).view(-1, 2, 3)
            observations[s] = nxt
            writer.add(torch.tensor([t % 2, (t + 1) % 3]), torch.tensor([float(t), -t / 2]),
                       nxt, ended, torch.zeros(2, dtype=torch.bool),
                       (torch.tensor([[float(t)], [t + 0.5]]),))
            if t % 5 == 4:
                batch = writer.flush()
                if batch is None:
                    continue
                seen = writer.as_sample(batch)
                ids, _ = storage.add(batch)
                for k, sequence_id in enumerate(ids.tolist()):
                    if sequence_id >= 0:
                        expected[sequence_id] = {
                            name: (getattr(seen, name)[k] if name in STATE_FIELDS
                                   else getattr(seen, name)[:, k])
                            for name in (*STEP_FIELDS, *STATE_FIELDS)}
                if check_every_add:
                    check_live(storage, expected)
    return expected


def check_live(storage: SequenceStorage,
               expected: dict[int, dict[str, torch.Tensor]]) -> None:
    oldest, end = storage.live_ids()
    ids = torch.arange(oldest, end)
    got = storage.gather(ids)
    for k, sequence_id in enumerate(ids.tolist()):
        for name, want in expected[sequence_id].items():
            column = got[name][k] if name in STATE_FIELDS else got[name][:, k]
            assert torch.equal(column, want), (sequence_id, name)


@pytest.mark.parametrize("capacity, frame_capacity", [(400, 4000), (30, 4000), (400, 300)])
def test_sequences_rebuild_the_writers_observations_across_batches_and_wrap_around(
        capacity, frame_capacity):
    storage = SequenceStorage(capacity, length=9, frame_shape=(3,), frame_dtype=torch.uint8,
                              frame_stack=2, frame_capacity=frame_capacity, stream_window=256)
    expected = run_streams(storage, steps=400)
    assert storage.transitions_written == len(expected) > 200
    assert 0 < len(storage) <= capacity
    if frame_capacity < 4000:  # frames overwritten: the sequences that used them left
        assert storage.oldest > storage.transitions_written - capacity
    assert storage.frames_written < 2 * 2 * (400 * 1.2 + 20)  # each frame stored once


def test_a_stored_sequence_costs_about_its_period_in_frames():
    storage = SequenceStorage(1000, length=9, frame_shape=(3,), frame_dtype=torch.uint8,
                              frame_stack=2, frame_capacity=8000, stream_window=256)
    run_streams(storage, steps=300, check_every_add=False)
    # 4 envs x 300 steps; sequences start every 2 steps: about 2 frames per sequence
    # (plus episode starts), not the 9 x 2 a self-contained sequence would need.
    assert storage.frames_written / storage.transitions_written < 3.0


def test_buffer_round_trips_a_checkpoint_bit_exactly():
    def make() -> ReplayBuffer:
        storage = SequenceStorage(50, length=9, frame_shape=(3,), frame_dtype=torch.uint8,
                                  frame_stack=2, frame_capacity=500, stream_window=256)
        return ReplayBuffer(storage, PrioritizedSampler(50, alpha=0.9, beta=0.6))

    buffer = make()
    run_streams(buffer.storage, steps=150, check_every_add=False)
    oldest, end = buffer.storage.live_ids()
    buffer.sampler.add(torch.arange(oldest, end), torch.rand(end - oldest) + 0.1)
    restored = make()
    restored.load_state_dict(buffer.state_dict())
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    a, b = buffer.sample(8, g1), restored.sample(8, g2)
    for name in ("indices", "weights", "observations", "actions", "valid", "stored_state"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_out_of_order_batches_are_refused():
    storage = SequenceStorage(10, length=9, frame_shape=(3,), frame_dtype=torch.uint8,
                              frame_stack=2, frame_capacity=100, stream_window=64)
    writer = SequenceWriter(1, burn_in=3, trace_length=4, period=2, bootstrap=2, frame_stack=2)
    writer.begin(torch.zeros(1, 2, 3, dtype=torch.uint8))
    batches = []
    for _ in range(20):
        writer.add(torch.zeros(1, dtype=torch.int64), torch.ones(1),
                   torch.zeros(1, 2, 3, dtype=torch.uint8), torch.zeros(1, dtype=torch.bool),
                   torch.zeros(1, dtype=torch.bool))
        batch = writer.flush()
        if batch is not None:
            batches.append(batch)
    storage.add(batches[0])
    with pytest.raises(ValueError, match="stream 0 sent frames from id"):
        storage.add(batches[2])
