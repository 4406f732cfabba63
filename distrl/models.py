"""Moved to :mod:`distrl.nets.models`; this path stays for one release
(CHANGELOG.md) and is that module itself, so what it holds and what a test patches on it
are the same."""

from __future__ import annotations

import sys
import warnings

from distrl.nets import models as _moved

warnings.warn("distrl.models moved to distrl.nets.models (CHANGELOG.md)",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _moved
