"""``axiomformer study``: config validation, the built-in sweep, parameter matching, the store, the report, the CLI."""

from __future__ import annotations

import json
import sqlite3
import textwrap

import pytest
from typer.testing import CliRunner

from axiomformer.cli import app
from axiomformer.spec import AttentionSpec
from axiomformer.study import (
    ResultsStore,
    StudyConfigError,
    default_config,
    default_sweep,
    load_config,
    models,
    plan,
    run_study,
    validate_config,
)
from axiomformer.study.report import assumption_of
from axiomformer.study.stages import plan_all
from axiomformer.study.sweep import match_width, match_widths


def tiny_study_toml(
    name: str = "tiny study",
    seeds: int = 2,
    variants: tuple = ("standard", "A5=sigmoid"),
    baselines: tuple = ("rnn",),
    steps: int = 8,
) -> str:
    """A study config small enough for a unit test (1-layer width-16 models, needle at lengths 8 and 12)."""
    return textwrap.dedent("""
    name = "{name}"
    seeds = {seeds}
    variants = {variants}
    baselines = {baselines}
    threads = 1
    workers = 1
    lr_widen = 0
    controls = []
    aa_control = false
    lr_check = false

    [model]
    dim = 16
    heads = 2
    layers = 1

    [budget]
    steps = {steps}
    batch_size = 8
    eval_batches = 1
    warmup = 2
    lr_grid = [3e-3, 1e-2]

    [sections]
    audit = false
    derive = false
    flow = false

    [[tasks]]
    name = "needle"
    seq_lens = [8, 12]
""").format(
        name=name, seeds=seeds, steps=steps, variants=json.dumps(list(variants)), baselines=json.dumps(list(baselines))
    )


TINY = tiny_study_toml()


@pytest.fixture
def tiny_toml(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    return path


# ---------------------------------------------------------------------------------------------------- config
def test_unknown_key_is_rejected_naming_the_key_and_the_allowed_ones(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[budget]\nstpes = 10\n")
    with pytest.raises(StudyConfigError) as info:
        load_config(path, base=default_sweep(quick=True))
    message = str(info.value)
    assert "'stpes'" in message and "budget" in message
    for allowed in ("steps", "batch_size", "lr", "warmup"):
        assert allowed in message


def test_unknown_top_level_and_task_keys_are_rejected():
    with pytest.raises(StudyConfigError, match=r"unknown key 'sedes'.*allowed keys: .*seeds"):
        validate_config({"sedes": 3}, base=default_sweep(quick=True))
    with pytest.raises(StudyConfigError, match=r"tasks\.0.*unknown key 'seq_len'.*seq_lens"):
        validate_config({"tasks": [{"name": "needle", "seq_len": 16}]}, base=default_sweep(quick=True))


def test_invalid_values_are_rejected_with_the_choices():
    with pytest.raises(StudyConfigError, match="sofmax.*softmax"):
        validate_config({"variants": ["A5=sofmax"]}, base=default_sweep(quick=True))
    with pytest.raises(StudyConfigError, match="unknown baseline 'transformer'.*rnn, lstm, gru"):
        validate_config({"baselines": ["transformer"]}, base=default_sweep(quick=True))
    with pytest.raises(StudyConfigError, match="steps"):
        validate_config({"budget": {"steps": 0}}, base=default_sweep(quick=True))


def test_config_file_overrides_the_builtin_sweep_key_by_key(tiny_toml, tmp_path):
    path = tmp_path / "partial.toml"
    path.write_text("seeds = 3\n[budget]\nsteps = 7\n")
    base = default_sweep(quick=False)
    cfg = load_config(path, base=base)
    assert cfg.seeds == 3 and cfg.budget.steps == 7
    assert cfg.budget.batch_size == base["budget"]["batch_size"]  # tables merge
    assert [t.name for t in cfg.tasks] == [t["name"] for t in base["tasks"]]
    tiny = load_config(tiny_toml, base=base)
    assert [t.name for t in tiny.tasks] == ["needle"] and tiny.baselines == ["rnn"]  # lists replace


def test_malformed_toml_is_reported_with_the_file_name(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("seeds = = 2\n")
    with pytest.raises(StudyConfigError, match="broken.toml is not valid TOML"):
        load_config(path)


# ---------------------------------------------------------------------------------------------------- sweep
def test_full_sweep_has_every_variant_and_baseline_of_the_issue():
    labels = [m.label for m in models(default_config(preset="full"))]
    expected = [
        "standard",
        "A1=mlp",
        "A2=joint",
        "A3=mlp",
        "A4=cosine",
        "A4=neg_l2",
        "A4=additive",
        "A5=sigmoid",
        "A5=sparsemax",
        "A5=gumbel_softmax",
        "A5=linear",
        "scale=none",
        "position=none",
        "position=sinusoidal",
        "position=rope",
        "position=alibi",
        "rnn",
        "lstm",
        "gru",
        "no_mixing",
        "uniform_mixing",
        "standard (A/A)",
    ]
    assert labels == expected
    # position=none is the standard spec without the model's input encoding: no position signal at all (NoPE).
    nope = next(m for m in models(default_config(preset="full")) if m.label == "position=none")
    assert nope.spec == "standard" and nope.input_position == "none"
    assert next(m for m in models(default_config()) if m.label == "standard").input_position == "auto"
    tasks = {t.name: t.seq_lens for t in default_config(preset="full").tasks}
    assert {"majority", "mqar", "copy", "induction", "selective_copy"} <= set(tasks) and default_config().seeds >= 8
    assert len(default_config().budget.lr_grid) == 3
    quick = default_config(quick=True)
    assert {m.label for m in models(quick)} <= set(expected) and "standard" in [m.label for m in models(quick)]
    assert quick.seeds >= 2 and quick.pilot and len(quick.budget.lr_grid) >= 2


def test_model_labels_name_the_relaxed_assumption():
    assert [assumption_of(x) for x in ("standard", "A4=cosine", "scale=none", "position=rope")] == [
        "none",
        "A4",
        "A5 (scale)",
        "position",
    ]
    assert assumption_of("gru", "gru") == "A0"
    assert assumption_of("uniform_mixing", "uniform_mixing") == "control"
    assert assumption_of("standard (A/A)") == "A/A"
    cfg = validate_config(
        {"variants": ["score=cosine", "A4=cosine", "normalizer=sigmoid,A4=cosine"], "aa_control": False},
        base=default_sweep(quick=True),
    )
    assert [m.label for m in models(cfg) if m.kind == "transformer"] == ["A4=cosine", "A4=cosine,A5=sigmoid"]


def test_match_width_picks_the_closest_count_and_skips_invalid_widths():
    def count(w):
        if w % 5 == 0:
            raise ValueError("invalid width")
        return w * w

    assert match_width(count, 50, list(range(1, 30))) == (7, 49)
    assert match_width(count, 110, list(range(1, 30))) == (11, 121)  # 10 is invalid: 9 (81) vs 11 (121) -> 11
    assert match_width(count, 95, list(range(1, 30))) == (9, 81)
    assert match_width(lambda w: 3 * w, 1000, list(range(1, 30))) == (29, 87)


def test_default_sweep_parameter_counts_are_matched_within_ten_percent():
    from axiomformer.models import build_model, count_parameters
    from axiomformer.tasks import make_task

    cfg = default_config()
    runs = plan(cfg)
    reference: dict[tuple[str, int], int] = {}
    checked = set()
    for run in runs:  # recount independently from the run's own training config
        tc = run.train_config
        task = make_task(tc["task"], seq_len=tc["seq_len"], **tc["task_options"])
        key = (run.model.label, run.task, run.seq_len)
        if key in checked:
            continue
        checked.add(key)
        spec = (
            AttentionSpec.standard(tc["dim"], tc["heads"], causal=True).relax(tc["spec"])
            if tc["model"] == "transformer"
            else None
        )
        n = count_parameters(
            build_model(
                tc["model"],
                vocab_size=task.vocab_size,
                dim=tc["dim"],
                num_layers=tc["layers"],
                max_len=tc["seq_len"],
                spec=spec,
            )
        )
        assert n == run.expected_params
        if run.model.label == "standard":
            reference[(run.task, run.seq_len)] = n
    selected = len(models(cfg)) - cfg.aa_control  # the A/A control has no selection runs
    assert len(checked) == selected * sum(len(t.seq_lens) for t in cfg.tasks)
    for label, task, seq_len in checked:
        n = next(r.expected_params for r in runs if (r.model.label, r.task, r.seq_len) == (label, task, seq_len))
        assert abs(n - reference[(task, seq_len)]) <= 0.10 * reference[(task, seq_len)], (label, task, seq_len)


def test_every_model_gets_the_same_training_budget_and_learning_rate_grid():
    cfg = default_config()
    runs = plan(cfg)  # the selection stage: every cell at every learning rate of the grid
    budget_keys = (
        "steps",
        "batch_size",
        "warmup",
        "weight_decay",
        "grad_clip",
        "eval_batches",
        "eval_every",
        "target_accuracy",
        "patience",
        "layers",
    )
    for task in {(r.task, r.seq_len) for r in runs}:
        budgets = {json.dumps({k: r.train_config[k] for k in budget_keys}) for r in runs if (r.task, r.seq_len) == task}
        assert len(budgets) == 1, task
        grids = {  # the A/A control trains at the standard model's chosen rate: it has no selection runs
            m.label: sorted({r.lr for r in runs if (r.task, r.seq_len) == task and r.model.label == m.label})
            for m in models(cfg)
            if m.label != "standard (A/A)"
        }
        assert all(g == sorted(cfg.budget.lr_grid) for g in grids.values()), task
    assert {r.seed for r in runs} == set(cfg.selection_seeds) and not set(cfg.selection_seeds) & set(range(cfg.seeds))


def test_run_keys_are_unique_stable_and_change_with_the_budget():
    cfg = validate_config({}, base=default_sweep(quick=True))
    keys = [r.key for r in plan(cfg)]
    assert (
        len(keys)
        == len(set(keys))
        == (len(models(cfg)) - cfg.aa_control)  # the A/A control has no selection runs
        * len(cfg.budget.lr_grid)
        * len(cfg.selection_seeds)
        * sum(len(t.seq_lens) for t in cfg.tasks)
    )
    assert keys == [r.key for r in plan(cfg)]
    other = validate_config({"budget": {"warmup": cfg.budget.warmup + 1}}, base=cfg.model_dump())
    assert not set(keys) & {r.key for r in plan(other)}


def test_impossible_parameter_matching_is_an_error():
    cfg = validate_config(
        {"model": {"tolerance": 0.0001}, "variants": ["A3=mlp"], "baselines": []}, base=default_sweep(quick=True)
    )
    with pytest.raises(ValueError, match="cannot match parameters of A3=mlp"):
        match_widths(cfg, models(cfg))


# ---------------------------------------------------------------------------------------------------- store
def test_store_keeps_one_row_per_key(tmp_path):
    row = {
        "key": "k1",
        "label": "standard",
        "model": "transformer",
        "spec": "standard",
        "assumptions": {"A1": True},
        "task": "needle",
        "seq_len": 8,
        "task_config": {},
        "seed": 0,
        "dim": 16,
        "layers": 1,
        "train_config": {"steps": 1},
        "accuracy": 0.5,
    }
    with ResultsStore(tmp_path) as store:
        assert store.add_run(row) is True
        assert store.add_run(row | {"accuracy": 0.9}) is False
        assert store.count() == 1 and store.runs()[0].accuracy == 0.5
        assert store.runs()[0].assumptions == {"A1": True}


# ---------------------------------------------------------------------------------------------------- end to end
def test_study_writes_store_report_and_figures_and_a_rerun_trains_nothing(tiny_toml, tmp_path, monkeypatch):
    out = tmp_path / "study"
    runner = CliRunner()
    result = runner.invoke(app, ["study", "--config", str(tiny_toml), "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    for name in ("report.md", "report.html", "results.sqlite"):
        assert (out / name).is_file()
    pngs = sorted(p.name for p in (out / "figures").glob("*.png"))
    assert "needle_accuracy_vs_length.png" in pngs and "differences.png" in pngs

    cfg = load_config(tiny_toml, base=default_sweep())
    with ResultsStore(out) as store:
        planned = plan_all(cfg, {r.key: r for r in store.runs()})
    db = sqlite3.connect(out / "results.sqlite")
    rows = db.execute(
        "SELECT key, label, seed, accuracy, params, git_commit, package_version, assumptions FROM runs"
    ).fetchall()
    assert sorted(r[0] for r in rows) == sorted(r.key for r in planned)
    assert all(r[6] for r in rows)
    report = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    for label in ("standard", "A5=sigmoid", "rnn"):
        assert f"| {label} |" in report and f"<td>{label}</td>" in html
    # the headline cell of standard@8, recomputed from the store: the lr with the best validation accuracy at the
    # selection seed 1000 (ties: lower validation loss, then the smaller lr), then the mean over the reported seeds
    # 0 and 1 at that lr (the selection seed is never among them), with its Student-t interval
    seed0 = [
        (json.loads(o)["val_accuracy"], -json.loads(o)["val_loss"], -json.loads(t)["lr"], json.loads(t)["lr"])
        for o, t in db.execute(
            "SELECT outcome, train_config FROM runs WHERE label='standard' AND seq_len=8 AND seed=1000"
        )
    ]
    lr = max(seed0)[3]
    first = [
        a
        for a, t, seed in db.execute(
            "SELECT accuracy, train_config, seed FROM runs WHERE label='standard' AND seq_len=8"
        )
        if json.loads(t)["lr"] == lr and seed < 2
    ]
    from axiomformer.study.statistics import cell_interval

    ci = cell_interval(first, n_test=8)  # 1 test batch of 8 sequences, one scored position each
    mean, low, high = ci.estimate, ci.low, ci.high
    assert len(first) == 2 and f"{mean:.3f} [{low:.3f}, {high:.3f}] lr {lr:g}" in report
    assert "Failed or missing runs" not in report  # selection-only runs are stored, not missing
    assert low <= mean <= high
    assert json.loads(next(r[7] for r in rows if r[1] == "rnn")) == {"A0": False}
    assert json.loads(next(r[7] for r in rows if r[1] == "A5=sigmoid"))["A5"] is False
    db.close()

    import axiomformer.train

    def no_training(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(axiomformer.train, "train", no_training)
    again = runner.invoke(app, ["study", "--config", str(tiny_toml), "--out", str(out), "--no-progress"])
    assert again.exit_code == 0, again.output
    assert "trained 0 run(s) (36 already stored)" in again.output  # 3 models x 2 lengths x (2 lrs x 2 + 2 seeds)


def test_report_command_rebuilds_the_report_from_the_store(tiny_toml, tmp_path):
    out = tmp_path / "study"
    summary = run_study(load_config(tiny_toml), out, progress=False, console=_quiet())
    before = (out / "report.md").read_text()
    for path in [out / "report.md", out / "report.html", *(out / "figures").glob("*.png")]:
        path.unlink()
    result = CliRunner().invoke(app, ["report", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "report.md").read_text() == before
    assert (out / "report.html").is_file() and len(list((out / "figures").glob("*.png"))) == 2
    assert (
        summary.trained == 36 and not summary.failed
    )  # 3 models x 2 lengths x (2 rates x 2 selection seeds + 2 seeds)
    answer = json.loads(CliRunner().invoke(app, ["report", str(out), "--json"]).output)
    assert len(answer["cells"]) == 3 * 2 and len(answer["comparisons"]) == 2 * 2  # 2 non-standard models x 2
    for cell in answer["cells"]:
        assert {
            "model",
            "task",
            "mean",
            "ci_low",
            "ci_high",
            "ci_method",
            "n_seeds",
            "n_test",
            "lr",
            "converged",
        } <= set(cell)
        assert cell["n_seeds"] == 2 and cell["ci_low"] <= cell["mean"] <= cell["ci_high"]
        assert cell["ci_method"].startswith(("t over seeds", "Clopper-Pearson")) and cell["n_test"] == 8
    for comp in answer["comparisons"]:
        assert {"model", "task", "diff", "ci_low", "ci_high", "ci_method", "significant"} <= set(comp)
    design = answer["design"]
    assert design["selection_seeds"] == [1000, 1001] and design["reported_seeds"] == [0, 1] and design["margin"] == 0.02
    assert design["pilot"] and "fewer than the preset's minimum" in design["pilot_reason"]
    assert [v["verdict"] for v in answer["verdicts"]] == ["pilot"] * 4


def test_cli_rejects_bad_input_without_a_traceback(tmp_path):
    runner = CliRunner()
    bad = tmp_path / "bad.toml"
    bad.write_text("[model]\nwidth = 3\n")
    cases = [
        (["study", "--config", str(bad), "--out", str(tmp_path / "a")], "unknown key 'width'"),
        (["study", "--backend", "slurm", "--out", str(tmp_path / "b")], "unknown backend 'slurm'"),
        (["study", "--address", "auto", "--out", str(tmp_path / "c")], "--address is only used with --backend ray"),
        (["report", str(tmp_path / "missing")], "no results.sqlite"),
    ]
    for args, message in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        assert message in result.output and "Traceback" not in result.output


def _quiet():
    from rich.console import Console

    return Console(quiet=True)


def test_report_tables_align_text_left_and_numbers_right():
    from axiomformer.study.render import Table, numeric_columns, to_html, to_markdown

    table = Table(
        ["model", "needle@32", "verdict", "p (Holm)"],
        [["standard", "1.000 [1.000, 1.000]", "free", "1"], ["rnn", "0.057 [0.039, 0.070]*", "forced", "–"]],
    )
    assert numeric_columns(table) == [False, True, False, True]
    assert "|:---|---:|:---|---:|" in to_markdown([table])
    page = to_html([table], "t")
    assert '<td>standard</td><td class="num">1.000 [1.000, 1.000]</td><td>free</td>' in page
    assert "th, td { border: 1px solid #ccc; padding: 0.25rem 0.6rem; text-align: left; }" in page


def test_no_accuracy_against_length_figure_for_a_single_length(tmp_path, monkeypatch):
    """A line over one length carries no information: only tasks run at two or more lengths get the figure."""
    import axiomformer.study.summary as summary
    from axiomformer.study import figures

    class Data:
        tasks = [("needle", 32), ("mqar", 32), ("mqar", 64)]
        models: list = []

    drawn = []
    monkeypatch.setattr(
        figures, "_accuracy_vs_length", lambda d, stats, task, lengths, path: drawn.append((task, lengths)) or path
    )
    monkeypatch.setattr(summary, "cell_stats", lambda d: [])
    monkeypatch.setattr(summary, "comparisons", lambda d: [])
    out = figures.draw_figures(Data(), tmp_path)
    assert drawn == [("mqar", [32, 64])] and list(out) == ["length:mqar"]
