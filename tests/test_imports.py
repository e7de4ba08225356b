"""The package's import graph has no cycle (every import that runs counts, including those inside functions and
modules loaded by name with ``importlib.import_module``; imports under ``if TYPE_CHECKING:`` do not)."""

from __future__ import annotations

import ast
from pathlib import Path

import axiomformer

ROOT = Path(axiomformer.__file__).parent


def _module_name(path: Path, root: Path) -> str:
    parts = ("axiomformer",) + path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1]) if parts[-1] == "__init__" else ".".join(parts)


def _runtime_nodes(tree: ast.AST):
    """Every node except those under ``if TYPE_CHECKING:`` (imports for annotations only, never run)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _is_import_module(node: ast.Call) -> bool:
    name = ast.unparse(node.func)
    return name in ("importlib.import_module", "import_module", "__import__") and bool(node.args)


def _importlib_targets(arg: ast.AST, files: dict) -> list[str]:
    """The modules an ``import_module`` argument can name: a constant names one; an f-string every module that starts
    with its constant prefix (``f"axiomformer.commands.{name}"``: every command module)."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return [arg.value]
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        prefix = str(arg.values[0].value)
        return [m for m in files if m.startswith(prefix) and "." in prefix]
    return []


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its file (relative imports resolved)."""
    files = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps: set[str] = set()
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in _runtime_nodes(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            elif isinstance(node, ast.Call) and _is_import_module(node):
                targets = _importlib_targets(node.args[0], files)
            else:
                continue
            deps.update(t for t in targets if t in files and t != name)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_the_package_imports_have_no_cycle():
    assert cycles(import_graph()) == []


def test_the_cycle_check_finds_a_planted_cycle(tmp_path):
    package = tmp_path / "axiomformer"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from axiomformer.sub import b\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("def f():\n    from .. import a\n")
    assert cycles(import_graph(package)) == [frozenset({"axiomformer.a", "axiomformer.sub.b"})]


def test_the_cycle_check_follows_importlib_targets(tmp_path):
    package = tmp_path / "axiomformer"
    (package / "plugins").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "core.py").write_text(
        "import importlib\ndef load(n):\n    return importlib.import_module(f'axiomformer.plugins.{n}')\n"
    )
    (package / "plugins" / "__init__.py").write_text("")
    (package / "plugins" / "one.py").write_text("from axiomformer import core\n")
    graph = import_graph(package)
    assert "axiomformer.plugins.one" in graph["axiomformer.core"]
    assert cycles(graph) == [frozenset({"axiomformer.core", "axiomformer.plugins.one"})]


def test_the_study_imports_nothing_above_it():
    """``study/`` is a job under the command line (docs/ARCHITECTURE.md): none of its modules imports a command
    module or the ``cli`` at run time, so the study runs, stores and reports from a library call alone."""
    upward = {
        name: sorted(d for d in deps if d == "axiomformer.cli" or d.startswith("axiomformer.commands"))
        for name, deps in import_graph().items()
        if name == "axiomformer.study" or name.startswith("axiomformer.study.")
    }
    assert {name: deps for name, deps in upward.items() if deps} == {}
    assert len(upward) > 20  # every study module was looked at, the suites included
