"""Count the gloo threads a torchrun rank still runs after its training run returned."""

from __future__ import annotations

import os
from pathlib import Path


def gloo_threads_left() -> int:
    """gloo's worker and transport threads still running in this process (Linux only).

    After a run returns, its process groups must be gone and these threads with them:
    threads alive at interpreter exit abort the process now and then (std::terminate
    while a worker frees a tensor and cannot take the GIL).
    """
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            names.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
        except FileNotFoundError:  # the thread ended between the listing and the read
            continue
    return sum(name.startswith(("pt_gloo", "gloo")) for name in names)
