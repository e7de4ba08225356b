"""``entmax_alpha`` for large alpha (issue 36): weights within 1e-3 and gradients within 1e-2 relative of alpha-entmax
computed with mpmath at 40 + 2.2 alpha digits (bisection on the threshold, the Jacobian diag(g) - g g^T / sum g with
g_i = p_i^(2 - alpha) on the support, Peters et al. 2019 Prop. 2), on rows that put a weight near the support's edge,
where a float64 threshold of the form 1 + beta (x - m) cancels (at alpha = 10 it was off by 0.43)."""

from __future__ import annotations

import mpmath as mp
import pytest
import torch

from axiomformer.axes import normalizer
from axiomformer.axes.normalizer import entmax_alpha


def exact(x: list[float], alpha) -> list:
    """alpha-entmax of x in mpmath, with digits enough for u = p^(alpha - 1) of the smallest weight tested."""
    mp.mp.dps = int(40 + 2.2 * float(alpha))
    beta = mp.mpf(alpha) - 1
    z = [beta * mp.mpf(v) for v in x]
    lo, hi = max(z) - 1, max(z)
    for _ in range(int(3.4 * mp.mp.dps)):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(max(zi - mid, 0) ** (1 / beta) for zi in z) >= 1 else (lo, mid)
    return [max(zi - lo, 0) ** (1 / beta) for zi in z]


def exact_vjp(p: list, alpha: float, w: list[float]) -> list[float]:
    g = [pi ** (2 - mp.mpf(alpha)) if pi > 0 else mp.mpf(0) for pi in p]
    q = sum(gi * wi for gi, wi in zip(g, w)) / sum(g)
    return [float(gi * (wi - q)) for gi, wi in zip(g, w)]


ROWS = [[0.111, 0.0], [-0.111, 0.0], [0.3, 0.2, -0.5, 0.25], [2.0, 1.9, 1.95, -3.0, 1.0], [5.0, 5.0 - 1e-3, 4.0]]


@pytest.mark.parametrize("alpha", [2.0, 3.0, 6.0, 10.0, 30.0, 100.0])
def test_weights_and_score_gradients_match_mpmath_for_large_alpha(alpha):
    for row in ROWS:
        x32 = torch.tensor([row]).float()
        xs = x32.double()[0].tolist()  # the float32 scores, exactly
        ref = exact(xs, alpha)
        x = x32.clone().requires_grad_()
        p = entmax_alpha(x, torch.tensor(alpha))
        torch.testing.assert_close(
            p[0].double(), torch.tensor([float(v) for v in ref], dtype=torch.float64), rtol=0, atol=1e-3
        )
        w = [float((-1) ** i * (i + 1)) for i in range(len(row))]
        (p * torch.tensor([w])).sum().backward()
        want = torch.tensor(exact_vjp(ref, alpha, w), dtype=torch.float64)
        torch.testing.assert_close(x.grad[0].double(), want, rtol=1e-2, atol=1e-2 * float(want.abs().max()) + 1e-9)


def test_the_weight_near_the_edge_is_monotone_in_the_score_at_alpha_ten():
    ts = torch.linspace(-1, 1, 2001)
    p0 = entmax_alpha(torch.stack([ts, torch.zeros_like(ts)], -1), torch.tensor(10.0))[:, 0]
    assert float((p0[1:] - p0[:-1]).min()) >= -1e-6


def test_a_planted_m_form_is_caught(monkeypatch):
    # the form that had the 0.43 error: the recentred one switched off
    monkeypatch.setattr(normalizer, "ENTMAX_RECENTRE", float("inf"))
    p = entmax_alpha(torch.tensor([[0.09, 0.0]]), torch.tensor(10.0))
    assert abs(float(p[0, 0]) - float(exact([0.09, 0.0], 10.0)[0])) > 0.1


@pytest.mark.parametrize("alpha", [1.6, 3.0, 10.0, 100.0])
def test_the_alpha_gradient_matches_an_mpmath_central_difference(alpha):
    h = mp.mpf(10) ** -20
    for row in ROWS:
        x32 = torch.tensor([row]).float()
        xs = x32.double()[0].tolist()
        w = [float((-1) ** i * (i + 1)) for i in range(len(row))]
        up, down = exact(xs, mp.mpf(alpha) + h), exact(xs, mp.mpf(alpha) - h)
        want = float(sum((a - b) / (2 * h) * wi for a, b, wi in zip(up, down, w)))
        a = torch.tensor(alpha, dtype=torch.float64, requires_grad=True)
        (got,) = torch.autograd.grad((entmax_alpha(x32, a).double() * torch.tensor([w], dtype=torch.float64)).sum(), a)
        assert abs(float(got) - want) <= 1e-2 * abs(want) + 1e-6, (row, float(got), want)


@pytest.mark.parametrize("alpha", [1.55, 3.0, 10.0])
def test_blocked_keys_leave_every_gradient_finite(alpha):
    # found by the differential fuzzer: beta * (-inf) in the unselected branch of a torch.where gave a NaN dp/dalpha
    x = torch.tensor([[0.3, float("-inf"), 0.1], [0.5, float("-inf"), float("-inf")]], requires_grad=True)
    a = torch.tensor(alpha, requires_grad=True)
    p = entmax_alpha(x, a)
    (p * torch.tensor([[1.0, 2.0, 3.0]])).sum().backward()
    assert p[:, 1].eq(0).all() and torch.isfinite(x.grad).all() and torch.isfinite(a.grad)
    want = exact([0.3, 0.1], alpha)
    torch.testing.assert_close(
        p[0, [0, 2]].double(), torch.tensor([float(v) for v in want], dtype=torch.float64), rtol=0, atol=1e-6
    )


# ---------------------------------------------------------------------------------------------- the bound on alpha
def test_random_rows_at_the_bound_match_mpmath():
    """At ENTMAX_ALPHA_MAX (32) on random rows whose smallest weights lie near the support's edge: within 1e-3 of
    mpmath, small weights included (the test set holds one below 0.01)."""
    alpha = normalizer.ENTMAX_ALPHA_MAX
    g = torch.Generator().manual_seed(0)
    x = torch.randn(24, 16, generator=g) * (2.0 / (alpha - 1))
    p = entmax_alpha(x, torch.tensor(alpha)).double()
    ref = torch.tensor([[float(v) for v in exact(row.double().tolist(), alpha)] for row in x], dtype=torch.float64)
    assert float(ref[ref > 0].min()) < 0.01
    assert float((p - ref).abs().max()) < 1e-3


def test_beyond_the_bound_small_weights_are_lost():
    """Why the bound: at alpha = 300 a weight of 0.0045 has u = p^299 ~ 1e-700, below float64 (and ENTMAX_TINY), and
    comes out 0 — the 1e-3 check above fails there, so it can tell."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 48, generator=g) * (2.0 / 299)
    p = entmax_alpha(x, torch.tensor(300.0)).double()
    ref = torch.tensor([[float(v) for v in exact(row.double().tolist(), 300.0)] for row in x], dtype=torch.float64)
    assert float((p - ref).abs().max()) > 1e-3


def test_the_learned_alpha_is_bounded_by_a_clamp():
    """alpha = 1 + min(softplus(theta), 31): at the initialisation 1.5 as before (theta in float32); far above the bound 32, with
    a finite (zero) gradient for theta and finite score gradients."""
    from axiomformer import AttentionSpec
    from axiomformer.axes.normalizer import Normalizer

    module = Normalizer(AttentionSpec(dim=4, num_heads=2, normalizer="entmax_alpha"))
    assert torch.allclose(module.params()["alpha"], torch.tensor(1.5, dtype=torch.float64), rtol=0, atol=1e-7)
    with torch.no_grad():
        module.alpha_raw.fill_(200.0)
    params = module.params()
    assert float(params["alpha"].max()) == normalizer.ENTMAX_ALPHA_MAX
    assert float(params["alpha_minus_one"].max()) == normalizer.ENTMAX_ALPHA_MAX - 1
    x = (torch.randn(1, 2, 3, 6) * 0.05).requires_grad_(True)
    module(x).mul(torch.randn(1, 2, 3, 6)).sum().backward()
    assert torch.isfinite(x.grad).all() and float(module.alpha_raw.grad.abs().max()) == 0.0


def test_a_weight_at_the_support_s_edge_at_the_bound_matches_a_deep_mpmath_reference():
    """alpha = 32, row [-0.032, 0]: p0 = 2.59069e-4, so u = p0^31 ~ 1e-111 and the reference needs more than 111
    digits (at 80 digits a bisection returns 2.44e-3, a wrong reference, not a wrong library); here 250."""
    mp.mp.dps = 250
    beta = mp.mpf(31)
    z = [beta * mp.mpf(v) for v in (-0.032, 0.0)]
    lo, hi = max(z) - 1, max(z)
    for _ in range(900):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(max(zi - mid, 0) ** (1 / beta) for zi in z) >= 1 else (lo, mid)
    p = [max(zi - lo, 0) ** (1 / beta) for zi in z]
    expected = float(p[0] / sum(p))
    got = entmax_alpha(torch.tensor([[-0.032, 0.0]], dtype=torch.float64), normalizer.ENTMAX_ALPHA_MAX)[0, 0]
    assert abs(float(got) - expected) < 1e-9 and 2.5e-4 < expected < 2.7e-4
