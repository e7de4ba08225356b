"""The docs site's generators (tools/): the design-space page documents every choice or the build fails."""

import importlib.util
from pathlib import Path

import pytest

TOOLS = Path(__file__).parent.parent / "tools"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_design_space_lists_every_choice_and_fails_on_an_undocumented_one(monkeypatch):
    pytest.importorskip("mkdocs")
    from mkdocs.exceptions import PluginError

    from axiomformer import spec

    hooks = _load("docs_hooks")
    page = hooks.design_space()
    for axis, choices in spec.AXES.items():
        assert f"## {axis}" in page
        assert all(f"`{choice}`" in page for choice in choices)
    monkeypatch.setitem(spec.AXES, "score", spec.AXES["score"] + ("dotted_line",))
    with pytest.raises(PluginError, match="axis 'score' does not document choice\\(s\\) dotted_line"):
        hooks.design_space()


def test_doctest_lines_become_fenced_code():
    pytest.importorskip("griffe")
    fences = _load("griffe_doctest_fences")
    text = "Intro.\n\n>>> f(1)\n['a']\n\nAfter.\n```python\n>>> kept\n```"
    assert fences.fence_examples(text) == ("Intro.\n\n```python\n>>> f(1)\n['a']\n```\n\nAfter.\n```python\n>>> kept\n```")
