"""The import rules of docs/architecture.md (its Rooms, Modules and Kept paths tables),
checked with ``ast``.

A distrl module may import modules of its own room and of rooms on lower layers; the
modules' imports form no cycle; distrl never imports ``agents`` (or ``run``); agents
import distrl only, never each other (the registry in agents/__init__.py goes by name
through importlib, whose strings are not imports). A kept path (a module that stands for
one that moved) imports its new home only, and nothing imports it. A module missing from
the Modules table, or a row naming a module that does not exist, fails, so the map cannot
go stale silently.
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


class Map:
    """The three tables: room -> layer, the modules named, kept path -> new home."""

    def __init__(self, text: str) -> None:
        self.rooms = {row[0]: int(row[1]) for row in markdown_table(text, "Rooms")}
        self.modules = [row[0] for row in markdown_table(text, "Modules")]
        self.kept = {row[0]: row[1] for row in markdown_table(text, "Kept paths")}


MAP_TABLES = Map(MAP.read_text())


def matches(module: str, pattern: str) -> bool:
    """Glob match where ``*`` stands for one dotted component: "replay.*" is not "replay.a.b"."""
    regex = r"[^.]+".join(re.escape(part) for part in pattern.split("*"))
    return re.fullmatch(regex, module) is not None


def room_of(module: str, rooms: dict[str, int]) -> str:
    """"acting.actor" -> "acting"; "acting" (its package) -> "acting"; "types" -> "."."""
    first = module.split(".")[0]
    return first if first in rooms else "."


def named(module: str, table: Map = MAP_TABLES) -> bool:
    return module in table.kept or any(matches(module, m) for m in table.modules)


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


def distrl_target(name: str, package_dir: Path, table: Map = MAP_TABLES) -> str | None:
    """The distrl module that dotted ``name`` imports, or None if not distrl.

    ``distrl.acting.actor.Actor`` -> "acting.actor"; ``distrl.rl.vtrace`` -> "rl.vtrace";
    ``distrl.__version__`` (an attribute of the package) -> "__init__".
    """
    parts = name.split(".")
    if parts[0] != "distrl":
        return None
    parts = parts[1:]
    # The longest prefix that is a module or a package of distrl, or, for a module not
    # written yet, one the map names.
    for n in range(len(parts), 0, -1):
        candidate = package_dir.joinpath(*parts[:n])
        on_disk = candidate.with_suffix(".py").is_file() or (candidate / "__init__.py").is_file()
        if on_disk or named(".".join(parts[:n]), table):
            return ".".join(parts[:n])
    return "__init__"


def _is_package(module: str, package_dir: Path) -> bool:
    return module == "__init__" or (package_dir / module.replace(".", "/")).is_dir()


def distrl_imports(module: str, source: str, package_dir: Path,
                   table: Map = MAP_TABLES) -> list[tuple[int, str]]:
    """(line, imported module) for every distrl module ``source`` imports, itself excepted."""
    absolute = "distrl" if module == "__init__" else f"distrl.{module}"
    found = []
    for line, name in imported_names(ast.parse(source), absolute,
                                     _is_package(module, package_dir)):
        target = distrl_target(name, package_dir, table)
        if target is not None and target != module:
            found.append((line, target))
    return found


def distrl_violations(module: str, source: str, package_dir: Path,
                      table: Map = MAP_TABLES) -> list[str]:
    """Why ``source`` (distrl module ``module``) breaks the map; empty if it does not."""
    if not named(module, table):
        return [f"distrl.{module} is not in the map: give it a row in docs/architecture.md"]
    absolute = "distrl" if module == "__init__" else f"distrl.{module}"
    problems = []
    for line, name in imported_names(ast.parse(source), absolute,
                                     _is_package(module, package_dir)):
        top = name.split(".")[0]
        if top in ("agents", "run"):
            problems.append(f"distrl.{module}:{line} imports {name}: distrl never imports {top}")
    imports = distrl_imports(module, source, package_dir, table)
    if module in table.kept:
        home = table.kept[module]
        return problems + [f"distrl.{module}:{line} imports distrl.{target}: a kept path "
                           f"imports its new home, distrl.{home}, only"
                           for line, target in imports if target != home]
    room = room_of(module, table.rooms)
    for line, target in imports:
        if target in table.kept:
            problems.append(f"distrl.{module}:{line} imports distrl.{target}, a kept path: "
                            f"import distrl.{table.kept[target]}")
            continue
        if not named(target, table):
            problems.append(f"distrl.{module}:{line} imports distrl.{target}, not in the map")
            continue
        other = room_of(target, table.rooms)
        if other != room and table.rooms[other] >= table.rooms[room]:
            problems.append(
                f"distrl.{module}:{line} (room {room}, layer {table.rooms[room]}) imports "
                f"distrl.{target} (room {other}, layer {table.rooms[other]}): only its own "
                f"room and lower layers may be imported")
    return problems


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` (module -> the modules it imports) as a path, or []."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return []


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
        elif top == "distrl":
            target = distrl_target(name, DISTRL_DIR)
            if target in MAP_TABLES.kept:
                problems.append(f"agents.{module}:{line} imports distrl.{target}, a kept "
                                f"path: import distrl.{MAP_TABLES.kept[target]}")
    return problems


DISTRL_DIR = ROOT / "distrl"
AGENTS_DIR = ROOT / "agents"
DISTRL_FILES = sorted(DISTRL_DIR.rglob("*.py"))
AGENT_FILES = sorted(AGENTS_DIR.rglob("*.py"))


def test_the_tree_is_where_the_test_looks() -> None:
    names = {module_name(p, DISTRL_DIR) for p in DISTRL_FILES}
    assert {"__init__", "types", "acting.actor", "training.learner", "training.loop"} <= names
    assert "impala" in {module_name(p, AGENTS_DIR) for p in AGENT_FILES}


@pytest.mark.parametrize("path", DISTRL_FILES, ids=lambda p: module_name(p, DISTRL_DIR))
def test_distrl_module_follows_the_map(path: Path) -> None:
    module = module_name(path, DISTRL_DIR)
    assert distrl_violations(module, path.read_text(), DISTRL_DIR) == []


def test_the_modules_imports_form_no_cycle() -> None:
    graph = {}
    for path in DISTRL_FILES:
        module = module_name(path, DISTRL_DIR)
        if module not in MAP_TABLES.kept:
            graph[module] = {t for _, t in distrl_imports(module, path.read_text(), DISTRL_DIR)}
    assert find_cycle(graph) == []


@pytest.mark.parametrize("path", AGENT_FILES, ids=lambda p: module_name(p, AGENTS_DIR))
def test_agent_imports_distrl_only(path: Path) -> None:
    assert agent_violations(module_name(path, AGENTS_DIR), path.read_text()) == []


def test_no_room_holds_more_than_a_dozen_modules() -> None:
    per_folder: dict[Path, int] = {}
    for path in DISTRL_FILES:
        if path.name != "__init__.py":
            per_folder[path.parent] = per_folder.get(path.parent, 0) + 1
    crowded = {str(f.relative_to(ROOT)): n for f, n in per_folder.items() if n > 12}
    assert crowded == {}


# The checker itself, on made-up sources: a rule that can never fire protects nothing.


@pytest.mark.parametrize(
    "module, source, expected",
    [
        ("acting.actor", "from distrl.envs import VectorEnv\nfrom distrl import types", []),
        ("rl.losses", "from distrl.rl import vtrace", []),
        ("rl.losses", "import distrl.rl.vtrace as v", []),
        ("training.learner", "from . import loop", []),
        ("rl.vtrace", "from distrl.transport.queues import SlotPool",
         ["distrl.rl.vtrace:1 (room rl, layer 1) imports distrl.transport.queues (room "
          "transport, layer 1)"]),
        ("transport.queues", "def f():\n    from distrl.acting.actor import Actor",
         ["distrl.transport.queues:2 (room transport, layer 1) imports distrl.acting.actor "
          "(room acting, layer 3)"]),
        ("transport.weights", "from ..training import loop",
         ["distrl.transport.weights:1 (room transport, layer 1) imports distrl.training.loop"]),
        ("types", "from distrl.acting import actor",
         ["distrl.types:1 (room ., layer 0) imports distrl.acting.actor"]),
        ("training.loop", "import agents.impala", ["distrl.training.loop:1 imports agents.impala"]),
        ("acting.actor", "from distrl.vtrace import vtrace",
         ["distrl.acting.actor:1 imports distrl.vtrace, a kept path: import distrl.rl.vtrace"]),
        ("vtrace", "import sys\nfrom distrl.rl import vtrace as _moved", []),
        ("vtrace", "from distrl.nets import models",
         ["distrl.vtrace:1 imports distrl.nets.models: a kept path imports its new home"]),
        ("newroom.module", "", ["distrl.newroom.module is not in the map"]),
    ],
)
def test_the_distrl_checker_flags_what_it_should(module: str, source: str, expected: list[str]):
    problems = distrl_violations(module, source, DISTRL_DIR)
    assert len(problems) == len(expected), problems
    for problem, start in zip(problems, expected, strict=True):
        assert problem.startswith(start), problem


def test_the_cycle_finder_finds_a_cycle_and_only_one_that_is_there() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "d"}, "b": set(), "d": {"e"}, "e": {"d"}}) == ["d", "e", "d"]


def test_rooms_and_kept_paths() -> None:
    assert room_of("replay.sum_tree", MAP_TABLES.rooms) == "replay"
    assert room_of("ops", MAP_TABLES.rooms) == "."
    assert distrl_target("distrl.replay.storage.Storage", DISTRL_DIR) == "replay.storage"
    assert distrl_target("distrl.ops.has_extension", DISTRL_DIR) == "ops"
    assert distrl_violations("replay.sum_tree", "from distrl import ops", DISTRL_DIR) == []
    assert len(distrl_violations("replay.buffer", "from distrl.transport import queues",
                                 DISTRL_DIR)) == 1
    assert len(distrl_violations("envs", "from distrl.nets import models", DISTRL_DIR)) == 1


@pytest.mark.parametrize(
    "module, source, expected",
    [
        ("impala", "from distrl.runners.runner import train_agent\nimport torch", 0),
        ("impala", "from distrl.unroll_runner import train_unroll_agent", 1),
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
    stale = [m for m in [*MAP_TABLES.modules, *MAP_TABLES.kept]
             if not any(matches(name, m) for name in on_disk)]
    assert stale == [], f"docs/architecture.md names modules that do not exist: {stale}"
    assert set(MAP_TABLES.kept.values()) <= on_disk
    rooms_on_disk = {p.parent.name for p in DISTRL_FILES if p.parent != DISTRL_DIR}
    assert rooms_on_disk == set(MAP_TABLES.rooms) - {"."}


def test_the_map_reader_reads_tables_and_refuses_a_missing_section() -> None:
    text = ("# map\n\n## Rooms\n\nintro\n\n| room | layer | job |\n|---|---|---|\n"
            "| `.` | 0 | base |\n| `acting` | 3 | acting |\n\nafter\n\n"
            "## Modules\n\n| module | job |\n|--|--|\n| `types` | records |\n\n"
            "## Kept paths\n\n| module | new home | why |\n|--|--|--|\n"
            "| `actor` | `acting.actor` | moved |\n")
    table = Map(text)
    assert (table.rooms, table.modules, table.kept) == (
        {".": 0, "acting": 3}, ["types"], {"actor": "acting.actor"})
    with pytest.raises(AssertionError, match="no '## Kept paths' section"):
        Map(text.split("## Kept paths")[0])
    assert MAP_TABLES.rooms["runners"] > MAP_TABLES.rooms["training"] > MAP_TABLES.rooms["acting"]


@pytest.mark.parametrize("old, new", sorted(MAP_TABLES.kept.items()))
def test_a_kept_path_is_its_new_home(old: str, new: str) -> None:
    import importlib
    import sys

    home = importlib.import_module(f"distrl.{new}")
    if old == "diagnose":  # the command's module: no warning, the same main
        assert importlib.import_module("distrl.diagnose").main is home.main
        return
    sys.modules.pop(f"distrl.{old}", None)
    with pytest.warns(DeprecationWarning, match=rf"distrl\.{old} moved to distrl\.{new}"):
        assert importlib.import_module(f"distrl.{old}") is home
