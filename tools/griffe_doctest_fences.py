"""Griffe extension for the docs site: interactive examples (``>>>`` lines and their output) written in a docstring's
prose become fenced ``python`` code blocks, so Markdown neither quotes them nor reads their output as links; Sphinx
roles (``:mod:`x```, ``:class:`~x```) become inline code; reStructuredText simple tables (rows of ``====`` borders)
become Markdown tables."""

from __future__ import annotations

import re

import griffe

SPHINX_ROLE = re.compile(r":(?:mod|class|func|meth|attr|data|exc|obj):`~?([^`]+)`")
BORDER = re.compile(r"^\s*=+(\s+=+)+\s*$")


def _columns(border: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in re.finditer(r"=+", border)]


def _split(line: str, spans: list[tuple[int, int]]) -> list[str]:
    """A row's cells; the last column runs to the end of the line."""
    cells = []
    for i, (start, _end) in enumerate(spans):
        stop = spans[i + 1][0] if i + 1 < len(spans) else len(line)
        cells.append(line[start:stop].strip())
    return cells


def rst_tables(text: str) -> str:
    """Every reStructuredText simple table (border, header, border, rows, border) as a Markdown table; a row whose
    first cell is empty continues the row above it, as in reStructuredText."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        if not (BORDER.match(lines[i]) and i + 2 < len(lines) and BORDER.match(lines[i + 2])):
            out.append(lines[i])
            i += 1
            continue
        spans = _columns(lines[i])
        header = _split(lines[i + 1], spans)
        rows: list[list[str]] = []
        i += 3
        while i < len(lines) and not BORDER.match(lines[i]):
            if lines[i].strip():
                cells = _split(lines[i], spans)
                if rows and not cells[0]:
                    rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells)]
                else:
                    rows.append(cells)
            i += 1
        i += 1  # the closing border
        out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(out)


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
            obj.docstring.value = SPHINX_ROLE.sub(r"`\1`", rst_tables(fence_examples(obj.docstring.value)))
