"""``axiomformer bench``: the JSON interface, the interleaving and the peak-memory meter (no timing goals here)."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch
from typer.testing import CliRunner

from axiomformer import bench
from axiomformer.cli import app

FIELDS = {
    "variant": str,
    "engine": str,
    "seq_len": int,
    "causal": bool,
    "ms": float,
    "sdpa_ms": float,
    "ratio_vs_sdpa": float,
    "peak_mem_mb": float,
    "sdpa_peak_mem_mb": float,
    "ratio_ci": list,
    "warmup_dropped": int,
    "time_goal": (float, type(None)),
    "memory_goal": (float, type(None)),
    "goal_met": (bool, type(None)),
}


def test_bench_json_last_line_has_the_documented_rows(tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "--lengths",
            "48,80",
            "--variants",
            "standard;normalizer=sigmoid;normalizer=linear",
            "--json",
            "--out",
            str(tmp_path),
            "--heads",
            "2",
            "--head-dim",
            "8",
            "--repeats",
            "1",
            "--threads",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output.strip().splitlines()[-1])
    assert set(payload) == {"device", "torch", "rows"} and payload["torch"] == torch.__version__
    rows = payload["rows"]
    for row in rows:
        assert set(row) == set(FIELDS)
        for key, kind in FIELDS.items():
            assert isinstance(row[key], kind) or (kind is float and isinstance(row[key], int)), (key, row[key])
        assert row["ms"] > 0 and row["sdpa_ms"] > 0 and row["peak_mem_mb"] >= 0
        assert row["ratio_vs_sdpa"] == pytest.approx(row["ms"] / row["sdpa_ms"], rel=0.05, abs=0.01)
        assert len(row["ratio_ci"]) == 2  # one repeat: no interval (nan, nan)
    goals = {(r["variant"], r["seq_len"]): (r["time_goal"], r["memory_goal"]) for r in rows if r["engine"] == "sdpa"}
    assert goals[("standard", 48)] == (1.05, None)  # the memory goal holds from L = 4096 on
    engines = {(r["variant"], r["engine"]) for r in rows}
    xt = {("standard", "x-transformers"), ("standard", "x-transformers-flash")}
    assert (xt <= engines) == (importlib.util.find_spec("x_transformers") is not None)
    assert engines - xt == {
        ("standard", "sdpa"),
        ("normalizer=sigmoid", "elementwise"),
        ("normalizer=linear", "linear"),
        ("standard", "reference"),
        ("normalizer=sigmoid", "reference"),
        ("normalizer=linear", "reference"),
    }
    assert {(r["seq_len"], r["causal"]) for r in rows} == {(48, True), (80, True), (48, False), (80, False)}
    assert (tmp_path / "bench.png").stat().st_size > 0
    assert "peak memory:" in (tmp_path / "bench.md").read_text()


def test_bench_rejects_bad_lengths_and_variants(tmp_path):
    runner = CliRunner()
    bad_lengths = runner.invoke(app, ["bench", "--lengths", "12,abc", "--out", str(tmp_path)])
    assert bad_lengths.exit_code == 2 and "comma-separated integers" in bad_lengths.output
    bad_variant = runner.invoke(app, ["bench", "--variants", "normalizer=sofmax", "--out", str(tmp_path)])
    assert bad_variant.exit_code == 2 and "unknown normalizer" in bad_variant.output


def test_timings_are_interleaved_a_b_a_b():
    calls = []
    bench.interleaved_ms(lambda: calls.append("a"), lambda: calls.append("b"), torch.device("cpu"), repeats=3)
    assert calls == ["a", "b"] * 4  # one warm-up pair, then three timed pairs


def test_peak_memory_meter_sees_a_torch_allocation_of_known_size():
    from axiomformer.memory import owning_process_memory

    with owning_process_memory():  # as the bench command runs it
        meter = bench.PeakMemory(torch.device("cpu"), allocator_modes=True)
    n = 16 * 2**20 // 4  # 16 MiB of float32

    def allocate_and_touch():
        x = torch.ones(n)
        y = x * 2  # two live 16 MiB tensors at the peak
        del x, y

    peak = meter.measure(allocate_and_touch)
    assert 30 <= peak <= 40, (peak, meter.method)


def test_the_stretch_relaxations_are_bench_rows_each_under_the_masks_it_is_defined_for(tmp_path):
    # Tiny sizes, one repeat: which rows exist and which engine runs them (no timing is read).
    assert {"normalizer=sinkhorn", "normalizer=power", "aggregator=laser", "position=cope"} <= set(bench.FULL_VARIANTS)
    variants = "normalizer=sinkhorn;normalizer=power;aggregator=laser;normalizer=stick_breaking;position=cope"
    args = ["bench", "--lengths", "32", "--variants", variants, "--json", "--out", str(tmp_path)]
    args += ["--heads", "2", "--head-dim", "8", "--repeats", "1", "--threads", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output.strip().splitlines()[-1])["rows"]
    auto = {(r["variant"], r["causal"]): r["engine"] for r in rows if r["engine"] not in ("reference",)}
    auto = {key: engine for key, engine in auto.items() if not engine.startswith("x-transformers")}
    assert (
        auto
        == {
            ("normalizer=sinkhorn", False): "reference",  # the queries are coupled: no chunked or fast engine
            ("normalizer=power", True): "rowwise",
            ("normalizer=power", False): "rowwise",
            ("aggregator=laser", True): "sdpa",  # exp(v - m) in, m + log(.) out: the weighted sum is SDPA's
            ("aggregator=laser", False): "sdpa",
            ("normalizer=stick_breaking", True): "rowwise",
            ("position=cope", True): "sdpa",  # CoPE's bias, computed from q and k, is a float bias SDPA adds
            ("standard", True): "sdpa",
            ("standard", False): "sdpa",
        }
        or auto
    )


def test_the_transports_are_bench_rows_and_the_state_transports_run_on_the_recurrent_engine(tmp_path):
    # Tiny sizes, one repeat: which rows exist and which engine runs them (no timing is read).
    from axiomformer.spec import AXES

    transports = [v for v in bench.FULL_VARIANTS if v.startswith("transport=")]
    assert {v.split(",")[0].split("=")[1] for v in transports} == set(AXES["transport"][1:])
    args = ["bench", "--lengths", "32", "--variants", ";".join(transports), "--json", "--out", str(tmp_path)]
    args += ["--heads", "2", "--head-dim", "8", "--repeats", "1", "--threads", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output.strip().splitlines()[-1])["rows"]
    engines: dict[str, set] = {}
    for r in rows:
        if r["causal"] and not r["engine"].startswith("x-transformers") and r["variant"] != "standard":
            engines.setdefault(r["variant"], set()).add(r["engine"])
    assert engines == {
        "normalizer=none,transport=decay": {"recurrent", "reference"},
        "transport=householder": {"chunked_transport", "reference"},  # PaTH's blockwise softmax
        "normalizer=none,transport=decay_householder": {"recurrent", "reference"},
        "normalizer=none,transport=diag_decay_householder": {"recurrent", "reference"},
    }


def test_every_new_choice_has_a_goal_bearing_row_and_the_goals_are_the_issues():
    from axiomformer.spec import AXES

    quick = set(bench.QUICK_VARIANTS)
    for axis in ("transport", "select"):
        named = {v.split(",")[0].split("=")[1] for v in quick if v.startswith(f"{axis}=")}
        assert named == set(AXES[axis][1:]), axis
    assert {"position=short_conv", "kv_latent=128"} <= quick
    for variant in bench.QUICK_VARIANTS:  # every goal row <= 1.5x SDPA at both lengths, or a stricter goal
        for length in (1024, 4096):
            goal = bench.time_goal(variant, length)
            assert goal is None or goal <= 1.5, (variant, length, goal)
            assert bench.memory_goal(variant, length) == (2.0 if length >= 4096 else None), variant
    for variant in bench.TRANSPORT_ROWS:  # no slower than SDPA at 4096
        assert bench.time_goal(variant, 4096) == 1.0
    assert all(bench.time_goal(v, 4096) == 1.5 for v in quick if v.startswith("select="))


def test_a_row_carries_its_goals_and_the_report_reads_them():
    fast = bench.Row("normalizer=sparsemax", "sparse", 4096, True, 1.4, 1.0, 1.4, 10.0, 6.0, (1.3, 1.5))
    fat = bench.Row("normalizer=sparsemax", "sparse", 1024, True, 1.6, 1.0, 1.6, 30.0, 6.0, (1.5, 1.7))
    slow = bench.Row("transport=householder", "chunked_transport", 4096, True, 2.0, 1.0, 2.0, 10.0, 6.0)
    assert (fast.time_goal, fast.memory_goal, fast.goal_met) == (1.5, 2.0, True)
    assert (fat.time_goal, fat.memory_goal, fat.goal_met) == (1.5, None, False)
    assert (slow.time_goal, slow.goal_met) == (1.0, False)
    ref = bench.Row("normalizer=sparsemax", "reference", 1024, True, 9.0, 1.0, 9.0, 99.0, 6.0)
    assert ref.goal_met is None and ref.time_goal is None
    report = "\n".join(bench.goal_report([fast, fat, slow, ref]))
    assert "normalizer=sparsemax: time <= 1.5x SDPA: NOT met (worst 1.60x at L=1024" in report
    assert "transport=householder: no slower than causal SDPA at L>=4096: NOT met" in report
    assert "normalizer=sparsemax: peak memory <= 2.0x SDPA at L>=4096: met (L=4096: 1.67x)" in report
    # a row spells its variant in the spec's order (normalizer before transport), the goal table in the issue's: the
    # goal still applies (a quiet run's three delta-rule rows had no goal line when the lookup compared the strings)
    decay = bench.Row("normalizer=none,transport=decay", "recurrent", 4096, True, 1.1, 1.0, 1.1, 30.0, 6.0)
    assert "transport=decay,normalizer=none" in bench.TRANSPORT_ROWS
    assert (decay.time_goal, decay.memory_goal, decay.goal_met) == (1.0, 2.0, False)
    assert "transport=decay,normalizer=none: no slower than causal SDPA at L>=4096: NOT met" in "\n".join(
        bench.goal_report([decay])
    )


def test_the_ratio_interval_is_the_t_interval_of_the_paired_log_ratios():
    from statsmodels.stats.weightstats import DescrStatsW

    g = torch.Generator().manual_seed(0)
    b = (1 + torch.rand(9, generator=g)).tolist()
    a = [2 * y * float(1 + 0.1 * torch.randn((), generator=g)) for y in b]  # a / b about 2, paired noise
    low, high = bench.ratio_interval(a, b)
    logs = [math.log(x / y) for x, y in zip(a, b)]
    want = DescrStatsW(logs).tconfint_mean(alpha=0.05)
    assert (low, high) == pytest.approx((math.exp(want[0]), math.exp(want[1])), abs=1e-4)
    assert low < 2 < high
    assert all(math.isnan(x) for x in bench.ratio_interval([1.0], [2.0]))


def test_a_first_timed_pair_that_is_still_warming_up_is_dropped_and_retimed(monkeypatch):
    clock = iter([5.0] + [1.0] * 40)  # the first timed call of a is 5x the others: a warm-up outlier
    monkeypatch.setattr(bench, "_timed", lambda call, device: next(clock))
    a, b, dropped = bench.interleaved_times(lambda: None, lambda: None, torch.device("cpu"), repeats=7)
    assert dropped == 1 and len(a) == len(b) == 7 and max(a) == 1.0
    steady = iter([1.0] * 40)
    monkeypatch.setattr(bench, "_timed", lambda call, device: next(steady))
    assert bench.interleaved_times(lambda: None, lambda: None, torch.device("cpu"), repeats=7)[2] == 0
