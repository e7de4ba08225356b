"""The precision rule (``axiomformer.precision``): every engine and normalizer computes in max(input dtype, float32).

Float64 inputs give float64-accurate outputs (against closed forms and the entmax package in float64) and pass
``gradcheck``; float16 inputs whose q . k overflows float16 before the scale give finite outputs and weights equal to
the float64 result on the same inputs, to float16's own rounding. Rows of every normalizer sum to one (or, for the
elementwise ones, to their closed form) within their dtype's precision."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from entmax import entmax15, entmax_bisect, sparsemax
from torch.autograd import gradcheck

from axiomformer import Attention, AttentionSpec
from axiomformer.axes.normalizer import DIFF_LAMBDA_INIT, LINEAR_EPS, normalize
from axiomformer.engines import ENGINES, attend
from axiomformer.engines.chunked import ChunkedEngine
from axiomformer.engines.linear import LinearEngine
from axiomformer.engines.rowwise import RowwiseEngine
from axiomformer.spec import AXES

HEADS, HEAD_DIM = 2, 4
DIM = HEADS * HEAD_DIM
ENGINE_NAMES = ["auto", "reference", "chunked", "sdpa", "linear"]
NORMALIZERS = list(AXES["normalizer"])


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch):
    monkeypatch.setitem(ENGINES, "chunked", ChunkedEngine(query_chunk=2, key_chunk=2))
    monkeypatch.setitem(ENGINES, "linear", LinearEngine(chunk=2))
    monkeypatch.delenv("AXIOMFORMER_ENGINE", raising=False)


CAUSAL_ONLY = {"stick_breaking"}
NONCAUSAL_ONLY = {"sinkhorn"}
TOPK = 2
"""``topk`` runs with k = 2 here, fewer than the 5-6 keys (at the default 8 it would be softmax)."""


def _stick_breaking64(s, visible):
    # u_ij = beta_ij prod over visible l with j < l of (1 - beta_il): the product written out, key by key
    beta = torch.sigmoid(s) * visible
    w = torch.zeros_like(s)
    for j in range(s.shape[-1]):
        w[..., j] = beta[..., j] * torch.prod(1 - beta[..., j + 1 :], dim=-1)
    return w


def _softpick64(s, visible):
    # relu(e^s - 1) / (sum |e^s - 1| + 1e-6), numerator and denominator times e^-m (scores up to 16384 here)
    m = s.masked_fill(~visible, float("-inf")).amax(-1, keepdim=True).clamp_min(0)
    a = (torch.exp(s - m) - torch.exp(-m)) * visible
    return torch.relu(a) / (a.abs().sum(-1, keepdim=True) + 1e-6 * torch.exp(-m))


def _topk64(blocked):
    kth = blocked.topk(TOPK, dim=-1).values[..., -1:]
    return torch.softmax(blocked.masked_fill(blocked < kth, float("-inf")), -1)


def _diff64(q, k, visible):
    # softmax(q1 k1 / sqrt(d/2)) - lambda softmax(q2 k2 / sqrt(d/2)), lambda at its initial value
    half = q.shape[-1] // 2
    parts = [
        torch.softmax((a @ b.transpose(-2, -1) / math.sqrt(half)).masked_fill(~visible, float("-inf")), -1)
        for a, b in ((q[..., :half], k[..., :half]), (q[..., half:], k[..., half:]))
    ]
    return parts[0] - DIFF_LAMBDA_INIT * parts[1]


def _sinkhorn64(blocked):
    # exp(s) with its rows, columns and rows divided by their sums (Sander et al. 2022, 3 normalizations)
    w = torch.exp(blocked - blocked.amax((-2, -1), keepdim=True))
    for dim in (-1, -2, -1):
        w = w / w.sum(dim, keepdim=True)
    return w


def _power64(s, visible):
    w = s.square() * visible  # p = 2 (Buckman, Gelada & Zhang 2024)
    return w / w.sum(-1, keepdim=True)


def truth64(normalizer: str, q, k, v, scale: float, causal: bool):
    """The weights and output in float64 from closed forms and the entmax package, independent of the engines."""
    q, k, v = q.double(), k.double(), v.double()
    q_len, k_len = q.shape[-2], k.shape[-2]
    visible = torch.ones(q_len, k_len, dtype=torch.bool)
    if causal:
        visible = visible.tril(k_len - q_len)
    n = visible.sum(-1, keepdim=True).double()
    if normalizer == "linear":
        # The linear normalizer's default temperature is 1 (axes.normalizer.default_scale).
        kernel = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-2, -1) * visible
        w = kernel / (kernel.sum(-1, keepdim=True) + LINEAR_EPS)
        return w, w @ v
    s = scale * q @ k.transpose(-2, -1)
    blocked = s.masked_fill(~visible, float("-inf"))
    w = {
        "softmax": lambda: torch.softmax(blocked, -1),
        "gumbel_softmax": lambda: torch.softmax(blocked, -1),  # eval, tau = 1
        "sigmoid": lambda: torch.sigmoid(s - n.log()) * visible,
        "relu": lambda: torch.relu(s) / n * visible,
        "none": lambda: s * visible,  # no normalization
        "sparsemax": lambda: sparsemax(blocked, -1),
        "entmax15": lambda: entmax15(blocked, -1),
        "entmax_alpha": lambda: entmax_bisect(blocked, 1.5, -1, n_iter=100),
        "softmax1": lambda: torch.softmax(torch.cat([blocked, torch.zeros_like(s[..., :1])], -1), -1)[..., :-1],
        # the sink logit starts at 0: softmax1 (gpt-oss)
        "softmax_sink": lambda: torch.softmax(torch.cat([blocked, torch.zeros_like(s[..., :1])], -1), -1)[..., :-1],
        "stick_breaking": lambda: _stick_breaking64(s, visible),
        "softpick": lambda: _softpick64(s, visible),
        "topk": lambda: _topk64(blocked),
        "diff": lambda: _diff64(q, k, visible),
        "sinkhorn": lambda: _sinkhorn64(blocked),
        "power": lambda: _power64(s, visible),
    }[normalizer]()
    return w, w @ v


def _run(normalizer, engine, q, k, v, causal, need_weights=False):
    spec = AttentionSpec.standard(DIM, HEADS, causal=causal).relax(normalizer=normalizer)
    if normalizer == "topk":
        spec = spec.relax(topk=TOPK)
    try:
        return attend(q, k, v, spec=spec, engine=engine, need_weights=need_weights)
    except ValueError as err:
        assert "cannot run" in str(err)
        return None


@pytest.mark.parametrize("normalizer", NORMALIZERS)
@pytest.mark.parametrize("engine", ENGINE_NAMES)
@pytest.mark.parametrize("causal", [False, True])
def test_float64_inputs_are_computed_in_float64_on_every_engine(normalizer, engine, causal):
    if normalizer in CAUSAL_ONLY and not causal:
        pytest.skip("defined under a causal mask only")
    if normalizer in NONCAUSAL_ONLY and causal:
        pytest.skip("defined without a causal mask only")
    q, k, v = (torch.randn(2, HEADS, n, HEAD_DIM, dtype=torch.float64) for n in (5, 6, 6))
    result = _run(normalizer, engine, q, k, v, causal)
    if result is None:
        return
    _, expected = truth64(normalizer, q, k, v, HEAD_DIM**-0.5, causal)
    assert result.out.dtype == torch.float64
    torch.testing.assert_close(result.out, expected, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_float64_weights_are_float64_and_rows_sum_to_one_within_float64(normalizer):
    causal = normalizer in CAUSAL_ONLY
    q, k, v = (torch.randn(2, HEADS, n, HEAD_DIM, dtype=torch.float64) for n in (5, 6, 6))
    weights = _run(normalizer, "auto", q, k, v, causal, need_weights=True).weights
    expected, _ = truth64(normalizer, q, k, v, HEAD_DIM**-0.5, causal)
    assert weights.dtype == torch.float64
    torch.testing.assert_close(weights, expected, rtol=1e-11, atol=1e-12)
    if normalizer not in (
        "none",
        "sigmoid",
        "relu",
        "softmax1",
        "linear",
        "diff",
        "stick_breaking",
        "softmax_sink",
        "softpick",
    ):
        # the ones that are distributions
        torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights.sum(-1)), rtol=0, atol=1e-13)


@pytest.mark.parametrize("normalizer", NORMALIZERS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rows_of_every_distribution_normalizer_sum_to_one_within_its_dtype(normalizer, dtype):
    if normalizer in (
        "sigmoid",
        "relu",
        "softmax1",
        "linear",
        "diff",
        "stick_breaking",
        "softmax_sink",
        "softpick",
        "none",
    ):
        pytest.skip("not a distribution over the keys")
    scores = (torch.randn(3, HEADS, 7, 11) * 4).to(dtype)
    weights = normalize(scores, None, normalizer)
    assert weights.dtype == torch.float32  # computed in max(dtype, float32)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, HEADS, 7), rtol=0, atol=4e-7)


@pytest.mark.parametrize("engine", ["reference", "chunked"])
@pytest.mark.parametrize(
    "normalizer", ["softmax", "sigmoid", "relu", "entmax15", "linear", "softmax1", "power", "sinkhorn"]
)
def test_float64_gradcheck_passes(engine, normalizer):
    q, k, v = (torch.randn(1, HEADS, n, HEAD_DIM, dtype=torch.float64, requires_grad=True) for n in (3, 4, 4))
    if normalizer in NONCAUSAL_ONLY and engine == "chunked":
        pytest.skip("the chunked engine splits the queries, which sinkhorn couples: it declines it")
    causal = normalizer not in NONCAUSAL_ONLY
    spec = AttentionSpec.standard(DIM, HEADS, causal=causal).relax(normalizer=normalizer)
    assert gradcheck(lambda q, k, v: attend(q, k, v, spec=spec, engine=engine).out, (q, k, v), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "relax",
    ["softcap=2.5", "normalizer=softpick", "normalizer=stick_breaking", "normalizer=topk,topk=2"]
    + [
        "normalizer=softpick,softcap=2.5",
        "normalizer=stick_breaking,softcap=2.5",
        "normalizer=topk,topk=2,softcap=2.5",
    ],
)
def test_float64_gradcheck_passes_on_the_rowwise_kernels(monkeypatch, relax):
    monkeypatch.setitem(ENGINES, "rowwise", RowwiseEngine(memory_budget=40))  # chunks of 2-4 queries
    q, k, v = (torch.randn(1, HEADS, n, HEAD_DIM, dtype=torch.float64, requires_grad=True) for n in (5, 6, 6))
    spec = AttentionSpec.standard(DIM, HEADS, causal=True).relax(relax)
    assert gradcheck(lambda q, k, v: attend(q, k, v, spec=spec, engine="rowwise").out, (q, k, v), eps=1e-6, atol=1e-7)


def test_float64_positions_are_computed_in_float64():
    for relax in ("position=rope", "position=sinusoidal", "position=alibi,causal=true"):
        att = Attention(AttentionSpec.standard(DIM, HEADS).relax(relax)).double()
        x = torch.randn(1, 6, DIM, dtype=torch.float64, requires_grad=True)
        assert gradcheck(att, (x,), eps=1e-6, atol=1e-7)


def test_the_float64_check_sees_a_float32_reference(monkeypatch):
    # Plant the old fault: scores computed in float32 whatever the input.
    from axiomformer.engines import reference

    monkeypatch.setattr(reference, "compute_dtype", lambda *dtypes: torch.float32)
    q, k, v = (torch.randn(2, HEADS, n, HEAD_DIM, dtype=torch.float64) for n in (5, 6, 6))
    _, expected = truth64("softmax", q, k, v, HEAD_DIM**-0.5, False)
    out = attend(q, k, v, engine="reference").out
    assert float((out - expected).abs().max()) > 1e-10


# ---------------------------------------------------------------------------------------------- float16 overflow
@pytest.mark.parametrize("normalizer", NORMALIZERS)
@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_float16_scores_beyond_the_float16_range_stay_finite_and_correctly_rounded(normalizer, engine):
    # q = k = 64 in every coordinate: q . k = 64 * 64 * 16 = 65536 > 65504 (float16 max) before the 1/4 scale.
    if normalizer == "none":
        pytest.skip("no normalization: the weights are the scores themselves, beyond float16's range by design")
    causal = normalizer in CAUSAL_ONLY
    q = torch.full((1, 1, 3, 16), 64.0, dtype=torch.float16)
    v = torch.randn(1, 1, 3, 16).to(torch.float16)
    spec = AttentionSpec.standard(16, 1, causal=causal).relax(normalizer=normalizer)
    if normalizer == "topk":
        spec = spec.relax(topk=3)  # every score ties here: which k of them are kept is not defined for k < 3
    try:
        result = attend(q, q, v, spec=spec, engine=engine, need_weights=engine == "auto")
    except ValueError as err:
        assert "cannot run" in str(err)
        return
    expected_w, expected = truth64(normalizer, q, q, v, 0.25, causal)
    assert torch.isfinite(result.out).all()
    # The float64 result on the same float16 inputs, rounded once to float16, is the best any float16 output can be.
    assert float((result.out.double() - expected).abs().max()) <= 2**-10 * float(expected.abs().max()) + 1e-3
    if result.weights is not None:
        assert torch.isfinite(result.weights).all()
        torch.testing.assert_close(result.weights.double(), expected_w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("score", ["bilinear", "cosine", "mlp", "additive", "neg_l2"])
def test_learned_scores_in_float16_run_and_stay_finite(score):
    att = Attention(AttentionSpec.standard(DIM, HEADS).relax(score=score)).half()
    x = (torch.randn(1, 5, DIM) * 30).half().requires_grad_()
    out = att(x)
    out.float().sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    assert all(p.grad is None or p.grad.dtype == torch.float16 for p in att.parameters())


def test_the_float16_check_sees_scores_multiplied_in_float16(monkeypatch):
    from axiomformer.engines import reference

    monkeypatch.setattr(reference, "compute_dtype", lambda *dtypes: dtypes[0])
    q = torch.full((1, 1, 3, 16), 64.0, dtype=torch.float16)
    out = attend(q, q, q, engine="reference").out
    assert not bool(torch.isfinite(out).all())


def test_scale_constant_matches_math():
    assert HEAD_DIM**-0.5 == pytest.approx(1 / math.sqrt(HEAD_DIM))
