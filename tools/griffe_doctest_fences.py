"""Griffe extension for the docs site: interactive examples (``>>>`` lines and their output) written in a docstring's
prose become fenced ``python`` code blocks, so Markdown neither quotes them nor reads their output as links; Sphinx
roles (``:mod:`x```, ``:class:`~x```) become inline code."""

from __future__ import annotations

import re

import griffe

SPHINX_ROLE = re.compile(r":(?:mod|class|func|meth|attr|data|exc|obj):`~?([^`]+)`")


def fence_examples(text: str) -> str:
    """Wrap every run of lines starting at a ``>>>`` line (up to the next blank line) in a ```` ```python ```` fence;
    text already inside a fence is left alone."""
    out: list[str] = []
    in_fence = in_example = False
    for line in text.splitlines():
        stripped = line.strip()
        if in_example and not stripped:
            out.append("```")
            in_example = False
        if stripped.startswith("```"):
            in_fence = not in_fence
        elif not in_fence and not in_example and stripped.startswith(">>>"):
            out.append("```python")
            in_example = True
        out.append(line)
    if in_example:
        out.append("```")
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    """Applies :func:`fence_examples` to every docstring griffe loads."""

    def on_object(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = SPHINX_ROLE.sub(r"`\1`", fence_examples(obj.docstring.value))
