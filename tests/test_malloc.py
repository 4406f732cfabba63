"""distrl.run.malloc: the learner process keeps what it frees, so repeating an allocation does
not fault in fresh pages each time. Each case runs in its own interpreter, as the setting
lasts for the life of a process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from distrl.config import ConfigError, DistributedConfig
from distrl.run.malloc import _glibc

# A learner's update in small: the shallow torso's forward and backward on a uint8 batch
# of 336 84x84x4 frames (38 MB as float, over glibc's largest mmap threshold of 32 MiB, as
# a Pong IMPALA batch is); prints the minor page faults of updates 11 to 13, once the
# heap has settled (measured from update 4 on, one update in several grew it once more).
PROBE = """
import json, resource, sys, torch
from distrl.run.malloc import keep_freed_memory
from distrl.nets.torsos import ShallowCNN, channels_last_for_training
line = keep_freed_memory() if sys.argv[1] == "keep" else "malloc=system"
torch.set_num_threads(1)
torch.manual_seed(0)
model = channels_last_for_training(ShallowCNN(4))
frames = torch.randint(0, 256, (336, 4, 84, 84), dtype=torch.uint8)
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for update in range(13):
    if update == 10:
        before = faults()
    model.zero_grad()
    model(frames).square().mean().backward()
print(json.dumps({"line": line, "faults": faults() - before}))
"""


def probe(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                         check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(_glibc() is None, reason="glibc's mallopt only")
def test_a_repeated_large_allocation_reuses_its_pages_once_freed_memory_is_kept():
    batch_pages = 336 * 4 * 84 * 84 * 4 // 4096  # 9,261 pages of 4 KiB: the float batch
    system, kept = probe("system"), probe("keep")
    assert system["line"] == "malloc=system" and kept["line"] == "malloc=keep_freed"
    assert system["faults"] > 3 * batch_pages  # at least a fresh batch every update
    # The earlier updates' pages, reused: mostly no fresh batch in the three updates, at
    # times one (the heap growing once more, as CI saw: exactly 9,261 faults), never one an
    # update as without it.
    assert kept["faults"] < min(1.5 * batch_pages, system["faults"] / 3)


def test_keep_freed_memory_must_be_a_bool():
    with pytest.raises(ConfigError, match="distributed.keep_freed_memory must be true or "
                                          "false, got 'yes'"):
        DistributedConfig(keep_freed_memory="yes")
