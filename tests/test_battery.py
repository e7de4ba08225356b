"""The task battery (issue 32): ceilings against brute-force posteriors, the validity controls, the symmetric verdict
rule, solve-rate intervals against Newcombe's published table, lr sensitivity and the A/A control on planted stores.
No test requires a model to win or lose: planted numbers decide, and each check is compared with values computed
independently here."""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from axiomformer.cli import app
from axiomformer.models.controls import ControlLM, causal_mean
from axiomformer.study import ResultsStore
from axiomformer.study.battery import loss_still_falling
from axiomformer.study.statistics import PairedItem, VerdictRule, agrees, newcombe_difference, solve_rate_comparison
from axiomformer.tasks import TASKS, make_task
from axiomformer.tasks.base import IGNORE
from axiomformer.tasks.multiset import MAJORITY_WEIGHT, MajorityTask, majority_posterior
from axiomformer.tasks.order import SortTask


# ---------------------------------------------------------------------------------------------------- ceilings
def brute_force_ceiling(inputs: np.ndarray, targets: np.ndarray) -> float:
    """The best causal accuracy on these rows, by brute force: group every scored position by its prefix and count
    the most frequent target of each group (the empirical Bayes predictor; exact when the groups are the whole
    example space)."""
    groups: dict[tuple, Counter] = defaultdict(Counter)
    for row, target in zip(inputs, targets, strict=True):
        for t in range(len(row)):
            if target[t] != IGNORE:
                groups[(t, *row[: t + 1])][int(target[t])] += 1
    total = sum(sum(c.values()) for c in groups.values())
    return sum(max(c.values()) for c in groups.values()) / total


SMALL = {
    "copy": {"seq_len": 6, "vocab": 2},
    "mqar": {"seq_len": 8, "vocab": 4, "num_pairs": 1},
    "induction": {"seq_len": 5, "vocab": 2},
    "selective_copy": {"seq_len": 6, "vocab": 2, "num_tokens": 2},
    "sort_causal": {"seq_len": 7, "num_symbols": 2},
    "needle": {"seq_len": 5, "num_keys": 2, "num_filler": 2},
    "needle_kv": {"seq_len": 7, "num_keys": 3, "num_filler": 1, "pairs": 2},
}
"""Small instances whose example spaces are sampled many times over, so that prefixes repeat."""


@pytest.mark.parametrize("name", sorted(n for n, cls in TASKS.items() if cls.prefix_determined))
def test_a_prefix_determined_ceiling_matches_the_brute_force_posterior(name):
    assert name in SMALL, f"add a small instance of {name} to SMALL: every prefix-determined task is checked"
    options = dict(SMALL[name])
    task = make_task(name, seq_len=options.pop("seq_len"), **options)
    x, y = task.sample(np.random.default_rng(0), 20_000)
    claimed = task.ceiling(torch.from_numpy(x), torch.from_numpy(y))
    assert claimed is not None and claimed.method == "exact"
    assert claimed.value == brute_force_ceiling(x, y) == 1.0


def test_a_wrong_ceiling_claim_is_caught_by_the_brute_force_check():
    class Planted(SortTask):  # claims its targets are read from the prefix: sort's depend on the future
        prefix_determined = True

    task = Planted(seq_len=4, num_symbols=2)
    x, y = task.sample(np.random.default_rng(0), 20_000)
    assert task.ceiling(torch.from_numpy(x), torch.from_numpy(y)).value == 1.0
    assert brute_force_ceiling(x, y) < 0.95


def _exact_majority(num_symbols: int, seq_len: int) -> dict[tuple, np.ndarray]:
    """The exact posterior of the majority target for every prefix, by enumerating every row of the generator."""
    weight: dict[tuple, float] = {}
    for row in itertools.product(range(num_symbols), repeat=seq_len):
        counts = np.bincount(row, minlength=num_symbols)
        top = np.sort(counts)
        if top[-1] == top[-2]:
            continue  # a tied mode is redrawn
        weight[row] = sum(MAJORITY_WEIGHT ** counts[f] for f in range(num_symbols))  # shared normalizer left out
    posterior: dict[tuple, np.ndarray] = defaultdict(lambda: np.zeros(num_symbols))
    for row, w in weight.items():
        mode = int(np.argmax(np.bincount(row, minlength=num_symbols)))
        for t in range(seq_len):
            posterior[row[: t + 1]][mode] += w
    return {k: v / v.sum() for k, v in posterior.items()}


def test_the_majority_ceiling_matches_the_exact_posterior_on_a_small_instance():
    s, n = 3, 5
    exact = _exact_majority(s, n)
    rng = np.random.default_rng(0)
    for prefix, post in exact.items():  # the Monte Carlo posterior against the enumeration, prefix by prefix
        counts = np.bincount(prefix, minlength=s)[None, :]
        estimate = majority_posterior(counts, n - len(prefix), s, rng, 4000)[0]
        assert np.abs(estimate - post).max() < 0.03, (prefix, estimate, post)
    task = MajorityTask(seq_len=n, num_symbols=s)
    x, y = task.sample(np.random.default_rng(1), 3000)
    bayes = np.mean(
        [exact[tuple(row[: t + 1])].argmax() == target[t] for row, target in zip(x, y, strict=True) for t in range(n)]
    )
    found = task.ceiling(torch.from_numpy(x), torch.from_numpy(y))
    assert found.method == "monte carlo" and abs(found.value - bayes) < 0.01 + 3 * found.error
    prefix_majority = np.mean(
        [
            np.bincount(row[: t + 1], minlength=s).argmax() == target[t]
            for row, target in zip(x, y, strict=True)
            for t in range(n)
        ]
    )
    assert prefix_majority <= bayes + 1e-9  # the Bayes predictor is never beaten by a heuristic on its own items


# ---------------------------------------------------------------------------------------------------- controls
def test_causal_mean_is_the_mean_of_each_prefix():
    v = torch.randn(2, 7, 3, dtype=torch.float64)
    expected = torch.stack([v[:, : i + 1].mean(dim=1) for i in range(7)], dim=1)
    torch.testing.assert_close(causal_mean(v), expected)


@pytest.mark.parametrize("kind", ["no_mixing", "uniform_mixing"])
def test_controls_are_causal_and_mix_only_as_stated(kind):
    torch.manual_seed(0)
    model = ControlLM(kind, vocab_size=10, dim=8, num_layers=2, max_len=12).double().eval()
    ids = torch.randint(0, 10, (1, 12))
    future = ids.clone()
    future[0, 8:] = (future[0, 8:] + 1) % 10
    past = ids.clone()
    past[0, 2] = (past[0, 2] + 1) % 10
    base, changed_future, changed_past = model(ids), model(future), model(past)
    torch.testing.assert_close(base[:, :8], changed_future[:, :8])  # no future token reaches position < 8
    reaches = (base[0, 5] - changed_past[0, 5]).abs().max() > 1e-9
    assert reaches == (kind == "uniform_mixing")  # only uniform mixing carries token 2 to position 5


def test_a_bidirectional_uniform_control_averages_the_whole_row():
    from axiomformer.models.controls import row_mean

    v = torch.randn(2, 7, 3, dtype=torch.float64)
    torch.testing.assert_close(row_mean(v), v.mean(dim=1, keepdim=True).expand(2, 7, 3))
    torch.manual_seed(0)
    model = ControlLM("uniform_mixing", vocab_size=10, dim=8, num_layers=1, max_len=12, causal=False).double().eval()
    ids = torch.randint(0, 10, (1, 12))
    future = ids.clone()
    future[0, 10] = (future[0, 10] + 1) % 10
    assert (model(ids)[0, 0] - model(future)[0, 0]).abs().max() > 1e-9  # a later token reaches position 0
    causal = ControlLM("uniform_mixing", vocab_size=10, dim=8, num_layers=1, max_len=12).double().eval()
    causal.load_state_dict(model.state_dict())  # the same weights, causal: the planted leak is absent
    torch.testing.assert_close(causal(ids)[0, :10], causal(future)[0, :10])


def test_a_control_without_positions_is_permutation_equivariant_on_the_whole_row():
    """The rho suite's controls (bidirectional, no input encoding): permuting the row permutes the outputs (A0); the
    same weights with the sinusoidal encoding are not (the check fails where a position signal is left in)."""
    torch.manual_seed(0)
    free = ControlLM("uniform_mixing", 10, 8, 1, 12, mlp_ratio=0, causal=False, input_position="none").double().eval()
    encoded = ControlLM("uniform_mixing", 10, 8, 1, 12, mlp_ratio=0, causal=False).double().eval()
    encoded.load_state_dict(free.state_dict())
    ids = torch.randint(0, 10, (1, 12))
    order = torch.randperm(12)
    torch.testing.assert_close(free(ids[:, order]), free(ids)[:, order])
    assert (encoded(ids[:, order]) - encoded(ids)[:, order]).abs().max() > 1e-6
    assert free.config["input_position"] == "none" and "input_position" not in encoded.config
    from axiomformer.models import build_from_config

    rebuilt = build_from_config(free.config).double().eval()  # what a checkpoint stores rebuilds the same control
    rebuilt.load_state_dict(free.state_dict())
    torch.testing.assert_close(rebuilt(ids), free(ids))
    with pytest.raises(ValueError, match="sinusoidal, none"):
        ControlLM("no_mixing", 4, 8, 1, 4, input_position="learned")
    from axiomformer.train import _control_position

    with pytest.raises(ValueError, match="auto, sinusoidal or none"):  # the trainer refuses, not maps, the others
        _control_position("rope")


def test_a_control_refuses_bad_sizes_naming_the_choices():
    with pytest.raises(ValueError, match="no_mixing, uniform_mixing"):
        ControlLM("attention", vocab_size=4, dim=8, num_layers=1, max_len=4)
    with pytest.raises(ValueError, match="even"):
        ControlLM("no_mixing", vocab_size=4, dim=7, num_layers=1, max_len=4)


def test_init_stream_changes_the_initial_weights_and_nothing_else():
    from axiomformer.train import TrainConfig, train

    base = dict(
        task="copy",
        seq_len=8,
        task_options={"vocab": 4},
        dim=16,
        heads=2,
        layers=1,
        steps=2,
        eval_every=2,
        eval_batches=1,
        device="cpu",
    )
    a, b = TrainConfig(**base), TrainConfig(**base, init_stream=1)
    assert a.init_seed == a.seed and b.init_seed != b.seed and b.init_seed < 2**32
    ra, rb = train(a, progress=False), train(b, progress=False)
    assert ra.losses[0] != rb.losses[0]  # another initialization...
    assert ra.config["seed"] == rb.config["seed"]  # ...on the same seed, so the same batches in the same order


# ---------------------------------------------------------------------------------------------------- statistics
NEWCOMBE_1998 = [  # Newcombe (1998), Statistics in Medicine 17:873-890, Table II, method 10 (hybrid score)
    ((56, 70, 48, 80), (0.0524, 0.3339)),
    ((9, 10, 3, 10), (0.1705, 0.8090)),
    ((6, 7, 2, 7), (0.0582, 0.8062)),
    ((5, 56, 0, 29), (-0.0381, 0.1926)),
    ((0, 10, 0, 20), (-0.1611, 0.2775)),
    ((10, 10, 0, 20), (0.6791, 1.0000)),
]


@pytest.mark.parametrize(("counts", "published"), NEWCOMBE_1998)
def test_the_solve_rate_interval_matches_newcombes_published_table(counts, published):
    found = newcombe_difference(*counts, level=0.95)
    assert (found.low, found.high) == pytest.approx(published, abs=1e-4)
    assert found.high > found.low  # never of zero width, even at 0/10 against 0/20


def test_solve_rate_comparison_counts_a_diverged_run_as_not_solved():
    item = PairedItem("A4", "A4=cosine", "mqar@16", [1.0] * 7 + [float("nan")], [1.0] * 8)
    v = solve_rate_comparison(item, threshold=0.9, rule=VerdictRule(margin=0.25))
    assert v.diff == pytest.approx(-1 / 8) and v.metric == "solve_rate" and agrees(v.to_dict())
    low, high = newcombe_difference(7, 8, 8, 8, 0.95).low, newcombe_difference(7, 8, 8, 8, 0.95).high
    assert (v.ci_low, v.ci_high) == pytest.approx((low, high))


def test_loss_still_falling_tells_a_falling_curve_from_a_flat_one():
    rng = np.random.default_rng(0)
    flat = list(1.0 + rng.normal(0, 0.01, 400))
    falling = list(np.linspace(2.0, 1.0, 400) + rng.normal(0, 0.01, 400))
    assert loss_still_falling(falling) and not loss_still_falling(flat)
    assert not loss_still_falling([float("nan")] * 100)  # a diverged run is not "still improving"


# ---------------------------------------------------------------------------------------------------- planted stores
LABELS = {
    "standard": "transformer",
    "A4=cosine": "transformer",
    "A5=sigmoid": "transformer",
    "no_mixing": "no_mixing",
    "uniform_mixing": "uniform_mixing",
    "standard (A/A)": "transformer",
}
SEEDS = 8


def _config(tasks: list[dict]) -> dict:
    return {
        "suite": "main",
        "name": "planted",
        "seeds": SEEDS,
        "min_seeds": SEEDS,
        "selection_seeds": [1000, 1001],
        "margin": 0.02,
        "solve_margin": 0.25,
        "solve_threshold": 0.9,
        "variants": ["standard", "A4=cosine", "A5=sigmoid"],
        "baselines": [],
        "controls": ["no_mixing", "uniform_mixing"],
        "aa_control": True,
        "lr_check": True,
        "primary": ["A4=cosine", "A5=sigmoid"],
        "tasks": tasks,
        "budget": {"lr_grid": [1e-3, 3e-3]},
        "sections": {"audit": False, "derive": False, "flow": False},
    }


def _row(label: str, task: str, seed: int, lr: float, accuracy: float, cpu: float = 1.0) -> dict:
    tc = {
        "task": task,
        "seq_len": 8,
        "model": LABELS[label],
        "lr": lr,
        "steps": 100,
        "batch_size": 8,
        "eval_batches": 2,
        "seed": seed,
    }
    return {
        "key": f"{label}|{task}@8|seed={seed}|lr={lr}",
        "label": label,
        "model": LABELS[label],
        "spec": label,
        "assumptions": {},
        "task": task,
        "seq_len": 8,
        "task_config": {"chance": 0.125},
        "seed": seed,
        "dim": 16,
        "layers": 1,
        "heads": 2,
        "params": 100,
        "accuracy": accuracy,
        "loss": 0.1,
        "cpu_seconds": cpu,
        "losses": [0.1] * 50,
        "train_config": tc,
        "outcome": {
            "lr": lr,
            "val_accuracy": accuracy,
            "val_loss": 1.0,
            "stop_reason": "target",
            "n_test": 64,
            "history": [{"step": 50, "accuracy": accuracy, "loss": 0.1}],
        },
    }


def planted(
    path,
    values: dict[tuple[str, str], list[float]],
    second: dict[tuple[str, str], list[float]] | None = None,
    metrics: dict[str, str] | None = None,
):
    """A store: reported runs at lr 1e-3 (the rate selection picks: its selection runs score 0.9 against 0.5) with
    the given accuracies per (label, task), the second-best rate's runs from ``second`` (default: the same values),
    and an exact ceiling of 1 for every task."""
    tasks = sorted({t for _, t in values})
    config = _config([{"name": t, "seq_lens": [8], "metric": (metrics or {}).get(t, "accuracy")} for t in tasks])
    with ResultsStore(path) as store:
        store.set_meta("config", config)
        store.set_meta("models", [{"label": m, "kind": k, "spec": m} for m, k in LABELS.items()])
        store.put_section(
            "ceilings",
            {
                f"{t}@8": {
                    "ceiling": 1.0,
                    "ceiling_method": "exact",
                    "ceiling_error": 0.0,
                    "note": "planted",
                    "n_items": 64,
                }
                for t in tasks
            },
        )
        for (label, task), accs in values.items():
            if label != "standard (A/A)":
                for seed in (1000, 1001):
                    store.add_run(_row(label, task, seed, 1e-3, 0.9))
                    store.add_run(_row(label, task, seed, 3e-3, 0.5))
            for seed, acc in enumerate(accs):
                store.add_run(_row(label, task, seed, 1e-3, acc, cpu=2.0))
            if label in ("A4=cosine", "A5=sigmoid"):
                for seed, acc in enumerate((second or {}).get((label, task), accs)):
                    store.add_run(_row(label, task, seed, 3e-3, acc))
    return path


def _report(path) -> dict:
    """The report's files rebuilt (``report``), then its JSON (``report --json``, which writes nothing)."""
    built = CliRunner().invoke(app, ["report", str(path)])
    assert built.exit_code == 0, built.output
    result = CliRunner().invoke(app, ["report", str(path), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _battery(rng, task: str, *, uniform: float, a4: float, a5_noise: float = 0.002, aa: float = 0.0) -> dict:
    ref = np.clip(rng.normal(0.95, 0.01, SEEDS), 0, 1)
    return {
        ("standard", task): list(ref),
        ("A4=cosine", task): list(ref + a4 + rng.normal(0, 0.002, SEEDS)),
        ("A5=sigmoid", task): list(ref + rng.normal(0, a5_noise, SEEDS)),
        ("no_mixing", task): list(rng.normal(0.12, 0.01, SEEDS)),
        ("uniform_mixing", task): list(np.clip(rng.normal(uniform, 0.01, SEEDS), 0, 1)),
        ("standard (A/A)", task): list(ref + aa + rng.normal(0, 0.002, SEEDS)),
    }


def test_planted_battery_design_answer_and_the_symmetric_rule(tmp_path):
    rng = np.random.default_rng(0)
    values = _battery(rng, "copy", uniform=0.6, a4=-0.01) | _battery(rng, "mqar", uniform=0.95, a4=-0.2)
    answer = _report(planted(tmp_path / "s", values))
    tasks = {t["task"]: t for t in answer["design"]["tasks"]}
    assert tasks["copy@8"]["discriminates"] and not tasks["mqar@8"]["discriminates"]
    assert "uniform mixing" in tasks["mqar@8"]["why"]
    for t in tasks.values():
        assert set(t) >= {"task", "chance", "ceiling", "ceiling_method", "controls", "standard", "discriminates", "why"}
        assert t["ceiling"] >= t["standard"]
        assert t["controls"]["uniform_mixing"] == pytest.approx(np.mean(values[("uniform_mixing", t["task"][:-2])]))
    verdicts = {(v["model"], v["task"]): v for v in answer["verdicts"]}
    a4 = verdicts[("A4=cosine", "copy@8")]
    assert -0.02 < a4["ci_low"] and a4["ci_high"] < 0  # inside the margin and excluding 0...
    assert a4["verdict"] == "free"  # ...is free under the symmetric rule
    assert all(agrees(v) and {"metric", "lr_sensitive"} <= set(v) for v in answer["verdicts"])
    assert answer["answer"] == {
        "A4": {"copy@8": "free"},
        "A5 (normalizer)": {"copy@8": verdicts[("A5=sigmoid", "copy@8")]["verdict"]},
    }
    assert set(answer["control_answer"]["A4"]) == {"mqar@8"}  # a task that does not discriminate: reported apart
    with ResultsStore(tmp_path / "s", readonly=True) as store:
        assert answer["cpu_seconds"] == pytest.approx(sum(r.cpu_seconds for r in store.runs()))
    report = (tmp_path / "s" / "report.md").read_text()
    assert report.index("| assumption | relaxation | copy@8 |") < report.index("### Can each task answer?")


def test_planted_lr_sensitivity_is_caught_where_it_was_planted(tmp_path):
    rng = np.random.default_rng(1)
    values = _battery(rng, "copy", uniform=0.6, a4=0.0)
    second = {
        ("A4=cosine", "copy"): list(np.array(values[("standard", "copy")]) - 0.3),
        ("A5=sigmoid", "copy"): values[("A5=sigmoid", "copy")],
    }
    answer = _report(planted(tmp_path / "s", values, second))
    verdicts = {v["model"]: v for v in answer["verdicts"]}
    assert verdicts["A4=cosine"]["verdict"] == "free" and verdicts["A4=cosine"]["lr_sensitive"] is True
    assert verdicts["A5=sigmoid"]["lr_sensitive"] is False
    assert "lr-sensitive" in (tmp_path / "s" / "report.md").read_text()


def test_planted_aa_control_a_sound_design_is_never_forced_and_a_broken_one_is_said_first(tmp_path):
    rng = np.random.default_rng(2)
    sound = _report(planted(tmp_path / "a", _battery(rng, "copy", uniform=0.6, a4=0.0)))["aa_control"]
    assert sound["verdict"] in ("free", "inconclusive") and not sound["broken"]
    assert all(agrees(v) for v in sound["tasks"])
    assert sound["tasks"] and {v["family"] for v in sound["tasks"]} == {
        "aa_control"
    }  # its own family, never the answer
    broken = _report(planted(tmp_path / "b", _battery(rng, "copy", uniform=0.6, a4=0.0, aa=-0.1)))["aa_control"]
    assert broken["verdict"] == "forced" and broken["broken"]
    report = (tmp_path / "b" / "report.md").read_text()
    assert report.index("the design is broken") < report.index("| assumption | relaxation |")


def test_planted_solve_rate_task_uses_newcombe_on_solved_runs(tmp_path):
    rng = np.random.default_rng(3)
    values = _battery(rng, "induction", uniform=0.2, a4=0.0)
    values[("A4=cosine", "induction")] = [1.0] * 2 + [0.2] * 6  # 2 of 8 solve, against 8 of 8
    answer = _report(planted(tmp_path / "s", values, metrics={"induction": "solve_rate"}))
    v = {x["model"]: x for x in answer["verdicts"]}["A4=cosine"]
    assert v["metric"] == "solve_rate" and v["ci_method"].startswith("Newcombe")
    expected = newcombe_difference(2, 8, 8, 8, v["ci_level"])
    assert (v["ci_low"], v["ci_high"]) == pytest.approx((expected.low, expected.high)) and agrees(v)


# ---------------------------------------------------------------------------------------------------- the run record
def test_the_store_columns_are_the_run_record_fields_and_a_malformed_row_is_refused(tmp_path):
    from pydantic import ValidationError

    from axiomformer.study.record import RunRecord

    with ResultsStore(tmp_path / "s") as store:
        columns = [r[1] for r in store.conn.execute("PRAGMA table_info(runs)")]
        assert columns == list(RunRecord.model_fields)
        good = _row("standard", "copy", 0, 1e-3, 0.9) | {"finished_at": None}  # as a fresh record has it
        assert store.add_run(good) and not store.add_run(good)  # stored once: an existing key is the only skip
        bad = _row("standard", "copy", 1, 1e-3, 0.9) | {"seed": "one"}
        with pytest.raises(ValidationError, match="seed"):
            store.add_run(bad)
        with pytest.raises(ValidationError, match="unknown_field"):
            store.add_run(_row("standard", "copy", 2, 1e-3, 0.9) | {"unknown_field": 1})
        (back,) = store.runs()  # nothing half-written; what comes back is the validated record
        assert RunRecord.model_validate(back.row()) == back and back.outcome.n_test == 64


def test_a_run_record_comes_back_from_the_store_as_the_same_typed_record(tmp_path):
    from axiomformer.study.record import RunOutcome, RunRecord

    record = RunRecord.model_validate(
        _row("standard", "copy", 0, 1e-3, 0.9) | {"finished_at": "2026-12-02T00:00:00+00:00"}
    )
    record = record.model_copy(update={"outcome": RunOutcome(val_accuracy=0.8, extra={"end": {"x": 1}}, probe=2)})
    with ResultsStore(tmp_path / "s") as store:
        assert store.add_run(record)
        (back,) = store.runs()
    assert isinstance(back, RunRecord) and back == record
    assert back.outcome.extra == {"end": {"x": 1}} and back.outcome.model_extra == {"probe": 2}


def test_a_malformed_stored_row_is_reported_naming_its_key_and_the_field(tmp_path):
    from axiomformer.study.store import StoreError

    with ResultsStore(tmp_path / "s") as store:
        store.add_run(_row("standard", "copy", 0, 1e-3, 0.9))
        # a row written past the record (by hand, or by another tool): its seed is not an integer
        store.conn.execute("UPDATE runs SET seed = 'one'")
        with pytest.raises(StoreError, match=r"'standard\|copy@8\|seed=0\|lr=0.001' is malformed: seed: "):
            store.runs()


def test_the_stored_config_reads_back_as_the_study_config_it_was_written_from(tmp_path):
    from axiomformer.study.config import stored_config
    from axiomformer.study.sweep import default_config

    config = default_config(quick=True)
    with ResultsStore(tmp_path / "s") as store:
        store.set_meta("config", config.model_dump())
        back = stored_config(store.get_meta("config"))
    assert back.config == config and back.migrations == ()


def test_an_older_stored_config_is_migrated_by_name_and_keeps_its_rules():
    from axiomformer.study.config import StudyConfigError, stored_config

    old = {"seeds": 3, "selection_seed": 0, "tasks": [{"name": "copy", "seq_lens": [8]}]}
    back = stored_config(old)
    assert back.migrations == ("selection_seed", "lr_widen")
    assert back.config.selection_seeds == [0] and back.config.lr_widen == 0  # what that version did
    with pytest.raises(StudyConfigError, match=r"\[stpes\] .*unknown key|unknown key 'stpes'"):
        stored_config(old | {"stpes": 1})


def test_the_median_steps_to_solve_counts_runs_that_never_solved_as_beyond_the_budget():
    """5 of 8 runs solve at 200, 250, 250, 400, 700 steps, 3 never: the median of all 8 (statistics.median with the
    3 at +inf) is 550, not the solved runs' 250; with fewer than half solving it lies beyond the budget (None)."""
    import math
    import statistics

    from axiomformer.study.battery import median_steps_to_solve

    steps = [200, 250, 250, 400, 700, None, None, None]
    expected = statistics.median([math.inf if s is None else s for s in steps])
    assert median_steps_to_solve(steps) == expected == 550
    assert median_steps_to_solve([100, None, None]) is None
    assert median_steps_to_solve([100, 300, None]) == 300
    assert median_steps_to_solve([]) is None
