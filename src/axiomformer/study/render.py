"""A tiny document model (headings, paragraphs, tables, images) rendered both to Markdown and to standalone HTML,
so ``report.md`` and ``report.html`` always say the same thing."""

from __future__ import annotations

import html
from dataclasses import dataclass, field


@dataclass
class Table:
    """A table of already formatted cells; ``note`` is a paragraph printed under it."""

    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    note: str = ""


@dataclass
class Heading:
    text: str
    level: int = 2


@dataclass
class Paragraph:
    text: str


@dataclass
class Image:
    path: str  # relative to the report
    alt: str


Block = Heading | Paragraph | Table | Image


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _is_number(text: str) -> bool:
    """Whether a formatted cell reads as a number (``0.75``, ``-0.94 [-1.0, -0.9]*``, ``1,024``, ``5e-3``)."""
    head = str(text).strip().split(" ")[0].rstrip("*%x").replace(",", "")
    try:
        float(head)
    except ValueError:
        return False
    return True


def numeric_columns(table: Table) -> list[bool]:
    """Per column: every non-empty cell is a number (right-aligned); other columns hold text (left-aligned)."""
    flags = []
    for i in range(len(table.headers)):
        cells = [str(row[i]).strip() for row in table.rows if i < len(row)]
        filled = [c for c in cells if c not in ("", "-", "–")]
        flags.append(bool(filled) and all(_is_number(c) for c in filled))
    return flags


def to_markdown(blocks: list[Block]) -> str:
    """Render to GitHub-flavoured Markdown."""
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            out.append(f"{'#' * block.level} {block.text}\n")
        elif isinstance(block, Paragraph):
            out.append(block.text + "\n")
        elif isinstance(block, Image):
            out.append(f"![{block.alt}]({block.path})\n")
        elif isinstance(block, Table):
            out.append("| " + " | ".join(_md_cell(h) for h in block.headers) + " |")
            out.append("|" + "|".join("---:" if num else ":---" for num in numeric_columns(block)) + "|")
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in block.rows]
            out.append("")
            if block.note:
                out.append(block.note + "\n")
    return "\n".join(out).rstrip() + "\n"


_CSS = """
body { font-family: system-ui, sans-serif; max-width: 72rem; margin: 2rem auto; padding: 0 1rem; color: #222; }
table { border-collapse: collapse; margin: 0.5rem 0 1.2rem; font-size: 0.9rem; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.6rem; text-align: left; }
th.num, td.num { text-align: right; }
th { background: #f3f3f3; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.5rem 0; }
code { background: #f6f6f6; padding: 0 0.2rem; }
"""


def _inline(text: str) -> str:
    """Escape, then turn `code` spans into <code> (the only inline Markdown the report uses)."""
    parts = html.escape(str(text)).split("`")
    return "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))


def to_html(blocks: list[Block], title: str) -> str:
    """Render to one standalone HTML page (figures referenced by relative path)."""
    body: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            body.append(f"<h{block.level}>{_inline(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            body.append(f"<p>{_inline(block.text)}</p>")
        elif isinstance(block, Image):
            body.append(f'<p><img src="{html.escape(block.path)}" alt="{html.escape(block.alt)}"></p>')
        elif isinstance(block, Table):
            kinds = [' class="num"' if num else "" for num in numeric_columns(block)]
            head = "".join(f"<th{k}>{_inline(h)}</th>" for k, h in zip(kinds, block.headers))
            rows = "".join(
                "<tr>" + "".join(f"<td{k}>{_inline(c)}</td>" for k, c in zip(kinds + [""] * len(row), row)) + "</tr>"
                for row in block.rows
            )
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
            if block.note:
                body.append(f"<p>{_inline(block.note)}</p>")
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_CSS}</style></head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n"
    )
