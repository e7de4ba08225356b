"""MkDocs hooks: pages generated from the code at build time, so the docs cannot drift from it.

``<!-- generated: design-space -->`` becomes every axis of ``axiomformer.spec.AXES`` with its choices and its axis
module's docstring (formula and source of every choice); the build fails when a choice is missing from its module's
docstring. ``<!-- generated: routing -->`` becomes the engine that automatic routing picks for the standard spec and
every single-axis relaxation, measured by running each one. ``<!-- generated: engines -->`` becomes the table of
what each registered engine computes and its API entry, in routing order. ``<!-- generated: suites -->`` becomes the
table of every registered study suite. ``<!-- generated: audit-matrix -->`` becomes the relaxation-by-check
matrix, measured by auditing every single-axis relaxation. ``<!-- generated: hf-zoo -->`` becomes the Hugging Face
zoo table read from ``benchmarks/results/hf_zoo.json``. ``<!-- generated: results NAME -->`` becomes a Results page
read from the committed stores (``tools/docs_results.py``).

Math: ``pymdownx.arithmatex`` (generic mode) marks ``$...$`` and ``$$...$$``; :func:`on_page_content` turns each into
MathML with ``latex2mathml`` at build time, which browsers typeset natively: no script, no font download, no CDN.
"""

from __future__ import annotations

import html
import importlib
import importlib.util
import inspect
import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError

_HERE = Path(__file__).resolve().parent


def _tool(name: str):
    """A sibling module of this file (mkdocs loads hooks by path, so ``tools`` is not a package on sys.path)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, _HERE / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


AXIS_MODULE = {"feature_map": "normalizer"}
"""Axes documented in another axis's module (the linear kernel's feature map belongs to A5's normalizer)."""


def _axis_doc(axis: str) -> str:
    module = importlib.import_module(f"axiomformer.axes.{AXIS_MODULE.get(axis, axis)}")
    doc = inspect.getdoc(module) or ""
    function = getattr(module, axis, None)  # an axis with its own function (feature_map) documents its choices there
    if axis in AXIS_MODULE and callable(function):
        doc += f"\n\n{module.__name__}.{axis}: {inspect.getdoc(function)}"
    return doc


def design_space() -> str:
    from axiomformer.design_space import design_space_table
    from axiomformer.spec import ALIASES, ASSUMPTIONS, AXES

    alias = {axis: name for name, axis in ALIASES.items()}
    parts = [
        "## Every choice\n\nOne row per registry entry: its formula, the assumption it relaxes and how, and its "
        "source.\n\n" + design_space_table()
    ]
    for axis, choices in AXES.items():
        doc = _axis_doc(axis)
        missing = [c for c in choices if not re.search(rf"(?<![\w]){re.escape(c)}(?![\w])", doc)]
        if missing:
            raise PluginError(
                f"design space: the docstring of the module of axis {axis!r} does not document "
                f"choice(s) {', '.join(missing)}"
            )
        title = f"{axis} ({alias[axis]})" if axis in alias else axis
        head = f"**Assumption {alias[axis]}**: {ASSUMPTIONS[alias[axis]]}.\n\n" if axis in alias else ""
        listed = ", ".join(f"`{c}`" + (" (standard)" if i == 0 else "") for i, c in enumerate(choices))
        module = f"axiomformer.axes.{AXIS_MODULE.get(axis, axis)}"
        parts.append(f"## {title}\n\n{head}Choices: {listed}.\n\nFrom `{module}`:\n\n```text\n{doc}\n```\n")
    return "\n".join(parts)


def routing() -> str:
    import torch

    from axiomformer.attention import Attention
    from axiomformer.spec import AXES, AttentionSpec, required_fields

    base = AttentionSpec.standard(32, 4, causal=True, max_len=16)
    variants = ["standard"] + [
        f"{axis}={choice}" for axis, choices in AXES.items() if axis != "feature_map" for choice in choices[1:]
    ]
    rows = [
        "| spec | engine (training, causal, 2 x 16 tokens, CPU) | engine with `need_weights=True` |",
        "|---|---|---|",
    ]
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 16, 32, generator=generator)
    for variant in variants:
        # A choice defined only without a causal mask (sinkhorn) runs without one, and its row says so.
        need = {} if variant == "standard" else required_fields(*variant.split("=", 1))
        module = Attention(base.relax(need).relax(None if variant == "standard" else variant))
        with torch.no_grad():
            module(x)
            plain = module.last_engine
            module(x, need_weights=True)
        label = f"`{variant}`" + (" (not causal: defined only without the mask)" if need.get("causal") is False else "")
        rows.append(f"| {label} | `{plain}` | `{module.last_engine}` |")
    return "\n".join(rows) + "\n"


def engines() -> str:
    """A table of what each registered engine computes (its ``computes`` over choice traits), then one API entry per
    engine, in routing order (``ENGINE_ORDER``), rendered by mkdocstrings."""
    from axiomformer.engines import ENGINE_ORDER, ENGINES, describe_engines

    rows = [f"| `{name}` | {what} |" for name, what in describe_engines()]
    blocks = [
        "| engine | computes (traits of the plan's choices; `accepts` adds the problem's kind) |\n|---|---|\n"
        + "\n".join(rows)
        + "\n"
    ]
    for name in ENGINE_ORDER:
        cls = type(ENGINES[name])
        blocks.append(f"::: {cls.__module__}.{cls.__qualname__}\n    options:\n      heading_level: 3\n")
    return "\n".join(blocks)


def audit_matrix() -> str:
    """The relaxation-by-check matrix of every single-axis relaxation and the reference targets, measured now."""
    from axiomformer.audit.matrix import matrix_markdown, relaxation_matrix

    return matrix_markdown(relaxation_matrix())


def hf_zoo() -> str:
    """The Hugging Face zoo table, read from the committed ``benchmarks/results/hf_zoo.json``
    (``axiomformer audit --hf-zoo --out benchmarks/results/hf_zoo.json`` writes it)."""
    import json

    from axiomformer.surgery.hf_zoo import zoo_markdown

    path = _HERE.parent / "benchmarks" / "results" / "hf_zoo.json"
    if not path.is_file():
        raise PluginError(f"hf zoo: {path} is missing; run axiomformer audit --hf-zoo --out {path}")
    return zoo_markdown(json.loads(path.read_text()))


def suites() -> str:
    """The table of every registered study suite (``axiomformer.study.registry``): name, summary, presets, and the
    page that describes it."""
    import axiomformer.study  # noqa: F401 - importing it registers the built-in suites
    from axiomformer.study.registry import get_suite, registered

    pages = {"main": "study.md", "long-range": "study.md#the-long-range-suite"}
    rows = ["| suite | what it measures | presets | described in |", "|---|---|---|---|"]
    for name in registered():
        suite = get_suite(name)
        page = pages.get(name, "open_questions.md")
        presets = ", ".join(p for p in ("quick", "default", "full") if p in suite.presets)
        rows.append(f"| `{name}` | {suite.summary.replace('|', chr(92) + '|')} | {presets} | [{page}]({page}) |")
    return "\n".join(rows) + "\n"


GENERATORS = {
    "suites": suites,
    "design-space": design_space,
    "routing": routing,
    "engines": engines,
    "audit-matrix": audit_matrix,
    "hf-zoo": hf_zoo,
}

_RESULTS_MARKER = re.compile(r"<!-- generated: results ([\w-]+) -->")


def _results(match: re.Match) -> str:
    pages = _tool("docs_results").PAGES
    if match.group(1) not in pages:
        raise PluginError(f"results page {match.group(1)!r} unknown; choose one of: {', '.join(pages)}")
    return pages[match.group(1)]()


def on_page_markdown(markdown: str, page, config, files) -> str:
    for name, build in GENERATORS.items():
        marker = f"<!-- generated: {name} -->"
        if marker in markdown:
            markdown = markdown.replace(marker, build())
    return _RESULTS_MARKER.sub(_results, markdown)


def on_files(files, config):
    """Publish the result stores' figures (``benchmarks/results/**/*.png``) for the Results pages."""
    for file in _tool("docs_results").figure_files(config):
        files.append(file)
    return files


_MATH = re.compile(r'<(span|div) class="arithmatex">(.*?)</\1>', re.S)
_DELIMITERS = {r"\(": r"\)", r"\[": r"\]", "$$": "$$", "$": "$"}


def latex_to_mathml(latex: str, display: bool) -> str:
    """One formula as MathML (``latex2mathml``); a formula it cannot convert fails the build, naming it."""
    from latex2mathml.converter import convert

    try:
        mathml = convert(latex, display="block" if display else "inline")
    except Exception as err:  # latex2mathml raises its own exception types
        raise PluginError(f"math: cannot typeset {latex!r}: {type(err).__name__} {err}") from err
    unknown = re.findall(r">(\\[A-Za-z]+)<", mathml)  # a command latex2mathml does not know stays as text
    if unknown:
        raise PluginError(f"math: cannot typeset {latex!r}: unknown command(s) {', '.join(unknown)}")
    return mathml


def typeset(content: str) -> str:
    """Every arithmatex span/div of a rendered page as MathML."""

    def one(match: re.Match) -> str:
        body = html.unescape(match.group(2)).strip()
        for start, end in _DELIMITERS.items():
            if body.startswith(start) and body.endswith(end) and len(body) >= len(start) + len(end):
                body = body[len(start) : len(body) - len(end)]
                break
        display = match.group(1) == "div"
        return latex_to_mathml(body.strip(), display)

    return _MATH.sub(one, content)


def on_page_content(content: str, page, config, files) -> str:
    return typeset(content)
