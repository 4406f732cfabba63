"""The import rules of docs/architecture.md (its Layers table), checked with ``ast``.

A distrl module may import distrl modules of strictly lower layers, plus the same-layer
pairs in ``SAME_LAYER_ALLOWED``; distrl never imports ``agents`` (or ``run``); agents
import distrl only, never each other (the registry in agents/__init__.py goes by name
through importlib, whose strings are not imports). A new distrl module must be added to
docs/architecture.md's layer table before this test passes, and a row naming a module
that does not exist fails it too, so the map cannot go stale silently.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

MAP = ROOT / "docs" / "architecture.md"


def markdown_table(text: str, heading: str) -> list[list[str]]:
    """The rows (cells without backticks) of the first table under ``## heading``."""
    section = text.split(f"\n## {heading}\n", 1)
    if len(section) < 2:
        raise AssertionError(f"docs/architecture.md has no '## {heading}' section")
    rows = []
    for line in section[1].split("\n## ", 1)[0].splitlines():
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
        if not set(cells[0]) <= set("-: "):  # the separator row
            rows.append(cells)
    return rows[1:]  # without the header


def read_map(text: str) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The layer table (module -> layer) and the same-layer allowances of the map."""
    layers = {row[0]: int(row[1]) for row in markdown_table(text, "Layers")}
    allowed = [(row[0], row[1]) for row in markdown_table(text, "Same-layer imports")]
    return layers, allowed


# Module names are relative to distrl/; "__init__" is distrl/__init__.py itself.
LAYERS, SAME_LAYER_ALLOWED = read_map(MAP.read_text())


def matches(module: str, pattern: str) -> bool:
    """Glob match where ``*`` stands for one dotted component: "replay.*" is not "replay.a.b"."""
    regex = r"[^.]+".join(re.escape(part) for part in pattern.split("*"))
    return re.fullmatch(regex, module) is not None


def layer_of(module: str) -> int | None:
    for pattern, layer in LAYERS.items():
        if matches(module, pattern):
            return layer
    return None


def module_name(path: Path, package_dir: Path) -> str:
    """distrl/replay/storage.py -> "replay.storage"; distrl/replay/__init__.py -> "replay"."""
    parts = list(path.relative_to(package_dir).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def imported_names(tree: ast.AST, importer: str, is_package: bool) -> list[tuple[int, str]]:
    """Absolute dotted names of everything ``tree`` imports, with line numbers.

    ``from X import y`` yields ``X.y`` (which may name a module or an attribute); relative
    imports are resolved against ``importer`` (a dotted absolute module name).
    """
    package = importer if is_package else importer.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            out += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return out


def distrl_target(name: str, package_dir: Path) -> str | None:
    """The distrl module (LAYERS key) that dotted ``name`` imports, or None if not distrl.

    ``distrl.actor.Actor`` -> "actor"; ``distrl.replay.storage`` -> "replay.storage";
    ``distrl.__version__`` (an attribute of the package) -> "__init__".
    """
    parts = name.split(".")
    if parts[0] != "distrl":
        return None
    parts = parts[1:]
    # The longest prefix that is a module or a package of distrl, or, for a module not
    # written yet (replay.storage while replay/ holds only sum_tree), one the table names.
    for n in range(len(parts), 0, -1):
        candidate = package_dir.joinpath(*parts[:n])
        on_disk = candidate.with_suffix(".py").is_file() or (candidate / "__init__.py").is_file()
        if on_disk or layer_of(".".join(parts[:n])) is not None:
            return ".".join(parts[:n])
    return "__init__"


def distrl_violations(module: str, source: str, package_dir: Path) -> list[str]:
    """Why ``source`` (distrl module ``module``) breaks the layer table; empty if it does not."""
    layer = layer_of(module)
    if layer is None:
        return [f"distrl.{module} is not in LAYERS: give it a row in docs/architecture.md"]
    tree = ast.parse(source)
    is_package = module == "__init__" or (package_dir / module.replace(".", "/")).is_dir()
    absolute = "distrl" if module == "__init__" else f"distrl.{module}"
    problems = []
    for line, name in imported_names(tree, absolute, is_package):
        top = name.split(".")[0]
        if top in ("agents", "run"):
            problems.append(f"distrl.{module}:{line} imports {name}: distrl never imports {top}")
            continue
        target = distrl_target(name, package_dir)
        if target is None or target == module:
            continue
        target_layer = layer_of(target)
        if target_layer is None:
            problems.append(f"distrl.{module}:{line} imports distrl.{target}, not in LAYERS")
        elif target_layer < layer:
            continue
        elif target_layer == layer and any(
            matches(module, a) and matches(target, b)
            for a, b in SAME_LAYER_ALLOWED
        ):
            continue
        else:
            problems.append(
                f"distrl.{module}:{line} (layer {layer}) imports distrl.{target} "
                f"(layer {target_layer}): only strictly lower layers may be imported"
            )
    return problems


# SEED trains with another agent's learner, so it may import that agent (nothing else may).
AGENT_IMPORTS_ALLOWED: list[tuple[str, str]] = [("seed", "agents.impala"),
                                                ("seed", "agents.r2d2")]


def agent_violations(module: str, source: str) -> list[str]:
    """Why agent module ``module`` ("impala", or "__init__" for the registry) breaks the rules."""
    absolute = "agents" if module == "__init__" else f"agents.{module}"
    problems = []
    for line, name in imported_names(ast.parse(source), absolute, module == "__init__"):
        top = name.split(".")[0]
        if top == "agents" and (module, name) in AGENT_IMPORTS_ALLOWED:
            continue
        if top == "agents":
            problems.append(f"agents.{module}:{line} imports {name}: agents never import agents")
        elif top == "run":
            problems.append(f"agents.{module}:{line} imports run.py, which sits above agents")
    return problems


DISTRL_DIR = ROOT / "distrl"
AGENTS_DIR = ROOT / "agents"
DISTRL_FILES = sorted(DISTRL_DIR.rglob("*.py"))
AGENT_FILES = sorted(AGENTS_DIR.rglob("*.py"))


def test_the_tree_is_where_the_test_looks() -> None:
    names = {module_name(p, DISTRL_DIR) for p in DISTRL_FILES}
    assert {"__init__", "types", "actor", "learner", "loop"} <= names
    assert "impala" in {module_name(p, AGENTS_DIR) for p in AGENT_FILES}


@pytest.mark.parametrize("path", DISTRL_FILES, ids=lambda p: module_name(p, DISTRL_DIR))
def test_distrl_module_follows_the_layer_table(path: Path) -> None:
    module = module_name(path, DISTRL_DIR)
    assert distrl_violations(module, path.read_text(), DISTRL_DIR) == []


@pytest.mark.parametrize("path", AGENT_FILES, ids=lambda p: module_name(p, AGENTS_DIR))
def test_agent_imports_distrl_only(path: Path) -> None:
    assert agent_violations(module_name(path, AGENTS_DIR), path.read_text()) == []


# The checker itself, on made-up sources: a rule that can never fire protects nothing.


@pytest.mark.parametrize(
    "module, source, expected",
    [
        ("actor", "from distrl.envs import VectorEnv\nfrom distrl import types", []),
        ("losses", "from distrl import vtrace", []),
        ("losses", "import distrl.vtrace as v", []),
        ("vtrace", "from distrl.losses import entropy", ["distrl.vtrace:1 (layer 1) imports "
                                                         "distrl.losses (layer 1)"]),
        ("types", "from distrl.config import EnvConfig", ["distrl.types:1 (layer 0) imports "
                                                          "distrl.config (layer 0)"]),
        ("queues", "def f():\n    from distrl.actor import Actor",
         ["distrl.queues:2 (layer 1) imports distrl.actor (layer 2)"]),
        ("learner", "from . import loop", ["distrl.learner:1 (layer 2) imports "
                                           "distrl.loop (layer 4)"]),
        ("learner", "from .weights import WeightStore", []),
        ("loop", "import agents.impala", ["distrl.loop:1 imports agents.impala"]),
        ("config", "from distrl import __version__",
         ["distrl.config:1 (layer 0) imports distrl.__init__ (layer 0)"]),
        ("newmodule", "", ["distrl.newmodule is not in LAYERS"]),
    ],
)
def test_the_distrl_checker_flags_what_it_should(module: str, source: str, expected: list[str]):
    problems = distrl_violations(module, source, DISTRL_DIR)
    assert len(problems) == len(expected), problems
    for problem, start in zip(problems, expected, strict=True):
        assert problem.startswith(start), problem


def test_the_same_layer_allowances() -> None:
    assert layer_of("replay.sum_tree") == layer_of("replay") == 1
    assert layer_of("replay.sum_tree.SumTree") is None
    # replay/storage.py does not exist yet: the table, not the disk, resolves it.
    assert distrl_target("distrl.replay.storage.Storage", DISTRL_DIR) == "replay.storage"
    assert distrl_target("distrl.ops.has_extension", DISTRL_DIR) == "ops"
    assert distrl_violations("replay.buffer", "from distrl.replay import samplers\n"
                             "from distrl.replay.storage import Storage", DISTRL_DIR) == []
    assert distrl_violations("replay.sum_tree", "from distrl import ops", DISTRL_DIR) == []
    assert len(distrl_violations("replay.buffer", "from distrl import queues", DISTRL_DIR)) == 1
    # envs gets no same-layer extra: its brackets name only layer-0 modules.
    assert len(distrl_violations("envs", "from distrl import models", DISTRL_DIR)) == 1


@pytest.mark.parametrize(
    "module, source, expected",
    [
        ("impala", "from distrl.unroll_runner import train_unroll_agent\nimport torch", 0),
        ("apex", "from agents.impala import loss_fn", 1),
        ("apex", "from . import impala", 1),
        ("apex", "from .impala import loss_fn", 1),
        ("__init__", "import importlib\nimportlib.import_module('agents.impala')", 0),
        ("__init__", "from agents import impala", 1),
        ("r2d2", "import run", 1),
    ],
)
def test_the_agent_checker_flags_what_it_should(module: str, source: str, expected: int):
    assert len(agent_violations(module, source)) == expected


def test_every_row_of_the_map_names_a_module_that_exists() -> None:
    on_disk = {module_name(p, DISTRL_DIR) for p in DISTRL_FILES}
    stale = [m for m in LAYERS if not any(matches(name, m) for name in on_disk)]
    assert stale == [], f"docs/architecture.md names modules that do not exist: {stale}"
    for importer, imported in SAME_LAYER_ALLOWED:
        assert layer_of(importer) == layer_of(imported) is not None, (importer, imported)


def test_the_map_reader_reads_tables_and_refuses_a_missing_section() -> None:
    text = ("# map\n\n## Layers\n\nintro\n\n| module | layer | job |\n|---|---|---|\n"
            "| `types` | 0 | records |\n| `actor` | 2 | acting |\n\nafter\n\n"
            "## Same-layer imports\n\n| importer | imported | why |\n|--|--|--|\n"
            "| `inference` | `actor` | channels |\n")
    assert read_map(text) == ({"types": 0, "actor": 2}, [("inference", "actor")])
    with pytest.raises(AssertionError, match="no '## Same-layer imports' section"):
        read_map(text.split("## Same-layer")[0])
    layers = dict(LAYERS)
    assert layers["loop"] > layers["learner"] and layers["unroll_runner"] > layers["loop"]
