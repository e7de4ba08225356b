"""Source 2 (attention as implicit multinomial regression): gradients, flow terms, integrator orders, tie-in to Attention."""

from __future__ import annotations

import functools
import itertools

import pytest
import torch
import torch.nn.functional as F

from axiomformer.attention import Attention
from axiomformer.flows import (
    FlowNet,
    cross_attention,
    euler,
    feature_gradient,
    flow_rhs,
    flow_terms,
    integrate,
    lie_trotter,
    multinomial_loss,
    project_to_sphere,
    quadratic_weights,
    rk4,
    self_attention,
    strang,
    theta_from_phi,
    vector_fields,
)
from axiomformer.spec import AttentionSpec

F64 = torch.float64


def _linear_problem(seed=0, n=9, d=5, K=4, batch=()):
    g = torch.Generator().manual_seed(seed)
    Z = torch.randn(*batch, n, d, generator=g, dtype=F64)
    theta = torch.randn(K, d, generator=g, dtype=F64)
    C = torch.softmax(3 * torch.randn(*batch, n, K, generator=g, dtype=F64), -1)  # soft targets, rows sum to 1
    return Z, theta, C


def _doubly_stochastic(n, g):
    # A convex mix of permutation matrices (Birkhoff): rows and columns sum to one exactly.
    w = torch.rand(4, generator=g, dtype=F64)
    w = w / w.sum()
    return sum(wk * torch.eye(n, dtype=F64)[torch.randperm(n, generator=g)] for wk in w)


def _quadratic_problem(seed=0, n=7, d=5, r=3, batch=()):
    g = torch.Generator().manual_seed(seed)
    Z = torch.randn(*batch, n, d, generator=g, dtype=F64)
    theta = theta_from_phi(torch.randn(d, r, generator=g, dtype=F64) / 2)
    C = torch.stack([_doubly_stochastic(n, g) for _ in range(int(torch.tensor(batch).prod()) if batch else 1)])
    return Z, theta, C.reshape(*batch, n, n)


def _autograd(loss_fn, Z):
    Z = Z.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(loss_fn(Z), Z)
    return grad


def _query_only_loss(Zq, Zk, theta, C):
    return -(C * torch.log_softmax(Zq @ theta @ Zk.transpose(-1, -2), -1)).sum()


def test_cross_attention_is_softmax_of_logits_times_class_embeddings():
    Z, theta, _ = _linear_problem()
    expected = torch.stack([sum(torch.softmax(z @ theta.T, 0)[k] * theta[k] for k in range(len(theta))) for z in Z])
    torch.testing.assert_close(cross_attention(Z, theta), expected, rtol=0, atol=1e-13)


@pytest.mark.parametrize("batch", [(), (3,)])
def test_linear_feature_gradient_matches_autograd(batch):
    Z, theta, C = _linear_problem(batch=batch)
    want = _autograd(lambda z: multinomial_loss(z, theta, C, "linear"), Z)
    assert (feature_gradient(Z, theta, C, "linear") - want).abs().max() <= 1e-10


def test_linear_loss_is_sum_of_row_cross_entropies():
    Z, theta, C = _linear_problem()
    y = C.argmax(-1)
    onehot = F.one_hot(y, theta.shape[0]).to(F64)
    want = F.cross_entropy(Z @ theta.T, y, reduction="sum")
    torch.testing.assert_close(multinomial_loss(Z, theta, onehot), want)


@pytest.mark.parametrize("batch", [(), (2,)])
def test_quadratic_feature_gradient_keep_matches_autograd(batch):
    Z, theta, C = _quadratic_problem(batch=batch)
    want = _autograd(lambda z: multinomial_loss(z, theta, C, "quadratic"), Z)
    assert (feature_gradient(Z, theta, C, "quadratic", "keep") - want).abs().max() <= 1e-10


def test_quadratic_drop_is_the_gradient_with_respect_to_the_queries_only():
    Z, theta, C = _quadratic_problem(seed=1)
    want = _autograd(lambda z: _query_only_loss(z, Z, theta, C), Z)
    assert (feature_gradient(Z, theta, C, "quadratic", "drop") - want).abs().max() <= 1e-10


def test_quadratic_symmetrize_is_twice_the_query_gradient_for_symmetrized_targets():
    Z, theta, C = _quadratic_problem(seed=2)
    C_sym = (C + C.T) / 2  # rows sum to one because C is doubly stochastic
    want = 2 * _autograd(lambda z: _query_only_loss(z, Z, theta, C_sym), Z)
    assert (feature_gradient(Z, theta, C, "quadratic", "symmetrize") - want).abs().max() <= 1e-10


@pytest.mark.parametrize(
    "model,term", [("linear", "keep"), ("quadratic", "keep"), ("quadratic", "drop"), ("quadratic", "symmetrize")]
)
def test_flow_right_hand_side_is_minus_the_gradient_direction(model, term):
    Z, theta, C = _linear_problem() if model == "linear" else _quadratic_problem(seed=3)
    attention, label = flow_terms(Z, theta, C, model, term)
    assert (attention + label + feature_gradient(Z, theta, C, model, term)).abs().max() <= 1e-12
    fa, fb = vector_fields(theta, C, model, term)
    torch.testing.assert_close(fa(Z) + fb(Z), flow_rhs(Z, theta, C, model, term), rtol=0, atol=1e-13)


def test_quadratic_attention_terms_are_self_attention_and_its_transpose():
    Z, theta, C = _quadratic_problem(seed=4)
    P = quadratic_weights(Z, theta)
    torch.testing.assert_close(P.sum(-1), torch.ones(len(Z), dtype=F64))
    attention, _ = flow_terms(Z, theta, C, "quadratic", "keep")
    torch.testing.assert_close(attention, -(P @ Z @ theta + P.T @ Z @ theta), rtol=0, atol=1e-12)


def test_bad_arguments_name_the_choices():
    Z, theta, C = _linear_problem()
    with pytest.raises(ValueError, match="choose one of: linear, quadratic"):
        feature_gradient(Z, theta, C, "cubic")
    with pytest.raises(ValueError, match="quadratic. only"):
        feature_gradient(Z, theta, C, "linear", "drop")
    Zq, tq, Cq = _quadratic_problem()
    with pytest.raises(ValueError, match="keep, drop, symmetrize"):
        feature_gradient(Zq, tq, Cq, "quadratic", "transpose")
    with pytest.raises(ValueError, match="symmetric"):
        feature_gradient(Zq, tq + torch.triu(torch.ones_like(tq), 1), Cq, "quadratic")
    with pytest.raises(ValueError, match=r"C must be"):
        multinomial_loss(Z, theta, C[:, :2])


@functools.cache
def _reference(model):
    Z, theta, C = _linear_problem(seed=5, n=6) if model == "linear" else _quadratic_problem(seed=5, n=6)
    A, B = vector_fields(theta, C, model)
    return Z, A, B, rk4(lambda z: A(z) + B(z), Z, 1 / 2048, 2048)  # "exact" solution at T = 1


def _errors(method, model, steps=(16, 32, 64)):
    Z, A, B, ref = _reference(model)
    return [
        float((integrate(method, attention=A, linear=B, Z0=Z, h=1 / n, n_steps=n) - ref).abs().max()) for n in steps
    ]


def _ratios(errs):
    return [a / b for a, b in itertools.pairwise(errs)]


@pytest.mark.parametrize("model", ["linear", "quadratic"])
@pytest.mark.parametrize(
    "method, low, high",
    [
        ("euler", 1.7, 2.4),  # first order: halving the step halves the error (ratio 2)
        ("rk4", 13.0, 19.5),  # fourth order: ratio 16
        ("lie_trotter", 1.6, 2.4),  # first-order splitting: ratio 2
        ("strang", 3.4, 4.8),  # second-order splitting: ratio 4
    ],
)
def test_integrators_converge_at_their_order(model, method, low, high):
    assert all(low < r < high for r in _ratios(_errors(method, model)))


def test_strang_with_euler_substeps_drops_to_first_order():
    Z, A, B, ref = _reference("quadratic")
    errs = [float((strang(A, B, Z, 1 / n, n, substep="euler") - ref).abs().max()) for n in (16, 32, 64)]
    assert all(1.6 < r < 2.4 for r in _ratios(errs))


def test_oracle_flow_with_small_step_decreases_the_loss_monotonically():
    Z, theta, C = _linear_problem(seed=6, n=20)
    A, B = vector_fields(theta, C)
    h = 1.0 / float(torch.linalg.matrix_norm(theta, ord=2)) ** 2
    traj = lie_trotter(A, B, Z, h, 30, return_trajectory=True)
    losses = torch.stack([multinomial_loss(z, theta, C) for z in traj])
    assert traj.shape == (31, *Z.shape)
    assert bool((losses[1:] <= losses[:-1]).all()) and losses[-1] < losses[0]


def test_sphere_projection_puts_every_feature_on_the_sphere_after_each_step():
    Z, theta, C = _linear_problem(seed=7)
    A, B = vector_fields(theta, C)
    traj = euler(lambda z: A(z) + B(z), Z, 0.3, 5, project=2.0, return_trajectory=True)
    torch.testing.assert_close(traj[1:].norm(dim=-1), torch.full((5, len(Z)), 2.0, dtype=F64))
    torch.testing.assert_close(project_to_sphere(Z, 1.0).norm(dim=-1), torch.ones(len(Z), dtype=F64))


def _attention_module(d, q_weight, v_weight):
    spec = AttentionSpec.standard(d, 1).relax(scale="none", bias=False)
    module = Attention(spec).double()
    with torch.no_grad():
        module.q_proj.weight.copy_(q_weight)
        module.k_proj.weight.copy_(q_weight)
        module.v_proj.weight.copy_(v_weight)
        module.out_proj.weight.copy_(torch.eye(d, dtype=F64))
    return module


def test_lie_trotter_step_is_cross_attention_sublayer_then_linear_sublayer():
    # Linear model: queries = Z (W_q = I), keys = values = theta rows (W_k = I, W_v = -h I), no scale; then the
    # label sublayer C -> h C theta (a bias-free Linear of the one-hot labels), each with its residual.
    Z, theta, C = _linear_problem(seed=8, d=6)
    h, d, K = 0.3, Z.shape[-1], theta.shape[0]
    attention = _attention_module(d, torch.eye(d, dtype=F64), -h * torch.eye(d, dtype=F64))
    label = torch.nn.Linear(K, d, bias=False).double()
    with torch.no_grad():
        label.weight.copy_(h * theta.T)
    x = Z[None]
    x = x + attention(x, theta[None], theta[None])
    x = x + label(C[None])
    A, B = vector_fields(theta, C)
    assert (x[0] - lie_trotter(A, B, Z, h, 1)).abs().max() <= 1e-12


def test_lie_trotter_step_is_self_attention_sublayer_then_linear_sublayer():
    # Quadratic model, transposed_term="drop": W_q = W_k = phi^T (tied queries and keys Z phi), W_v = -h theta,
    # no scale; then the linear sublayer Z -> h C Z theta with its residual.
    g = torch.Generator().manual_seed(9)
    d, n, h = 6, 5, 0.2
    Z = torch.randn(n, d, generator=g, dtype=F64)
    phi = torch.randn(d, d, generator=g, dtype=F64) / 2
    theta = theta_from_phi(phi)
    C = _doubly_stochastic(n, g)
    attention = _attention_module(d, phi.T, -h * theta)
    x = Z[None]
    x = x + attention(x)
    x = x + h * C @ x @ theta
    A, B = vector_fields(theta, C, "quadratic", "drop")
    assert (x[0] - lie_trotter(A, B, Z, h, 1)).abs().max() <= 1e-12
    torch.testing.assert_close(-A(Z), self_attention(Z, theta))


@pytest.mark.parametrize("model", ["linear", "quadratic"])
def test_flownet_with_zero_steps_is_multinomial_regression(model):
    torch.manual_seed(0)
    kw = {"num_tokens": 4} if model == "quadratic" else {}
    net = FlowNet(6, 3, dim=8, steps=0, model=model, **kw)
    x = torch.randn(5, 4, 6) if model == "quadratic" else torch.randn(5, 6)
    Z = x @ net.embed.weight.T + net.embed.bias
    if model == "quadratic":
        Z = (Z + net.position).mean(1)
    torch.testing.assert_close(net(x), Z @ net.theta.T)
    assert len(list(net.mlps)) == 0


@pytest.mark.parametrize("share,blocks", [(True, 1), (False, 3)])
def test_flownet_step_is_attention_then_mlp_with_residuals(share, blocks):
    torch.manual_seed(1)
    net = FlowNet(6, 3, dim=8, steps=3, share_steps=share, step_size=0.4)
    assert len(net.mlps) == blocks
    x = torch.randn(5, 6)
    logits, feats = net(x, return_features=True)
    Z = net.embed(x)
    for k in range(3):
        Z = Z - 0.4 * cross_attention(Z, net.theta)
        Z = Z + 0.4 * net.mlps[0 if share else k](Z)
        torch.testing.assert_close(feats[k + 1], Z)
    torch.testing.assert_close(logits, Z @ net.theta.T)


def test_flownet_free_value_keeps_the_flow_weights_and_learns_the_values():
    torch.manual_seed(3)
    net = FlowNet(
        4, 3, dim=6, steps=1, model="quadratic", num_tokens=5, mixing="attention", value="free", step_size=0.3
    )
    Z = net.embed_inputs(torch.randn(2, 5, 4))
    theta = net.phis[0] @ net.phis[0].T
    want = Z + 0.3 * quadratic_weights(Z, theta) @ Z @ net.values[0]
    torch.testing.assert_close(net.step(Z, 0), want)
    tied = FlowNet(4, 3, dim=6, steps=1, model="quadratic", num_tokens=5, mixing="attention", step_size=0.3)
    tied.load_state_dict(net.state_dict(), strict=False)
    torch.testing.assert_close(tied.step(Z, 0), Z - 0.3 * self_attention(Z, theta))


@pytest.mark.parametrize(
    "mixing,attention,mlp",
    [("attention", True, False), ("mlp", False, True), ("both", True, True), ("neither", False, False)],
)
def test_flownet_mixing_arm_has_exactly_its_sublayers(mixing, attention, mlp):
    net = FlowNet(4, 3, dim=6, steps=2, model="quadratic", num_tokens=5, mixing=mixing)
    assert (len(net.phis) > 0) == attention and (len(net.mlps) > 0) == mlp
    if mixing == "neither":
        Z = torch.randn(2, 5, 6)
        torch.testing.assert_close(net.step(Z, 0), Z)


def test_flownet_quadratic_trains_end_to_end():
    torch.manual_seed(2)
    net = FlowNet(4, 3, dim=8, steps=2, model="quadratic", num_tokens=5, transposed_term="keep", project=1.0)
    x, y = torch.randn(16, 5, 4), torch.randint(0, 3, (16,))
    F.cross_entropy(net(x), y).backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())


def test_flownet_bad_choice_names_the_valid_ones():
    with pytest.raises(ValueError, match="choose one of: mean, cls, flatten"):
        FlowNet(4, 3, model="quadratic", num_tokens=5, readout="max")
    with pytest.raises(ValueError, match="choose one of: attention, mlp, both, neither"):
        FlowNet(4, 3, mixing="attn")


def _unnormalized_linear(seed=0):
    g = torch.Generator().manual_seed(seed)
    Z, theta = torch.randn(2, 6, 4, generator=g, dtype=F64), torch.randn(3, 4, generator=g, dtype=F64)
    return Z, theta, 2 * torch.rand(2, 6, 3, generator=g, dtype=F64)  # row sums far from 1


def _unnormalized_quadratic(seed=0):
    g = torch.Generator().manual_seed(seed)
    Z = torch.randn(2, 5, 4, generator=g, dtype=F64)
    theta = theta_from_phi(torch.randn(4, 2, generator=g, dtype=F64) / 2)
    return Z, theta, 2 * torch.rand(2, 5, 5, generator=g, dtype=F64)


def test_unnormalized_targets_use_the_general_formula_that_matches_autograd():
    Z, theta, C = _unnormalized_linear()
    auto = _autograd(lambda z: multinomial_loss(z, theta, C), Z)
    assert (feature_gradient(Z, theta, C) - auto).abs().max() <= 1e-10
    assert (-flow_rhs(Z, theta, C) - auto).abs().max() <= 1e-10
    # the source's sigma(N) - C (rows assumed to sum to 1) is what the check must catch
    assert ((torch.softmax(Z @ theta.T, -1) - C) @ theta - auto).abs().max() > 0.1
    Z, theta, C = _unnormalized_quadratic()
    auto = _autograd(lambda z: multinomial_loss(z, theta, C, "quadratic"), Z)
    assert (feature_gradient(Z, theta, C, "quadratic", "keep") - auto).abs().max() <= 1e-10
    A, B = vector_fields(theta, C, "quadratic", "keep")
    assert (-(A(Z) + B(Z)) - auto).abs().max() <= 1e-10
    query_only = _autograd(lambda zq: _query_only_loss(zq, Z, theta, C), Z)
    assert (feature_gradient(Z, theta, C, "quadratic", "drop") - query_only).abs().max() <= 1e-10
    A, B = vector_fields(theta, C, "quadratic", "drop")
    assert (-(A(Z) + B(Z)) - query_only).abs().max() <= 1e-10


def test_symmetrize_rejects_targets_whose_rows_do_not_sum_to_one():
    Z, theta, C = _unnormalized_quadratic()
    for call in (
        lambda: feature_gradient(Z, theta, C, "quadratic", "symmetrize"),
        lambda: flow_terms(Z, theta, C, "quadratic", "symmetrize"),
        lambda: vector_fields(theta, C, "quadratic", "symmetrize"),
    ):
        with pytest.raises(ValueError, match="rows sum to 1"):
            call()
