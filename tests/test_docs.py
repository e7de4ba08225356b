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
    assert fences.fence_examples(text) == (
        "Intro.\n\n```python\n>>> f(1)\n['a']\n```\n\nAfter.\n```python\n>>> kept\n```"
    )


def test_rst_simple_tables_become_markdown_tables_with_continuation_rows():
    pytest.importorskip("griffe")
    fences = _load("griffe_doctest_fences")
    text = (
        "Intro.\n\n=====  ==========\nfield  meaning\n=====  ==========\nscore  the score, s_ij = q.k\n"
        "       over the keys\nvalue  v(x) = W_v x\n=====  ==========\n\nAfter."
    )
    assert fences.rst_tables(text) == (
        "Intro.\n\n| field | meaning |\n|---|---|\n| score | the score, s_ij = q.k over the keys |\n"
        "| value | v(x) = W_v x |\n\nAfter."
    )


def test_every_rst_table_in_a_public_docstring_is_converted():
    """The API reference renders cleanly: no reStructuredText table border survives the docstring extension."""
    pytest.importorskip("griffe")
    import importlib
    import pkgutil

    import axiomformer

    fences = _load("griffe_doctest_fences")
    left = []
    for info in pkgutil.walk_packages(axiomformer.__path__, "axiomformer."):
        if info.name.endswith("__main__"):
            continue  # runs the command line on import
        try:
            module = importlib.import_module(info.name)
        except ImportError:
            continue  # an optional extra (transformers, ray) is absent
        converted = fences.rst_tables(module.__doc__ or "")
        if any(fences.BORDER.match(line) for line in converted.splitlines()):
            left.append(info.name)
    assert left == []


def test_math_becomes_mathml_and_a_bad_formula_names_itself():
    pytest.importorskip("latex2mathml")
    pytest.importorskip("mkdocs")
    from mkdocs.exceptions import PluginError

    hooks = _load("docs_hooks")
    page = (
        '<p>Inline <span class="arithmatex">\\(a^2\\)</span> and</p>'
        '<div class="arithmatex">\\[ \\frac{q^\\top k}{\\sqrt{d}} \\]</div>'
    )
    out = hooks.typeset(page)
    assert 'class="arithmatex"' not in out and out.count("<math") == 2 and "<mfrac>" in out and "<msqrt>" in out
    assert 'display="block"' in out and 'display="inline"' in out
    with pytest.raises(PluginError, match="cannot typeset 'a\\^'"):
        hooks.typeset('<span class="arithmatex">\\(a^\\)</span>')
    with pytest.raises(PluginError, match=r"unknown command\(s\) \\notacommand"):
        hooks.typeset('<span class="arithmatex">\\(\\notacommand x\\)</span>')


def test_results_tables_keep_every_scalar_field_and_align_text_left():
    results = _load("docs_results")
    records = [
        {"model": "standard", "mean": 0.75, "ci_low": None, "seeds": [0, 1]},
        {"model": "A4=cosine", "mean": 0.9, "verdict": "free"},
    ]
    lines = results.table(records).splitlines()
    assert lines[0] == "| model | mean | ci_low | verdict |"
    assert lines[1] == "|:---|---:|---:|:---|"
    assert lines[2] == "| standard | 0.75 | – | – |" and lines[3] == "| A4=cosine | 0.9 | – | free |"


def test_a_results_store_that_cannot_be_read_is_named_and_the_build_goes_on(tmp_path, monkeypatch):
    results = _load("docs_results")
    store = tmp_path / "benchmarks" / "results" / "study-x"
    store.mkdir(parents=True)
    (store / "results.sqlite").write_text("not a database")
    (store / "report.md").write_text("# Report\n\nThe committed words.\n")
    monkeypatch.setattr(results, "ROOT", tmp_path)
    monkeypatch.setattr(results, "RESULTS", tmp_path / "benchmarks" / "results")
    page = results.study_section(store, "X")
    assert "could not be read" in page and "benchmarks/results/study-x" in page and "The committed words." in page


def test_the_study_page_lists_every_registered_suite(monkeypatch):
    pytest.importorskip("mkdocs")
    from axiomformer.study import registry
    from axiomformer.study.suites import BUILTIN

    hooks = _load("docs_hooks")
    page = hooks.suites()
    assert all(f"| `{name}` | {registry.get_suite(name).summary}" in page for name in BUILTIN), page
    assert "<!-- generated: suites -->" in (TOOLS.parent / "docs" / "study.md").read_text()
    planted = registry.get_suite("rho")
    monkeypatch.setitem(registry._SUITES, "planted", planted)  # a suite registered later appears too
    assert "| `planted` |" in hooks.suites()
