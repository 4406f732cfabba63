"""The learning tests' own rules (tests/learning.py): each runs learning_seed(), is marked
``slow``, and its docstring names the calibration seeds and the seed it runs."""

from __future__ import annotations

import ast
from pathlib import Path

from learning import CALIBRATION_SEEDS, TEST_SEED

TESTS = Path(__file__).resolve().parent


def _learning_tests() -> list[tuple[str, ast.FunctionDef]]:
    found = []
    for path in sorted(TESTS.glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and any(
                    isinstance(call, ast.Call) and getattr(call.func, "id", "") == "learning_seed"
                    for call in ast.walk(node)):
                found.append((f"{path.name}::{node.name}", node))
    return found


def _marks(node: ast.FunctionDef) -> set[str]:
    return {ast.unparse(d).removeprefix("pytest.mark.").split("(")[0]
            for d in node.decorator_list}


def test_every_learning_test_is_slow_and_names_its_seeds() -> None:
    tests = _learning_tests()
    assert len(tests) >= 8, [name for name, _ in tests]
    seeds = " and ".join(str(s) for s in CALIBRATION_SEEDS)
    wrong = []
    for name, node in tests:
        doc = " ".join((ast.get_docstring(node) or "").split())
        if ("slow" not in _marks(node) or f"from seeds {seeds})" not in doc
                or f"runs seed {TEST_SEED}." not in doc):
            wrong.append(name)
    assert not wrong, f"not marked slow or not naming seeds {seeds} and {TEST_SEED}: {wrong}"


def test_no_learning_test_runs_a_calibration_seed() -> None:
    assert TEST_SEED not in CALIBRATION_SEEDS
