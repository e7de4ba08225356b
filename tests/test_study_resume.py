"""Interrupting a study (Ctrl-C, kill) and running it again: no finished run lost, none duplicated."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys

import pytest
from rich.console import Console

from axiomformer.study import ResultsStore, default_sweep, load_config, plan, run_study
from axiomformer.study.stages import plan_all
from test_study import tiny_study_toml


def _config(tmp_path, steps: int, seeds: int):
    path = tmp_path / "study.toml"
    path.write_text(
        tiny_study_toml(
            name="resume test", seeds=seeds, variants=("standard", "A4=cosine"), baselines=("gru",), steps=steps
        )
    )
    return path


def _rows(out) -> list[tuple]:
    db = sqlite3.connect(out / "results.sqlite")
    try:
        return db.execute("SELECT key, accuracy, loss, finished_at FROM runs ORDER BY key").fetchall()
    finally:
        db.close()


def test_interrupt_in_the_kth_run_then_resume_loses_and_duplicates_nothing(tmp_path, monkeypatch):
    import axiomformer.train

    path = _config(tmp_path, steps=4, seeds=2)
    config = load_config(path)
    total = len(plan(config)) + 3 * 2 * 2  # selection (3 models x 2 lengths x 2 lrs) + reported seeds 0, 1 per cell
    out = tmp_path / "study"
    real_train, calls = axiomformer.train.train, []

    def interrupted_at_fourth(cfg, **kwargs):
        if cfg.steps == config.budget.steps:  # not the runner's short memory warm-up
            calls.append(cfg)
            if len(calls) == 4:
                raise KeyboardInterrupt  # what Ctrl-C raises in the middle of a run
        return real_train(cfg, **kwargs)

    monkeypatch.setattr(axiomformer.train, "train", interrupted_at_fourth)
    with pytest.raises(KeyboardInterrupt):
        run_study(config, out, progress=False, console=Console(quiet=True))
    before = _rows(out)
    assert len(before) == 3  # the three runs that finished before the interrupt

    calls.clear()

    def counted(cfg, **kwargs):
        if cfg.steps == config.budget.steps:
            calls.append(cfg)
        return real_train(cfg, **kwargs)

    monkeypatch.setattr(axiomformer.train, "train", counted)
    summary = run_study(config, out, progress=False, console=Console(quiet=True))
    after = _rows(out)
    assert len(calls) == summary.trained == total - 3
    assert len(after) == len({r[0] for r in after}) == total
    assert set(before) <= set(after)  # stored rows untouched: same metrics, same finish time
    with ResultsStore(out) as store:
        assert {r[0] for r in after} == {r.key for r in plan_all(config, {r.key: r for r in store.runs()})}


def _drive(mode: str, path, out) -> subprocess.CompletedProcess:
    """``axiomformer study`` in a subprocess that signals itself at a fixed point of its work (after the K-th stored
    run: ``tests/study_interrupt_driver.py``), so the test does not depend on timing."""
    tests = os.path.dirname(__file__)
    env = dict(
        os.environ,
        MPLBACKEND="Agg",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join([os.path.join(tests, "..", "src"), tests, os.environ.get("PYTHONPATH", "")]),
    )
    command = [
        sys.executable,
        os.path.join(tests, "study_interrupt_driver.py"),
        mode,
        "--",
        "study",
        "--config",
        str(path),
        "--out",
        str(out),
        "--no-progress",
    ]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, start_new_session=True)


@pytest.mark.slow
def test_killed_then_ctrl_c_study_resumes_without_losing_or_duplicating_runs(tmp_path):
    path = _config(tmp_path, steps=4, seeds=2)
    config = load_config(path, base=default_sweep())  # what the CLI runs: the file over the default preset
    total = len(plan(config)) + 3 * 2 * 2  # selection (3 models x 2 lengths x 2 lrs) + seeds 0, 1 per cell
    out = tmp_path / "study"

    first = _drive("kill-after-run-2", path, out)  # kill -9 right after the second stored run
    assert first.returncode == -signal.SIGKILL
    killed = _rows(out)
    assert len(killed) == 2

    second = _drive("after-run-1", path, out)  # Ctrl-C right after one more stored run
    assert second.returncode == 130, second.stderr
    assert "interrupted" in second.stderr and f"--out {out}" in second.stderr
    assert "Traceback" not in second.stderr
    interrupted = _rows(out)
    assert set(killed) <= set(interrupted) and len(interrupted) == 3

    summary = run_study(config, out, progress=False, console=Console(quiet=True))
    final = _rows(out)
    assert summary.trained == total - len(interrupted)
    assert len(final) == len({r[0] for r in final}) == total
    assert set(interrupted) <= set(final)


def test_a_run_stopped_part_way_resumes_from_its_progress_file_as_if_never_stopped(tmp_path, monkeypatch):
    import axiomformer.train

    path = _config(tmp_path, steps=8, seeds=2)
    path.write_text(path.read_text().replace("eval_batches = 1", "eval_batches = 1\neval_every = 2"))
    config = load_config(path)
    out, fresh = tmp_path / "study", tmp_path / "fresh"
    real_train, calls = axiomformer.train.train, []

    def stopped_in_the_third(cfg, **kwargs):
        if cfg.steps == config.budget.steps:  # not the runner's short memory warm-up
            calls.append(cfg)
            if len(calls) == 3:
                seen: list[str] = []

                def log(line: str) -> None:
                    seen.append(line)
                    if len(seen) == 2:  # after its first evaluation wrote the progress file
                        raise KeyboardInterrupt

                return real_train(cfg, **kwargs, log=log)
        return real_train(cfg, **kwargs)

    monkeypatch.setattr(axiomformer.train, "train", stopped_in_the_third)
    with pytest.raises(KeyboardInterrupt):
        run_study(config, out, progress=False, console=Console(quiet=True))
    assert len(list((out / "progress").glob("*.pt"))) == 1
    lines: list[str] = []
    monkeypatch.setattr(axiomformer.train, "train", lambda cfg, **kwargs: real_train(cfg, **kwargs, log=lines.append))
    run_study(config, out, progress=False, console=Console(quiet=True))
    assert sum("resumed from" in line for line in lines) == 1
    assert not list((out / "progress").glob("*.pt"))
    monkeypatch.setattr(axiomformer.train, "train", real_train)
    run_study(config, fresh, progress=False, console=Console(quiet=True))
    assert [r[:3] for r in _rows(out)] == [r[:3] for r in _rows(fresh)]  # the same runs, the same metrics


def test_a_resumed_store_recomputes_its_ceilings_when_the_config_gains_or_changes_a_task(tmp_path):
    """The task ceilings are a section computed once per store; a store resumed with a config that gained a task (or
    changed a task's options) must compute them again, or its new task reads "no ceiling" and never discriminates.
    Planted: a store whose section has the old tasks only."""
    from axiomformer.study.config import validate_config
    from axiomformer.study.runner import _extras_todo, ceiling_cells
    from axiomformer.study.sections import ceilings_section
    from axiomformer.study.store import ResultsStore
    from axiomformer.study.suites import get_suite

    config = validate_config(get_suite("positions").preset("quick"))
    cells = ceiling_cells(config)
    with ResultsStore(tmp_path) as store:
        store.put_section("ceilings", ceilings_section(cells[:1]))  # the first task only
        assert "ceilings" in [name for name, _ in _extras_todo(store, config)[1]]
        store.put_section("ceilings", ceilings_section(cells))
        assert "ceilings" not in [name for name, _ in _extras_todo(store, config)[1]]
        changed = [dict(cells[0], options={**cells[0]["options"], "vocab": 5}), *cells[1:]]
        store.put_section("ceilings", ceilings_section(changed))  # another vocabulary for the same task@length
        assert "ceilings" in [name for name, _ in _extras_todo(store, config)[1]]
