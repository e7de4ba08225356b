"""The trainer's fast path (``TrainConfig(fast=True, compile=True)``) trains what the plain loop trains, and
``bench --train --json`` reports its documented fields (no timing assertions).

The fast path rounds differently (fused AdamW; the compiled forward), so its runs are compared with the plain runs in
distribution: the test accuracies of several seeds each, two-sided Mann-Whitney U (scipy). Its first training loss,
before any update, must equal the plain loop's to float32 rounding (same initialization, same batch, same function).
The compile backend is ``aot_eager`` here: the same traced forward and backward graphs as inductor's, without its code
generation (10-40 s per model structure on a cold cache; ``docs/training_speed.md``).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from scipy import stats
from typer.testing import CliRunner

from axiomformer import fastpath, train_bench
from axiomformer.cli import app
from axiomformer.runtime import torch_threads
from axiomformer.train import TrainConfig, train

SEEDS = range(6)
TINY = {
    "task": "copy",
    "seq_len": 8,
    "task_options": {"vocab": 4},
    "dim": 16,
    "layers": 1,
    "heads": 2,
    "batch_size": 16,
    "steps": 100,
    "eval_every": 100,
    "eval_batches": 2,
    "target_accuracy": None,
    "device": "cpu",
}
"""A copy task small enough for 6 seeds per path in seconds, long enough that the accuracies spread above chance."""


@pytest.fixture(autouse=True)
def _traced_without_codegen(monkeypatch):
    monkeypatch.setattr(fastpath, "COMPILE_BACKEND", "aot_eager")


def _runs(**fast_options) -> list:
    with torch_threads(1):
        return [train(TrainConfig(**TINY, seed=seed, **fast_options), progress=False) for seed in SEEDS]


@pytest.fixture(scope="module")
def plain_runs():
    return _runs()


def _same_distribution(plain, fast) -> float:
    return stats.mannwhitneyu([r.accuracy for r in plain], [r.accuracy for r in fast], alternative="two-sided").pvalue


def test_fast_path_gives_the_plain_accuracy_distribution(plain_runs):
    fast = _runs(fast=True, compile=True)
    for p, f in zip(plain_runs, fast, strict=True):
        assert math.isclose(f.losses[0], p.losses[0], rel_tol=1e-5), (f.losses[0], p.losses[0])
        assert f.steps == p.steps == TINY["steps"]
    assert max(r.accuracy for r in plain_runs) > 1.5 * plain_runs[0].chance  # the budget learns: a test with power
    assert _same_distribution(plain_runs, fast) > 0.05


def test_a_fast_path_that_does_not_learn_is_caught(plain_runs, monkeypatch):
    """Planted: a fast path whose clipping zeroes the gradients (AdamW's weight decay alone moves the weights)."""

    def zeroing(params, max_norm):
        for p in params:
            p.grad.zero_()
        return torch.zeros(())

    monkeypatch.setattr(fastpath, "clip_gradients", zeroing)
    broken = _runs(fast=True)
    assert _same_distribution(plain_runs, broken) < 0.01


def test_a_fast_path_that_computes_another_function_is_caught(monkeypatch):
    """Planted: a compiled forward that halves the logits; the first loss no longer matches the plain one."""
    real = fastpath.training_forward

    def halving(net, *, compile_model):
        forward = real(net, compile_model=compile_model)
        return (lambda x: 0.5 * forward(x)) if compile_model else forward

    monkeypatch.setattr(fastpath, "training_forward", halving)
    with torch_threads(1):
        config = TrainConfig(**{**TINY, "steps": 1})
        plain = train(config, progress=False)
        fast = train(config.model_copy(update={"fast": True, "compile": True}), progress=False)
    assert not math.isclose(fast.losses[0], plain.losses[0], rel_tol=1e-5)


def test_paired_speedup_is_the_geometric_mean_ratio_with_a_t_interval():
    plain, fast = [3.0, 4.0, 3.5, 5.0], [1.0, 2.1, 1.5, 2.4]
    logs = [math.log(p / f) for p, f in zip(plain, fast, strict=True)]
    n, mean = len(logs), sum(logs) / len(logs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    half = stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    got = train_bench.paired_speedup(plain, fast)
    assert got["speedup"] == pytest.approx(math.exp(mean))
    assert got["ci_low"] == pytest.approx(math.exp(mean - half))
    assert got["ci_high"] == pytest.approx(math.exp(mean + half))
    with pytest.raises(ValueError, match="same positive number"):
        train_bench.paired_speedup([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="positive"):
        train_bench.paired_speedup([1.0, 0.0], [1.0, 2.0])


def test_bench_train_json_has_the_speedup_and_both_paths(tmp_path):
    args = ["bench", "--train", "--train-steps", "3", "--repeats", "2", "--train-tasks", "copy", "--json"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert report == json.loads((tmp_path / "train_bench.json").read_text())
    (entry,) = report["tasks"]
    assert entry["task"] == "copy" and entry["config"]["dim"] == 32 and entry["config"]["steps"] == 3
    for block in (report, entry):
        for path in ("plain", "fast"):
            assert len(block[path]["cpu_s"]) == 2
            mean = sum(block[path]["cpu_s"]) / 2
            assert block[path]["runs_per_cpu_hour"] == pytest.approx(3600 / mean)
        recomputed = train_bench.paired_speedup(block["plain"]["cpu_s"], block["fast"]["cpu_s"])
        assert block["speedup"] == pytest.approx(recomputed["speedup"])
        assert block["ci_low"] <= block["speedup"] <= block["ci_high"]
    assert set(entry["warmup"]) == {"plain_cpu_s", "fast_cpu_s", "compile_cpu_s"}
    assert len(entry["plain"]["accuracy"]) == len(entry["fast"]["accuracy"]) == 2


@pytest.mark.parametrize(
    ("option", "value", "fragment"),
    [("--train-tasks", "majority", "choose from copy, induction"), ("--train-steps", "0", "--train-steps must be")],
)
def test_bench_train_bad_options_give_one_error_line(tmp_path, option, value, fragment):
    result = CliRunner().invoke(app, ["bench", "--train", option, value, "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("error: ") and fragment in last, last


def test_the_study_model_traces_into_one_graph_and_the_check_sees_a_break():
    """The compiled training forward is one graph (a graph break would run the rest eagerly, and slowly); planted: the
    same model given explicit ``position_ids`` reads the largest position back to the host, which breaks the graph."""
    from axiomformer.train import _build

    config = train_bench.bench_config("copy", steps=1, seed=0, fast=True)
    model = _build(config, torch.device("cpu")).model
    ids = torch.zeros(2, config.seq_len, dtype=torch.long)
    assert torch._dynamo.explain(model)(ids).graph_break_count == 0
    torch._dynamo.reset()
    positions = torch.arange(config.seq_len)
    assert torch._dynamo.explain(lambda x: model(x, position_ids=positions))(ids).graph_break_count >= 1
