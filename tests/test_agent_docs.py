"""Each agent page's "Defaults and their sources" table against the agent's config: a
default changed in the code and not on its page (or the other way) fails here."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from agents.apex import ApexConfig
from agents.impala import ImpalaConfig
from agents.r2d2 import R2D2Config
from agents.seed import SeedConfig

DOCS = Path(__file__).resolve().parents[1] / "docs" / "agents"
ROW = re.compile(r"^\| (`agent\.[^|]+) \| ([^|]+) \|")

# page -> (its config, how many rows at least must be compared: a parser that stopped
# reading a page would otherwise pass)
PAGES = {"impala.md": (ImpalaConfig, 15), "apex.md": (ApexConfig, 15),
         "r2d2.md": (R2D2Config, 18), "seed.md": (SeedConfig, 6)}


def literal(text: str) -> Any:
    """A table cell's value as the config holds it, or None where the cell is prose
    (several settings in words, a formula) that no one value stands for."""
    text = text.strip().strip("`")
    words = {"true": True, "false": False, "null": None}
    if text in words:
        return words[text]
    if re.fullmatch(r"-?[\d,]*\.?\d+(e-?\d+)?", text):
        number = float(text.replace(",", ""))
        return int(number) if number.is_integer() and "e" not in text else number
    if re.fullmatch(r"[a-z_0-9]+", text):
        return text
    return ...


def documented_defaults(page: str) -> list[tuple[str, Any]]:
    """(setting under ``agent.``, documented value) for each row of the page's defaults
    table whose cell is one value, or one value per named setting (``a, b`` | ``x, y``)
    or one value for all (``1.0 each``)."""
    rows = []
    in_table = False
    for line in (DOCS / page).read_text().splitlines():
        if line.startswith("## "):
            in_table = line.startswith("## Defaults")
            continue
        match = ROW.match(line) if in_table else None
        if not match:
            continue
        names = [n.strip().strip("`").removeprefix("agent.") for n in match[1].split(",")]
        cell = match[2].strip()
        if cell.endswith(" each"):
            values = [literal(cell.removesuffix(" each"))] * len(names)
        elif len(names) > 1:
            values = [literal(part) for part in cell.split(", ")]
        else:
            values = [literal(cell)]
        if len(values) == len(names) and all(v is not ... for v in values):
            rows += list(zip(names, values, strict=True))
    return rows


def documented_optimizer(page: str) -> dict[str, Any]:
    """The ``agent.optimizer`` row's settings, as ``OptimizerConfig`` names them: its name
    (the backticked word; "centered" after it), then comma-separated phrases ("lr 1e-4",
    "decay 0.95", "eps 1.5e-7", "momentum 0" or "no momentum", "constant lr", "gradient
    norm 40"). A phrase not in that list fails the test, so the row is read whole."""
    cell = next(line.split(" | ")[1] for line in (DOCS / page).read_text().splitlines()
                if line.startswith("| `agent.optimizer` |"))
    head, *phrases = cell.split(", ")
    name = re.fullmatch(r"`(\w+)`( centered)?", head)
    assert name, (page, head)
    settings: dict[str, Any] = {"name": name[1], "centered": bool(name[2])}
    keys = {"lr": "lr", "decay": "alpha", "eps": "eps", "momentum": "momentum",
            "gradient norm": "max_grad_norm"}
    for phrase in phrases:
        if phrase == "no momentum":
            settings["momentum"] = 0.0
        elif phrase == "constant lr":
            settings["lr_schedule"] = "constant"
        else:
            key, _, value = phrase.rpartition(" ")
            numerator, _, denominator = value.partition("/")
            assert key in keys, (page, phrase)
            settings[keys[key]] = float(numerator) / float(denominator or 1)
    return settings


def config_value(config: Any, name: str) -> Any:
    for part in name.split("."):
        config = getattr(config, part)
    return config


@pytest.mark.parametrize("page", sorted(PAGES))
def test_each_documented_default_is_the_configs(page):
    config_class, at_least = PAGES[page]
    config = config_class()
    rows = documented_defaults(page)
    assert len(rows) >= at_least, (page, rows)
    wrong = [(name, documented, config_value(config, name)) for name, documented in rows
             if config_value(config, name) != documented]
    assert not wrong, f"{page}: (setting, page, {config_class.__name__}): {wrong}"


@pytest.mark.parametrize("page", ["impala.md", "apex.md", "r2d2.md"])
def test_the_documented_optimizer_is_the_configs(page):
    optimizer = PAGES[page][0]().optimizer
    documented = documented_optimizer(page)
    assert {"name", "lr", "eps"} <= documented.keys()
    wrong = {key: (value, getattr(optimizer, key)) for key, value in documented.items()
             if getattr(optimizer, key) != pytest.approx(value)}
    assert not wrong, f"{page}: setting: (page, config): {wrong}"


def test_a_cell_in_words_is_not_read_as_a_value():
    assert literal("`rmsprop_tf`, lr 0.0006, decay 0.99") is ...
    assert literal("0.00025/4") is ...
    assert [literal(c) for c in ("2,000,000", "1e-6", "`abs_one`", "null", "0.997")] == [
        2_000_000, 1e-6, "abs_one", None, 0.997]
