"""Checks of single settings, each raising :class:`ConfigError` that names the field and
what is allowed. Apart from the config schema (:mod:`distrl.config`, which uses them and
re-exports them), so that a module checking one size imports this leaf, not the schema.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any


class ConfigError(ValueError):
    """A configuration value is outside what its field allows."""


def _check_finite(name: str, value: Any) -> None:
    """nan and inf pass every comparison a range check makes (nan <= 0 is False), so they
    are refused here by name: an lr of nan or inf would train to garbage without a word."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")


def refuse_non_finite(config: Any, prefix: str = "") -> None:
    """Raise ConfigError naming the first float field of ``config`` (a dataclass, searched
    through its nested dataclasses) that is nan or infinite."""
    for spec in dataclasses.fields(config):
        value = getattr(config, spec.name)
        _check_finite(f"{prefix}{spec.name}", value)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            refuse_non_finite(value, f"{prefix}{spec.name}.")


def check_positive(name: str, value: Any) -> None:
    """Raise ConfigError unless ``value`` is a finite number > 0."""
    _check_finite(name, value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"{name} must be a positive number, got {value!r}")


def check_non_negative(name: str, value: Any) -> None:
    """Raise ConfigError unless ``value`` is a finite number >= 0."""
    _check_finite(name, value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"{name} must be a number >= 0, got {value!r}")


def check_choice(name: str, value: Any, allowed: tuple[str, ...]) -> None:
    """Raise ConfigError unless ``value`` is one of ``allowed``."""
    if value not in allowed:
        raise ConfigError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")


AUTO = "auto"  # a distributed.* size chosen at the start of the run (distrl.training.sizing)
# The distributed.* settings that may say auto; a run stores the numbers auto chose.
AUTO_FIELDS = ("actors", "envs_per_actor", "env_groups", "learner_threads")


def is_auto(value: Any) -> bool:
    """Whether a setting says ``auto``."""
    return isinstance(value, str) and value == AUTO


def check_count_or_auto(name: str, value: Any, minimum: int = 1) -> None:
    """Raise ConfigError unless ``value`` is ``auto`` or an int >= ``minimum``."""
    if is_auto(value):
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be auto or a whole number >= {minimum}, "
                          f"got {value!r}")


def check_count(name: str, value: Any) -> None:
    """Raise ConfigError unless ``value`` is an int >= 1 (a size or a count)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be an int >= 1, got {value!r}")


def check_unit_interval(name: str, value: Any) -> None:
    """Raise ConfigError unless ``value`` lies in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ConfigError(f"{name} must lie in [0, 1], got {value!r}")


def check_run_name(name: str, value: Any) -> None:
    """Raise ConfigError unless ``value`` is empty or one plain directory name: no path
    separator, no ``..``, not absolute, so the run stays inside ``log.dir``."""
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, got {value!r}")
    if value and (value in (".", "..") or "/" in value or "\\" in value or "\0" in value):
        raise ConfigError(
            f"{name} must be one plain directory name inside log.dir (no '/', no '..', not "
            f"absolute), got {value!r}; put the path in log.dir instead")
