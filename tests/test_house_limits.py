"""The house's size rule (issue 37): no function or method in ``src/`` is longer than :data:`MAX_LINES` lines,
counted from its ``def`` line to its last line (signature and docstring included), as Python's own parser sees it."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
MAX_LINES = 60


def long_functions(source: str, limit: int = MAX_LINES) -> list[tuple[str, int]]:
    """(name, lines) of every function or method of ``source`` longer than ``limit`` lines."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > limit:
                found.append((node.name, lines))
    return found


def test_the_rule_catches_a_planted_long_method():
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_LINES))
    planted = f"class A:\n    def short(self):\n        return 1\n\n    def long(self):\n{body}\n"
    assert long_functions(planted) == [("long", MAX_LINES + 1)]
    assert long_functions("def f():\n" + "\n".join(f"    y{i} = {i}" for i in range(MAX_LINES - 1))) == []


def test_no_function_in_src_is_over_the_limit():
    over = {
        f"{path.relative_to(SRC)}:{name}": lines
        for path in sorted(SRC.rglob("*.py"))
        for name, lines in long_functions(path.read_text(encoding="utf-8"))
    }
    assert not over, f"functions over {MAX_LINES} lines (split them): {over}"
