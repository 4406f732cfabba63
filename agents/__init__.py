"""Agent registry: name -> module. Agents import distrl only, never each other, except
SEED, which trains with another agent's learner (agents.impala, agents.r2d2)."""

from __future__ import annotations

import importlib
from types import ModuleType

from distrl.config import ConfigError

AGENTS = {
    "impala": ("agents.impala", "ImpalaConfig"),
    "apex": ("agents.apex", "ApexConfig"),
    "r2d2": ("agents.r2d2", "R2D2Config"),
    "seed": ("agents.seed", "SeedConfig"),
}


def get(name: str) -> ModuleType:
    """The agent module registered under ``name``."""
    if name not in AGENTS:
        raise ConfigError(f"agent: unknown agent {name!r}; allowed: {', '.join(sorted(AGENTS))}")
    return importlib.import_module(AGENTS[name][0])


def register_configs() -> None:
    """Register every agent's config dataclass in Hydra's ConfigStore (group ``agent``)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for name, (module, config_class) in AGENTS.items():
        cs.store(group="agent", name=f"{name}_schema",
                 node=getattr(importlib.import_module(module), config_class))
