"""The Ray backend runs the same sweep as the local one, with the same results for the same seeds."""

from __future__ import annotations

import pytest
from rich.console import Console

from axiomformer.study import ResultsStore, default_sweep, run_study, validate_config

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


def _runs(out) -> dict[str, dict]:
    with ResultsStore(out) as store:
        return {r["key"]: r for r in store.runs()}


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
        assert {k: a[key][k] for k in COMPARED} == {k: b[key][k] for k in COMPARED}
        assert (a[key]["backend"], b[key]["backend"]) == ("local", "ray")
    assert (tmp_path / "ray" / "report.md").is_file()
