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
    cfg = validate_config(get_suite("long-range").preset("default"))
    assert cfg.seeds >= 3 and min(cfg.selection_seeds) >= cfg.seeds  # selection seeds never reported
    for task in cfg.tasks:
        assert max(task.seq_lens) == 10000
        for n in task.seq_lens:
            b = task.length_budgets[str(n)]
            assert (b.test_batches or b.eval_batches) * b.batch_size >= 100, (task.name, n)


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
    assert zero and len(zero) == len(warm)
    sources = {r.state_path for r in reported}
    for r in zero:
        assert r.train_config["steps"] == 0 and r.train_config["init_from"] in sources
        shortest = min(min(t.seq_lens) for t in cfg.tasks if t.name == r.task)
        assert r.model.label == zero_shot_label(r.model.label.split(" (")[0], shortest)
    # the warm start of the curriculum is from the previous length too, but its own label and budget
    assert all(r.train_config["steps"] > 0 for r in warm)
