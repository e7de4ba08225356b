"""The flow experiment's controls (issue 24): the token_mlp, shuffled and value=classifier arms, ``flow_params``, the
Holm-corrected comparisons and their verdicts, the per-K learning rate, resuming. Every property is checked against an
independent computation, and a planted wrong version shows that the check can fail."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats

from axiomformer.flows import FlowNet
from axiomformer.flows.comparisons import COMPARISON_KEYS, compare_arms, holm, minimal_detectable, paired, tost, verdict
from axiomformer.flows.experiment import (
    ArmSetup,
    FlowConfig,
    _check_disjoint,
    build_arm,
    choose_lrs,
    lr_key,
    run_flow_experiment,
    selection_seeds,
    train_group,
)
from axiomformer.flows.net import matched_hidden
from axiomformer.flows.report import markdown


def _net(mixing, value="tied", dim=8, tokens=4, steps=1, **kw):
    torch.manual_seed(0)
    return FlowNet(3, 3, dim=dim, steps=steps, model="quadratic", num_tokens=tokens, mixing=mixing, value=value, **kw)


def _within(count: int, target: int, tol: float = 0.15) -> bool:
    return abs(count - target) <= tol * target


# ---- token_mlp: a token-wise MLP with the attention step's parameter count -------------------------------------


@pytest.mark.parametrize("dim", [3, 5, 8, 16, 32, 64])
def test_token_mlp_has_the_attention_steps_parameter_count_within_15_percent(dim):
    attention = _net("attention", dim=dim)
    control = _net("token_mlp", dim=dim)
    phi_count = sum(p.numel() for p in attention.phis.parameters())  # counted independently
    mlp_count = sum(p.numel() for p in control.mlps.parameters())
    assert phi_count == dim * dim and attention.flow_parameter_count() == phi_count
    assert control.flow_parameter_count() == mlp_count
    assert _within(mlp_count, phi_count)
    h = control.mlps[0][0].out_features  # closed form 2dh + h + d
    assert mlp_count == 2 * dim * h + h + dim
    # the check can fail: the ordinary MLP (hidden 2d) is 4x the attention step at every dim
    assert not _within(_net("mlp", dim=dim).flow_parameter_count(), phi_count)


def test_matched_hidden_is_the_closest_width_by_exhaustive_search():
    for dim in (3, 6, 16, 40):
        target = dim * dim
        best = min(range(1, 4 * dim), key=lambda h: (abs(2 * dim * h + h + dim - target), h))
        assert matched_hidden(dim, target) == best


def test_token_mlp_does_not_mix_tokens_and_attention_does():
    Z = torch.randn(2, 4, 8)
    for mixing, mixes in (("token_mlp", False), ("attention", True)):
        net = _net(mixing)
        Z2 = Z.clone()
        Z2[:, 3] += 1.0  # change one token
        moved = (net.step(Z2, 0) - net.step(Z, 0))[:, :3].abs().max()  # the other tokens
        assert (moved > 1e-6) == mixes


def test_token_mlp_that_cannot_be_matched_is_refused():
    with pytest.raises(ValueError, match="within 15%"):
        _net("token_mlp", dim=4)
    with pytest.raises(ValueError, match="needs model='quadratic'"):
        FlowNet(3, 3, dim=8, steps=1, model="linear", mixing="token_mlp")


# ---- shuffled: attention weights from another image's tokens ---------------------------------------------------


def _independent_step(Z, W, theta, h):
    """Z - h softmax(W theta W^T) Z theta, numpy float64, per image: W are the features the weights come from."""
    Z, W, theta = (np.asarray(a, dtype=np.float64) for a in (Z, W, theta))
    out = np.empty_like(Z)
    for b in range(len(Z)):
        s = W[b] @ theta @ W[b].T
        a = np.exp(s - s.max(axis=1, keepdims=True))
        a /= a.sum(axis=1, keepdims=True)
        out[b] = Z[b] - h * a @ Z[b] @ theta
    return out


def _one_step(mixing: str) -> tuple[FlowNet, torch.Tensor, np.ndarray, np.ndarray]:
    """(net, Z, theta = phi phi^T, the net's step from Z) of a one-step quadratic net of ``mixing``."""
    net = _net(mixing)
    Z = torch.randn(3, 4, 8)
    phi = net.phis[0].detach().numpy()
    return net, Z, phi @ phi.T, net.step(Z, 0).detach().numpy()


def test_shuffled_step_uses_the_previous_images_tokens_for_its_weights():
    net, Z, theta, got = _one_step("shuffled")
    other = Z.numpy()[[2, 0, 1]]  # image b's weights: image b - 1
    np.testing.assert_allclose(got, _independent_step(Z.numpy(), other, theta, net.step_size), atol=1e-5)
    # the check can fail: weights from the image's own tokens (the attention arm) give another result
    own = _independent_step(Z.numpy(), Z.numpy(), theta, net.step_size)
    assert np.abs(got - own).max() > 1e-3


def test_shuffled_output_depends_on_another_image_and_attention_does_not():
    Z = torch.randn(3, 4, 8)
    Z2 = Z.clone()
    Z2[0] += torch.randn(4, 8)  # change image 0 only
    for mixing, leaks in (("shuffled", True), ("attention", False)):
        net = _net(mixing)
        change = (net.step(Z2, 0) - net.step(Z, 0))[1].abs().max()  # image 1's output
        assert (change > 1e-6) == leaks


def test_shuffled_needs_two_images():
    with pytest.raises(ValueError, match="at least 2 images"):
        _net("shuffled")(torch.randn(1, 4, 3))


# ---- uniform: every attention weight 1/n (no scores) ------------------------------------------------------------


def test_uniform_step_is_the_attention_step_with_all_scores_zero():
    net, Z, theta, got = _one_step("uniform")
    zero_scores = np.zeros_like(Z.numpy())  # softmax of all-zero scores: every weight 1/n
    np.testing.assert_allclose(got, _independent_step(Z.numpy(), zero_scores, theta, net.step_size), atol=1e-5)
    assert net.flow_parameter_count() == _net("attention").flow_parameter_count()  # same parameters, no scores
    # the check can fail: the attention arm's weights come from the scores
    own = _independent_step(Z.numpy(), Z.numpy(), theta, net.step_size)
    assert np.abs(_net("attention").step(Z, 0).detach().numpy() - own).max() < 1e-5
    assert np.abs(got - own).max() > 1e-3


def test_uniform_linear_step_moves_every_sample_by_the_mean_class_embedding():
    torch.manual_seed(0)
    for value in ("tied", "free"):
        net = FlowNet(3, 4, dim=5, steps=1, model="linear", mixing="uniform", value=value)
        Z = torch.randn(6, 5)
        target = net.values[0] if value == "free" else -net.theta
        expected = Z.numpy() + net.step_size * target.detach().numpy().mean(axis=0)
        np.testing.assert_allclose(net.step(Z, 0).detach().numpy(), expected, atol=1e-6)


# ---- value = classifier: the form derived from the fixed classifier ---------------------------------------------


def test_classifier_value_derives_the_form_from_theta():
    net = _net("attention", value="classifier")
    Z = torch.randn(3, 4, 8)
    t = net.theta.detach().numpy().astype(np.float64)
    form = t.T @ t / np.linalg.svd(t, compute_uv=False)[0] ** 2  # theta^T theta / ||theta||_2^2
    np.testing.assert_allclose(net.classifier_form().detach().numpy(), form, atol=1e-6)
    np.testing.assert_allclose(
        net.step(Z, 0).detach().numpy(), _independent_step(Z.numpy(), Z.numpy(), form, net.step_size), atol=1e-5
    )
    assert net.flow_parameter_count() == 0 and len(net.phis) == 0
    with torch.no_grad():  # it follows theta, not a copy
        net.theta.mul_(-2.0).add_(torch.randn_like(net.theta))
    t2 = net.theta.detach().numpy().astype(np.float64)
    form2 = t2.T @ t2 / np.linalg.svd(t2, compute_uv=False)[0] ** 2
    np.testing.assert_allclose(
        net.step(Z, 0).detach().numpy(), _independent_step(Z.numpy(), Z.numpy(), form2, net.step_size), atol=1e-5
    )
    # the check can fail: a learned phi (the tied arm) is not the classifier's form
    tied = _net("attention", value="tied")
    phi = tied.phis[0].detach().numpy()
    assert np.abs(phi @ phi.T - form).max() > 1e-2


def _trainable(net):
    return {name for name, p in net.named_parameters() if p.requires_grad}


def test_classifier_arm_with_theta_fixed_trains_only_the_embedding():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (32,), generator=g)
    x = torch.randn(32, 4, 3, generator=g) + F.one_hot(y, 3).float()[:, None, :]
    cfg = FlowConfig(dim=8, batch_size=16, readout="mean")
    fit = FlowNet(3, 3, dim=8, steps=0, model="quadratic", num_tokens=4)
    net = build_arm(fit, ArmSetup("fixed", "attention", "classifier", K=2), cfg=cfg, x=x, seed=1)
    assert _trainable(net) == {"embed.weight", "embed.bias", "position"}
    before = {name: p.detach().clone() for name, p in net.named_parameters()}
    train_group([net], x=x, y=y, sigmas=[0.0], seeds=[1], epochs=2, lr=1e-2, cfg=cfg)
    assert torch.equal(net.theta, before["theta"])  # fixed: bit-identical
    assert not torch.equal(net.embed.weight, before["embed.weight"])  # the embedding did train
    # the check can fail: the tied arm trains its phi too
    tied = build_arm(fit, ArmSetup("fixed", "attention", "tied", K=2), cfg=cfg, x=x, seed=1)
    assert _trainable(tied) - {"embed.weight", "embed.bias", "position"} == {"phis.0"}


def test_classifier_value_of_the_linear_model_is_the_tied_cross_attention():
    torch.manual_seed(0)
    net = FlowNet(3, 3, dim=8, steps=1, model="linear", mixing="attention", value="classifier")
    Z = torch.randn(5, 8)
    theta = net.theta.detach().numpy().astype(np.float64)
    z = Z.numpy().astype(np.float64)
    s = z @ theta.T
    w = np.exp(s - s.max(1, keepdims=True))
    w /= w.sum(1, keepdims=True)
    np.testing.assert_allclose(net.step(Z, 0).detach().numpy(), z - net.step_size * w @ theta, atol=1e-5)
    assert net.flow_parameter_count() == 0


# ---- statistics: paired t-intervals, Holm over the whole family, equivalence, detectable difference -------------


def test_paired_interval_and_p_are_the_t_formulas():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.6, 0.02, 7), rng.normal(0.58, 0.02, 7)
    diff, low, high, p = paired(a, b)
    d = a - b
    half = stats.t.ppf(0.975, 6) * d.std(ddof=1) / np.sqrt(7)
    assert diff == pytest.approx(d.mean()) and (low, high) == pytest.approx((d.mean() - half, d.mean() + half))
    tstat = d.mean() / (d.std(ddof=1) / np.sqrt(7))
    assert p == pytest.approx(2 * stats.t.sf(abs(tstat), 6))
    # a normal-quantile interval (wrong at n = 7) is narrower by the factor 1.96 / t_0.975,6
    assert (high - low) / 2 > stats.norm.ppf(0.975) * d.std(ddof=1) / np.sqrt(7) * 1.1


def _holm_by_hand(p):
    order = np.argsort(p)
    m, out, running = len(p), np.empty(len(p)), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def test_holm_matches_statsmodels_and_the_step_down_formula():
    from statsmodels.stats.multitest import multipletests

    p = np.array([0.01, 0.04, 0.03, 0.005, 0.2, 0.001])
    np.testing.assert_allclose(holm(p), multipletests(p, method="holm")[1])
    np.testing.assert_allclose(holm(p), _holm_by_hand(p))
    assert not np.allclose(holm(p), np.minimum(1, p * len(p)))  # it is not Bonferroni


def _acc(seed=0):
    rng = np.random.default_rng(seed)
    base = rng.normal(0.5, 0.01, 6)
    arms = {
        "neither": 0.0,
        "attention/tied": 0.03,
        "token_mlp": 0.05,
        "shuffled/tied": 0.0,
        "mlp": 0.1,
        "both/tied": 0.1,
    }
    return {
        (t, a, k, s): list(base + shift + rng.normal(0, 0.01, 6))
        for t in ("fixed", "learned")
        for a, shift in arms.items()
        for k in (1, 2)
        for s in (0.0, 1.0)
    }


def test_comparisons_have_the_schema_and_holm_over_the_whole_family():
    from statsmodels.stats.multitest import multipletests

    acc = _acc()
    rows, eq = compare_arms(acc, 0.02)
    assert all(tuple(r) == COMPARISON_KEYS for r in rows)
    assert set(COMPARISON_KEYS) == {"a", "b", "theta", "K", "noise", "diff", "ci_low", "ci_high", "p", "p_holm"}
    # 4 pairs present (attention/tied - neither, - token_mlp, - shuffled/tied; both/tied - mlp) x 2 x 2 x 2
    assert len(rows) == 4 * 2 * 2 * 2 and len(eq["rows"]) == len(rows)
    for r in rows:  # each p independently
        assert r["p"] == pytest.approx(
            stats.ttest_rel(
                acc[(r["theta"], r["a"], r["K"], r["noise"])], acc[(r["theta"], r["b"], r["K"], r["noise"])]
            ).pvalue
        )
    whole = multipletests([r["p"] for r in rows], method="holm")[1]
    np.testing.assert_allclose([r["p_holm"] for r in rows], whole)
    # the check can fail: Holm within each theta setting only gives other values
    per_theta = np.empty(len(rows))
    for theta in ("fixed", "learned"):
        idx = [i for i, r in enumerate(rows) if r["theta"] == theta]
        per_theta[idx] = multipletests([rows[i]["p"] for i in idx], method="holm")[1]
    assert not np.allclose(per_theta, whole)


def test_tost_is_the_larger_of_two_one_sided_t_tests():
    rng = np.random.default_rng(1)
    a, b = rng.normal(0.6, 0.01, 10), rng.normal(0.6, 0.01, 10)
    d, n, m = a - b, 10, 0.02
    se = d.std(ddof=1) / np.sqrt(n)
    expected = max(stats.t.sf((d.mean() + m) / se, n - 1), stats.t.cdf((d.mean() - m) / se, n - 1))
    assert tost(a, b, m) == pytest.approx(expected)
    assert tost(a, b + 0.05, m) > 0.5  # far outside the margin


def test_minimal_detectable_difference_has_power_0_8_by_the_noncentral_t():
    d = np.random.default_rng(2).normal(0.0, 0.015, 12)
    family = 20
    mdd = minimal_detectable(d, family)
    n, alpha = len(d), 0.05 / family
    crit = stats.t.ppf(1 - alpha / 2, n - 1)
    nc = mdd / (d.std(ddof=1) / np.sqrt(n))
    power = stats.nct.sf(crit, n - 1, nc) + stats.nct.cdf(-crit, n - 1, nc)
    assert power == pytest.approx(0.8, abs=1e-3)
    assert minimal_detectable(d, 1) < mdd  # a smaller family detects less


def test_compare_arms_verdicts_follow_the_symmetric_rule_not_the_raw_p():
    rows, eq = compare_arms(_acc(), 0.02)
    for r, e in zip(rows, eq["rows"]):
        assert e["verdict"].startswith("higher") == (e["ci_low_adj"] > 0 and e["ci_high_adj"] >= 0.02)
        assert e["verdict"].startswith("lower") == (e["ci_high_adj"] < 0 and e["ci_low_adj"] <= -0.02)
        assert e["verdict"].startswith("no difference") == (-0.02 < e["ci_low_adj"] and e["ci_high_adj"] < 0.02)
        assert (e["ci_low_adj"] <= r["ci_low"]) and (r["ci_high"] <= e["ci_high_adj"])  # wider than the 95 % one


# ---- learning rate per K, on seeds never reported ---------------------------------------------------------------


def test_selection_seeds_never_overlap_reported_seeds_and_overlap_is_refused():
    cfg = FlowConfig(lr_seeds=3)
    select = selection_seeds(cfg, 0)
    _check_disjoint(select, [1000 * s for s in range(16)])
    with pytest.raises(ValueError, match="overlap"):
        _check_disjoint(select, [select[1] - 1])  # its seed + 1 is used too


def test_learning_rate_is_chosen_per_k_on_validation():
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (40,), generator=g)
    x = torch.randn(40, 4, 3, generator=g) + F.one_hot(y, 3).float()[:, None, :]
    cfg = FlowConfig(
        dim=6,
        batch_size=16,
        fit_epochs=1,
        epochs=1,
        lr_grid=(1e-3, 1e-2),
        lr_seeds=1,
        thetas=("fixed",),
        mixings=("attention", "neither"),
        values=("tied",),
    )
    chosen = choose_lrs(replace(cfg, K=(0, 1, 2)), x=x, y=y, noise=[0.0], seed=0, say=lambda *a: None)
    assert set(chosen) == {
        lr_key("fixed", "attention/tied", 1),
        lr_key("fixed", "attention/tied", 2),
        lr_key("fixed", "neither", 0),
    }
    assert set(chosen.values()) <= {1e-3, 1e-2}
    kept = choose_lrs(
        replace(cfg, K=(0, 1, 2)),
        x=x,
        y=y,
        noise=[0.0],
        seed=0,
        say=lambda *a: None,
        known={lr_key("fixed", "neither", 0): 7.0},
    )
    assert kept[lr_key("fixed", "neither", 0)] == 7.0  # a resumed choice is kept


@pytest.mark.parametrize("lr_epochs", [None, 2])
def test_each_learning_rate_is_tried_for_lr_epochs_and_the_fits_for_fit_epochs(lr_epochs, monkeypatch):
    import axiomformer.flows.experiment as experiment

    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (40,), generator=g)
    x = torch.randn(40, 4, 3, generator=g)
    cfg = FlowConfig(dim=6, batch_size=16, fit_epochs=1, epochs=3, lr_epochs=lr_epochs, lr_grid=(1e-3, 1e-2))
    cfg = replace(cfg, lr_seeds=1, thetas=("fixed",), mixings=("attention",), values=("tied",), K=(1,))
    seen: list[tuple[int, float]] = []
    real = experiment.train_group

    def spy(nets, **kw):
        seen.append((kw["epochs"], kw["lr"]))
        return real(nets, **kw)

    monkeypatch.setattr(experiment, "train_group", spy)
    choose_lrs(cfg, x=x, y=y, noise=[0.0], seed=0, say=lambda *a: None)
    tried = sorted(lr for epochs, lr in seen if lr in cfg.lr_grid and epochs != cfg.fit_epochs)
    assert seen[0] == (cfg.fit_epochs, cfg.lr)  # the fits of the selection seeds
    # K = 0 (neither) and K = 1 (attention/tied), each rate once, for lr_epochs (None: the arms' own epochs)
    assert [e for e, _ in seen[1:]] == [lr_epochs or cfg.epochs] * 4 and tried == sorted(cfg.lr_grid * 2)
    with pytest.raises(ValueError, match="lr_epochs=-1"):
        run_flow_experiment("tiny", noise=(0.0,), config=replace(cfg, lr_epochs=-1))


# ---- the whole run: schema, report, resume ------------------------------------------------------------------------


def _tiny_run(tmp_path, monkeypatch=None):
    from axiomformer.flows import data

    g = np.random.default_rng(0)
    n = 90
    yy = g.integers(0, 3, n)
    xx = g.random((n, 64)) * 0.3
    for i, c in enumerate(yy):
        xx[i, 16 * c : 16 * c + 16] += 0.7
    ds = data.Dataset("tiny", xx[:60], yy[:60], xx[60:], yy[60:], 8, 3)
    cfg = FlowConfig(
        patch=4,
        dim=6,
        fit_epochs=1,
        epochs=1,
        batch_size=16,
        seeds=3,
        oracle_steps=3,
        thetas=("fixed",),
        mixings=("attention", "token_mlp", "neither"),
        values=("tied", "classifier"),
    )
    return ds, cfg


def test_run_writes_comparisons_flow_params_and_a_report_and_resumes(tmp_path, monkeypatch):
    from axiomformer.flows import experiment

    ds, cfg = _tiny_run(tmp_path)
    monkeypatch.setattr(experiment, "load_dataset", lambda *a, **k: ds)
    out = tmp_path / "out"
    rng = torch.random.get_rng_state()
    result = run_flow_experiment("tiny", noise=(0.0,), out_dir=out, config=replace(cfg, K=(0, 1)))
    assert torch.equal(torch.random.get_rng_state(), rng)  # the caller's stream is untouched
    params = {(r["arm"], r["K"]): r["flow_params"] for r in result["arms"]}
    assert params[("attention/tied", 1)] == 36 and params[("attention/classifier", 1)] == 0
    assert params[("token_mlp", 1)] == 2 * 6 * 2 + 2 + 6 and params[("attention/tied", 0)] == 0
    assert params[("neither", 1)] == 0
    pairs = {(c["a"], c["b"]) for c in result["comparisons"]}
    assert pairs == {
        ("attention/tied", "neither"),
        ("attention/tied", "token_mlp"),
        ("attention/classifier", "neither"),
        ("attention/tied", "attention/tied (A/A)"),
    }
    saved = json.loads((out / "flow_results.json").read_text())
    assert saved["comparisons"] == json.loads(json.dumps(result["comparisons"]))
    text = (out / "flow_results.md").read_text()
    assert text == markdown(saved) and "p_holm" in text and "flow_params" in text
    # resume: a partial store with every arm finished is used as it is (no training: the accuracies are the same
    # even though the training function now fails)
    (out / "flow_results.partial.json").write_text(json.dumps(saved))
    monkeypatch.setattr(experiment, "train_arm", lambda *a, **k: (_ for _ in ()).throw(AssertionError("trained")))
    again = run_flow_experiment("tiny", noise=(0.0,), out_dir=out, config=replace(cfg, K=(0, 1)))
    assert [r["acc"] for r in again["arms"]] == [r["acc"] for r in saved["arms"]]
    assert not (out / "flow_results.partial.json").exists()
    # a partial store of another protocol is not used
    other = dict(saved, seeds=[7, 8, 9])
    (out / "flow_results.partial.json").write_text(json.dumps(other))
    with pytest.raises(AssertionError, match="trained"):
        run_flow_experiment("tiny", noise=(0.0,), out_dir=out, config=replace(cfg, K=(0, 1)))
    # a store written before a config field existed ran at its default: resumed; at another value of it: not
    older = dict(saved, config={k: v for k, v in saved["config"].items() if k != "lr_rank"})
    (out / "flow_results.partial.json").write_text(json.dumps(older))
    run_flow_experiment("tiny", noise=(0.0,), out_dir=out, config=replace(cfg, K=(0, 1)))
    (out / "flow_results.partial.json").write_text(json.dumps(older))
    with pytest.raises(AssertionError, match="trained"):
        run_flow_experiment("tiny", noise=(0.0,), out_dir=out, config=replace(cfg, K=(0, 1), lr_epochs=5))


# ---- every arm of the default run moves the features at K > 0; the A/A copy; the symmetric verdict rule ----------


def _substeps_move(net: FlowNet, x: torch.Tensor) -> bool:
    """Whether every flow step of ``net`` changes the features, each of its sub-steps (attention, MLP) has a
    non-zero direction, and the step applies every sub-step it has (it equals their composition, written out here
    from the protocol: attention then MLP, each with its residual and the step size): a no-op inside ``both`` is
    caught though the other sub-step still moves the features, whether planted in the sub-step or in the step."""
    h = net.step_size
    with torch.no_grad():
        Z = net.embed_inputs(x)
        for k in range(net.steps):
            expected = Z
            if net.use_attention:
                direction = net._attention(expected, k)
                if not direction.abs().max() > 0:
                    return False
                expected = expected + h * direction
            if net.use_mlp:
                direction = net.mlps[net._block(k)](expected)
                if not direction.abs().max() > 0:
                    return False
                expected = expected + h * direction
            moved = net.step(Z, k)
            if torch.equal(moved, Z) or (net.project is None and not torch.allclose(moved, expected)):
                return False
            Z = moved
    return True


def _default_arms_at(K: int):
    from axiomformer.flows.experiment import arm_names, default_config, make_net

    cfg = default_config()
    x = torch.randn(6, 16, 49, generator=torch.Generator().manual_seed(3))  # 28 x 28 images as 7 x 7 patches
    with torch.random.fork_rng():
        torch.manual_seed(0)
        fit = make_net(cfg, x=x, num_classes=10, K=0)
    for theta in cfg.thetas:
        for arm, mixing, value in arm_names(cfg):
            net = build_arm(fit, ArmSetup(theta, mixing, value, K), cfg=cfg, x=x, seed=0)
            yield theta, arm, net, x


@pytest.mark.parametrize("K", [1, 8])
def test_every_arm_of_the_default_run_moves_the_features_at_every_step_and_planted_no_ops_are_caught(K, monkeypatch):
    from axiomformer.flows.experiment import AA_ARM, default_config

    cfg = default_config()
    assert cfg.thetas == ("fixed", "learned") and cfg.K == (0, 1, 2, 4, 8)  # the default restored
    seen = set()
    for theta, arm, net, x in _default_arms_at(K):
        seen.add((theta, arm))
        assert net.steps == K
        assert _substeps_move(net, x) == (arm != "neither"), (theta, arm, K)
    assert len(seen) == 2 * 12 and ("learned", AA_ARM) in seen
    # the check can fail: an attention sub-step planted as a no-op is caught in every arm that has one (in `both`
    # too, where the MLP still moves the features), and so is a whole step planted as the identity
    monkeypatch.setattr(FlowNet, "_attention", lambda self, Z, k: torch.zeros_like(Z))
    for _, arm, net, x in _default_arms_at(K):
        assert not _substeps_move(net, x) if net.use_attention else _substeps_move(net, x) == (arm != "neither")
    monkeypatch.undo()
    # planted in the step: `both` computes its attention sub-step but drops it, so only the MLP moves the features
    real_step = FlowNet.step

    def drops_attention(self, Z, k):
        if not (self.use_attention and self.use_mlp):
            return real_step(self, Z, k)
        self._attention(Z, k)
        return Z + self.step_size * self.mlps[self._block(k)](Z)

    monkeypatch.setattr(FlowNet, "step", drops_attention)
    for _, arm, net, x in _default_arms_at(K):
        assert _substeps_move(net, x) == (arm != "neither" and not arm.startswith("both")), arm
    monkeypatch.setattr(FlowNet, "step", lambda self, Z, k: Z)
    assert not any(_substeps_move(net, x) for _, _, net, x in _default_arms_at(K))


def test_the_aa_arm_differs_from_attention_tied_only_in_the_initial_flow_parameters():
    from axiomformer.flows.experiment import AA_INIT_OFFSET, make_net
    from axiomformer.runtime import seeded

    cfg = FlowConfig(dim=16, thetas=("fixed",))
    x = torch.randn(4, 16, 49, generator=torch.Generator().manual_seed(1))
    with seeded(5):
        fit = make_net(cfg, x=x, num_classes=10, K=0)
    a = build_arm(fit, ArmSetup("fixed", "attention", "tied", K=2), cfg=cfg, x=x, seed=1000)
    aa = build_arm(fit, ArmSetup("fixed", "attention", "tied", K=2, init_stream=1), cfg=cfg, x=x, seed=1000)
    with seeded(1000 + AA_INIT_OFFSET):  # built independently from the stated stream
        expected = make_net(cfg, x=x, num_classes=10, K=2, mixing="attention", value="tied")
    assert torch.equal(aa.phis[0], expected.phis[0]) and not torch.equal(aa.phis[0], a.phis[0])
    for name in ("embed.weight", "theta", "position"):
        assert torch.equal(aa.state_dict()[name], a.state_dict()[name]), name
    assert aa.theta.requires_grad is False


def test_symmetric_verdict_rule_from_the_bonferroni_interval():
    def eq(low, high, mdd=0.03):
        return {"ci_low_adj": low, "ci_high_adj": high, "mdd": mdd}

    assert verdict(eq(0.004, 0.012), 0.02) == "no difference within +-0.02"  # excludes 0 but inside the margin
    assert verdict(eq(-0.019, 0.019), 0.02) == "no difference within +-0.02"
    assert verdict(eq(0.004, 0.021), 0.02) == "higher"
    assert verdict(eq(-0.05, -0.001), 0.02) == "lower"
    assert verdict(eq(-0.01, 0.03), 0.02) == "inconclusive: detectable only above 0.030"
    assert verdict(eq(None, None, None), 0.02) == "inconclusive"


def test_compare_arms_bonferroni_intervals_and_the_aa_family_on_its_own():
    acc = _acc()
    rng = np.random.default_rng(7)
    for t in ("fixed", "learned"):
        for k in (1, 2):
            for s in (0.0, 1.0):
                base = np.asarray(acc[(t, "attention/tied", k, s)])
                acc[(t, "attention/tied (A/A)", k, s)] = list(base + rng.normal(0, 0.004, 6))
    rows, eq = compare_arms(acc, 0.02)
    assert eq["families"] == {"main": 4 * 2 * 2 * 2, "aa": 2 * 2 * 2}
    main = [i for i, e in enumerate(eq["rows"]) if e["family"] == "main"]
    aa = [i for i, e in enumerate(eq["rows"]) if e["family"] == "aa"]
    assert all((rows[i]["a"], rows[i]["b"]) == ("attention/tied", "attention/tied (A/A)") for i in aa)
    for idx in (main, aa):
        m = len(idx)
        for i in idx:  # the interval by the formula mean +- t_(1 - 0.05/(2m), n-1) sd / sqrt(n)
            r, e = rows[i], eq["rows"][i]
            d = np.subtract(
                acc[(r["theta"], r["a"], r["K"], r["noise"])], acc[(r["theta"], r["b"], r["K"], r["noise"])]
            )
            half = stats.t.ppf(1 - 0.05 / (2 * m), len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
            assert (e["ci_low_adj"], e["ci_high_adj"]) == pytest.approx((d.mean() - half, d.mean() + half))
        ps = [rows[i]["p"] for i in idx]
        np.testing.assert_allclose([rows[i]["p_holm"] for i in idx], _holm_by_hand(np.asarray(ps)))
    # the A/A copies differ by noise of sd 0.004: every A/A verdict is "no difference"; the planted +0.03 of
    # attention/tied over neither (sd 0.014 of the difference, 6 seeds) is never called "no difference"
    assert all(eq["rows"][i]["verdict"] == "no difference within +-0.02" for i in aa)
    assert not any(eq["rows"][i]["verdict"].startswith("no difference") for i in main if rows[i]["b"] == "neither")


def test_on_epoch_sees_each_epochs_weights_and_changes_nothing():
    """The budget pilot's training curve (``benchmarks/flow_curve.py``): the weights ``on_epoch`` sees after epoch 1
    are those of a separate 1-epoch training, and the final ones those of a 2-epoch training without the hook."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(40, 4, 3, generator=g), torch.randint(0, 3, (40,), generator=g)
    cfg = FlowConfig(dim=6, batch_size=16)

    def nets():
        return [_net("both", dim=6), _net("both", dim=6)]

    seen = {}

    def hook(epoch, trained):
        seen[epoch] = [{k: v.clone() for k, v in n.state_dict().items()} for n in trained]

    kw = dict(x=x, y=y, sigmas=[0.0, 1.0], seeds=[3, 4], lr=1e-2, cfg=cfg)
    with_hook = train_group(nets(), epochs=2, on_epoch=hook, **kw)
    one, two = train_group(nets(), epochs=1, **kw), train_group(nets(), epochs=2, **kw)
    assert sorted(seen) == [1, 2]
    for m in range(2):
        for name, value in one[m].state_dict().items():
            assert torch.equal(seen[1][m][name], value), name
        for name, value in two[m].state_dict().items():
            assert torch.equal(with_hook[m].state_dict()[name], value) and torch.equal(seen[2][m][name], value)
    assert not torch.equal(seen[1][0]["mlps.0.0.weight"], seen[2][0]["mlps.0.0.weight"])  # it did train on


def test_parts_split_by_arms_merge_into_the_whole_run(tmp_path, monkeypatch):
    """``benchmarks/flow_merge.py``: the default store is run as parts (theta x arm groups); merged, they must give the
    per-seed accuracies, learning rates and comparisons of one run of all the arms together."""
    import importlib.util
    from pathlib import Path

    from axiomformer.flows import experiment

    spec = importlib.util.spec_from_file_location("flow_merge", Path(__file__).parents[1] / "benchmarks/flow_merge.py")
    flow_merge = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(flow_merge)
    ds, cfg = _tiny_run(tmp_path)
    monkeypatch.setattr(experiment, "load_dataset", lambda *a, **k: ds)
    cfg = replace(cfg, K=(0, 1), values=("tied",), lr_grid=(1e-3, 1e-2), lr_seeds=1)
    whole = run_flow_experiment("tiny", noise=(0.0,), config=cfg)
    parts = [
        run_flow_experiment("tiny", noise=(0.0,), config=replace(cfg, mixings=mix))
        for mix in (("attention", "neither"), ("token_mlp", "neither"))
    ]
    merged = flow_merge.merge(parts)
    cells = {(r["theta"], r["arm"], r["K"], r["noise"]): r["acc"] for r in whole["arms"]}
    assert {(r["theta"], r["arm"], r["K"], r["noise"]): r["acc"] for r in merged["arms"]} == cells
    assert len(merged["arms"]) == len(whole["arms"]) and merged["lr"] == whole["lr"]
    key = lambda c: (c["a"], c["b"], c["theta"], c["K"], c["noise"])
    assert sorted(map(key, merged["comparisons"])) == sorted(map(key, whole["comparisons"]))
    by = {key(c): c for c in whole["comparisons"]}
    for c in merged["comparisons"]:
        assert c == pytest.approx(by[key(c)])
    assert merged["partial"] is False and merged["missing"] == []
    # a part cut off after its first arm (its resumable store): the merge says which cells are missing
    cut = dict(parts[1], arms=[r for r in parts[1]["arms"] if r["arm"] != "token_mlp"], partial_part=True)
    partial = flow_merge.merge([parts[0], cut])
    assert partial["partial"] is True
    assert {(m["arm"], m["K"]) for m in partial["missing"]} == {("token_mlp", 0), ("token_mlp", 1)}
    assert not any(c["b"] == "token_mlp" for c in partial["comparisons"])
    assert "not run" in markdown(partial) and "Partial: 2 cells" in markdown(partial)
    # the check can fail: parts whose shared rows disagree are refused
    i = next(i for i, r in enumerate(parts[1]["arms"]) if r["arm"] == "neither")  # a row both parts have
    parts[1]["arms"][i] = dict(parts[1]["arms"][i], acc=[0.0] * 3)
    with pytest.raises(ValueError, match="disagree"):
        flow_merge.merge(parts)


# ---- the learning-rate check: the arms at their second-best rate ------------------------------------------------


def test_ranked_lr_follows_the_selection_rule_and_refuses_a_missing_ranking():
    from axiomformer.flows.experiment import ranked_lr

    scores = {"c": {"0.001": 0.5, "0.003": 0.7, "0.01": 0.7, "0.03": 0.2}}
    chosen = {"c": max((0.001, 0.003, 0.01, 0.03), key=lambda lr: (scores["c"][f"{lr:g}"], -lr))}  # choose_lrs's rule
    assert ranked_lr(chosen, scores, "c", 1) == chosen["c"] == 0.003
    assert [ranked_lr(chosen, scores, "c", r) for r in (2, 3, 4)] == [0.01, 0.001, 0.03]
    with pytest.raises(ValueError, match="needs 2 scored learning rates"):
        ranked_lr(chosen, {}, "c", 2)


def test_a_run_at_lr_rank_2_trains_every_arm_at_its_second_best_rate(tmp_path, monkeypatch):
    from axiomformer.flows import experiment

    ds, cfg = _tiny_run(tmp_path)
    cfg = replace(cfg, lr_grid=(1e-3, 1e-2, 3e-2), lr_seeds=1, mixings=("attention", "neither"), values=("tied",))
    monkeypatch.setattr(experiment, "load_dataset", lambda *a, **k: ds)
    used: list[float] = []
    real = experiment.train_arm

    def spy(*a, **kw):
        used.append(kw["lr"])
        return real(*a, **kw)

    first = run_flow_experiment("tiny", noise=(0.0,), config=replace(cfg, K=(0, 1)))
    monkeypatch.setattr(experiment, "train_arm", spy)
    second = run_flow_experiment("tiny", noise=(0.0,), config=replace(cfg, K=(0, 1), lr_rank=2))
    ranking = {k: sorted(v, key=lambda lr: (-v[lr], float(lr))) for k, v in second["lr_scores"].items()}
    assert second["lr"] == first["lr"] and all(first["lr"][k] == float(r[0]) for k, r in ranking.items())
    trained = used[-3:]  # after the selection: neither (K = 0), attention/tied and its A/A copy at K = 1
    keys = [lr_key("fixed", "neither", 0), lr_key("fixed", "attention/tied", 1), lr_key("fixed", "attention/tied", 1)]
    assert trained == [float(ranking[k][1]) for k in keys]
    assert any(t != first["lr"][k] for t, k in zip(trained, keys))  # the check can fail: rank 2 is not rank 1
    with pytest.raises(ValueError, match="lr_rank"):
        run_flow_experiment("tiny", noise=(0.0,), config=replace(cfg, lr_rank=4))


def test_lr_check_flags_a_verdict_that_flips_at_either_sides_second_rate():
    from axiomformer.flows.comparisons import compare_arms, lr_check

    rng = np.random.default_rng(1)
    base = rng.normal(0.5, 0.002, 16)
    chosen = {("fixed", "neither", 1, 0.0): list(base), ("fixed", "attention/tied", 1, 0.0): list(base + 0.1)}
    chosen[("fixed", "token_mlp", 1, 0.0)] = list(base + 0.1 + rng.normal(0, 0.002, 16))
    _, eq = compare_arms(chosen, 0.02)
    verdicts = {(r["a"], r["b"]): r["verdict"] for r in eq["rows"]}
    assert verdicts[("attention/tied", "neither")] == "higher"
    assert verdicts[("attention/tied", "token_mlp")].startswith("no difference")
    # the second-best rates: attention/tied collapses to neither's level; the others keep theirs
    second = dict(chosen) | {("fixed", "attention/tied", 1, 0.0): list(base + rng.normal(0, 0.002, 16))}
    rows = {(r["a"], r["b"]): r for r in lr_check(chosen, second, eq)}
    assert rows[("attention/tied", "neither")]["a_second"].startswith("no difference")
    assert rows[("attention/tied", "neither")]["b_second"] == "higher"
    assert rows[("attention/tied", "token_mlp")]["a_second"] == "lower"
    assert all(r["lr_sensitive"] for r in rows.values())
    # the same rates again: nothing flips (the check is not always on); b's side alone is caught too
    assert not any(r["lr_sensitive"] for r in lr_check(chosen, chosen, eq))
    b_only = dict(chosen) | {("fixed", "neither", 1, 0.0): list(base + 0.1)}
    row = {(r["a"], r["b"]): r for r in lr_check(chosen, b_only, eq)}[("attention/tied", "neither")]
    assert row["a_second"] == "higher" and row["b_second"].startswith("no difference") and row["lr_sensitive"]
