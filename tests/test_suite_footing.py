"""The open-question suites stand on the main study's footing (issue 33): a task that does not discriminate gives no
verdict, positions' verdicts carry their family (``primary`` at the training length, ``extrapolation`` beyond it), a
bidirectional scheme that does not learn the task is left out of the primary family, the learning-rate check and the
solve-rate metric reach the suites' verdicts, the scale suite reads its trend per head_dim, and a bidirectional suite's
ceiling is the row's. Each check is shown catching a planted wrong version. Stores are planted (no training); nothing
here requires a real model to win or lose."""

from __future__ import annotations

import sqlite3

import pytest
import torch

from axiomformer.study.contrasts import Contrast, contrast_verdicts
from axiomformer.study.report import study_json
from test_suite_verdicts import _noise, plant

INFO = {
    "pilot": False,
    "min_seeds": 8,
    "alpha": 0.05,
    "margin": 0.02,
    "margins": {"accuracy": 0.02, "solve_rate": 0.25},
    "solve_threshold": 0.9,
}


def _positions(tmp_path, value, **kw):
    plant(tmp_path / "p", "positions", "default", value, **kw)
    return study_json(tmp_path / "p")


def test_positions_verdicts_carry_their_family_and_primary_is_at_the_training_length(tmp_path):
    planted = {"position=none": 0.55, "position=rope": 0.97}
    data = _positions(tmp_path, lambda label, seed: planted.get(label, 0.95) + _noise(seed))
    found = data["verdicts"]
    assert {v["family"] for v in found} == {"primary", "extrapolation"}
    for v in found:
        if v["family"] == "primary":
            assert (
                v["model"].split(" vs ")[0] == "position=none"
                and " at " not in v["task"]
                and v["task"] in ("copy@16", "induction@32", "selective_copy@32", "sort_causal@32")
            )
        else:
            assert v["task"].endswith("at 2L-4L") and v["model"].endswith("at L")
    # the difference, computed here from the planted values: NoPE minus rope on copy (accuracy, same seeds)
    (rope,) = [v for v in found if v["model"] == "position=none vs position=rope" and v["task"] == "copy@16"]
    assert rope["diff"] == pytest.approx(0.55 - 0.97) and rope["verdict"] == "forced"
    (solve,) = [v for v in found if v["model"] == "position=none vs position=rope" and v["task"] == "induction@32"]
    assert solve["metric"] == "solve_rate" and solve["diff"] == pytest.approx(0.0 - 1.0)  # 0 of 8 against 8 of 8
    # NoPE does not learn (0.55 < the solve threshold): it is not asked whether it extrapolates
    assert not [v for v in found if v["family"] == "extrapolation" and v["model"].startswith("position=none")]


def test_a_verdict_with_a_wrong_family_is_refused():
    from axiomformer.study.suites.positions import FAMILIES

    a, b = dict.fromkeys(range(8), 0.5), dict.fromkeys(range(8), 0.9)
    good = Contrast("q", "x", "y", "t@8", 8, "extrapolation", a, b)
    assert [f for _, _, f in contrast_verdicts(INFO, [good], FAMILIES)] == ["extrapolation"]
    planted = Contrast("q", "x", "y", "t@8", 8, "secondary", a, b)  # the old design's name for the second question
    with pytest.raises(ValueError, match="primary, extrapolation"):
        contrast_verdicts(INFO, [good, planted], FAMILIES)


def test_a_task_that_does_not_discriminate_gives_no_verdict(tmp_path, monkeypatch):
    # uniform mixing reaches the standard model everywhere, then is set to chance on induction only
    plant(tmp_path / "p", "positions", "default", lambda label, seed: 0.95 + _noise(seed), controls=None)
    with sqlite3.connect(tmp_path / "p" / "results.sqlite") as db:  # induction's controls at chance
        db.execute("UPDATE runs SET accuracy = 0.1 WHERE label = 'uniform_mixing' AND task = 'induction'")
    data = study_json(tmp_path / "p")
    tasks = {t["task"]: t for t in data["design"]["tasks"]}
    assert not tasks["copy@16"]["discriminates"] and tasks["induction@32"]["discriminates"]
    assert not tasks["selective_copy@32"]["discriminates"] and not tasks["sort_causal@32"]["discriminates"]
    assert data["verdicts"] and all(v["task"].startswith("induction@32") for v in data["verdicts"])
    silent = {c["task"].split(" ")[0] for c in data["no_verdict"]}
    assert silent == {"copy@16", "selective_copy@32", "sort_causal@32"}
    # planted wrong version: a base that skips the validity check would give copy verdicts, and is caught here
    from axiomformer.study.suites import common

    monkeypatch.setattr(common, "validity", lambda d, ref: [t | {"discriminates": True} for t in tasks.values()])
    again = study_json(tmp_path / "p")
    assert any(v["task"].startswith("copy@16") for v in again["verdicts"])


@pytest.mark.parametrize("alibi, listed", [(0.3, False), (0.95, True)])
def test_a_bidirectional_scheme_enters_the_primary_family_only_where_it_learns(tmp_path, alibi, listed):
    plant(
        tmp_path / "p",
        "positions",
        "default",
        lambda label, seed: (alibi if label == "position=alibi" else 0.95) + _noise(seed),
    )
    with sqlite3.connect(tmp_path / "p" / "results.sqlite") as db:
        db.execute(
            "UPDATE runs SET train_config = json_set(train_config, '$.causal', json('false')) "
            "WHERE label = 'position=alibi'"
        )
    found = study_json(tmp_path / "p")["verdicts"]
    primary = [v for v in found if v["family"] == "primary" and v["model"].endswith("position=alibi")]
    assert bool(primary) == listed


def test_the_lr_check_flags_a_verdict_that_the_second_best_rate_changes():
    a = {s: 0.5 + _noise(s) for s in range(8)}
    b = {s: 0.9 + _noise(s + 100) for s in range(8)}
    same = Contrast("q", "x", "y", "t@8", 8, "primary", a, b, metric="accuracy", a_second=dict(a))
    flips = Contrast("q", "x", "y", "t@8", 8, "primary", a, b, metric="accuracy", a_second=dict(b))
    unchecked = Contrast("q", "x", "y", "t@8", 8, "primary", a, b, metric="accuracy")
    out = [v for v, _, _ in contrast_verdicts(INFO, [same, flips, unchecked])]
    assert [v.verdict for v in out] == ["forced"] * 3
    assert [v.lr_sensitive for v in out] == [False, True, None]
    # side b moved to its second-best rate is checked too (positions: NoPE is side a, each scheme side b); a check
    # of side a alone misses this flip
    b_flips = Contrast("q", "x", "y", "t@8", 8, "primary", a, b, metric="accuracy", a_second=dict(a), b_second=dict(a))
    b_only = Contrast("q", "x", "y", "t@8", 8, "primary", a, b, metric="accuracy", b_second=dict(a))
    both = [v for v, _, _ in contrast_verdicts(INFO, [b_flips, b_only])]
    assert [v.lr_sensitive for v in both] == [True, True]


def test_a_solve_rate_contrast_uses_newcombes_interval_computed_by_statsmodels():
    from statsmodels.stats.proportion import confint_proportions_2indep

    a = {s: (0.95 if s < 2 else 0.3) for s in range(8)}  # 2 of 8 solve
    b = {s: (0.95 if s < 7 else 0.5) for s in range(8)}  # 7 of 8 solve
    ((v, _, _),) = contrast_verdicts(INFO, [Contrast("q", "x", "y", "t@8", 8, "primary", a, b, metric="solve_rate")])
    low, high = confint_proportions_2indep(2, 8, 7, 8, method="newcomb", compare="diff", alpha=0.05)
    assert v.metric == "solve_rate" and v.diff == pytest.approx(2 / 8 - 7 / 8)
    assert (v.ci_low, v.ci_high) == pytest.approx((low, high), abs=1e-9)


@pytest.mark.parametrize("costs, grows", [((0.0, 0.3, 0.6), True), ((0.6, 0.3, 0.0), False)])
def test_scale_reads_whether_the_cost_grows_with_head_dim(tmp_path, costs, grows):
    from axiomformer.study.suites.scale import HEAD_DIMS

    drop = dict(zip(HEAD_DIMS, costs))

    def value(label, seed):
        head_dim = int(label.split()[0].split("=")[1]) if label.startswith("d=") else 16
        return 0.95 - (drop[head_dim] if label.endswith("scale=none") else 0.0) + _noise(seed)

    plant(tmp_path / "s", "scale", "default", value)
    data = study_json(tmp_path / "s")
    per = {e["head_dim"]: e["cost"] for e in data["trend"]["per_head_dim"]}
    solved = {h: (1.0 if 0.95 - c >= 0.9 else 0.0) for h, c in drop.items()}  # solve rates by hand: 8/8 or 0/8
    assert per == pytest.approx({h: 1.0 - solved[h] for h in HEAD_DIMS})
    assert data["trend"]["grows"] is grows
    assert {v["assumption"] for v in data["verdicts"] if v["family"] == "primary"} == {
        f"is 1/sqrt(d) forced at head_dim {h}?" for h in HEAD_DIMS
    }


def test_a_bidirectional_ceiling_is_the_rows_and_catches_targets_the_row_does_not_determine(monkeypatch):
    from axiomformer.study.suites import common

    assert common.row_ceiling("sort", 6, {"num_symbols": 3}, 32, 4)["ceiling"] == 1.0  # the row determines sort
    x = torch.tensor([[0, 1, 2], [0, 1, 2], [2, 1, 0], [0, 1, 2]])
    y = torch.tensor([[5, -100, 1], [5, -100, 2], [4, -100, 4], [5, -100, 2]])
    monkeypatch.setattr("axiomformer.study.sections.task_test_items", lambda *a: (None, x, y))
    found = common.row_ceiling("planted", 3, {}, 4, 1)
    # by hand: row (0,1,2) thrice: position 0 all 5 (3 of 3), position 2 targets 1,2,2 (2 of 3); row (2,1,0): 2 of 2
    assert found["ceiling"] == pytest.approx((3 + 2 + 2) / 8)


@pytest.mark.parametrize("deep_sets, held", [(0.99, True), (0.4, False)])
def test_rho_withholds_the_mlp_questions_where_a_sum_and_the_mlp_already_solve(tmp_path, deep_sets, held):
    from axiomformer.study.suites.rho import DEEP_SETS, QUESTIONS

    values = {"attn-only rho=identity": 0.6, DEEP_SETS: deep_sets}
    plant(tmp_path / "p", "rho", "default", lambda label, seed: values.get(label, 0.99) + _noise(seed))
    data = study_json(tmp_path / "p")
    (a1,) = [v for v in data["verdicts"] if v["assumption"] == QUESTIONS[0][0]]
    assert a1["family"] == "primary" and a1["verdict"] == "better"  # learned rho minus identity, 0.99 - 0.6
    mlp_questions = {q for q, _, _ in QUESTIONS[1:]}
    given = [v for v in data["verdicts"] if v["assumption"] in mlp_questions]
    withheld = [c for c in data["no_verdict"] if DEEP_SETS in (c["why"] or "")]
    assert (len(given), len(withheld)) == ((0, 2) if held else (2, 0))
    assert all(v["family"] == "secondary" for v in given)
    assert all(c["by"] == "control" for c in withheld)
    from axiomformer.study.report import build_report

    text = build_report(tmp_path / "p")["markdown"].read_text(encoding="utf-8")
    assert ("held by the suite's own control" in text) == held and DEEP_SETS in text  # its row, its reason


def test_rho_withholds_the_mlp_questions_while_their_control_has_not_run(tmp_path):
    from axiomformer.study.suites.rho import DEEP_SETS, QUESTIONS

    plant(tmp_path / "p", "rho", "default", lambda label, seed: 0.99 + _noise(seed))
    with sqlite3.connect(tmp_path / "p" / "results.sqlite") as db:
        db.execute("DELETE FROM runs WHERE label = ?", (DEEP_SETS,))
    data = study_json(tmp_path / "p")
    assert not [v for v in data["verdicts"] if v["assumption"] != QUESTIONS[0][0]]
    assert len([c for c in data["no_verdict"] if c["by"] == "control"]) == 2


def test_a_rho_suite_without_its_gate_is_caught(tmp_path, monkeypatch):
    """Planted: the suite registered without ``gate`` gives the MLP questions verdicts although the Deep Sets control
    solves the task; the check above (held: no verdict) then fails."""
    from dataclasses import replace

    from axiomformer.study import registry
    from axiomformer.study.suites import common, rho

    values = {"attn-only rho=identity": 0.6, rho.DEEP_SETS: 0.99}
    plant(tmp_path / "p", "rho", "default", lambda label, seed: values.get(label, 0.99) + _noise(seed))
    question = common.OpenQuestion(
        name="rho",
        summary="",
        presets=rho.SUITE.presets,
        arms=rho.arms,
        comparisons=rho.comparisons,
        question="",
        measured=rho._measured,
        body=rho._body,
        reference=rho.REFERENCE,
    )
    suite = replace(rho.SUITE, comparisons=question.contrasts, extra_json=question.extra_json)
    monkeypatch.setitem(registry._SUITES, "rho", suite)
    data = study_json(tmp_path / "p")
    assert len([v for v in data["verdicts"] if v["family"] == "secondary"]) == 2


def test_the_gap_rule_is_read_from_one_place_by_the_battery_and_by_rhos_control(tmp_path, monkeypatch):
    """Planted: a gap rule that no interval passes, set in ``battery.separated`` alone, silences both the task
    validity check and rho's own control (``rho.gate``): neither keeps a copy of the rule."""
    from axiomformer.study import battery
    from axiomformer.study.suites.rho import DEEP_SETS

    values = {"attn-only rho=identity": 0.6, DEEP_SETS: 0.4, "uniform_mixing": 0.3}
    plant(tmp_path / "p", "rho", "default", lambda label, seed: values.get(label, 0.99) + _noise(seed))
    assert len(study_json(tmp_path / "p")["verdicts"]) == 3
    monkeypatch.setattr(battery, "separated", lambda low, control_high: False)
    data = study_json(tmp_path / "p")
    assert data["verdicts"] == [] and not any(t["discriminates"] for t in data["design"]["tasks"])
    from axiomformer.study.report import load_study
    from axiomformer.study.suites import rho

    d = load_study(tmp_path / "p")
    mlp_questions = [c for c in rho.comparisons(d) if c.question != rho.QUESTIONS[0][0]]
    assert mlp_questions and all("less than the gap" in (rho.gate(d, c) or "") for c in mlp_questions)
    monkeypatch.undo()
    assert [rho.gate(d, c) for c in mlp_questions] == [None] * len(mlp_questions)


def test_a_suite_whose_every_comparison_is_held_says_so_and_names_only_its_own_tasks(tmp_path):
    """rho with uniform mixing at the reference's level: every comparison is stored and held (`no_verdict`), which
    the answer must say instead of "no paired runs stored"; what was measured names the tasks the config has."""
    from axiomformer.study.report import build_report
    from axiomformer.study.suites.common import config_tasks

    plant(tmp_path / "p", "rho", "default", lambda label, seed: 0.99 + _noise(seed), controls=None)
    data = study_json(tmp_path / "p")
    assert data["verdicts"] == [] and len(data["no_verdict"]) == 3
    text = build_report(tmp_path / "p")["markdown"].read_text(encoding="utf-8")
    assert "No verdict: each of the 3 comparison(s) is held" in text and "no paired runs stored" not in text
    from axiomformer.study.report import load_study

    names = {t for t, _ in config_tasks(load_study(tmp_path / "p"))}
    measured = text.split("## What was measured", 1)[1].split("\n\n", 2)[1]
    assert all(f"`{t}`" in measured for t in names)
    assert all(f"`{t}`" not in measured for t in {"majority", "distinct"} - names)
