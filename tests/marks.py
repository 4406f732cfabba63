"""Skip marks shared by several test files."""

from __future__ import annotations

import pytest

from distrl import ops

# Only the explicit opt-out (DISTRL_NO_EXTENSION=1) gets this far without distrl._C:
# conftest.py stops the session when the extension fails to load otherwise.
needs_extension = pytest.mark.skipif(
    not ops.has_extension(), reason=f"distrl._C not tested: {ops.extension_error()}"
)
