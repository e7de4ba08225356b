"""The open-question suites report verdicts under the main study's rules, from stores planted with known values (no
training): the JSON has design / verdicts / ci_method / n_test, every verdict agrees with its interval, a planted
difference is found and attributed to the right comparison, the quick preset claims nothing, and a diverged run
breaks no report or figure. Nothing here requires a suite's real experiment to come out one way."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from axiomformer.study import ResultsStore, validate_config
from axiomformer.study.registry import get_suite
from axiomformer.study.report import build_report, study_json
from axiomformer.study.runner import _row
from axiomformer.study.statistics import VERDICT_KEYS, agrees

SUITES = ("positions", "rho", "scale", "gumbel")


def _result(run, accuracy: float | None, *, diverged: bool = False) -> dict:
    tc = run.train_config
    extra = {}
    if tc.get("eval_lengths"):
        extra.setdefault("end", {})["length_accuracy"] = {
            str(n): {"accuracy": None if accuracy is None else accuracy * 0.9, "loss": 1.0, "chance": 0.1}
            for n in tc["eval_lengths"]
        }
    if "sampled_eval" in (tc.get("probes") or []):
        extra.setdefault("end", {})["sampled_accuracy"] = accuracy
    if "init_entropy" in (tc.get("probes") or []):
        extra["init"] = {"init_entropy": [{"entropy": 2.5, "score_var": 0.3, "closed_form": 2.6}]}
    losses = [2.0, 1.5, None if diverged else 1.0]
    return {
        "accuracy": accuracy,
        "loss": None if diverged else 1.0,
        "steps": 3,
        "seconds": 0.1,
        "params": 100,
        "tokens_per_second": 1.0,
        "peak_mem_mb": 1.0,
        "engine": "reference",
        "losses": losses,
        "chance": 0.1,
        "val_accuracy": 0.5,
        "val_loss": 1.0,
        "best_step": 2,
        "converged": True,
        "stop_reason": "nonfinite" if diverged else "target",
        "history": [],
        "extra": extra,
        "n_test": 1024,
    }


def plant(out, suite: str, preset: str, value, *, diverged_label: str | None = None, controls: float | None = 0.1):
    """A store of ``suite``/``preset`` whose every planned run is stored with test accuracy ``value(label, seed)``
    (selection runs: validation accuracy rising with the learning rate; ``diverged_label``: its seed 0 diverged), the
    validity controls at ``controls`` (``None``: ``value`` too), and the ceilings section the runner stores."""
    from axiomformer.study.config import CONTROLS
    from axiomformer.study.runner import ceiling_cells
    from axiomformer.study.sections import ceilings_section

    if controls is not None:
        planted = value
        value = lambda label, seed: controls if label in CONTROLS else planted(label, seed)
    cfg = validate_config(get_suite(suite).preset(preset))
    stages = get_suite(suite).stages(cfg)
    out.mkdir(parents=True, exist_ok=True)
    with ResultsStore(out) as store:
        store.set_meta("config", cfg.model_dump())
        store.set_meta("models", [{"label": "standard", "kind": "transformer", "spec": "standard"}])
        stored: dict = {}
        planned = []
        for index, stage in enumerate(stages):
            for run in stage(None if index == 0 else stored):
                if run.key in stored:
                    continue
                bad = run.model.label == diverged_label and run.seed == 0
                result = _result(run, None if bad else value(run.model.label, run.seed), diverged=bad)
                result["val_accuracy"] = float(run.train_config.get("lr") or 0.0)
                row = _row(run, result, "local")
                store.add_run(row)
                stored[run.key] = row
                planned.append(
                    {
                        "key": run.key,
                        "label": run.model.label,
                        "task": run.task,
                        "seq_len": run.seq_len,
                        "seed": run.seed,
                        "expected_params": None,
                    }
                )
        store.set_meta("planned", planned)
        store.put_section("ceilings", ceilings_section(ceiling_cells(cfg)))
    return cfg


def _noise(seed: int) -> float:
    return float(np.random.default_rng(seed).normal(0.0, 0.005))


TARGET = {
    "positions": ("position=none", "position=rope"),
    "rho": ("attn-only rho=mlp", "attn-only rho=identity"),
    "scale": ("d=16 scale=none", "d=16 scale=inv_sqrt_d"),
    "gumbel": ("gumbel hard", "softmax"),
}
"""Per suite, one comparison ``a vs b`` of its own, planted with a - b = -0.3 (0.65 against 0.95: also a solve-rate difference)."""


@pytest.mark.parametrize("suite", SUITES)
def test_planted_difference_is_found_where_it_was_planted_and_every_verdict_agrees(tmp_path, suite):
    a, _ = TARGET[suite]
    plant(tmp_path / suite, suite, "default", lambda label, seed: 0.95 - (0.3 if label == a else 0.0) + _noise(seed))
    data = study_json(tmp_path / suite)
    assert {"design", "cells", "comparisons", "verdicts"} <= set(data)
    assert data["design"]["reported_seeds"] and not set(data["design"]["reported_seeds"]) & set(
        data["design"]["selection_seeds"]
    )
    assert data["cells"] and all(c["ci_method"] and c["n_test"] == 1024 for c in data["cells"])
    assert data["verdicts"] and all({*VERDICT_KEYS, "family"} == set(v) for v in data["verdicts"])
    assert all(agrees(v) for v in data["verdicts"]), [v for v in data["verdicts"] if not agrees(v)]
    assert all(v["n_seeds"] >= 5 and v["verdict"] != "pilot" for v in data["verdicts"])
    hit = [
        v
        for v in data["verdicts"]
        if v["model"].split(" vs ")[0].startswith(a) and v["verdict"] in ("forced", "better")
    ]
    assert hit, "the planted difference was not found"
    # attributed correctly: a comparison between two arms both planted at 0.7 is never called different
    assert all(
        v["verdict"] not in ("forced", "better") or a in v["model"]
        for v in data["verdicts"]
        if v["family"] != "extrapolation"
    )


@pytest.mark.parametrize("suite", SUITES)
def test_quick_preset_is_a_pilot_everywhere(tmp_path, suite):
    plant(tmp_path / suite, suite, "quick", lambda label, seed: 0.9 + 0.05 * seed)
    data = study_json(tmp_path / suite)
    assert data["design"]["pilot"] and data["verdicts"]
    assert {v["verdict"] for v in data["verdicts"]} == {"pilot"}


@pytest.mark.parametrize("suite", SUITES)
def test_a_diverged_run_breaks_no_report_or_figure(tmp_path, suite):
    a, _ = TARGET[suite]
    plant(tmp_path / suite, suite, "default", lambda label, seed: 0.6 + _noise(seed), diverged_label=a)
    paths = build_report(tmp_path / suite)
    text = paths["markdown"].read_text()
    assert "Diverged runs" in text and "no test accuracy" in text
    assert paths["figures"] and all(p.stat().st_size > 0 for p in paths["figures"].values())
    data = json.loads(json.dumps(study_json(tmp_path / suite)))  # JSON-clean: no NaN sneaks in
    assert all(agrees(v) for v in data["verdicts"])
    for v in data["verdicts"]:
        if v["model"].split(" vs ")[0] in (a, a + " at 2L-4L"):
            assert v["n_seeds"] == len(data["design"]["reported_seeds"]) - 1  # left out, not counted as zero


def test_contrast_verdicts_reject_an_unknown_family():
    from axiomformer.study.contrasts import Contrast, contrast_verdicts

    info = {"pilot": False, "min_seeds": 2, "alpha": 0.05, "margin": 0.02}
    with pytest.raises(ValueError, match="primary, secondary"):
        contrast_verdicts(info, [Contrast("q", "a", "b", "t", 8, "tertiary", {0: 1.0, 1: 1.0}, {0: 0.0, 1: 0.0})])
    ((v, _, _),) = contrast_verdicts(
        info, [Contrast("q", "a", "b", "t", 8, "primary", {0: 1.0, 1: math.nan, 2: 0.9}, {0: 0.5, 1: 0.5, 2: 0.4})]
    )
    assert v.n_seeds == 2 and v.diff == pytest.approx(0.5)


@pytest.mark.parametrize("suite", SUITES)
def test_every_suite_reports_its_footing_and_its_aa_control_catches_a_broken_design(tmp_path, suite):
    # The acceptance keys of every suite's report --json: design.tasks with ceilings and both controls, and the A/A
    # control, computed against the suite's own reference arm (the rho and scale references are not "standard").
    from axiomformer.study.sweep import AA_LABEL

    data = _footing(tmp_path / "ok", suite, lambda label, seed: 0.95 + _noise(seed))
    for task in data["design"]["tasks"]:
        assert task["ceiling"] is not None and set(task["controls"]) == {"no_mixing", "uniform_mixing"}
        assert all(value is not None for value in task["controls"].values())
    aa = data["aa_control"]
    assert aa is not None and not aa["broken"] and {t["family"] for t in aa["tasks"]} == {"aa_control"}
    # planted: the A/A copy scores far below its source, as a design that leaks the initialization would
    broken = _footing(tmp_path / "bad", suite, lambda label, seed: (0.55 if label == AA_LABEL else 0.95) + _noise(seed))
    assert broken["aa_control"]["broken"] and broken["aa_control"]["verdict"] == "forced"


def _footing(out, suite, value):
    plant(out, suite, "default", value)
    return study_json(out)
