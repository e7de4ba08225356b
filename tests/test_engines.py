"""Every fast engine against the reference engine, forward and backward, with masks and uneven chunk boundaries."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

from axiomformer import Attention, AttentionSpec
from axiomformer.engines import ENGINES, AttentionProblem, problem_kind
from axiomformer.engines.chunked import ChunkedEngine
from axiomformer.engines.flex import FlexEngine
from axiomformer.engines.linear import LinearEngine
from axiomformer.engines.reference import ReferenceEngine
from axiomformer.engines.sdpa import alibi_column_ok

DIM, HEADS, BATCH = 16, 2, 2
Q_LEN, K_LEN = 37, 70  # not multiples of the chunk size 16
MASKS = ("none", "key_padding", "bool", "float")


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch):
    # Chunks of 16 queries and 16 keys, so 37 and 70 leave partial chunks; the linear engine's prefix sum likewise.
    monkeypatch.setitem(ENGINES, "chunked", ChunkedEngine(query_chunk=16, key_chunk=16))
    monkeypatch.setitem(ENGINES, "linear", LinearEngine(chunk=16))
    monkeypatch.delenv("AXIOMFORMER_ENGINE", raising=False)


def _inputs(q_len: int, k_len: int, masks: str, causal: bool):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH, q_len, DIM, generator=g)
    kv = torch.randn(BATCH, k_len, DIM, generator=g)
    kwargs = {}
    if masks == "key_padding":
        keep = torch.ones(BATCH, k_len, dtype=torch.bool)
        keep[1, 9:] = False
        keep[0, -5:] = False
        kwargs["key_padding_mask"] = keep
    elif masks == "bool":
        allowed = torch.rand(q_len, k_len, generator=g) > 0.3
        allowed[3] = False  # a query with no visible key
        kwargs["attn_mask"] = allowed
    elif masks == "float":
        kwargs["attn_mask"] = torch.randn(BATCH, 1, q_len, k_len, generator=g)
    return x, kv, kwargs


def _run(spec, engine: str, x, kv, **kwargs):
    torch.manual_seed(3)  # identical parameters for every engine
    att = Attention(spec, engine=engine).eval()
    x = x.clone().requires_grad_()
    kv = kv.clone().requires_grad_()
    out = att(x, kv, **kwargs)
    probe = torch.linspace(-1, 1, out.numel()).view_as(out)
    (out * probe).sum().backward()
    grads = [x.grad, kv.grad] + [p.grad for p in att.parameters() if p.grad is not None]
    return out.detach(), grads, att.last_engine


def _assert_close(actual, expected, rtol=1e-4):
    """Relative error of the output and of every gradient <= rtol (float32); gradients that are zero in exact
    arithmetic (e.g. the key bias under softmax) are compared against 1e-3 of the largest gradient instead."""
    out_a, grads_a, _ = actual
    out_e, grads_e, _ = expected
    err = float((out_a - out_e).norm() / out_e.norm())
    assert err <= rtol, f"output relative error {err:.2e}"
    floor = 1e-3 * max(float(g.norm()) for g in grads_e)
    assert len(grads_a) == len(grads_e)
    for i, (ga, ge) in enumerate(zip(grads_a, grads_e)):
        err = float((ga - ge).norm()) / max(float(ge.norm()), floor)
        assert err <= rtol, f"gradient {i} relative error {err:.2e}"


def _check_against_reference(engine: str, relax: str, causal: bool, masks: str, k_len: int):
    spec = AttentionSpec.standard(DIM, HEADS, causal=causal).relax(relax)
    x, kv, kwargs = _inputs(Q_LEN, k_len, masks, causal)
    fast = _run(spec, engine, x, kv, **kwargs)
    assert fast[2] == engine
    _assert_close(fast, _run(spec, "reference", x, kv, **kwargs))


SDPA_SPECS = (
    "standard",
    "A4=cosine",
    "A4=cosine,scale=learned",
    "A4=neg_l2",
    "A4=neg_l2,scale=learned",
    "A4=bilinear",
    "position=rope",
    "position=alibi",
    "position=alibi,A4=neg_l2",
    "A1=mlp,A3=mlp",
)


@pytest.mark.parametrize("relax", SDPA_SPECS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("k_len", [Q_LEN, K_LEN])
def test_sdpa_engine_matches_reference_forward_and_backward(relax, causal, k_len):
    for masks in MASKS:
        _check_against_reference("sdpa", relax, causal, masks, k_len)


CHUNKED_SPECS = (
    "A5=sigmoid",
    "A5=relu",
    "A5=sparsemax",
    "A5=entmax15",
    "A5=linear",
    "A4=additive",
    "A4=mlp,A5=sigmoid",
    "A2=joint",
    "A2=joint,A5=relu",
    "A4=neg_l2,A5=sigmoid",
    "position=alibi,A5=entmax15",
    "A4=cosine,A5=relu,scale=learned",
    "standard",
)


@pytest.mark.parametrize("relax", CHUNKED_SPECS)
@pytest.mark.parametrize("causal", [False, True])
def test_chunked_engine_matches_reference_forward_and_backward(relax, causal):
    for k_len in (Q_LEN, K_LEN):
        for masks in MASKS:
            _check_against_reference("chunked", relax, causal, masks, k_len)


@pytest.mark.parametrize("relax", ["A5=linear", "A5=linear,feature_map=relu", "A5=linear,position=rope"])
@pytest.mark.parametrize("causal", [False, True])
def test_linear_engine_matches_reference_forward_and_backward(relax, causal):
    for k_len in (Q_LEN, K_LEN):  # k_len > q_len: a KV-cache-like past
        for masks in ("none", "key_padding"):
            _check_against_reference("linear", relax, causal, masks, k_len)


def test_linear_engine_declines_masks_that_depend_on_the_query():
    spec = AttentionSpec.standard(DIM, HEADS, causal=True).relax("A5=linear")
    for masks, expected in (("none", "linear"), ("key_padding", "linear"), ("bool", "chunked"), ("float", "chunked")):
        x, kv, kwargs = _inputs(Q_LEN, K_LEN, masks, True)
        assert _run(spec, "auto", x, kv, **kwargs)[2] == expected


@pytest.mark.parametrize(
    "relax, causal, expected",
    [
        ("standard", False, "sdpa"),
        ("A4=cosine", True, "sdpa"),
        ("A4=neg_l2", False, "sdpa"),
        ("position=rope", True, "sdpa"),
        ("position=alibi", True, "sdpa"),
        ("A5=sigmoid", True, "elementwise"),
        ("A5=relu", False, "elementwise"),
        ("A5=sparsemax", True, "sparse"),
        ("A5=entmax15", False, "sparse"),
        ("A2=joint", True, "chunked"),
        ("A4=mlp", False, "chunked"),
        ("A5=linear", True, "linear"),
    ],
)
def test_auto_routing_follows_which_assumptions_hold(relax, causal, expected, monkeypatch):
    spec = AttentionSpec.standard(DIM, HEADS, causal=causal).relax(relax)
    x, kv, _ = _inputs(Q_LEN, Q_LEN, "none", causal)
    assert _run(spec, "auto", x, kv)[2] == expected
    monkeypatch.setenv("AXIOMFORMER_ENGINE", "reference")
    assert _run(spec, "auto", x, kv)[2] == "reference"


def test_sdpa_folds_causal_alibi_only_within_float32_precision():
    slopes = torch.tensor([0.5, 0.25])

    def problem(k_len, dtype, causal=True):
        q = torch.zeros(1, 2, 4, 8, dtype=dtype)
        k = torch.zeros(1, 2, k_len, 8, dtype=dtype)
        return AttentionProblem(q=q, k=k, v=k, causal=causal, alibi_slopes=slopes, q_offset=k_len - 4)

    assert alibi_column_ok(problem(4096, torch.float32))  # 0.5 * 2048 <= 2^10
    assert not alibi_column_ok(problem(4100, torch.float32))
    assert not alibi_column_ok(problem(5000, torch.float32))
    assert alibi_column_ok(problem(5000, torch.float64))
    assert not alibi_column_ok(problem(100, torch.float32, causal=False))
    assert not alibi_column_ok(problem(100, torch.bfloat16))


ENGINE_SPECS = [
    ("sdpa", "standard"),
    ("sdpa", "A4=neg_l2"),
    ("chunked", "A5=sigmoid"),
    ("chunked", "A5=sparsemax"),
    ("chunked", "A2=joint"),
    ("linear", "A5=linear"),
]


@pytest.mark.parametrize("engine, relax", ENGINE_SPECS)
def test_fully_masked_rows_give_zeros_with_finite_gradients_in_every_engine(engine, relax):
    spec = AttentionSpec.standard(DIM, HEADS, causal=True).relax(relax)
    x, kv, _ = _inputs(Q_LEN, Q_LEN, "none", True)
    keep = torch.ones(BATCH, Q_LEN, dtype=torch.bool)
    keep[1] = False  # sample 1 has no visible key at all
    keep[0, :5] = False  # sample 0: its first 5 queries see nothing
    out, grads, ran = _run(spec, engine, x, kv, key_padding_mask=keep)
    assert ran == engine
    assert torch.equal(out[1], torch.zeros_like(out[1])) and torch.equal(out[0, :5], torch.zeros_like(out[0, :5]))
    assert all(bool(torch.isfinite(g).all()) for g in grads)


@pytest.mark.parametrize("engine, relax", ENGINE_SPECS)
def test_nan_in_a_masked_key_never_reaches_the_outputs_in_every_engine(engine, relax):
    spec = AttentionSpec.standard(DIM, HEADS, causal=False).relax(relax)
    x, kv, _ = _inputs(Q_LEN, K_LEN, "none", False)
    kv[0, 50] = float("nan")
    keep = torch.ones(BATCH, K_LEN, dtype=torch.bool)
    keep[0, 50] = False
    out, grads, ran = _run(spec, engine, x, kv, key_padding_mask=keep)
    assert ran == engine
    assert bool(torch.isfinite(out).all())
    assert bool(torch.isfinite(grads[0]).all())  # the queries' gradient
    expected = _run(spec, "reference", x, kv, key_padding_mask=keep)
    torch.testing.assert_close(out, expected[0], rtol=1e-4, atol=1e-5)
    # A visible NaN key poisons exactly the outputs of the queries that may see it, as in the reference.
    if engine == "linear":  # takes key-only masks: all of sample 0 sees it
        out, _, _ = _run(spec, engine, x, kv)
        assert bool(torch.isnan(out[0]).all()) and bool(torch.isfinite(out[1]).all())
        return
    allowed = torch.ones(Q_LEN, K_LEN, dtype=torch.bool)
    allowed[:20, 50] = False
    out, _, _ = _run(spec, engine, x, kv, attn_mask=allowed)
    assert bool(torch.isnan(out[0, 20:]).all()) and bool(torch.isfinite(out[0, :20]).all())
    assert bool(torch.isfinite(out[1]).all())


@pytest.mark.parametrize("engine, relax", ENGINE_SPECS)
def test_need_weights_routes_to_the_engine_that_computes_with_them_whatever_engine_is_asked(engine, relax):
    spec = AttentionSpec.standard(DIM, HEADS, causal=True).relax(relax)
    x, kv, kwargs = _inputs(Q_LEN, K_LEN, "key_padding", True)
    torch.manual_seed(3)
    att = Attention(spec, engine=engine).eval()
    out, weights = att(x, kv, need_weights=True, **kwargs)
    torch.manual_seed(3)
    ref_att = Attention(spec, engine="reference").eval()
    ref_out, ref_weights = ref_att(x, kv, need_weights=True, **kwargs)
    assert att.last_engine == "reference" and weights.shape == (BATCH, HEADS, Q_LEN, K_LEN)
    torch.testing.assert_close(weights, ref_weights)
    torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("relax", ["A5=sigmoid", "A5=entmax15", "A2=joint"])
def test_chunked_engine_saves_no_full_score_matrix_for_backward(relax):
    # Tensors kept for the backward pass, recorded through saved-tensor hooks: with the reference the biggest holds
    # batch * heads * q_len * k_len elements (or more); the chunked engine keeps only per-chunk inputs.
    spec = AttentionSpec.standard(DIM, HEADS, causal=True).relax(relax)
    x, kv, _ = _inputs(Q_LEN, K_LEN, "none", True)
    full = BATCH * HEADS * Q_LEN * K_LEN

    def biggest_saved(engine):
        sizes = []

        def pack(t):
            sizes.append(t.numel())
            return t

        att = Attention(spec, engine=engine)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            att(x.requires_grad_(), kv).sum().backward()
        return max(sizes)

    assert biggest_saved("reference") >= full
    assert biggest_saved("chunked") < BATCH * HEADS * 16 * K_LEN


def test_flex_score_and_mask_mods_reproduce_the_reference():
    # flex_attention has no backward on CPU and compiles slowly there, so its mods are checked eagerly, forward.
    engine = FlexEngine(compile=False, devices=("cpu",))
    for relax, causal in (
        ("position=alibi", True),
        ("position=alibi,A4=neg_l2", False),
        ("position=alibi,A4=cosine,scale=learned", True),
    ):
        att = Attention(AttentionSpec.standard(DIM, HEADS, causal=causal).relax(relax)).eval()
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(BATCH, HEADS, n, DIM // HEADS, generator=g) for n in (Q_LEN, K_LEN, K_LEN))
        keep = torch.ones(BATCH, 1, 1, K_LEN, dtype=torch.bool)
        keep[1, ..., 2:] = False
        problem = AttentionProblem(
            q=q,
            k=k,
            v=v,
            causal=causal,
            mask=keep,
            alibi_slopes=att.position.slopes,
            q_offset=K_LEN - Q_LEN,
            scale=att.scale(),
        )
        parts = att.plan
        assert engine.accepts(parts, problem_kind(parts, problem))
        with torch.no_grad(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*without torch.compile")
            out, _ = engine(parts, problem)
            expected, _ = ReferenceEngine()(parts, problem)
        assert not engine.failed
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    assert not FlexEngine().accepts(parts, problem_kind(parts, problem))  # on CPU the default flex engine stands aside


def test_flex_failure_is_logged_once_and_falls_back(caplog, monkeypatch):
    engine = FlexEngine(devices=("cpu",))

    def broken():
        raise RuntimeError("no compiler for this device")

    monkeypatch.setattr(engine, "_kernel", broken)
    monkeypatch.setitem(ENGINES, "flex", engine)
    spec = AttentionSpec.standard(DIM, HEADS, causal=True).relax("position=alibi")
    x, kv, _ = _inputs(Q_LEN, Q_LEN, "none", True)
    with caplog.at_level(logging.WARNING, logger="axiomformer.engines.flex"):
        first = _run(spec, "auto", x, kv)
        second = _run(spec, "auto", x, kv)
    assert "cpu" in engine.failed
    assert sum("flex_attention failed" in r.message for r in caplog.records) == 1
    assert first[2] == second[2] == "sdpa"  # the router fell back on the failing call
    _assert_close(first, _run(spec, "reference", x, kv))


@pytest.mark.parametrize("kind", ["sigmoid", "relu"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale", ["inv_sqrt_d", "learned"])
@pytest.mark.parametrize("k_len", [Q_LEN, K_LEN])
def test_elementwise_closed_form_backward_matches_reference(monkeypatch, kind, causal, scale, k_len):
    from axiomformer.engines import elementwise

    calls = []
    real = elementwise.ElementwiseAttention.apply
    monkeypatch.setattr(elementwise.ElementwiseAttention, "apply", staticmethod(lambda *a: calls.append(1) or real(*a)))
    spec = AttentionSpec.standard(DIM, HEADS, causal=causal).relax(normalizer=kind, scale=scale)
    g = torch.Generator().manual_seed(11)
    x, kv = torch.randn(BATCH, Q_LEN, DIM, generator=g), torch.randn(BATCH, k_len, DIM, generator=g)
    fast = _run(spec, "elementwise", x, kv)
    assert calls, "the closed-form path did not run"
    _assert_close(fast, _run(spec, "reference", x, kv))
