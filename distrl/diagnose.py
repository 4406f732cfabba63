"""``python -m distrl.diagnose <run dir> [--last N] [--json]``: a finished run's throughput
diagnosis from its tensorboard events. The code is :mod:`distrl.telemetry.diagnose`."""

from __future__ import annotations

import sys

from distrl.telemetry.diagnose import main

if __name__ == "__main__":
    sys.exit(main())
