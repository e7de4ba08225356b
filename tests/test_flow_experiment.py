"""The flow experiment's data loading (IDX files) and the ``axiomformer flow`` command, on tiny data."""

from __future__ import annotations

import gzip
import json
import struct

import numpy as np
import pytest
from typer.testing import CliRunner

from axiomformer.cli import app
from axiomformer.flows import DataError, FlowConfig, load_dataset, read_idx, run_flow_experiment
from axiomformer.flows.data import FASHION_FILES, patchify





def _idx_bytes(array: np.ndarray) -> bytes:
    return bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.astype(np.uint8).tobytes()


def _write(path, array, gz):
    data = _idx_bytes(array)
    path.write_bytes(gzip.compress(data) if gz else data)


def _fake_fashion(folder, n_train=60, n_test=30, side=8, gz=True, seed=0):
    rng = np.random.default_rng(seed)
    # Three classes, each a bright block in its own region plus noise: learnable from a few dozen images.
    def images(n):
        y = rng.integers(0, 3, n)
        x = rng.integers(0, 60, (n, side, side))
        for i, c in enumerate(y):
            x[i, 2 * c: 2 * c + 3, :] += 180
        return x.clip(0, 255), y
    (xtr, ytr), (xte, yte) = images(n_train), images(n_test)
    for key, arr in (("train_images", xtr), ("train_labels", ytr), ("test_images", xte), ("test_labels", yte)):
        _write(folder / (FASHION_FILES[key] + (".gz" if gz else "")), arr, gz)
    return xtr, ytr, xte, yte


@pytest.mark.parametrize("gz", [True, False])
def test_idx_reader_round_trips_raw_and_gzipped_files(tmp_path, gz):
    arr = np.arange(2 * 3 * 4).reshape(2, 3, 4) % 256
    _write(tmp_path / "a", arr, gz)
    np.testing.assert_array_equal(read_idx(tmp_path / "a"), arr)


@pytest.mark.parametrize("gz", [True, False])
def test_fashion_mnist_loader_reads_the_four_standard_files(tmp_path, gz):
    xtr, ytr, xte, yte = _fake_fashion(tmp_path, gz=gz)
    ds = load_dataset("fashion-mnist", tmp_path)
    assert ds.x_train.shape == (60, 64) and ds.side == 8 and ds.num_classes == 3
    np.testing.assert_allclose(ds.x_train, xtr.reshape(60, -1) / 255.0)
    np.testing.assert_array_equal(ds.y_test, yte)


@pytest.mark.parametrize("corrupt,match", [
    (lambda p: p.write_bytes(b"\x08\x03\x00\x00garbage"), "bad magic"),
    (lambda p: p.write_bytes(_idx_bytes(np.zeros((4, 8, 8)))[:-5]), "declares shape"),
    (lambda p: p.write_bytes(bytes([0, 0, 0x0D, 1]) + struct.pack(">I", 1) + b"\x00" * 4), "data type 0x0d"),
    (lambda p: p.write_bytes(b"\x1f\x8b\x08 not really gzip"), "malformed gzip"),
    (lambda p: p.unlink(), "missing data file"),
])
def test_missing_or_malformed_idx_file_gives_an_error_naming_the_file(tmp_path, corrupt, match):
    _fake_fashion(tmp_path, gz=False)
    target = tmp_path / FASHION_FILES["train_images"]
    corrupt(target)
    with pytest.raises(DataError, match=match) as info:
        load_dataset("fashion-mnist", tmp_path)
    assert FASHION_FILES["train_images"] in str(info.value)


def test_image_and_label_counts_must_agree(tmp_path):
    _fake_fashion(tmp_path, gz=False)
    _write(tmp_path / FASHION_FILES["test_labels"], np.zeros(7), gz=False)
    with pytest.raises(DataError, match="labels for 30 images"):
        load_dataset("fashion-mnist", tmp_path)


def test_patchify_cuts_row_major_non_overlapping_patches():
    x = np.arange(16).reshape(1, 16)
    tokens = patchify(x, side=4, patch=2)
    np.testing.assert_array_equal(tokens[0, 0], [0, 1, 4, 5])
    np.testing.assert_array_equal(tokens[0, 3], [10, 11, 14, 15])


def test_cli_flow_missing_file_prints_a_clear_error_without_traceback(tmp_path):
    result = CliRunner().invoke(app, ["flow", "--data", "fashion-mnist", "--data-dir", str(tmp_path), "--json"])
    assert result.exit_code == 2
    assert "missing data file" in result.output and "train-images-idx3-ubyte" in result.output
    assert "Traceback" not in result.output


def test_cli_flow_rejects_bad_noise_list():
    result = CliRunner().invoke(app, ["flow", "--noise", "0,abc"])
    assert result.exit_code == 2 and "comma-separated numbers" in result.output


def test_cli_flow_json_on_tiny_fashion_mnist(tmp_path):
    _fake_fashion(tmp_path)
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["flow", "--data", "fashion-mnist", "--data-dir", str(tmp_path), "--noise", "0,0.5",
                                      "--steps", "0,2", "--quick", "--json", "--out", str(out)])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output.strip().splitlines()[-1])
    assert payload["dataset"] == "fashion-mnist"
    assert set(payload["accuracy"]) == {"0.0", "0.5"} and set(payload["accuracy"]["0.0"]) == {"0", "2"}
    assert all(0.0 <= a <= 1.0 for row in payload["accuracy"].values() for a in row.values())
    assert payload["oracle_loss_monotone"] is True
    assert payload["accuracy"]["0.0"]["0"] > 0.6          # three well-separated classes: far above chance (1/3)
    for name in ("flow_loss.png", "flow_accuracy.png", "flow_pca.png", "flow_results.json"):
        assert (out / name).stat().st_size > 0


def test_run_flow_experiment_oracle_loss_decreases_on_digits():
    cfg = FlowConfig(epochs=1, seeds=1, oracle_steps=10, max_train=300, max_test=100)
    result = run_flow_experiment("digits", noise=(0.0,), steps=(0,), config=cfg)
    losses = result["oracle_loss"]
    assert result["oracle_loss_monotone"] and len(losses) == 11 and losses[-1] < losses[0]
    assert result["oracle_accuracy"][-1] >= result["oracle_accuracy"][0]
