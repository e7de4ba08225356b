"""A diverged run (NaN loss) is recorded as diverged, and the study, every suite's report, the JSON verdicts and the
figures go on; a rerun that trains nothing keeps the record of the call that did."""

from __future__ import annotations

import shutil

import pytest
from rich.console import Console

from axiomformer.study.config import load_config
from axiomformer.study.report import build_report, study_json
from axiomformer.study.runner import _status, run_study
from axiomformer.study.store import ResultsStore
from axiomformer.study.suites import BUILTIN
from axiomformer.study.suites.common import new_figure, save

TOML = """
name = "diverging lr"
seeds = 2
variants = ["standard", "normalizer=sigmoid"]
baselines = []
threads = 1
workers = 1
[model]
dim = 16
heads = 2
layers = 1
[budget]
steps = 4
batch_size = 4
eval_batches = 1
eval_every = 2
warmup = 1
lr_grid = [1e5, 1e-3]
[sections]
audit = false
derive = false
flow = false
[[tasks]]
name = "needle"
seq_lens = [8]
"""


@pytest.fixture(scope="module")
def diverged_study(tmp_path_factory):
    work = tmp_path_factory.mktemp("diverged")
    (work / "study.toml").write_text(TOML)
    summary = run_study(load_config(work / "study.toml"), work / "out", progress=False, console=Console(quiet=True))
    return work / "out", summary


@pytest.mark.slow
def test_a_diverged_run_is_stored_as_diverged_and_the_study_reports(diverged_study):
    out, summary = diverged_study
    assert not summary.failed and summary.report["markdown"].is_file()
    with ResultsStore(out, readonly=True) as store:
        rows = store.runs()
    diverged = [r for r in rows if r.outcome.stop_reason == "nonfinite"]
    assert diverged and all(r.loss is None for r in diverged)
    assert study_json(out)["cells"]


@pytest.mark.slow
@pytest.mark.parametrize("suite", list(BUILTIN))
def test_every_suite_reports_a_store_with_diverged_runs(diverged_study, suite, tmp_path):
    out, _ = diverged_study
    copy = tmp_path / suite
    shutil.copytree(out, copy)
    with ResultsStore(copy) as store:
        config = store.get_meta("config")
        store.set_meta("config", {**config, "suite": suite})
    paths = build_report(copy)
    assert paths["markdown"].is_file()
    study_json(copy)


def test_the_status_line_of_a_diverged_run_says_n_a():
    class Model:
        label = "standard"

    class Run:
        model, task_label, seed, train_config = Model(), "needle@8", 0, {"lr": 1e5}

    line = _status(
        Run(),
        {
            "accuracy": 0.0,
            "loss": None,
            "val_accuracy": None,
            "seconds": None,
            "tokens_per_second": None,
            "stop_reason": "nonfinite",
            "steps": 3,
        },
    )
    assert "loss n/a" in line and "nonfinite" in line


def test_a_log_scaled_figure_with_nothing_positive_still_saves(tmp_path):
    fig, (ax,) = new_figure()
    ax.plot([1, 2], [0.0, 0.0])
    ax.set_yscale("log")
    assert save(fig, tmp_path, "empty").is_file()


@pytest.mark.slow
def test_a_rerun_that_trains_nothing_keeps_the_record_of_the_real_run(diverged_study, tmp_path):
    out, _ = diverged_study
    copy = tmp_path / "rerun"
    shutil.copytree(out, copy)
    with ResultsStore(copy, readonly=True) as store:
        real, calls = store.get_meta("last_invocation"), store.get_meta("invocations")
    assert real["trained"] > 0 and len(calls) == 1
    with ResultsStore(copy, readonly=True) as store:
        config = store.get_meta("config")
    from axiomformer.study.config import validate_config

    summary = run_study(
        validate_config(config, source="stored config"),
        copy,
        progress=False,
        console=Console(quiet=True),
        write_report=False,
    )
    assert summary.trained == 0
    with ResultsStore(copy, readonly=True) as store:
        assert store.get_meta("last_invocation") == real
        calls = store.get_meta("invocations")
    assert len(calls) == 2 and calls[0] == real and calls[1]["trained"] == 0
