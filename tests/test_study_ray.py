"""The Ray backend runs the same sweep as the local one, with the same results for the same seeds."""

from __future__ import annotations

import pytest
from rich.console import Console

from axiomformer.study import ResultsStore, default_sweep, run_study, validate_config
from axiomformer.study.record import RunRecord

ray = pytest.importorskip("ray")

SIX_RUNS = {
    "name": "ray test",
    "seeds": 2,
    "variants": ["standard"],
    "baselines": ["gru"],
    "threads": 1,
    "workers": 1,
    "model": {"dim": 16, "heads": 2, "layers": 1},
    "budget": {"steps": 6, "batch_size": 8, "eval_batches": 1, "warmup": 2, "lr_grid": [3e-3]},
    "sections": {"audit": False, "derive": False, "flow": False},
    "tasks": [{"name": "needle", "seq_lens": [8]}],
    "controls": [],
    "aa_control": False,
    "lr_check": False,
}

COMPARED = (
    "label",
    "task",
    "seq_len",
    "seed",
    "dim",
    "params",
    "accuracy",
    "loss",
    "steps",
    "losses",
    "engine",
    "train_config",
    "assumptions",
    "outcome",
)


def _runs(out) -> dict[str, RunRecord]:
    with ResultsStore(out) as store:
        return {r.key: r for r in store.runs()}


@pytest.mark.slow
def test_ray_backend_gives_the_same_results_as_the_local_backend(tmp_path):
    config = validate_config(SIX_RUNS, base=default_sweep(quick=True))
    local = run_study(config, tmp_path / "local", progress=False, console=Console(quiet=True))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        remote = run_study(config, tmp_path / "ray", backend="ray", progress=False, console=Console(quiet=True))
    finally:
        ray.shutdown()
    assert local.trained == remote.trained == 8 and not remote.failed  # 2 models x (2 selection runs + 2 seeds)
    a, b = _runs(tmp_path / "local"), _runs(tmp_path / "ray")
    assert a.keys() == b.keys() and len(a) == 8
    for key in a:
        assert {k: getattr(a[key], k) for k in COMPARED} == {k: getattr(b[key], k) for k in COMPARED}
        assert (a[key].backend, b[key].backend) == ("local", "ray")
    assert (tmp_path / "ray" / "report.md").is_file()


def _kill_first_run_worker(stop, killed: list[int]) -> None:
    """Kill (SIGKILL) the first Ray worker seen executing a run, found by its process title in /proc."""
    import os
    import signal
    from pathlib import Path

    while not stop.is_set() and not killed:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                title = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if title.startswith(b"ray::execute_in_worker"):
                os.kill(int(proc.name), signal.SIGKILL)
                killed.append(int(proc.name))
                return
        stop.wait(0.02)


@pytest.mark.slow
def test_a_ray_worker_that_dies_mid_sweep_fails_its_run_and_a_rerun_finishes_it(tmp_path):
    import sys
    import threading

    if not sys.platform.startswith("linux"):
        pytest.skip("finds the worker through /proc")
    config = validate_config(SIX_RUNS, base=default_sweep(quick=True))
    stop, killed = threading.Event(), []
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        killer = threading.Thread(target=_kill_first_run_worker, args=(stop, killed), daemon=True)
        killer.start()
        first = run_study(config, tmp_path / "ray", backend="ray", progress=False, console=Console(quiet=True))
        stop.set()
        killer.join()
        assert len(killed) == 1
        # recorded as failed, and the sweep went on (the other model's runs trained; a killed learning-rate
        # selection run leaves its seeds to the rerun)
        assert len(first.failed) == 1 and first.trained >= 3 and first.trained + 1 == first.planned
        with ResultsStore(tmp_path / "ray") as store:
            failure = store.failures()[0]
        assert failure["key"] == first.failed[0] and "Worker" in failure["error"]  # Ray's WorkerCrashedError
        again = run_study(config, tmp_path / "ray", backend="ray", progress=False, console=Console(quiet=True))
    finally:
        stop.set()
        ray.shutdown()
    assert not again.failed and again.already_stored == first.trained
    runs = _runs(tmp_path / "ray")
    assert len(runs) == 8 and first.failed[0] in runs  # the rerun finished the sweep, the killed run included
