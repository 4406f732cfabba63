"""SIGINT/SIGTERM in the training loop (:class:`distrl.training.loop.StopFlag`): the first asks for
a checkpoint and a stop and is remembered for the exit code, a second ends the run at
once, except while a checkpoint is being written: then it waits until the file is whole.

Signals are raised in this process; the fixture ``recorded`` puts a recording handler
under the code being tested, so a signal that escapes it fails the test instead of
interrupting pytest.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from distrl.run import checkpoint
from distrl.training import loop
from distrl.training.loop import StopFlag


@pytest.fixture
def recorded() -> Iterator[list[int]]:
    """The signals that reached the handlers in place before the code under test."""
    received: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: received.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    yield received
    for sig, handler in previous.items():
        signal.signal(sig, handler)


class SignalWhilePickled:
    """Raises ``signum`` in the middle of ``torch.save``, when the checkpoint file is
    half-written; it is stored as the int 0."""

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __reduce__(self) -> tuple[type, tuple[int]]:
        signal.raise_signal(self.signum)
        return int, (0,)


def state_signalling(signum: int) -> dict[str, object]:
    return {"format": 1, "weights": torch.arange(6.0), "mid_write": SignalWhilePickled(signum)}


def assert_whole_checkpoint(directory: Path, step: int) -> None:
    files = sorted(p.name for p in directory.iterdir())
    assert files == [f"checkpoint-{step:012d}.pt"], files  # no temporary file left either
    state = checkpoint.load(directory / files[0])
    assert torch.equal(state["weights"], torch.arange(6.0)) and state["mid_write"] == 0


def test_first_signal_asks_for_a_stop_and_is_remembered(recorded: list[int]) -> None:
    with StopFlag() as flag:
        assert not flag.requested and loop.stop_signal() is None
        signal.raise_signal(signal.SIGTERM)
        assert flag.requested and loop.stop_signal() == signal.SIGTERM
    assert recorded == [] and loop.stop_signal() == signal.SIGTERM
    with StopFlag():  # a new run in this process starts unstopped
        assert loop.stop_signal() is None
    assert signal.getsignal(signal.SIGINT).__name__ == "<lambda>"  # handlers given back


def test_second_signal_outside_a_checkpoint_stops_at_once(recorded: list[int]) -> None:
    with StopFlag():
        signal.raise_signal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
            pytest.fail("the second signal did not interrupt")
    assert recorded == []


def test_second_signal_while_checkpointing_waits_for_the_whole_file(
        tmp_path: Path, recorded: list[int]) -> None:
    """The second Ctrl-C arrives while torch.save is writing: the write completes (one
    whole, loadable file, no temporary left), then the run is interrupted."""
    with StopFlag() as flag:
        signal.raise_signal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt), flag.checkpointing():
            checkpoint.save(state_signalling(signal.SIGINT), tmp_path, 7, keep=2)
            completed = True
    assert completed
    assert_whole_checkpoint(tmp_path, 7)
    assert recorded == [] and loop.stop_signal() == signal.SIGINT


def test_signal_while_writing_the_final_checkpoint_of_a_stopped_run(
        tmp_path: Path, recorded: list[int]) -> None:
    """After train returned because of a SIGTERM, another SIGTERM during the final
    checkpoint (outside the training loop's flag) is held until the file is whole."""
    with StopFlag():
        signal.raise_signal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt), loop.checkpointing():
        checkpoint.save(state_signalling(signal.SIGTERM), tmp_path, 9, keep=2)
    assert_whole_checkpoint(tmp_path, 9)
    assert recorded == [] and loop.stop_signal() == signal.SIGTERM


def test_first_signal_while_writing_the_final_checkpoint_of_a_finished_run(
        tmp_path: Path, recorded: list[int]) -> None:
    """A run that spent its budget gets SIGINT while writing its final checkpoint: the
    file is written, nothing is interrupted, and the run counts as stopped by SIGINT."""
    with StopFlag():
        pass
    with loop.checkpointing():
        checkpoint.save(state_signalling(signal.SIGINT), tmp_path, 3, keep=2)
    assert_whole_checkpoint(tmp_path, 3)
    assert recorded == [] and loop.stop_signal() == signal.SIGINT
