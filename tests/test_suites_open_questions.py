"""The positions, rho, scale and gumbel suites: presets that plan, and a tiny run that writes a report."""

from __future__ import annotations

import pytest

from axiomformer.study import run_study
from axiomformer.study.config import validate_config
from axiomformer.study.suites import get_suite
from axiomformer.study.suites.common import interval

SUITES = ("positions", "rho", "scale", "gumbel")


@pytest.mark.parametrize("name", SUITES)
@pytest.mark.parametrize("preset", ["quick", "default", "full"])
def test_every_preset_validates_and_plans_its_arms(name, preset):
    suite = get_suite(name)
    config = validate_config(suite.preset(preset), source=f"{name} {preset}")
    runs = suite.stages(config)[0](None)
    labels = {r.model.label for r in runs}
    assert len(labels) >= 4 and len(runs) == len({r.key for r in runs})
    if name == "positions":
        assert all(r.train_config["causal"] is False and r.train_config["input_position"] == "none" for r in runs)
        assert all(r.train_config["eval_lengths"] == [2 * r.seq_len, 4 * r.seq_len, 8 * r.seq_len] for r in runs)
    if name == "rho":
        assert {r.train_config["mlp_ratio"] for r in runs} == {0, 4}
    if name == "scale":
        assert {r.train_config["dim"] // r.train_config["heads"] for r in runs} == {8, 16, 64}
    if name == "gumbel":
        assert any("gumbel_hard=true" in r.train_config["spec"] for r in runs)


def test_interval_is_the_studys_t_interval():
    mean, low, high = interval([0.5, 0.7, 0.9, None])
    half = 4.302652729911275 * 0.2 / 3**0.5  # t_{0.975, 2} x sd / sqrt(n), by hand
    assert (mean, low, high) == pytest.approx((0.7, 0.7 - half, 0.7 + half))
    assert all(x != x for x in interval([0.4])[1:])  # one seed: no interval


@pytest.mark.slow
def test_a_tiny_rho_study_writes_a_report_with_figures(tmp_path):
    suite = get_suite("rho")
    data = suite.preset("quick") | {
        "seeds": 2,
        "workers": 1,
        "threads": 1,
        "budget": suite.preset("quick")["budget"] | {"steps": 3, "eval_every": 3},
        "tasks": [{"name": "majority", "seq_lens": [6]}],
    }
    summary = run_study(validate_config(data), tmp_path, progress=False)
    assert (
        summary.failed == [] and summary.trained == 16
    )  # 4 arms x (2 selection runs at seeds 1000-1001 + 2 reported seeds)
    text = (tmp_path / "report.md").read_text()
    assert "## The answer" in text and "attn-only rho=identity" in text and "[" in text
    assert (tmp_path / "figures" / "rho_accuracy.png").stat().st_size > 0
