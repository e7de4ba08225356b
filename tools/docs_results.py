"""The docs site's Results pages, generated at build time from the committed result stores under
``benchmarks/results/``, so that they cannot go stale.

Each store is read the way its own command reads it, never written: a study store (``results.sqlite``) through
``axiomformer.study.report.study_json`` (what ``axiomformer report DIR --json`` prints) on a temporary copy, the flow
experiment through ``flow_results.json``, the bench through ``bench.json``. The rendering is generic: every list of
records becomes a table of its scalar fields, every other scalar a line, so that a field added or renamed by a later
run shows up without a change here. A store that cannot be read is named with the reason on its page (the committed
``report.md``, where there is one, stands in), and the build goes on.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
FIGURE_URI = "results/store"
"""Where the stores' figures are published on the site (``results/store/<path under benchmarks/results>``)."""

FIRST = ("answer", "aa_control", "verdicts", "design", "cells", "comparisons")
"""Sections of a study's JSON shown first, in this order; any other section follows."""

ROW_LIMIT = 400


def _number(value: float) -> str:
    if not math.isfinite(value):
        return str(value)
    if value == int(value) and abs(value) < 1e9:
        return str(int(value))
    return f"{value:.4g}"


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return _number(value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def _scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def table(records: list[dict[str, Any]]) -> str:
    """A Markdown table of the scalar fields of ``records`` (columns in order of first appearance); text columns
    left-aligned, numeric ones right-aligned; lists and nested records left out (they stay in the store)."""
    columns: list[str] = []
    for record in records:
        columns += [k for k, v in record.items() if k not in columns and _scalar(v)]
    if not columns:
        return ""
    numeric = {
        c: all(
            isinstance(r.get(c), (int, float)) and not isinstance(r.get(c), bool)
            for r in records
            if r.get(c) is not None
        )
        for c in columns
    }
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---:" if numeric[c] else ":---" for c in columns) + "|"]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in records[:ROW_LIMIT]]
    if len(records) > ROW_LIMIT:
        lines.append(f"\n({len(records) - ROW_LIMIT} more rows in the store.)")
    return "\n".join(lines) + "\n"


def render(data: dict[str, Any], level: int = 3, first: tuple[str, ...] = FIRST) -> str:
    """Every section of a JSON result: lists of records as tables, records as bullet lists, scalars as lines."""
    keys = [k for k in first if k in data] + [k for k in data if k not in first]
    scalars = [f"- **{k}**: {_cell(data[k])}" for k in keys if _scalar(data[k])]
    parts = ["\n".join(scalars) + "\n"] if scalars else []
    for key in keys:
        value = data[key]
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            parts.append(f"{'#' * level} {key}\n\n{table(value)}")
        elif isinstance(value, list) and value:
            parts.append(f"- **{key}**: {', '.join(_cell(v) for v in value)}\n")
        elif isinstance(value, dict) and value:
            flat = {k: (v if _scalar(v) else json.dumps(v)[:200]) for k, v in value.items()}
            parts.append(
                f"{'#' * level} {key}\n\n" + "\n".join(f"- **{k}**: {_cell(v)}" for k, v in flat.items()) + "\n"
            )
    return "\n".join(parts)


def study_data(store: Path) -> dict[str, Any]:
    """``study_json`` of a study store, read from a temporary copy (the committed store is never opened for
    writing, so no ``-wal``/``-shm`` file appears beside it)."""
    from axiomformer.study.report import study_json

    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy2(store / "results.sqlite", Path(tmp) / "results.sqlite")
        return study_json(tmp)


def figures(store: Path) -> str:
    """Markdown images of every PNG in the store (its ``figures/`` folder included), as published by
    :func:`figure_files`."""
    pngs = sorted(store.glob("*.png")) + sorted(store.glob("figures/*.png"))
    return "\n\n".join(f"![{p.stem.replace('_', ' ')}](store/{p.relative_to(RESULTS).as_posix()})" for p in pngs)


def _unreadable(store: Path, err: Exception) -> str:
    text = (
        f'!!! warning "Not readable by this build"\n    `{store.relative_to(ROOT).as_posix()}` could not be '
        f"read: {type(err).__name__}: {_cell(str(err))}\n"
    )
    report = store / "report.md"
    if report.is_file():
        text += "\nThe report committed with the store:\n\n" + _demoted(report.read_text())
    return text


def _demoted(markdown: str, by: int = 2) -> str:
    """Headings pushed ``by`` levels down, so a store's own report sits under this page's headings; its links to
    local files (figures) are dropped to their text."""
    import re

    out = []
    for line in markdown.splitlines():
        if line.startswith("#"):
            line = "#" * by + line
        out.append(re.sub(r"!?\[([^\]]*)\]\((?!https?:)[^)]*\)", r"\1", line))
    return "\n".join(out) + "\n"


def study_section(store: Path, title: str) -> str:
    """One study store: its JSON (verdicts first) and its figures; the committed ``report.md`` where there is no
    ``results.sqlite``."""
    where = f"`{store.relative_to(ROOT).as_posix()}`"
    head = f"## {title}\n\nFrom {where}.\n\n"
    if not (store / "results.sqlite").is_file():
        report = store / "report.md"
        if not report.is_file():
            return head + "Nothing committed yet.\n"
        return head + figures(store) + "\n\n" + _demoted(report.read_text())
    try:
        data = study_data(store)
    except Exception as err:
        return head + _unreadable(store, err)
    return head + summary_line(data) + "\n\n" + figures(store) + "\n\n" + render(data)


def summary_line(data: dict[str, Any]) -> str:
    """One sentence counting what a study's JSON decides: verdicts by kind, else comparisons by significance."""
    verdicts = data.get("verdicts")
    if isinstance(verdicts, list) and verdicts:
        counts: dict[str, int] = {}
        for v in verdicts:
            counts[str(v.get("verdict"))] = counts.get(str(v.get("verdict")), 0) + 1
        return "Verdicts: " + ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) + "."
    comparisons = data.get("comparisons") or []
    cells = data.get("cells") or []
    significant = sum(1 for c in comparisons if c.get("significant"))
    return (
        f"{len(cells)} cells; {len(comparisons)} comparisons with the standard model, {significant} of them "
        f"significant after Holm's correction."
    )


def json_section(path: Path, title: str, first: tuple[str, ...] = ()) -> str:
    """A JSON result file (flow, bench): every section, and the figures beside it."""
    head = f"## {title}\n\nFrom `{path.relative_to(ROOT).as_posix()}`.\n\n"
    if not path.is_file():
        return head + "Nothing committed yet.\n"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        return head + _unreadable(path.parent, err)
    if isinstance(data, list):
        data = {"rows": data}
    pngs = sorted(p for p in path.parent.glob("*.png") if p.stem.split("_")[0] == path.stem.split("_")[0])
    images = "\n\n".join(f"![{p.stem.replace('_', ' ')}](store/{p.relative_to(RESULTS).as_posix()})" for p in pngs)
    return head + images + "\n\n" + render(data, first=first)


def suites() -> str:
    """Every open-question suite committed under ``benchmarks/results/suites/``."""
    folder = RESULTS / "suites"
    stores = sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    if not stores:
        return "No suite results are committed yet.\n"
    return "\n".join(study_section(store, f"Suite `{store.name}`") for store in stores)


PAGES = {
    "study": lambda: study_section(RESULTS / "study-default", "The default study"),
    "long-range": lambda: study_section(RESULTS / "long-range", "The long-range suite"),
    "suites": suites,
    "flow": lambda: json_section(
        RESULTS / "flow" / "flow_results.json", "The flow experiment", first=("comparisons", "arms")
    ),
    "bench": lambda: json_section(RESULTS / "bench.json", "The bench", first=("rows",)),
}
"""The generators of ``<!-- generated: results NAME -->``."""


def figure_files(config: Any) -> list[Any]:
    """Every PNG under ``benchmarks/results`` as a file of the site at ``results/store/<its path there>``."""
    from mkdocs.structure.files import File

    return [
        File.generated(config, f"{FIGURE_URI}/{p.relative_to(RESULTS).as_posix()}", abs_src_path=str(p))
        for p in sorted(RESULTS.rglob("*.png"))
    ]
