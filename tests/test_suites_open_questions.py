"""The positions, rho, scale and gumbel suites: presets that plan, and a tiny run that writes a report."""

from __future__ import annotations

import pytest
import torch

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
    assert len(labels) >= 6 and len(runs) == len({r.key for r in runs})
    assert {"no_mixing", "uniform_mixing"} <= labels  # the validity controls train like every arm
    arms = [r for r in runs if r.model.kind == "transformer"]
    if name == "positions":
        assert all(r.train_config.get("causal", True) for r in runs)  # the position question is asked causally
        assert all(r.train_config["eval_lengths"] == [2 * r.seq_len, 4 * r.seq_len] for r in arms)
        assert "position=none" in labels and {r.train_config.get("input_position") for r in arms} == {None, "none"}
    if name == "rho":
        assert {r.train_config["mlp_ratio"] for r in arms} == {0, 4}
        assert all(r.train_config["causal"] is False for r in runs)  # controls too: a bag of the whole row
        # the validity controls are the reference arm (attention-only, learned rho) with another mixer: no MLP
        # sublayer, no position signal; the Deep Sets control keeps the MLP sublayer (the default width)
        controls = [r for r in runs if r.model.label in ("no_mixing", "uniform_mixing")]
        assert controls and all(r.train_config["mlp_ratio"] == 0 for r in controls)
        deep_sets = [r for r in runs if r.model.label == "uniform mixing +MLP"]
        assert deep_sets and all(r.train_config.get("mlp_ratio", 4) == 4 for r in deep_sets)
        assert all(r.train_config["input_position"] == "none" for r in controls + deep_sets)
    if name == "scale":
        assert {r.train_config["dim"] // r.train_config["heads"] for r in arms} == {8, 16, 64}
    if name == "gumbel":
        assert any("gumbel_hard=true" in r.train_config["spec"] for r in runs)


@pytest.mark.parametrize("name", SUITES)
def test_default_presets_carry_the_main_studys_footing(name):
    from axiomformer.study.suites.main import DEFAULT as MAIN

    config = validate_config(get_suite(name).preset("default"))
    assert config.aa_control and config.lr_check and config.controls == ["no_mixing", "uniform_mixing"]
    assert config.seeds == config.min_seeds == MAIN["seeds"] and len(config.budget.lr_grid) >= 2
    assert (config.margin, config.solve_margin, config.solve_threshold) == (
        MAIN["margin"],
        MAIN["solve_margin"],
        MAIN["solve_threshold"],
    )
    assert config.lr_widen == 2  # a cell whose best rate is at the grid's edge tries up to two more
    stages = get_suite(name).stages(config)
    selection = {r.key for r in stages[0](None)}
    widened = {r.key for stage in stages[1 : 1 + config.lr_widen] for r in stage({})}
    assert widened == selection  # with nothing stored, widening adds no rate: it reads the stored selection runs
    runs = [r for stage in stages[1 + config.lr_widen : 2 + config.lr_widen] for r in stage({})]
    assert runs == []  # the reported seeds are planned from stored selection runs only


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
    # 4 arms + the Deep Sets control + 2 validity controls at 2 rates x 2 selection seeds, 8 models (the A/A too) x 2
    # reported seeds, and the 3 arms that are neither the reference nor a control at their second-best rate x 2 seeds
    assert summary.failed == [] and summary.trained == 7 * 2 * 2 + 8 * 2 + 3 * 2
    text = (tmp_path / "report.md").read_text()
    assert "## The answer" in text and "attn-only rho=identity" in text and "[" in text
    assert (tmp_path / "figures" / "rho_accuracy.png").stat().st_size > 0


def test_a_control_is_built_with_the_reference_arms_blocks(monkeypatch):
    """The uniform-mixing control of an attention-only reference has no MLP sublayer: its parameters are the
    reference's minus the query and key projections (a count computed here from the widths), and a planted build
    that drops ``mlp_ratio`` (the control's default MLP) is caught by the same count."""
    import axiomformer.train as train_module
    from axiomformer.models import count_parameters
    from axiomformer.train import TrainConfig

    def params(model: str, **kw) -> int:
        config = TrainConfig(task="distinct", seq_len=8, model=model, dim=32, layers=1, heads=2, **kw)
        return count_parameters(train_module._build(config, torch.device("cpu")).model)

    attn_only = params("transformer", causal=False, mlp_ratio=0, input_position="none")
    uniform = params("uniform_mixing", causal=False, mlp_ratio=0)
    mlp = 32 * 128 + 128 + 128 * 32 + 32 + 2 * 32  # two linear layers and the second LayerNorm
    assert params("uniform_mixing", causal=False) - uniform == mlp
    assert attn_only - uniform == 2 * (32 * 32 + 32)  # W_q and W_k with their biases
    original = train_module._build

    def planted(config, device):  # the old build: a control ignored mlp_ratio
        return original(config.model_copy(update={"mlp_ratio": 4}), device)

    monkeypatch.setattr(train_module, "_build", planted)
    assert params("uniform_mixing", causal=False, mlp_ratio=0) - uniform == mlp


def _widened(name: str, accuracy) -> list[list[float]]:
    """The rates each widening stage of suite ``name``'s default preset plans for its first cell, with every stored
    selection run at validation accuracy ``accuracy(lr)`` (and loss 1 - accuracy, except on ties: lower at the
    larger rate, as a model stuck at chance often has); no training."""
    from types import SimpleNamespace

    config = validate_config(get_suite(name).preset("default"))
    stages = get_suite(name).stages(config)
    stored: dict = {}

    def fill(runs):
        for run in runs:
            lr = run.train_config["lr"]
            acc = accuracy(lr)
            stored.setdefault(run.key, SimpleNamespace(outcome=SimpleNamespace(val_accuracy=acc, val_loss=1 - lr)))

    first = stages[0](None)
    fill(first)
    cell = first[0]
    rounds = []
    for widen in stages[1 : 1 + config.lr_widen]:
        fill(widen(stored))
        rounds.append(sorted({r.train_config["lr"] for r in widen(stored) if r.model.label == cell.model.label}))
    return rounds


@pytest.mark.parametrize(
    "accuracy, expected",
    [
        # the best rate at the lower edge: one step below, twice (the grid's step 10/3)
        (lambda lr: 1.0 - lr, [[9e-4, 3e-3, 1e-2], [2.7e-4, 9e-4, 3e-3, 1e-2]]),
        # no rate separates (every one at chance): one step beyond each edge, whatever the loss prefers
        (lambda lr: 0.0625, [[9e-4, 3e-3, 1e-2, 1e-2 / 0.3], [2.7e-4, 9e-4, 3e-3, 1e-2, 1e-2 / 0.3, 1e-2 / 0.09]]),
        # once the rate beyond the edge loses (0.5 against 3e-3's 0.9), the best is inside: no second step
        (lambda lr: 0.9 if 2e-3 < lr < 5e-3 else 0.1 if lr > 5e-3 else 0.5, [[9e-4, 3e-3, 1e-2]] * 2),
    ],
)
def test_a_suite_widens_its_grid_from_the_stored_selection_runs(accuracy, expected):
    rounds = _widened("scale", accuracy)
    assert [[pytest.approx(x) for x in r] for r in rounds] == expected


def test_a_one_way_widening_of_a_grid_at_chance_is_caught(monkeypatch):
    """The earlier rule widened toward the rate the validation loss preferred, even with every rate at chance: at
    head_dim 64 without the scale that was upward only. Planted back, the tie case above fails."""
    from axiomformer.study import stages as stage_module

    monkeypatch.setattr(stage_module, "_undecided", lambda *args: False)
    rounds = _widened("scale", lambda lr: 0.0625)
    assert all(min(r) >= 3e-3 for r in rounds)  # never below the grid: the defect the rule fixes
