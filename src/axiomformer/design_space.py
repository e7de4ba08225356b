"""The design-space table, generated from the registries: one row per choice of every axis, with its formula, the
assumption it relaxes and how (``Choice.relaxes``), and its source.

``docs/design_space.md`` (through ``tools/docs_hooks.py``, at every docs build) is this output; the README links to
that page and holds no copy (``tests/test_design_space.py``). ``python -m axiomformer.design_space FILE.md`` refreshes
a copy between the markers :data:`BEGIN` and :data:`END` of any Markdown file. Choices that other packages register
(``axes/plugins.py``) appear with their package named.
"""

from __future__ import annotations

import sys
from pathlib import Path

from axiomformer.spec import ALIASES, ECONOMY_NOTES, FIELD_RELAXATIONS, REGISTRIES, AttentionSpec

BEGIN, END = "<!-- design-space table: generated -->", "<!-- design-space table: end -->"
"""The markers around a generated copy of the table in a Markdown file."""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def design_space_table() -> str:
    """The Markdown table: field | choice | formula | assumption relaxed, how | source."""
    alias = {axis: name for name, axis in ALIASES.items()}
    lines = ["| field | choice | formula | assumption relaxed, how | source |", "|---|---|---|---|---|"]
    for axis, registry in REGISTRIES.items():
        tag = alias.get(axis, "")
        for i, choice in enumerate(registry):
            how = choice.relaxes or (
                (f"— (standard: {tag} holds)" if axis in alias else "— (standard)") if i == 0 else "—"
            )
            origin = registry.origin(choice.name)
            source = choice.source + ("" if origin == "axiomformer" else f" (package {origin})")
            lines.append(f"| `{axis}` | `{choice.name}` | {_cell(choice.formula)} | {_cell(how)} | {_cell(source)} |")
    for name, (formula, how, source) in FIELD_RELAXATIONS.items():
        kind = "(true/false)" if isinstance(getattr(AttentionSpec(), name), bool) else "(a number)"
        lines.append(f"| `{name}` | {kind} | {_cell(formula)} | {_cell(how)} | {_cell(source)} |")
    for name, (formula, how, source) in ECONOMY_NOTES.items():  # the economies: MLA's latent, GQA, a window
        lines.append(f"| `{name}` | (an int, 0 = off) | {_cell(formula)} | {_cell(how)} | {_cell(source)} |")
    return "\n".join(lines) + "\n"


def replace_table(text: str) -> str:
    """``text`` with the part between :data:`BEGIN` and :data:`END` replaced by the generated table.

    Raises:
        ValueError: the markers are missing.
    """
    if BEGIN not in text or END not in text:
        raise ValueError(f"the markers {BEGIN} and {END} are missing")
    head, rest = text.split(BEGIN, 1)
    return head + BEGIN + "\n" + design_space_table() + END + rest.split(END, 1)[1]


if __name__ == "__main__":  # python -m axiomformer.design_space README.md
    for name in sys.argv[1:]:
        path = Path(name)
        path.write_text(replace_table(path.read_text(encoding="utf-8")), encoding="utf-8")
