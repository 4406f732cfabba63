"""Moved to :mod:`distrl.rl.vtrace`; this path stays for one release
(CHANGELOG.md) and is that module itself, so what it holds and what a test patches on it
are the same."""

from __future__ import annotations

import sys
import warnings

from distrl.rl import vtrace as _moved

warnings.warn("distrl.vtrace moved to distrl.rl.vtrace (CHANGELOG.md)",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
