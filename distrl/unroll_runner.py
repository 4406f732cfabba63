"""Moved to :mod:`distrl.runners.unroll_family`; this path stays for one release
(CHANGELOG.md) and is that module itself, so what it holds and what a test patches on it
are the same."""

from __future__ import annotations

import sys
import warnings

from distrl.runners import unroll_family as _moved

warnings.warn("distrl.unroll_runner moved to distrl.runners.unroll_family (CHANGELOG.md)",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
