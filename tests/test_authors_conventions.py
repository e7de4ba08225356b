"""The authors' released conventions as options (issue 34, item 6), each against an independent float64 formula
written here from the authors' code, and each shown to differ from the default (the paper's formula) on a case where
they differ, so that an option that changes nothing is caught. Every engine that accepts an option is checked
against the reference engine by the equivalence matrix (``tests/test_engine_matrix.py``, the field cases)."""

from __future__ import annotations

import math

import pytest
import torch

from axiomformer import AttentionSpec
from axiomformer.engines.router import attend

DIM, HEADS, LEN = 16, 2, 7


def _qkv(seed: int, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (2, HEADS, LEN, DIM // HEADS)
    q, k, v = (torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(3))
    return q * scale, k, v


def _f64(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def _scores(q: torch.Tensor, k: torch.Tensor) -> list[list[list[list[float]]]]:
    d = q.shape[-1]
    return (q @ k.transpose(-2, -1) / math.sqrt(d)).tolist()


# ------------------------------------------------------------------------------------------------------ softpick
def _softpick_authors(row: list[float]) -> list[float]:
    # zaydzuhri/softpick-attention's softpick: x_m = max(x) (no clamp), relu(e^(x - x_m) - e^-x_m) over
    # sum |e^(x - x_m) - e^-x_m| + 1e-8
    x_m = max(row)
    terms = [math.exp(x - x_m) - math.exp(-x_m) for x in row]
    denom = sum(abs(t) for t in terms) + 1e-8
    return [max(t, 0.0) / denom for t in terms]


@pytest.mark.parametrize("scale", [1.0, 1e-4])
def test_softpick_shifted_eps_is_the_authors_formula_and_not_the_default(scale):
    # At scale 1e-4 the logits are ~1e-5 and sum |e^s - 1| ~ 1e-4: the epsilon's place is visible.
    q, k, v = _qkv(0, scale)
    spec = AttentionSpec.standard(DIM, HEADS).relax("normalizer=softpick,softpick_shifted_eps=true")
    expected = _f64([[[_softpick_authors(r) for r in head] for head in b] for b in _scores(q, k)])
    out = attend(q, k, v, spec=spec, engine="reference", need_weights=True)
    # the formula's e^(x - x_m) - e^-x_m cancels to ~1e-16 / |x| relative (axiomformer takes expm1 there)
    tol = 1e-12 / scale
    assert torch.allclose(out.weights, expected, rtol=tol, atol=1e-15)
    assert torch.allclose(out.out, expected @ v, rtol=tol, atol=1e-15)
    default = attend(q, k, v, spec=spec.relax(softpick_shifted_eps=False), engine="reference").out
    assert float((default - out.out).abs().max()) > 1e-9  # the paper's 1e-6 e^-m: another output


def test_softpick_shifted_eps_on_the_rowwise_engine_matches_the_formula():
    q, k, v = _qkv(1, 1e-4)
    spec = AttentionSpec.standard(DIM, HEADS).relax("normalizer=softpick,softpick_shifted_eps=true")
    expected = _f64([[[_softpick_authors(r) for r in head] for head in b] for b in _scores(q, k)]) @ v
    out = attend(q, k, v, spec=spec, engine="rowwise")
    assert out.engine == "rowwise" and torch.allclose(out.out, expected, rtol=1e-8, atol=1e-14)


# ------------------------------------------------------------------------------------------------ stick-breaking
def _stick_authors(z: list[float], i: int, attend_current: bool, remainder: bool) -> list[float]:
    # shawntan/stickbreaking-attention: log beta_ij = logsigmoid(z_ij), A_ij = beta_ij prod_{j < k < i'} (1 - beta_ik)
    # over the keys j <= i' of query i (i' = i - 1 when the diagonal is left out); rem_i = 1 - sum_j A_ij goes to
    # the query's own value (o_i += rem_i v_i), returned here as its weight on key i.
    last = i if attend_current else i - 1
    beta = [1.0 / (1.0 + math.exp(-x)) for x in z]
    weights = [0.0] * len(z)
    for j in range(last + 1):
        weights[j] = beta[j] * math.prod(1.0 - beta[m] for m in range(j + 1, last + 1))
    if remainder:
        weights[i] += 1.0 - sum(weights)
    return weights


@pytest.mark.parametrize(
    "attend_current, remainder", [(False, True), (False, False), (True, True), (True, False)], ids=str
)
def test_stick_breaking_conventions_are_the_authors_formula(attend_current, remainder):
    q, k, v = _qkv(2)
    spec = AttentionSpec.standard(DIM, HEADS, causal=True).relax(
        normalizer="stick_breaking", stick_attend_current=attend_current, stick_remainder=remainder
    )
    rows = _scores(q, k)
    expected = _f64(
        [[[_stick_authors(r, i, attend_current, remainder) for i, r in enumerate(h)] for h in b] for b in rows]
    )
    out = attend(q, k, v, spec=spec, engine="reference", need_weights=True)
    assert torch.allclose(out.weights, expected, rtol=1e-12, atol=1e-15)
    assert torch.allclose(out.out, expected @ v, rtol=1e-12, atol=1e-14)
    if remainder:  # the remainder completes every row to 1 (the first query's whole weight is its own value)
        assert torch.allclose(out.weights.sum(-1), torch.ones(()).double(), atol=1e-14)
    default = attend(q, k, v, spec=spec.relax(stick_attend_current=True, stick_remainder=False)).out
    assert (attend_current, remainder) == (True, False) or float((default - out.out).abs().max()) > 1e-3


def test_stick_breaking_authors_conventions_decode_through_the_cache_as_the_full_forward():
    from axiomformer import Attention, KVCache

    spec = AttentionSpec.standard(DIM, HEADS, causal=True).relax(
        "normalizer=stick_breaking,stick_attend_current=false,stick_remainder=true"
    )
    torch.manual_seed(0)
    att = Attention(spec).double().eval()
    x = torch.randn(2, LEN, DIM, dtype=torch.float64)
    full = att(x)
    cache = KVCache()
    steps = [att(x[:, t : t + 1], cache=cache) for t in range(LEN)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-12)


def test_the_rowwise_engine_declines_stick_breaking_at_the_authors_conventions():
    q, k, v = _qkv(3)
    spec = AttentionSpec.standard(DIM, HEADS, causal=True).relax("normalizer=stick_breaking,stick_remainder=true")
    with pytest.raises(ValueError, match="cannot run"):
        attend(q.float(), k.float(), v.float(), spec=spec, engine="rowwise")
    assert attend(q.float(), k.float(), v.float(), spec=spec.relax(stick_remainder=False), engine="rowwise").out.numel()


@pytest.mark.parametrize(
    "text, field", [("softpick_shifted_eps=maybe", "softpick_shifted_eps"), ("stick_remainder=2", "stick_remainder")]
)
def test_convention_flags_are_booleans(text, field):
    with pytest.raises(ValueError, match=field):
        AttentionSpec.standard(DIM, HEADS).relax(text)
    with pytest.raises(ValueError, match=field):
        AttentionSpec(**{field: 1})


def test_the_variant_names_the_conventions_that_differ_from_the_defaults():
    spec = AttentionSpec.standard(DIM, HEADS, causal=True).relax("normalizer=stick_breaking,stick_attend_current=0")
    assert spec.variant == "normalizer=stick_breaking,stick_attend_current=false"
    assert AttentionSpec.from_string(spec.variant, dim=DIM, num_heads=HEADS, causal=True) == spec


# ------------------------------------------------------------------------------------------------- talking heads
def test_talking_heads_residual_is_x_transformers_mixing_and_not_the_default():
    # x-transformers' Attend: sim = sim + pre_softmax_talking_heads(sim), a 1x1 convolution over the heads
    # initialised by nn.init.dirac_ (the identity), so the mixing matrix is I + W and starts at 2 I.
    from axiomformer.axes.score import build_score

    q, k, _ = _qkv(4)
    spec = AttentionSpec.standard(DIM, HEADS).relax("score=talking_heads,talking_heads_residual=true")
    score = build_score(spec).double()
    logits = _f64(
        [
            [[[sum(a * b for a, b in zip(qi, kj)) for kj in kh] for qi in qh] for qh, kh in zip(qb, kb)]
            for qb, kb in zip(q.tolist(), k.tolist())
        ]
    )
    assert torch.allclose(score(q, k), 2.0 * logits, rtol=1e-13)  # dirac start: (I + I) s
    mix = _f64([[0.3, -1.2], [0.7, 0.4]])
    with torch.no_grad():
        score.mix.copy_(mix)
    expected = _f64(
        [
            [
                [
                    [
                        logits[b, h, i, j].item()
                        + sum(mix[h, g].item() * logits[b, g, i, j].item() for g in range(HEADS))
                        for j in range(LEN)
                    ]
                    for i in range(LEN)
                ]
                for h in range(HEADS)
            ]
            for b in range(2)
        ]
    )
    assert torch.allclose(score(q, k), expected, rtol=1e-12, atol=1e-13)
    default = build_score(spec.relax(talking_heads_residual=False)).double()
    with torch.no_grad():
        default.mix.copy_(mix)
    assert float((default(q, k) - expected).abs().max()) > 1e-2  # the paper's P s: another score
    assert spec.variant == "score=talking_heads,talking_heads_residual=true"


# ------------------------------------------------------------------------------------------------------ sinkhorn
def _sinkhorn_authors(dots: torch.Tensor) -> torch.Tensor:
    # michaelsdr/sinkformers, vit_pytorch/sinkhorn.py (SinkhornDistance, eps = 1, max_iter = 3) and vit.py
    # (attn = sink(dots)[0]; attn = attn * attn.shape[-1]), ported line by line in float64
    x_points, y_points = dots.shape[-2], dots.shape[-1]
    mu = torch.full(dots.shape[:-1], 1.0 / x_points, dtype=dots.dtype)
    nu = torch.full(dots.shape[:-2] + (y_points,), 1.0 / y_points, dtype=dots.dtype)
    u, v = torch.zeros_like(mu), torch.zeros_like(nu)

    def m(u, v):
        return dots + u.unsqueeze(-1) + v.unsqueeze(-2)

    for i in range(3):
        if i % 2 == 0:
            u = (torch.log(mu) - torch.logsumexp(m(u, v), dim=-1)) + u
        else:
            v = (torch.log(nu) - torch.logsumexp(m(u, v).transpose(-2, -1), dim=-1)) + v
            v = v.detach().requires_grad_(False)
    pi = torch.exp(m(u, v))
    return pi * pi.shape[-1]


@pytest.mark.parametrize("q_len", [5, LEN])
def test_sinkhorn_authors_is_the_released_layer_and_not_the_default(q_len):
    q, k, v = _qkv(5)
    q = q[:, :, :q_len].clone().requires_grad_()
    spec = AttentionSpec.standard(DIM, HEADS).relax("normalizer=sinkhorn,sinkhorn_authors=true")
    out = attend(q, k, v, spec=spec, engine="reference", need_weights=True)
    dots = q @ k.transpose(-2, -1) / math.sqrt(DIM // HEADS)
    expected = _sinkhorn_authors(dots)
    assert torch.allclose(out.weights, expected, rtol=1e-12, atol=1e-15)
    assert torch.allclose(out.weights.sum(-1), torch.full((), LEN / q_len, dtype=torch.float64), rtol=1e-12)
    probe = torch.linspace(-1, 1, out.out.numel()).double().view_as(out.out)
    (grad,) = torch.autograd.grad((out.out * probe).sum(), q)
    (want,) = torch.autograd.grad(((expected @ v) * probe).sum(), q)
    assert torch.allclose(grad, want, rtol=1e-10, atol=1e-13)  # the detached column potential
    default = attend(q, k, v, spec=spec.relax(sinkhorn_authors=False), engine="reference")
    (grad_default,) = torch.autograd.grad((default.out * probe).sum(), q)
    # non-square: other weights; square: the same weights (k_len / q_len = 1) but another gradient
    differs = (default.out - out.out) if q_len != LEN else (grad_default - grad)
    assert float(differs.abs().max()) > 1e-3
