"""Each short-budget Atari preset says which settings are the paper's and which it changed:
its ``# paper:`` fields equal the agent's defaults, its ``# changed:`` fields differ from
them, and no agent or env setting differs without being named (the reasons are the
preset's prose)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf
from presets import compose_preset, compose_run

from distrl.run.resume_settings import leaves

PRESETS = Path(__file__).resolve().parents[1] / "experiments" / "experiment"
# preset -> the run.py overrides that give its agent's defaults on the same game
ATARI_PRESETS = {
    "atari_short_impala": ("agent=impala",),
    "atari_short_appo": ("agent=impala",),
    "atari_short_apex": ("agent=apex",),
    "atari_short_r2d2": ("agent=r2d2",),
    "atari_short_seed": ("agent=seed",),
    "atari_short_seed_appo": ("agent=seed",),
    "atari_short_seed_r2d2": ("agent=seed", "agent.learner=r2d2"),
}
COMPARED = ("agent.", "env.")  # the algorithm's and the game's settings


def named_fields(preset: str, label: str) -> list[str]:
    """The dotted fields on the preset's ``# <label>:`` comment lines."""
    fields = []
    for line in (PRESETS / f"{preset}.yaml").read_text().splitlines():
        if line.startswith(f"# {label}:"):
            fields += line.split(":", 1)[1].split()
    return fields


def settings_of(config: Any) -> dict[str, Any]:
    """Every setting of a composed RunConfig by its dotted name."""
    return leaves(OmegaConf.to_container(OmegaConf.structured(config)))


def test_every_short_atari_preset_is_checked():
    assert sorted(p.stem for p in PRESETS.glob("atari_short_*.yaml")) == sorted(ATARI_PRESETS)


@pytest.mark.parametrize("preset", sorted(ATARI_PRESETS))
def test_preset_names_the_papers_settings_and_every_change(tmp_path, preset):
    chosen = settings_of(compose_preset(tmp_path, preset, "preset"))
    defaults = settings_of(compose_run(tmp_path, "defaults", *ATARI_PRESETS[preset], "env=Pong"))
    paper, changed = named_fields(preset, "paper"), named_fields(preset, "changed")
    assert paper and changed, f"{preset} names no paper's or no changed settings"
    for name in paper + changed:
        assert name in defaults, f"{preset} names {name}, which is not a setting"
    kept_wrongly = {name: (chosen[name], defaults[name]) for name in paper
                    if chosen[name] != defaults[name]}
    assert not kept_wrongly, f"{preset}: 'paper' settings that differ: {kept_wrongly}"
    unchanged = [name for name in changed if chosen[name] == defaults[name]]
    assert not unchanged, f"{preset}: 'changed' settings equal to the default: {unchanged}"
    unnamed = sorted(name for name in chosen if name.startswith(COMPARED)
                     and chosen[name] != defaults[name] and name not in changed)
    assert not unnamed, f"{preset} changes settings it does not name: {unnamed}"
