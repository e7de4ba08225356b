"""Task generators: the target at every scored position is what the task's definition says; splits are disjoint."""

import numpy as np
import pytest
import torch

from axiomformer.tasks import IGNORE, TASKS, make_task
from axiomformer.tasks.digits import load_split


def rows(task, n=16, seed=3, split="train"):
    x, y = task.batch(n, seed=seed, split=split)
    assert x.dtype == torch.int64 and y.dtype == torch.int64
    assert x.shape == y.shape == (n, task.seq_len)
    assert int(x.min()) >= 0 and int(x.max()) < task.vocab_size
    scored = y[y != IGNORE]
    assert int(scored.min()) >= 0 and int(scored.max()) < task.vocab_size
    return x.numpy(), y.numpy()


@pytest.mark.parametrize("seq_len", [12, 13])
def test_copy_targets_are_the_first_half_in_order(seq_len):
    task = make_task("copy", seq_len=seq_len, vocab=5)
    x, y = rows(task)
    pad = seq_len % 2
    n = seq_len // 2
    for xi, yi in zip(x, y):
        xi, yi = xi[pad:], yi[pad:]  # odd lengths carry one PAD in front
        data = xi[:n]
        assert xi[n] == task.sep
        assert list(xi[n + 1 :]) == list(data[: n - 1])  # the copy is fed back, shifted by one
        assert (yi[:n] == IGNORE).all()
        assert list(yi[n:]) == list(data)  # at SEP predict x_1, at x_j predict x_{j+1}
    assert (x[:, :pad] == task.pad).all() and (y[:, :pad] == IGNORE).all()


@pytest.mark.parametrize("seq_len", [12, 13])
def test_sort_causal_writes_the_row_sorted_after_reading_it(seq_len):
    task = make_task("sort_causal", seq_len=seq_len, num_symbols=4)
    x, y = rows(task, n=64)
    pad, n = seq_len % 2, seq_len // 2
    for xi, yi in zip(x, y):
        xi, yi = xi[pad:], yi[pad:]
        data = xi[:n]
        assert xi[n] == task.sep and (yi[:n] == IGNORE).all()
        assert list(yi[n:]) == sorted(data)  # at SEP the smallest, at y_j the next one
        assert list(xi[n + 1 :]) == sorted(data)[: n - 1]  # the answer is fed back, shifted by one
    assert (x[:, :pad] == task.pad).all() and (y[:, :pad] == IGNORE).all()
    # the input order does not matter: rows with the same tokens in another order have the same targets
    assert any(list(a[pad : pad + n]) != sorted(a[pad : pad + n]) for a in x)


def test_mqar_queries_recall_the_value_paired_with_their_key():
    task = make_task("mqar", seq_len=64, vocab=40, num_pairs=6, num_queries=5)
    half = task.vocab // 2
    x, y = rows(task, n=32)
    for xi, yi in zip(x, y):
        keys, values = xi[0:12:2], xi[1:12:2]
        assert len(set(keys)) == len(keys)  # keys unique within the sequence
        assert ((0 <= keys) & (keys < half)).all() and ((half <= values) & (values < task.vocab)).all()
        pairs = dict(zip(keys.tolist(), values.tolist()))
        scored = np.flatnonzero(yi != IGNORE)
        assert len(scored) == 5 and (scored >= 12).all()
        asked = xi[scored].tolist()
        assert len(set(asked)) == len(asked)
        for p in scored:
            assert yi[p] == pairs[int(xi[p])]  # the value stored with the key
            assert xi[p + 1] == yi[p]  # then revealed, as in Zoology
        rest = np.setdiff1d(np.arange(12, 64), np.concatenate([scored, scored + 1]))
        assert (xi[rest] == task.noise).all()


def test_mqar_defaults_fit_and_reject_impossible_layouts():
    task = make_task("mqar", seq_len=64)
    assert task.num_pairs == 4 and task.num_queries == 4 and task.vocab_size == 18
    with pytest.raises(ValueError, match="num_pairs"):
        make_task("mqar", seq_len=64, vocab=8, num_pairs=5)
    with pytest.raises(ValueError, match="no room"):
        make_task("mqar", seq_len=16, num_pairs=8)


def test_selective_copy_targets_are_the_scattered_tokens_in_order():
    task = make_task("selective_copy", seq_len=40, vocab=6, num_tokens=5)
    x, y = rows(task)
    c = 40 - 5
    for xi, yi in zip(x, y):
        data = xi[:c][xi[:c] != task.noise]
        assert len(data) == 5
        assert xi[c] == task.sep and (yi[:c] == IGNORE).all()
        assert list(yi[c:]) == list(data)
        assert list(xi[c + 1 :]) == list(data[:-1])


def test_needle_asks_at_the_end_for_the_value_stored_near_the_start():
    task = make_task("needle", seq_len=200, num_keys=4, num_filler=7, window=5, shared=False)
    x, y = rows(task, n=64)
    k = task.num_keys
    for xi, yi in zip(x, y):
        assert (yi[:-1] == IGNORE).all()
        key_positions = np.flatnonzero(xi < k)
        assert len(key_positions) == 2 and key_positions[1] == 199 and key_positions[0] < 5
        p = key_positions[0]
        assert xi[p] == xi[-1]
        assert k <= xi[p + 1] < 2 * k and yi[-1] == xi[p + 1]
        filler = np.delete(xi, [p, p + 1, 199])
        assert (filler >= 2 * k).all()


def test_needle_generates_ten_thousand_tokens():
    x, y = make_task("needle", seq_len=10_000).batch(2, seed=0, split="eval")
    assert x.shape == (2, 10_000) and int((y != IGNORE).sum()) == 2


def test_induction_target_is_the_token_after_the_earlier_trigger():
    task = make_task("induction", seq_len=30, vocab=5)
    x, y = rows(task, n=64)
    for xi, yi in zip(x, y):
        triggers = np.flatnonzero(xi == task.trigger)
        assert len(triggers) == 2 and triggers[1] == 29 and triggers[0] <= 27
        assert (yi[:-1] == IGNORE).all() and yi[-1] == xi[triggers[0] + 1]


def quantize_by_thresholds(pixels):
    # Level = how many of the 15 thresholds 17k/16 (k = 1..15) the intensity reaches: 16 equal-width bins on 0..17.
    thresholds = 17 * np.arange(1, 16) / 16
    return (pixels[..., None] >= thresholds).sum(-1)


def test_digits_rows_are_quantized_sklearn_images_labelled_at_the_end():
    from sklearn.datasets import load_digits

    data = load_digits()
    images = quantize_by_thresholds(data.data)
    lookup = {}
    for image, label in zip(images, data.target):
        lookup.setdefault(image.tobytes(), set()).add(int(label))
    task = make_task("digits", seq_len=70)
    x, y = rows(task, n=32)
    assert (x[:, :6] == task.pad).all() and (y[:, :-1] == IGNORE).all()
    for xi, yi in zip(x, y):
        labels = lookup[xi[6:].astype(images.dtype).tobytes()]
        assert int(yi[-1]) - 16 in labels


def test_digits_split_is_three_disjoint_pools_covering_the_data():
    split = load_split()
    images = {name: {row.tobytes() for row in split[name][0]} for name in ("train", "val", "test", "eval")}
    assert not images["train"] & images["val"] and not images["train"] & images["test"]
    assert not images["val"] & images["test"]
    assert images["eval"] == images["val"] | images["test"]
    assert sum(len(split[name][1]) for name in ("train", "val", "test")) == 1797
    assert 0.2 < len(split["eval"][1]) / 1797 < 0.3
    assert 0.4 < len(split["val"][1]) / len(split["eval"][1]) < 0.6
    # every label in every pool (stratified)
    assert all(set(split[name][1].tolist()) == set(range(10)) for name in ("train", "val", "test"))
    with pytest.raises(ValueError, match="seq_len >= 64"):
        make_task("digits", seq_len=32)


def test_text_windows_predict_the_next_character_from_their_own_region(tmp_path):
    text = "".join(chr(97 + (i * 7) % 26) + ("\n" if i % 13 == 0 else "") for i in range(3000))
    path = tmp_path / "book.txt"
    path.write_text(text)
    task = make_task("text", seq_len=20, path=str(path), eval_fraction=0.2)
    assert task.vocab_size == len(set(text))
    cut = round(len(text) * 0.8)
    middle = cut + (len(text) - cut) // 2
    for split, region in (("train", text[:cut]), ("val", text[cut:middle]), ("test", text[middle:])):
        x, y = task.batch(8, seed=1, split=split)
        for xi, yi in zip(x.tolist(), y.tolist()):
            window = task.decode(xi) + task.decode(yi[-1:])
            assert window in region
            assert yi[:-1] == xi[1:]
    with pytest.raises(ValueError, match="path"):
        make_task("text", seq_len=20)


SMALL = {
    "copy": dict(seq_len=8, vocab=3),
    "mqar": dict(seq_len=6, vocab=4, num_pairs=2, num_queries=1),
    "selective_copy": dict(seq_len=6, vocab=3, num_tokens=2),
    "needle": dict(seq_len=5, num_keys=3, num_filler=2, window=2, shared=False),
    "induction": dict(seq_len=5, vocab=3),
}


@pytest.mark.parametrize("name", list(SMALL))
def test_train_and_eval_share_no_example_even_in_a_tiny_example_space(name):
    task = make_task(name, **SMALL[name])
    train = {row.tobytes() for seed in range(4) for row in task.batch(128, seed=seed, split="train")[0].numpy()}
    evals = {row.tobytes() for seed in range(4) for row in task.batch(128, seed=seed, split="eval")[0].numpy()}
    assert len(train) < 4 * 128 and len(evals) < 4 * 128  # the space is small: examples repeat within a split
    assert not train & evals


def _any_task(name: str, tmp_path):
    if name == "text":
        path = tmp_path / "book.txt"
        letters = np.random.default_rng(0).integers(0, 26, size=20000)  # aperiodic: windows do not recur by chance
        path.write_text("".join(chr(97 + int(i)) for i in letters))
        return make_task("text", seq_len=16, path=str(path))
    return make_task(name, seq_len=64 if name == "digits" else 16)


@pytest.mark.parametrize("name", list(TASKS))
def test_no_input_appears_in_more_than_one_of_train_val_test(name, tmp_path):
    task = _any_task(name, tmp_path)
    seen = {
        split: {row.tobytes() for seed in range(6) for row in task.batch(64, seed=seed, split=split)[0].numpy()}
        for split in ("train", "val", "test")
    }
    assert not seen["train"] & seen["val"], name
    assert not seen["train"] & seen["test"], name
    assert not seen["val"] & seen["test"], name


def test_the_disjointness_check_catches_a_shared_pool(monkeypatch):
    # the planted error of the old digits split: val and test drawn from one pool share images
    import axiomformer.tasks.digits as digits

    pools = digits.load_split()
    monkeypatch.setattr(
        digits, "load_split", lambda fraction=0.25: pools | {"test": pools["eval"], "val": pools["eval"]}
    )
    task = make_task("digits", seq_len=64)
    val = {row.tobytes() for seed in range(4) for row in task.batch(64, seed=seed, split="val")[0].numpy()}
    test = {row.tobytes() for seed in range(4) for row in task.batch(64, seed=seed, split="test")[0].numpy()}
    assert val & test


@pytest.mark.parametrize("name", [n for n in TASKS if n != "text"])
def test_batches_are_a_function_of_seed_and_split(name):
    task = make_task(name, seq_len=64)
    a, b, c = task.batch(4, seed=5), task.batch(4, seed=5), task.batch(4, seed=6)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])
    assert not torch.equal(task.batch(4, seed=5, split="eval")[0], a[0])


def test_unknown_task_option_or_split_names_the_choices():
    with pytest.raises(ValueError, match=", ".join(TASKS)):
        make_task("mqr", seq_len=64)
    with pytest.raises(ValueError, match="num_pairs"):
        make_task("mqar", seq_len=64, pairs=3)
    with pytest.raises(ValueError, match="train, eval, val, test"):
        make_task("copy", seq_len=8).batch(2, seed=0, split="tst")


def test_shared_needle_key_occurs_once_before_the_query_and_the_pair_is_anywhere():
    task = make_task("needle", seq_len=40, num_keys=6, shared=True)
    x, y = rows(task, n=512)
    starts = []
    for xi, yi in zip(x, y):
        key, value = xi[-1], yi[-1]
        where = np.flatnonzero(xi[:-1] == key)
        assert len(where) == 1 and xi[where[0] + 1] == value and value != key  # the only lookup that answers
        starts.append(where[0])
    assert task.vocab_size == 6 and task.chance == pytest.approx(1 / 5)
    # the pair's start is uniform over 0 .. T-3: both ends are reached and the mean is near the middle (19)
    assert min(starts) == 0 and max(starts) == 37 and abs(np.mean(starts) - 18.5) < 2.0


def test_uniform_needle_with_disjoint_vocabularies_reaches_the_whole_sequence():
    task = make_task("needle", seq_len=300, shared=False)
    x, _ = rows(task, n=256)
    starts = [int(np.flatnonzero(xi[:-1] < task.num_keys)[0]) for xi in x]
    assert max(starts) > 250 and min(starts) < 50


def test_mqar_pairs_scale_with_the_length():
    counts = {
        n: make_task("mqar", seq_len=n, vocab=32, pairs_per_token=1 / 640).num_pairs for n in (64, 1024, 4096, 10_000)
    }
    assert counts == {64: 4, 1024: 4, 4096: 6, 10_000: 15}
    _x, y = rows(make_task("mqar", seq_len=4096, vocab=32, pairs_per_token=1 / 640), n=2)
    assert int((y != IGNORE).sum()) == 2 * 6
    with pytest.raises(ValueError, match="pairs_per_token"):
        make_task("mqar", seq_len=64, pairs_per_token=0.01, num_pairs=3)


def test_val_and_test_splits_are_disjoint_and_make_up_eval():
    from axiomformer.tasks.base import held_out_part, in_eval_split

    task = make_task("copy", seq_len=6, vocab=3)
    val, _ = task.batch(256, seed=0, split="val")
    test, _ = task.batch(256, seed=0, split="test")
    assert not {tuple(r) for r in val.tolist()} & {tuple(r) for r in test.tolist()}
    for batch, name in ((val, "val"), (test, "test")):
        parts = held_out_part(batch.numpy())
        assert (parts == name).all() and in_eval_split(batch.numpy()).all()
