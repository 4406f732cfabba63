"""Fixtures shared by several test files."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch


@pytest.fixture
def intra_op_threads() -> Iterator[Callable[[int], None]]:
    """``torch.set_num_threads`` for one test; the count before it is restored after."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)
