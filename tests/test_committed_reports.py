"""Every committed report is what its store gives at HEAD: each ``report.md`` under ``benchmarks/results/`` is rebuilt
from the ``results.sqlite`` beside it (``axiomformer report``), and the flow experiment's ``flow_results.md`` from its
``flow_results.json``, and compared line by line. A report written by older code (a changed verdict rule, a reworded
question) fails here until it is regenerated; the ones known to be stale are marked (strict: a regenerated report
turns its mark into a failure, so the mark is removed with the regeneration)."""

from __future__ import annotations

import difflib
import json
import shutil
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
STORES = sorted(
    p.parent.relative_to(RESULTS).as_posix()
    for p in RESULTS.rglob("results.sqlite")
    if (p.parent / "report.md").is_file()
)
STALE: dict[str, str] = {}
"""Committed reports known to lag their store (none: every report was rebuilt from its store on 2026-12-02)."""


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip().splitlines()]


def _differences(committed: str, rebuilt: str) -> list[str]:
    diff = difflib.unified_diff(_lines(committed), _lines(rebuilt), "committed", "rebuilt", lineterm="", n=0)
    return [line for line in diff if not line.startswith(("---", "+++", "@@"))]


def test_the_committed_stores_are_found():
    assert {"study-default", "long-range"} <= set(STORES) and len(STORES) >= 6, STORES


@pytest.mark.parametrize(
    "store",
    [
        pytest.param(s, marks=pytest.mark.xfail(reason=f"stale: {STALE[s]}", strict=True)) if s in STALE else s
        for s in STORES
    ],
)
def test_a_committed_study_report_is_rebuilt_from_its_store_unchanged(store, tmp_path):
    from axiomformer.study.report import build_report

    shutil.copy(RESULTS / store / "results.sqlite", tmp_path)  # the committed folder stays untouched
    rebuilt = build_report(tmp_path)["markdown"].read_text(encoding="utf-8")
    assert _differences((RESULTS / store / "report.md").read_text(encoding="utf-8"), rebuilt) == []


def test_the_committed_flow_report_is_rebuilt_from_its_store_unchanged():
    from axiomformer.flows.report import markdown

    store = json.loads((RESULTS / "flow" / "flow_results.json").read_text(encoding="utf-8"))
    committed = (RESULTS / "flow" / "flow_results.md").read_text(encoding="utf-8")
    assert _differences(committed, markdown(store)) == []


def test_the_comparison_sees_a_changed_line():
    assert _differences("a\nverdict: forced\n", "a\nverdict: free  \n") == ["-verdict: forced", "+verdict: free"]
    assert _differences("a \nb\n", "a\nb") == []
