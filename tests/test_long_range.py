"""The long-range suite's evidence: disjoint splits at every length, the several-pair needle a latch cannot solve, the
exact interval behind "solved", and the zero-shot runs of the curriculum."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import beta

from axiomformer.study import validate_config
from axiomformer.study.long_range_report import SeedResult, exact_interval, zero_shot_label
from axiomformer.study.record import RunOutcome, RunRecord
from axiomformer.study.suites import get_suite
from axiomformer.study.sweep import AA_LABEL
from axiomformer.tasks import base as task_base
from axiomformer.tasks import make_task, row_hash


def shared_sequences(task, batches: int = 6, batch_size: int = 16) -> dict[tuple[str, str], int]:
    """How many input sequences two splits of ``task`` have in common (by exact content), per pair of splits."""
    seen = {}
    for split in ("train", "val", "test"):
        rows = set()
        for seed in range(batches):
            inputs, _ = task.batch(batch_size, seed=seed, split=split)
            rows.update(tuple(row) for row in inputs.tolist())
        seen[split] = rows
    return {(a, b): len(seen[a] & seen[b]) for a, b in (("train", "val"), ("train", "test"), ("val", "test"))}


LONG_RANGE_TASKS = [
    ("needle", {"shared": False}),
    ("needle", {"pairs": 4}),
    ("needle_kv", {}),
    ("needle", {"shared": True}),
    ("mqar", {"vocab": 32, "pairs_per_token": 1 / 640}),
]


@pytest.mark.parametrize("name,options", LONG_RANGE_TASKS)
@pytest.mark.parametrize("seq_len", [12, 64])
def test_train_val_and_test_never_share_a_sequence(name, options, seq_len):
    # short lengths, where collisions are likeliest (12 tokens: few distinct sequences); longer ones split the same way
    task = make_task(name, seq_len=seq_len, **options)
    assert shared_sequences(task) == {("train", "val"): 0, ("train", "test"): 0, ("val", "test"): 0}


def test_the_disjointness_check_catches_a_split_that_leaks(monkeypatch):
    task = make_task("needle", seq_len=8, shared=True, num_keys=3)  # a tiny example space: repeats are certain
    monkeypatch.setattr(task_base, "in_split", lambda rows, split: np.ones(len(rows), dtype=bool))
    leaks = shared_sequences(task, batches=20, batch_size=32)
    assert all(n > 0 for n in leaks.values()), leaks


def test_the_split_is_a_function_of_the_sequence_alone():
    task = make_task("needle", seq_len=10_000, pairs=4)
    for split in ("val", "test"):
        inputs, _ = task.batch(4, seed=0, split=split)
        assert set(task_base.held_out_part(inputs.numpy())) == {split}
        assert (row_hash(inputs.numpy()) % np.uint64(task_base.EVAL_BUCKETS) == 0).all()


def test_several_pair_needle_asks_one_of_its_keys_and_a_latch_scores_about_one_in_p():
    p, k = 4, 16
    task = make_task("needle_kv", seq_len=40, pairs=p, num_keys=k)
    inputs, targets = task.batch(2000, seed=1, split="train")
    x, y = inputs.numpy(), targets.numpy()
    assert (y[:, :-1] == -100).all()
    latch_right = 0
    for row, target in zip(x, y[:, -1]):
        body = row[:-1]
        key_positions = np.flatnonzero(body < k)
        assert len(key_positions) == p and len(set(body[key_positions])) == p  # p distinct keys, nothing else
        assert np.all(np.diff(key_positions) >= 2)  # pairs do not overlap
        assert np.all((body[key_positions + 1] >= k) & (body[key_positions + 1] < 2 * k))
        asked = np.flatnonzero(body == row[-1])
        assert len(asked) == 1 and target == body[asked[0] + 1]  # the value after the asked key
        latch_right += int(body[key_positions[0] + 1] == target)  # a latch: keep the first value
    assert abs(latch_right / len(x) - (1 / p + (1 - 1 / p) / k)) < 0.035  # values may coincide


def test_several_pair_needle_rejects_what_cannot_be_built():
    with pytest.raises(ValueError, match="shared=False"):
        make_task("needle", seq_len=64, pairs=2, shared=True)
    with pytest.raises(ValueError, match="num_keys"):
        make_task("needle", seq_len=64, pairs=5, num_keys=4)
    with pytest.raises(ValueError, match="do not fit"):
        make_task("needle", seq_len=6, pairs=3)


def test_one_pair_is_the_original_needle():
    # pairs=1 keeps the original generator: the same batches as before the option existed
    a = make_task("needle", seq_len=64).batch(8, seed=5, split="test")
    b = make_task("needle", seq_len=64, pairs=1).batch(8, seed=5, split="test")
    assert all((u == v).all() for u, v in zip(a, b))


@pytest.mark.parametrize("k,n", [(100, 100), (95, 100), (0, 24), (24, 24), (37, 120)])
def test_exact_interval_is_clopper_pearson(k, n):
    low, high = exact_interval(k / n, n)
    assert low == pytest.approx(0.0 if k == 0 else beta.ppf(0.025, k, n - k + 1), abs=1e-9)
    assert high == pytest.approx(1.0 if k == n else beta.ppf(0.975, k + 1, n - k), abs=1e-9)
    assert exact_interval(0.5, None) is None and exact_interval(float("nan"), 10) is None


def _row(acc, n, stop="target") -> RunRecord:
    return RunRecord(
        key="k",
        label="standard",
        model="transformer",
        task="needle",
        seq_len=64,
        seed=0,
        dim=16,
        layers=1,
        accuracy=acc,
        steps=10,
        train_config={},
        outcome=RunOutcome(n_test=n, stop_reason=stop, converged=True),
    )


def test_solved_needs_the_lower_bound_above_the_line_not_the_point():
    assert SeedResult.of(_row(1.0, 100), 0.9).solved  # [0.964, 1]
    assert not SeedResult.of(_row(0.95, 100), 0.9).solved  # 0.95 >= 0.9, but the interval reaches 0.887
    assert not SeedResult.of(_row(1.0, 24), 0.9).solved  # 24/24: [0.858, 1]
    assert not SeedResult.of(_row(1.0, None), 0.9).solved  # unknown n: no interval, no claim
    diverged = SeedResult.of(_row(None, 100, stop="nonfinite"), 0.9)
    assert diverged.diverged and not diverged.solved and "diverged" in diverged.text()


def test_default_preset_meets_the_evidence_floor():
    # >= 400 scored test sequences per run at every length: one item moves the exact lower bound by about 0.002
    cfg = validate_config(get_suite("long-range").preset("default"))
    assert cfg.seeds >= 5 and min(cfg.selection_seeds) >= cfg.seeds  # selection seeds never reported
    assert cfg.aa_control and set(cfg.controls) == {"no_mixing", "uniform_mixing"}
    for task in cfg.tasks:
        assert max(task.seq_lens) == 10000
        for n in task.seq_lens:
            b = task.length_budgets[str(n)]
            assert (b.test_batches or b.eval_batches) * b.batch_size >= 400, (task.name, n)


def test_zero_shot_runs_start_from_the_shortest_length_and_train_nothing():
    from axiomformer.study.suites.long_range import stages

    cfg = validate_config(get_suite("long-range").preset("quick"))
    steps = stages(cfg)
    select = steps[0](None)
    stored = {
        r.key: _row(None, None).model_copy(update={"outcome": RunOutcome(val_accuracy=0.5, val_loss=1.0)})
        for r in select
    }
    reported = steps[1](stored)
    stored |= {r.key: _row(None, None).model_copy(update={"outcome": RunOutcome()}) for r in reported}
    longer = steps[2](stored)
    zero = [r for r in longer if r.model.label.endswith("only)")]
    warm = [r for r in longer if not r.model.label.endswith("only)")]
    asked = [r for r in warm if r.model.label != AA_LABEL and r.model.kind not in ("no_mixing", "uniform_mixing")]
    assert zero and len(zero) == len(asked) < len(warm)  # the controls and the A/A arm have no zero-shot run
    sources = {r.state_path for r in reported}
    for r in zero:
        assert r.train_config["steps"] == 0 and r.train_config["init_from"] in sources
        shortest = min(min(t.seq_lens) for t in cfg.tasks if t.name == r.task)
        assert r.model.label == zero_shot_label(r.model.label.split(" (")[0], shortest)
    # the warm start of the curriculum is from the previous length too, but its own label and budget
    assert all(r.train_config["steps"] > 0 for r in warm)


def lookup_answer(row: np.ndarray) -> int | None:
    """An independent reader of one needle sequence: the token after the one earlier occurrence of the query (the last
    token); ``None`` when the query occurs zero or several times before it (the answer is then not determined)."""
    earlier = np.flatnonzero(row[:-2] == row[-1])
    return int(row[earlier[0] + 1]) if len(earlier) == 1 else None


@pytest.mark.parametrize(
    "name,options", [("needle", {"shared": False}), ("needle", {"shared": True}), ("needle_kv", {})]
)
def test_needle_targets_are_fixed_by_the_prefix_so_the_ceiling_is_one(name, options):
    task = make_task(name, seq_len=48, **options)
    inputs, targets = task.batch(300, seed=2, split="test")
    x, y = inputs.numpy(), targets.numpy()
    assert all(lookup_answer(row) == t for row, t in zip(x, y[:, -1]))
    ceiling = task.ceiling(inputs, targets)
    assert ceiling is not None and ceiling.value == 1.0


def test_the_prefix_reader_catches_a_needle_whose_answer_is_not_determined():
    # Plant: a second occurrence of the asked key, followed by another value: the prefix no longer fixes the answer.
    task = make_task("needle_kv", seq_len=48)
    inputs, targets = task.batch(50, seed=2, split="test")
    x, y = inputs.numpy().copy(), targets.numpy()
    x[:, 0], x[:, 1] = x[:, -1], (y[:, -1] - task.num_keys + 1) % task.num_keys + task.num_keys
    assert not any(lookup_answer(row) == t for row, t in zip(x, y[:, -1]))


@pytest.mark.parametrize("pairs,keys", [(1, 16), (2, 16), (4, 16), (2, 4)])
def test_latch_accuracy_matches_a_simulated_latch(pairs, keys):
    # The latch keeps the last marked value it saw (a value token, K <= token < 2K) and answers it.
    task = make_task("needle", seq_len=40, pairs=pairs, num_keys=keys)
    inputs, targets = task.batch(4000, seed=3, split="train")
    x, y = inputs.numpy(), targets.numpy()[:, -1]
    last_value = np.array([row[:-1][(row[:-1] >= keys) & (row[:-1] < 2 * keys)][-1] for row in x])
    simulated = float((last_value == y).mean())
    assert abs(simulated - task.latch_accuracy) < 3 * np.sqrt(0.25 / len(x))
    # a wrong closed form (no chance term: 1/P) is off by (1 - 1/P)/K, outside the tolerance whenever P > 1
    if pairs > 1:
        assert abs(simulated - 1 / pairs) > 3 * np.sqrt(0.25 / len(x))
    assert np.isnan(make_task("needle", seq_len=40, shared=True).latch_accuracy)


_KINDS = {"lstm": "lstm", "gru": "gru", "no_mixing": "no_mixing", "uniform_mixing": "uniform_mixing"}


def _fake_study(accuracies: dict[tuple[str, str, int], list[float]], n: int, ceiling: float | None = 1.0):
    """A stand-in for ``report.StudyData``: what ``long_range_report``'s validity and solve-rate code reads."""
    from types import SimpleNamespace

    seeds = max(len(v) for v in accuracies.values())  # the standard's seeds, as if the preset ran that many
    cfg = validate_config(get_suite("long-range").preset("default") | {"seeds": seeds, "min_seeds": seeds})
    rows = []
    for (label, task, seq_len), values in accuracies.items():
        for seed, acc in enumerate(values):
            row = _row(acc, n).model_copy(update={"label": label, "task": task, "seq_len": seq_len, "seed": seed})
            rows.append(row)
    labels = dict.fromkeys(label for label, _, _ in accuracies)
    payload = {f"{t.name}@{s}": {"ceiling": ceiling, "ceiling_method": "exact"} for t in cfg.tasks for s in t.seq_lens}
    return SimpleNamespace(
        config=cfg,
        rows=rows,
        all_rows=rows,
        tasks=sorted({(t, s) for _, t, s in accuracies}),
        models=[SimpleNamespace(label=label, kind=_KINDS.get(label, "transformer")) for label in labels],
        sections={"ceilings": {"payload": payload}},
    )


def test_a_task_decides_only_when_every_standard_seed_solves_its_shortest_length():
    from axiomformer.study.long_range_report import task_validity

    def validity(values, n=400, ceiling=1.0):
        d = _fake_study({("standard", "needle_kv", 64): values, ("standard", "needle", 64): [1.0] * 3}, n, ceiling)
        return {v["task"]: v for v in task_validity(d, 0.9)}

    kv = validity([0.99, 0.98, 0.97])["needle_kv"]
    assert kv["decides"] and kv["tests"] == "recall" and kv["standard_solving_shortest"] == 3
    assert validity([0.99, 0.98, 0.97])["needle"]["tests"] == "retention"  # a latch solves the one-pair needle
    # 0.93 on 100 items has the point above 0.9 and the exact lower bound below it (0.861): not solved, no verdict
    assert not validity([0.99, 0.98, 0.93], n=100)["needle_kv"]["decides"]
    assert not validity([0.99, 0.98])["needle_kv"]["decides"]  # a seed missing
    assert not validity([0.99] * 3, ceiling=0.8)["needle_kv"]["decides"]
    assert not validity([0.99] * 3, ceiling=None)["needle_kv"]["decides"]


def test_the_validity_check_catches_a_solve_rule_on_the_point_estimate(monkeypatch):
    # Plant: "solved" read off the point accuracy; the 0.93-of-100 seed then passes and the task would decide.
    from axiomformer.study import long_range_report
    from axiomformer.study.long_range_report import task_validity

    real = SeedResult.of.__func__

    def on_the_point(cls, row, threshold):
        out = real(cls, row, threshold)
        out.solved = out.accuracy is not None and out.accuracy >= threshold
        return out

    d = _fake_study({("standard", "needle_kv", 64): [0.99, 0.98, 0.93]}, 100)
    assert not next(v for v in task_validity(d, 0.9) if v["task"] == "needle_kv")["decides"]
    monkeypatch.setattr(long_range_report.SeedResult, "of", classmethod(on_the_point))
    assert next(v for v in task_validity(d, 0.9) if v["task"] == "needle_kv")["decides"]


def test_solve_rate_comparisons_match_statsmodels_and_skip_tasks_that_do_not_decide():
    from statsmodels.stats.proportion import confint_proportions_2indep

    from axiomformer.study.long_range_report import solve_rate_comparisons

    acc = {
        ("standard", "needle", 64): [1.0] * 3,
        ("standard", "needle", 10000): [0.99, 0.99, 0.99],
        ("lstm", "needle", 10000): [0.99, 0.5, 0.5],
        ("standard", "needle_kv", 64): [0.5] * 3,  # not learned: needle_kv decides nothing
        ("standard", "needle_kv", 10000): [0.3] * 3,
        ("lstm", "needle_kv", 10000): [0.99] * 3,
    }
    found = solve_rate_comparisons(_fake_study(acc, 400), 0.9, 0.25)
    assert [(c["task"], c["model"]) for c in found] == [("needle", "lstm")]
    c = found[0]
    low, high = confint_proportions_2indep(1, 3, 3, 3, method="newcomb", compare="diff", alpha=0.05)
    assert (c["solved"], c["standard_solved"], c["family"]) == (1, 3, 1)
    assert c["ci_low"] == pytest.approx(low) and c["ci_high"] == pytest.approx(high)
    assert c["verdict"] == ("forced" if high < 0 else "inconclusive")


def test_the_long_range_json_carries_one_verdict_set_its_own(tmp_path):
    # The committed store read as report --json: the top-level verdicts are exactly the suite's solve-rate
    # comparisons (its own validity rule), never the main study's accuracy verdicts beside them; the main study's
    # answer and A/A summary do not apply (no controls, no A/A arm are trained here).
    import shutil
    from pathlib import Path

    from axiomformer.study.report import study_json

    store = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "long-range" / "results.sqlite"
    shutil.copy(store, tmp_path / "results.sqlite")
    out = study_json(tmp_path)
    own = out["long_range"]["solve_rate"]
    assert [(v["task"], v["seq_len"], v["model"], v["verdict"]) for v in out["verdicts"]] == [
        (c["task"], c["seq_len"], c["model"], c["verdict"]) for c in own
    ]
    assert {v["family"] for v in out["verdicts"]} <= {"long_range"}
    assert out["answer"] is None and out["control_answer"] is None
    aa = out["aa_control"]
    assert (aa is None) == (not any(c["model"] == AA_LABEL for c in out["long_range"]["cells"]))
    assert aa is None or {t["family"] for t in aa["tasks"]} == {"aa_control"}
    deciding = {v["task"] for v in out["long_range"]["validity"] if v["decides"]}
    assert {v["task"] for v in out["verdicts"]} <= deciding


def _verdicts_outside_design(out: dict) -> list[str]:
    """The verdicts of a report --json whose task@length ``design.tasks`` does not mark as discriminating."""
    good = {t["task"] for t in out["design"]["tasks"] if t["discriminates"]}
    return [f"{v['task']}@{v['seq_len']}" for v in out["verdicts"] if f"{v['task']}@{v['seq_len']}" not in good]


def _committed_json(tmp_path) -> dict:
    import shutil
    from pathlib import Path

    from axiomformer.study.report import study_json

    store = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "long-range" / "results.sqlite"
    shutil.copy(store, tmp_path / "results.sqlite")
    return study_json(tmp_path)


def test_design_tasks_state_the_rule_the_long_range_verdicts_follow(tmp_path):
    # design.tasks is the suite's own rule (per task, at the shortest length), so no verdict comes from a cell the
    # block calls non-discriminating; the battery's per-length answer stays beside it (at_length) with the reason.
    out = _committed_json(tmp_path)
    assert out["verdicts"] and _verdicts_outside_design(out) == []
    own = {v["task"]: v["decides"] for v in out["long_range"]["validity"]}
    for t in out["design"]["tasks"]:
        assert t["discriminates"] == own[t["task"].rsplit("@", 1)[0]] and isinstance(t["at_length"], bool)
        if t["discriminates"] and not t["at_length"]:
            assert "by the battery's rule it does not" in t["why"]


def test_the_battery_rule_in_design_tasks_is_caught_contradicting_the_verdicts():
    # Where the Transformer solves 64 tokens but not 10,000 and the LSTM solves 10,000, the suite compares solve rates
    # at 10,000. Planted: design.tasks by the battery's per-length rule (the suite without its own), which calls that
    # cell non-discriminating: the same consistency check finds the verdicts outside it.
    from axiomformer.study.battery import task_validity as battery_validity
    from axiomformer.study.long_range_report import design_tasks, solve_rate_comparisons
    from axiomformer.study.summary import cell_stats

    acc = {
        ("standard", "needle_kv", 64): [1.0] * 5,
        ("standard", "needle_kv", 10000): [0.3, 0.32, 0.28, 0.3, 0.31],
        ("lstm", "needle_kv", 10000): [0.99] * 5,
        ("uniform_mixing", "needle_kv", 64): [0.6] * 5,
        ("uniform_mixing", "needle_kv", 10000): [0.3, 0.29, 0.31, 0.3, 0.3],
    }
    d = _fake_study(acc, 400)
    d.lrs, d.lr_edges = {}, set()  # what summary.cell_stats reads beside the rows
    verdicts = solve_rate_comparisons(d, 0.9, 0.25)
    assert [(v["seq_len"], v["model"]) for v in verdicts][:1] == [(10000, "lstm")]
    own = design_tasks(d, 0.9)
    out = {"verdicts": verdicts, "design": {"tasks": own}}
    assert _verdicts_outside_design(out) == []
    long = next(t for t in own if t["task"] == "needle_kv@10000")
    assert long["discriminates"] and not long["at_length"] and "by the battery's rule it does not" in long["why"]
    planted = {"verdicts": verdicts, "design": {"tasks": battery_validity(d, cell_stats(d))}}
    assert _verdicts_outside_design(planted) == ["needle_kv@10000"] * len(verdicts)


def test_a_task_whose_uniform_mixing_control_solves_it_does_not_decide():
    from axiomformer.study.long_range_report import task_validity

    def validity(uniform):
        d = _fake_study(
            {
                ("standard", "needle_kv", 64): [0.99] * 5,
                ("no_mixing", "needle_kv", 64): [0.3] * 5,
                ("uniform_mixing", "needle_kv", 64): uniform,
            },
            400,
        )
        return next(v for v in task_validity(d, 0.9) if v["task"] == "needle_kv")

    kv = validity([0.99] * 5)  # planted: no scores needed
    assert not kv["decides"] and "uniform-mixing control" in kv["why"]
    assert kv["controls"]["uniform_mixing"]["64"]["solving"] == 5 and kv["controls"]["no_mixing"]["64"]["solving"] == 0
    assert validity([0.99, 0.99, 0.99, 0.99, 0.5])["decides"]  # one seed short of solving: the scores matter


def test_the_aa_control_is_its_own_family_and_never_a_verdict():
    from statsmodels.stats.proportion import confint_proportions_2indep

    from axiomformer.study.long_range_report import aa_control, solve_rate_comparisons

    acc = {
        ("standard", "needle", 64): [1.0] * 5,
        (AA_LABEL, "needle", 64): [1.0] * 5,
        ("standard", "needle", 10000): [0.99] * 5,
        (AA_LABEL, "needle", 10000): [0.99, 0.99, 0.5, 0.5, 0.5],  # planted: the model differs from itself
        ("uniform_mixing", "needle", 10000): [0.1] * 5,
        ("lstm", "needle", 10000): [0.99] * 5,
    }
    d = _fake_study(acc, 400)
    assert [c["model"] for c in solve_rate_comparisons(d, 0.9, 0.25)] == ["lstm"]  # the footing is not asked about
    found = aa_control(d, 0.9, 0.25)
    by = {t["task"]: t for t in found["tasks"]}
    assert set(by) == {"needle@64", "needle@10000"} and {t["family"] for t in found["tasks"]} == {"aa_control"}
    low, high = confint_proportions_2indep(2, 5, 5, 5, method="newcomb", compare="diff", alpha=0.05 / 2)
    assert by["needle@10000"]["ci_low"] == pytest.approx(low) and by["needle@10000"]["ci_high"] == pytest.approx(high)
    assert by["needle@10000"]["verdict"] == ("forced" if high < 0 else "inconclusive")
    assert found["broken"] == (high < 0)
    assert aa_control(_fake_study({("standard", "needle", 64): [1.0] * 5}, 400), 0.9, 0.25) is None


def test_the_curriculum_trains_the_aa_control_at_the_standard_models_rate_without_selection():
    from axiomformer.study.suites.long_range import stages

    cfg = validate_config(get_suite("long-range").preset("quick") | {"aa_control": True})
    steps = stages(cfg)
    select = steps[0](None)
    assert not [r for r in select if r.model.label == AA_LABEL]
    best = {1e-3: 0.9, 3e-3: 0.5, 1e-2: 0.4}
    stored = {
        r.key: _row(None, None).model_copy(
            update={"outcome": RunOutcome(val_accuracy=best.get(r.train_config["lr"], 0.1), val_loss=1.0)}
        )
        for r in select
    }
    reported = steps[1](stored)
    aa = [r for r in reported if r.model.label == AA_LABEL]
    assert aa and {r.train_config["lr"] for r in aa} == {1e-3} and {r.seed for r in aa} == set(range(cfg.seeds))
    stored |= {r.key: _row(None, None).model_copy(update={"outcome": RunOutcome()}) for r in reported}
    longer = steps[2](stored)
    assert not [r for r in longer if r.model.label.startswith(AA_LABEL)]  # the shortest length only
    assert {"no_mixing", "uniform_mixing"} <= {r.model.label for r in longer}  # the controls go on


@pytest.mark.parametrize(
    "accuracy, chosen, edge",
    [
        ({1e-3: 0.70, 3e-3: 0.95, 1e-2: 0.80}, 3e-3, False),
        ({1e-3: 0.99, 3e-3: 0.69, 1e-2: 0.69}, 1e-3, True),
        ({1e-3: 0.50, 3e-3: 0.60, 1e-2: 0.90}, 1e-2, True),
    ],
)
def test_the_learning_rate_block_names_the_chosen_rate_and_whether_it_is_at_a_grid_edge(accuracy, chosen, edge):
    from axiomformer.study.long_range_report import _lr_table, learning_rates

    d = _fake_study({("standard", "needle", 64): [1.0] * 5, ("standard", "needle", 10000): [1.0] * 5}, 400)
    selection = []
    for lr, acc in accuracy.items():
        for i, seed in enumerate(d.config.selection_seeds):  # seeds differ by +-0.01 about the planted mean
            outcome = RunOutcome(val_accuracy=acc + (0.01 if i else -0.01), val_loss=1 - acc)
            update = {"seed": seed, "train_config": {"lr": lr}, "outcome": outcome}
            selection.append(_row(acc, 400).model_copy(update=update))
            # the same seed at the longer length is warm-started (not a selection run) and must not count
            later = {**update, "seq_len": 10000, "train_config": {"lr": lr, "init_from": "x.pt"}}
            selection.append(_row(0.0, 400).model_copy(update=later))
    d.all_rows = d.rows + selection
    (entry,) = learning_rates(d)
    assert (entry["model"], entry["task"], entry["seq_len"]) == ("standard", "needle", 64)
    assert entry["chosen_lr"] == chosen and entry["at_grid_edge"] is edge
    assert [t["lr"] for t in entry["tried"]] == sorted(accuracy)
    assert [t["val_accuracy"] for t in entry["tried"]] == pytest.approx([accuracy[lr] for lr in sorted(accuracy)])
    (row,) = _lr_table(d).rows
    assert row[3] == f"{chosen:g}" and (row[4] == "yes") is edge


def test_a_curriculum_chooses_from_its_grid_as_given():
    from axiomformer.study.config import StudyConfig, StudyConfigError, stored_config

    preset = get_suite("long-range").preset("default")
    assert validate_config(preset).lr_widen == 0  # the curriculum's default
    assert validate_config(preset | {"curriculum": False}).lr_widen == StudyConfig.model_fields["lr_widen"].default
    with pytest.raises(StudyConfigError, match="lr_widen = 2 with curriculum"):
        validate_config(preset | {"lr_widen": 2})
    # a store written before this rule (lr_widen 2 recorded beside curriculum) still reads back
    assert stored_config(preset | {"lr_widen": 2}).config.lr_widen == 2
