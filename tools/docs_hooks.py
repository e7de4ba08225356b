"""MkDocs hooks: pages generated from the code at build time, so the docs cannot drift from it.

``<!-- generated: design-space -->`` becomes every axis of ``axiomformer.spec.AXES`` with its choices and its axis
module's docstring (formula and source of every choice); the build fails when a choice is missing from its module's
docstring. ``<!-- generated: routing -->`` becomes the engine that automatic routing picks for the standard spec and
every single-axis relaxation, measured by running each one. ``<!-- generated: engines -->`` becomes the API entry of
every registered engine in routing order.
"""

from __future__ import annotations

import importlib
import inspect
import re

from mkdocs.exceptions import PluginError

AXIS_MODULE = {"feature_map": "normalizer"}
"""Axes documented in another axis's module (the temperature and the linear kernel's feature map belong to A5)."""


def _axis_doc(axis: str) -> str:
    module = importlib.import_module(f"axiomformer.axes.{AXIS_MODULE.get(axis, axis)}")
    doc = inspect.getdoc(module) or ""
    function = getattr(module, axis, None)  # an axis with its own function (feature_map) documents its choices there
    if axis in AXIS_MODULE and callable(function):
        doc += f"\n\n{module.__name__}.{axis}: {inspect.getdoc(function)}"
    return doc


def design_space() -> str:
    from axiomformer.design_space import design_space_table
    from axiomformer.spec import ALIASES, AXES, ASSUMPTIONS

    alias = {axis: name for name, axis in ALIASES.items()}
    parts = ["## Every choice\n\nOne row per registry entry: its formula, the assumption it relaxes and how, and its "
             "source.\n\n" + design_space_table()]
    for axis, choices in AXES.items():
        doc = _axis_doc(axis)
        missing = [c for c in choices if not re.search(rf"(?<![\w]){re.escape(c)}(?![\w])", doc)]
        if missing:
            raise PluginError(f"design space: the docstring of the module of axis {axis!r} does not document "
                              f"choice(s) {', '.join(missing)}")
        title = f"{axis} ({alias[axis]})" if axis in alias else axis
        head = f"**Assumption {alias[axis]}**: {ASSUMPTIONS[alias[axis]]}.\n\n" if axis in alias else ""
        listed = ", ".join(f"`{c}`" + (" (standard)" if i == 0 else "") for i, c in enumerate(choices))
        module = f"axiomformer.axes.{AXIS_MODULE.get(axis, axis)}"
        parts.append(f"## {title}\n\n{head}Choices: {listed}.\n\nFrom `{module}`:\n\n```text\n{doc}\n```\n")
    return "\n".join(parts)


def routing() -> str:
    import torch

    from axiomformer.attention import Attention
    from axiomformer.spec import AXES, AttentionSpec

    base = AttentionSpec.standard(32, 4, causal=True, max_len=16)
    variants = ["standard"] + [f"{axis}={choice}" for axis, choices in AXES.items() if axis != "feature_map"
                               for choice in choices[1:]]
    rows = ["| spec | engine (training, causal, 2 x 16 tokens, CPU) | engine with `need_weights=True` |",
            "|---|---|---|"]
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 16, 32, generator=generator)
    for variant in variants:
        module = Attention(base.relax(None if variant == "standard" else variant))
        with torch.no_grad():
            module(x)
            plain = module.last_engine
            module(x, need_weights=True)
        rows.append(f"| `{variant}` | `{plain}` | `{module.last_engine}` |")
    return "\n".join(rows) + "\n"


def engines() -> str:
    """One API entry per registered engine, in routing order (``ENGINE_ORDER``), rendered by mkdocstrings."""
    from axiomformer.engines import ENGINE_ORDER, ENGINES

    blocks = []
    for name in ENGINE_ORDER:
        cls = type(ENGINES[name])
        blocks.append(f"::: {cls.__module__}.{cls.__qualname__}\n    options:\n      heading_level: 3\n")
    return "\n".join(blocks)


GENERATORS = {"design-space": design_space, "routing": routing, "engines": engines}


def on_page_markdown(markdown: str, page, config, files) -> str:
    for name, build in GENERATORS.items():
        marker = f"<!-- generated: {name} -->"
        if marker in markdown:
            markdown = markdown.replace(marker, build())
    return markdown
