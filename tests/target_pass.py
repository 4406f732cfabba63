"""A replay loss called as the learner step calls it: its target pass in the learner's
side thread (``in_thread``), or the loss alone, which runs that pass in this thread."""

from __future__ import annotations

from typing import Any

import torch

from distrl.nets.side_thread import SideThread


def call_loss(loss_fn: Any, model: torch.nn.Module, batch: Any, in_thread: bool) -> Any:
    if not in_thread:
        return loss_fn(model, batch)
    side = SideThread("learner-target")
    return loss_fn(model, batch, side.submit(loss_fn.target_pass(model, batch),
                                             torch.device("cpu")))
