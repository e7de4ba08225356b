"""``entmax_alpha`` over its whole range alpha >= 1: weights and dp/dalpha against the entmax package in float64
(and, at alpha -> 1, the closed-form derivative of alpha-entmax at 1), from float32 scores; the learned alpha keeps
alpha - 1 > 0 exactly (it once rounded to 1.0 in float32)."""

from __future__ import annotations

import math

import pytest
import torch
from entmax import entmax_bisect
from torch.autograd import gradcheck

from axiomformer import AttentionSpec
from axiomformer.axes.normalizer import Normalizer, entmax_alpha

X = torch.tensor([[0.0, 0.5, 1.0, -2.0, 0.7], [3.0, -1.0, 0.2, 0.21, -0.5]], dtype=torch.float64)


def dp_dalpha_at_one(x: torch.Tensor) -> torch.Tensor:
    """d alpha-entmax / d alpha at alpha = 1: s_i (E_s[l^2] - l_i^2) / 2, s = softmax(x), l = log s (expanding
    [1 + beta y]^(1 / beta) = e^y (1 - beta y^2 / 2 + O(beta^2)) and renormalizing)."""
    s = torch.softmax(x, -1)
    l2 = torch.log(s) ** 2
    return s * ((s * l2).sum(-1, keepdim=True) - l2) / 2


def truth(x: torch.Tensor, alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights and dp/dalpha in float64 from the entmax package (central differences in alpha), or from the
    closed forms at alpha - 1 <= 1e-4, where the package's float64 bisection is no longer accurate enough."""
    if alpha - 1 <= 1e-4:
        d1 = dp_dalpha_at_one(x)
        return torch.softmax(x, -1) + (alpha - 1) * d1, d1
    h = 1e-6
    run = lambda a: entmax_bisect(x, a, -1, n_iter=200)
    return run(alpha), (run(alpha + h) - run(alpha - h)) / (2 * h)


ALPHAS = [1.0, 1 + 1e-9, 1 + 1e-6, 1 + 1e-4, 1.01, 1.1, 1.5, 2.0, 3.0, 6.0]


@pytest.mark.parametrize("alpha", ALPHAS)
def test_weights_and_dp_dalpha_from_float32_scores_match_float64_over_the_whole_range(alpha):
    x = X.float()
    a = torch.tensor(alpha, dtype=torch.float64, requires_grad=True)
    p = entmax_alpha(x, a)
    grads = torch.stack(
        [torch.autograd.grad(p[r, i], a, retain_graph=True)[0] for r in range(2) for i in range(5)]
    ).view(2, 5)
    p_ref, g_ref = truth(X, alpha)
    assert p.dtype == torch.float32
    torch.testing.assert_close(p.double(), p_ref, rtol=0, atol=2e-6)
    torch.testing.assert_close(grads.double(), g_ref, rtol=1e-2, atol=2e-5)
    torch.testing.assert_close(p.sum(-1), torch.ones(2), rtol=0, atol=3e-7)


@pytest.mark.parametrize("alpha", [1.0, 1 + 1e-5, 1.3, 2.0, 3.5])
def test_float64_gradcheck_in_scores_and_alpha(alpha):
    x = X.clone().requires_grad_()
    a = torch.tensor(alpha, dtype=torch.float64, requires_grad=True)
    assert gradcheck(lambda x, a: entmax_alpha(x, a), (x, a), eps=1e-7, atol=1e-6)


def test_blocked_keys_get_zero_weight_and_finite_gradients():
    x = X.float().clone()
    x[0, 1] = float("-inf")
    x.requires_grad_()
    a = torch.tensor([[1.2], [1.0]], dtype=torch.float64, requires_grad=True)
    p = entmax_alpha(x, a)
    (p * torch.arange(5.0)).sum().backward()
    assert float(p[0, 1]) == 0.0
    assert torch.isfinite(x.grad).all() and torch.isfinite(a.grad).all()


@pytest.mark.parametrize("theta", [math.log(math.expm1(1e-4)), -20.0, -40.0])
def test_the_learned_alpha_keeps_alpha_minus_one_above_zero_and_its_gradient(theta):
    module = Normalizer(AttentionSpec(dim=2, num_heads=2, normalizer="entmax_alpha"))
    with torch.no_grad():
        module.alpha_raw.fill_(theta)
    params = module.params()
    assert bool((params["alpha_minus_one"] > 0).all()) and bool((params["alpha"] >= 1).all())
    p = module(X.float().view(1, 2, 1, 5).expand(1, 2, 1, 5))
    (p[0, 0, 0, 2]).backward()
    grad = module.alpha_raw.grad[0]
    beta = math.log1p(math.exp(theta))
    expected = float(truth(X[0:1], 1 + beta)[1][0, 2]) * (1 - math.exp(-beta))  # dalpha/dtheta = sigmoid(theta)
    assert math.isfinite(float(grad))
    assert float(grad) == pytest.approx(expected, rel=1e-2, abs=1e-12)


def test_the_check_sees_the_float32_package_derivative_near_one():
    # The old implementation: the entmax package's bisection in float32 at alpha = 1.0001.
    a = torch.tensor(1.0001, requires_grad=True)
    p = entmax_bisect(X.float(), a, -1)
    grad = torch.autograd.grad(p[0, 2], a)[0]
    assert abs(float(grad) - float(truth(X, 1.0001)[1][0, 2])) > 1e-2
