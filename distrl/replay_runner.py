"""Moved to :mod:`distrl.runners.replay_family`; this path stays for one release
(CHANGELOG.md) and is that module itself, so what it holds and what a test patches on it
are the same."""

from __future__ import annotations

import sys
import warnings

from distrl.runners import replay_family as _moved

warnings.warn("distrl.replay_runner moved to distrl.runners.replay_family (CHANGELOG.md)",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
