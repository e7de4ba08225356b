"""Study suites (``--suite``), the staged plan (lr selection, curriculum with warm starts) and the report's choice."""

from __future__ import annotations

import itertools
import json
import textwrap
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from axiomformer.cli import app
from axiomformer.study import ResultsStore, load_config, run_study, validate_config
from axiomformer.study.config import StudyConfig, stored_config
from axiomformer.study.record import RunOutcome, RunRecord
from axiomformer.study.stages import choose_lr, reported_rows, stages_for
from axiomformer.study.suites import BUILTIN, PRESETS, get_suite
from axiomformer.study.sweep import AA_LABEL, cells, state_path


def test_unknown_suite_or_preset_names_the_choices(tmp_path):
    with pytest.raises(ValueError, match="main, long-range"):
        get_suite("positons")
    with pytest.raises(ValueError, match="quick, default, full"):
        get_suite("main").preset("huge")
    result = CliRunner().invoke(app, ["study", "--suite", "positons", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "main, long-range" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("name", BUILTIN)
def test_every_preset_of_every_suite_validates_and_plans(name):
    for preset in PRESETS:
        cfg = validate_config(get_suite(name).preset(preset), source=f"{name}/{preset}")
        assert cfg.suite == name
        first = stages_for(cfg)[0](None)
        assert first and len({r.key for r in first}) == len(first)


def test_long_range_default_covers_64_to_10000_for_the_transformer_and_a_recurrent_model():
    cfg = validate_config(get_suite("long-range").preset("default"))
    assert cfg.curriculum and {t.name for t in cfg.tasks} == {"needle", "needle_kv"}
    for task in cfg.tasks:
        assert min(task.seq_lens) == 64 and max(task.seq_lens) == 10000
    all_cells = cells(cfg)
    assert {c.model.kind for c in all_cells} >= {"transformer", "lstm"}
    for task in cfg.tasks:  # the recurrent models get the same budget as the Transformer at every length
        for n in task.seq_lens:
            budgets = {json.dumps(c.budget, sort_keys=True) for c in all_cells if (c.task, c.seq_len) == (task.name, n)}
            assert len(budgets) == 1, (task.name, n)


def _stored(config: dict) -> StudyConfig:
    """A config of the previous version (one ``selection_seed``, default 0, also reported) read back from a store."""
    return stored_config({"tasks": [{"name": "needle", "seq_lens": [8, 16]}], **config}).config


def _row(label, seed, lr, val, acc, seq_len=8, init=None) -> RunRecord:
    return RunRecord(
        key=f"{label}{seed}{lr}{seq_len}",
        label=label,
        model="transformer",
        task="needle",
        seq_len=seq_len,
        seed=seed,
        dim=16,
        layers=1,
        accuracy=acc,
        train_config={"lr": lr, **({"init_from": init} if init else {})},
        outcome=RunOutcome(val_accuracy=val, val_loss=1.0),
    )


def test_choice_is_the_best_validation_run_and_only_its_rate_is_reported():
    rows = [
        _row("m", 0, 1e-3, 0.5, 0.9),
        _row("m", 0, 3e-3, 0.8, 0.1),
        _row("m", 1, 3e-3, None, 0.2),
        _row("m", 1, 1e-3, None, 0.95),
    ]
    reported, lrs = reported_rows(_stored({"seeds": 2}), rows)
    assert lrs == {("m", "needle", 8): 3e-3}
    assert sorted(r.accuracy for r in reported) == [0.1, 0.2]  # test accuracy plays no part in the choice
    assert (
        choose_lr(
            [
                (
                    1e-3,
                    _row("m", 1000, 1e-3, 0.5, None).model_copy(
                        update={"outcome": RunOutcome(val_accuracy=0.5, val_loss=2.0)}
                    ),
                ),
                (3e-3, _row("m", 1000, 3e-3, 0.5, None)),
                (1e-2, None),
            ]
        )
        == 3e-3
    )
    assert choose_lr([(1e-3, None)]) == "missing"


def test_curriculum_reports_longer_lengths_at_the_rate_chosen_at_the_shortest():
    rows = [
        _row("m", 0, 1e-3, 0.2, 0.3),
        _row("m", 0, 1e-2, 0.9, 0.8),
        _row("m", 0, 1e-2, 0.0, 0.6, seq_len=16, init="states/a.safetensors"),
    ]
    reported, lrs = reported_rows(_stored({"seeds": 1, "curriculum": True}), rows)
    assert lrs == {("m", "needle", 8): 1e-2, ("m", "needle", 16): 1e-2} and len(reported) == 2


CURRICULUM = textwrap.dedent("""
    seeds = 2
    curriculum = true
    variants = ["standard"]
    baselines = ["gru"]
    controls = []
    aa_control = false
    workers = 1
    [model]
    dim = 16
    heads = 2
    layers = 1
    [budget]
    steps = 6
    batch_size = 8
    eval_every = 3
    eval_batches = 1
    warmup = 1
    lr_grid = [1e-3, 1e-2]
    [sections]
    audit = false
    derive = false
    flow = false
    [[tasks]]
    name = "needle"
    seq_lens = [8, 12, 16]
    options = {shared = false}
""")


@pytest.mark.slow
def test_curriculum_warm_starts_each_length_from_the_previous_one_and_resumes(tmp_path, monkeypatch):
    path = tmp_path / "c.toml"
    path.write_text(CURRICULUM)
    cfg = load_config(path, base=get_suite("long-range").preset("default"))
    out = tmp_path / "lr"
    summary = run_study(cfg, out, progress=False, console=Console(quiet=True))
    # 2 models x 2 lrs x 2 selection seeds at 8, 2 x 2 seeds at 8, then 2 x 2 seeds x (12, 16) warm-started and as
    # many zero-shot runs (trained at 8 only)
    assert not summary.failed and summary.trained == 2 * 2 * 2 + 2 * 2 + 2 * 2 * 2 + 2 * 2 * 2
    with ResultsStore(out) as store:
        rows = store.runs()
    reported, _lrs = reported_rows(cfg, rows)
    for label in ("standard", "gru"):
        chain = sorted((r for r in reported if r.label == label and r.seed == 0), key=lambda r: r.seq_len)
        assert [r.seq_len for r in chain] == [8, 12, 16]
        for prev, run in itertools.pairwise(chain):
            assert run.train_config["init_from"] == state_path(prev.key)
            assert run.train_config["lr"] == chain[0].train_config["lr"]
        assert all((out / state_path(r.key)).is_file() for r in chain)
    # the warm start really loads the weights: zero steps from the 16-token state reproduce its test accuracy
    from axiomformer.train import TrainConfig, train

    last = next(r for r in reported if (r.label, r.seq_len, r.seed) == ("standard", 16, 0))
    tc = dict(last.train_config, steps=0, init_from=str(out / state_path(last.key)))
    assert train(TrainConfig(**tc), progress=False).accuracy == last.accuracy
    with pytest.raises(FileNotFoundError, match="no such state file"):
        train(TrainConfig(**dict(tc, init_from=str(out / "states" / "missing.safetensors"))), progress=False)
    # a rerun trains nothing
    import axiomformer.train

    monkeypatch.setattr(axiomformer.train, "train", lambda *a, **k: (_ for _ in ()).throw(AssertionError("rerun")))
    again = run_study(cfg, out, progress=False, console=Console(quiet=True), write_report=False)
    assert again.trained == 0 and again.already_stored == 28
    report = Path(out / "report.md").read_text()
    assert "Longest length solved" in report and "| gru |" in report


def _aa(source_label, seed, lr, acc, options):
    """A run of ``source_label`` and its A/A copy (another initialization stream), both at ``lr``."""
    base = _row(source_label, seed, lr, None, acc)
    config = {"lr": lr, "seed": seed, "options": options}
    aa = base.model_copy(
        update={"key": f"aa{base.key}", "label": AA_LABEL, "train_config": config | {"init_stream": 1}}
    )
    return base.model_copy(update={"train_config": config}), aa


@pytest.mark.parametrize("reference", ["standard", "+MLP rho=identity"])
def test_the_aa_control_is_reported_at_the_rate_chosen_for_the_arm_it_copies(reference):
    rows = []
    for seed in (1000, 0, 1):
        for lr, val in ((1e-3, 0.4), (3e-3, 0.9)):
            ref, aa = _aa(reference, seed, lr, 0.8, {"mlp": True})
            other = _row("attn-only", seed, lr, 0.95 if lr == 1e-3 else 0.1, 0.5).model_copy(
                update={"train_config": {"lr": lr, "seed": seed, "options": {"mlp": False}}}
            )
            ref = ref.model_copy(update={"outcome": RunOutcome(val_accuracy=val, val_loss=1.0)})
            rows += [ref, other] + ([aa] if seed < 1000 and lr == 3e-3 else [])
    reported, lrs = reported_rows(_stored({"seeds": 2, "selection_seeds": [1000]}), rows)
    # the A/A runs count at the reference's rate (3e-3), not at another arm's (attn-only chose 1e-3)
    assert lrs[(AA_LABEL, "needle", 8)] == 3e-3 and lrs[("attn-only", "needle", 8)] == 1e-3
    assert sorted(r.seed for r in reported if r.label == AA_LABEL) == [0, 1]
