"""What ``attend`` and ``Attention`` accept at their entry, on every engine and normalizer: queries past the last key
under a causal mask, empty sequences, 1-D masks, masks that only broadcast *with* the problem, windows that are not a
positive number of keys. Expected values come from SDPA's math path or from the reference engine given the explicit
boolean mask (an independent route through the code)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from axiomformer import Attention, AttentionSpec
from axiomformer.engines import ENGINES, attend
from axiomformer.engines.chunked import ChunkedEngine
from axiomformer.engines.linear import LinearEngine
from axiomformer.spec import AXES, required_fields

DIM, HEADS, HEAD_DIM = 16, 2, 8
NORMALIZERS = AXES["normalizer"]
ENGINE_NAMES = ["auto", "reference", "chunked", "sdpa", "linear"]


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch):
    monkeypatch.setitem(ENGINES, "chunked", ChunkedEngine(query_chunk=2, key_chunk=2))
    monkeypatch.setitem(ENGINES, "linear", LinearEngine(chunk=2))
    monkeypatch.delenv("AXIOMFORMER_ENGINE", raising=False)


def _spec(normalizer: str, causal: bool = False) -> AttentionSpec:
    # stick_breaking: causal only; sinkhorn: only without (attend refuses causal=True for it, naming why)
    causal = required_fields("normalizer", normalizer).get("causal", causal)
    return AttentionSpec.standard(DIM, HEADS, causal=causal).relax(normalizer=normalizer)


def _runs(normalizer, engine, **kwargs):
    """attend on ``engine``, or None where that engine cannot run the normalizer (a documented ValueError)."""
    try:
        causal = kwargs.pop("causal", False)
        spec = _spec(normalizer, causal)
        return attend(spec=spec, engine=engine, causal=causal or spec.causal, **kwargs).out
    except ValueError as err:
        assert "cannot run" in str(err) or "defined only without a causal mask" in str(err)
        return None


def _qkv(q_len, k_len, batch=2, dtype=torch.float32):
    return (torch.randn(batch, HEADS, n, HEAD_DIM, dtype=dtype) for n in (q_len, k_len, k_len))


# ---------------------------------------------------------------------------------------------- queries past the keys
@pytest.mark.parametrize("normalizer", NORMALIZERS)
@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_queries_past_the_last_key_equal_the_explicit_top_left_mask(normalizer, engine):
    q, k, v = _qkv(6, 3)
    out = _runs(normalizer, engine, q=q, k=k, v=v, causal=True, q_offset=0)
    if out is None:
        return
    explicit = torch.ones(6, 3, dtype=torch.bool).tril()  # query i sees keys j <= i
    if required_fields("normalizer", normalizer).get("causal"):  # causal only: the top-left rule, causal flag
        expected = attend(q, k, v, spec=_spec(normalizer), causal=True, q_offset=0, engine="reference").out
    else:
        expected = attend(q, k, v, spec=_spec(normalizer), mask=explicit, engine="reference").out
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)


def test_queries_past_the_last_key_equal_sdpa_top_left_is_causal():
    q, k, v = _qkv(6, 3)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(attend(q, k, v, causal=True, q_offset=0).out, expected)


@pytest.mark.parametrize("engine", ["sdpa", "chunked", "reference"])
def test_a_fully_masked_row_past_the_last_key_is_zero(engine):
    q, k, v = _qkv(2, 3)
    mask = torch.ones(2, 3, dtype=torch.bool)
    mask[0] = False
    out = attend(q, k, v, causal=True, q_offset=5, mask=mask, engine=engine).out
    assert torch.equal(out[:, :, 0], torch.zeros_like(out[:, :, 0]))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("engine", ["sdpa", "chunked", "reference"])
def test_a_non_finite_key_reaches_exactly_the_queries_that_see_it_past_the_last_key(engine):
    q, k, v = _qkv(5, 3)
    k[:, :, 2] = float("nan")  # key 2 is seen by queries 2, 3, 4 (top-left: j <= i)
    out = attend(q, k, v, causal=True, q_offset=0, engine=engine).out
    assert torch.isfinite(out[:, :, :2]).all()
    assert torch.isnan(out[:, :, 2:]).all()


# ---------------------------------------------------------------------------------------------- empty sequences
@pytest.mark.parametrize("normalizer", NORMALIZERS)
@pytest.mark.parametrize("engine", ENGINE_NAMES)
@pytest.mark.parametrize("q_len, k_len", [(0, 5), (5, 0), (0, 0)])
@pytest.mark.parametrize("causal", [False, True])
def test_empty_sequences_give_sdpas_empty_or_zero_output(normalizer, engine, q_len, k_len, causal):
    q, k, v = _qkv(q_len, k_len)
    out = _runs(normalizer, engine, q=q, k=k, v=v, causal=causal)
    if out is None:
        return
    expected = F.scaled_dot_product_attention(q, k, v)  # SDPA's math path: empty, or zeros
    assert out.shape == expected.shape and torch.equal(out, expected)


@pytest.mark.parametrize(
    "relax",
    [
        "standard",
        "causal=true",
        "position=rope",
        "position=alibi,causal=true",
        "position=learned",
        "normalizer=linear,causal=true",
        "window=2,causal=true",
        "aggregator=mlp",
        "normalizer=sparsemax",
    ],
)
@pytest.mark.parametrize("q_len, k_len", [(0, 3), (3, 0), (0, 0)])
def test_an_attention_layer_takes_empty_sequences_forward_and_backward(relax, q_len, k_len):
    att = Attention(AttentionSpec.standard(DIM, HEADS).relax(relax))
    x = torch.randn(2, q_len, DIM, requires_grad=True)
    y = torch.randn(2, k_len, DIM, requires_grad=True)
    out, weights = att(x, y, y, need_weights=True)
    assert out.shape == (2, q_len, DIM) and torch.equal(out, torch.zeros_like(out))
    assert weights.shape == (2, HEADS, q_len, k_len)
    out.sum().backward()  # differentiable, every gradient zero
    assert torch.equal(x.grad, torch.zeros_like(x)) and torch.equal(y.grad, torch.zeros_like(y))


# ---------------------------------------------------------------------------------------------- mask shapes
@pytest.mark.parametrize("engine", ["auto", "chunked", "reference", "sdpa"])
@pytest.mark.parametrize("kind", ["mask", "bias"])
@pytest.mark.parametrize("shape", [(5,), (1, 5), (6, 1), (1, 1, 6, 5), (2, 1, 1, 5)])
def test_masks_of_every_rank_that_broadcast_to_the_problem_equal_sdpa(engine, kind, shape):
    q, k, v = _qkv(6, 5)
    m = torch.rand(shape) > 0.3 if kind == "mask" else torch.randn(shape)
    if kind == "mask":
        m[..., 0] = True  # no empty rows: SDPA gives NaN for those
    with sdpa_kernel(SDPBackend.MATH):
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    out = attend(q, k, v, engine=engine, **{kind: m}).out
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)
    assert out.shape == expected.shape


@pytest.mark.parametrize("kind", ["mask", "bias"])
@pytest.mark.parametrize("shape", [(4, 6, 5), (3, 1, 6, 5), (2, 2, 2, 6, 5), (6, 4), (7,)])
def test_a_mask_that_only_broadcasts_with_the_problem_is_refused_naming_both_shapes(kind, shape):
    q, k, v = _qkv(6, 5)  # (batch, heads, q_len, k_len) = (2, 2, 6, 5)
    m = torch.ones(shape, dtype=torch.bool) if kind == "mask" else torch.zeros(shape)
    with pytest.raises(ValueError) as err:
        attend(q, k, v, **{kind: m})
    assert str(tuple(shape)) in str(err.value) and "(2, 2, 6, 5)" in str(err.value)


@pytest.mark.parametrize("shape", [(2, 3, 3), (2, 2, 3, 3), (1, 4, 3, 3)])
def test_an_mha_style_mask_is_refused_by_the_layer_naming_both_shapes(shape):
    att = Attention(AttentionSpec.standard(4, 2))  # batch 1, heads 2
    with pytest.raises(ValueError) as err:
        att(torch.randn(1, 3, 4), attn_mask=torch.ones(shape, dtype=torch.bool))
    assert str(tuple(shape)) in str(err.value) and "(1, 2, 3, 3)" in str(err.value)


def test_a_one_dim_key_mask_of_the_layer_equals_a_key_padding_mask():
    att = Attention(AttentionSpec.standard(DIM, HEADS))
    x = torch.randn(2, 5, DIM)
    keep = torch.tensor([True, False, True, True, False])
    torch.testing.assert_close(att(x, attn_mask=keep), att(x, key_padding_mask=keep.expand(2, 5)))


def test_wrong_mask_dtypes_and_ranks_are_refused():
    q, k, v = _qkv(6, 5)
    with pytest.raises(ValueError, match="mask must be bool"):
        attend(q, k, v, mask=torch.zeros(6, 5))
    with pytest.raises(ValueError, match="bias must be floating"):
        attend(q, k, v, bias=torch.zeros(6, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="k and v must share k_len"):
        attend(q, k, v[..., :4, :])
    with pytest.raises(ValueError, match=r"q must be \(batch, heads, seq, head_dim\)"):
        attend(q[0], k, v)


# ---------------------------------------------------------------------------------------------- windows
@pytest.mark.parametrize("window", [-1, -5, 2.5, True])
def test_a_window_that_is_not_a_count_of_keys_is_refused(window):
    q, k, v = _qkv(5, 5)
    with pytest.raises(ValueError, match="window must be a positive number of keys"):
        attend(q, k, v, causal=True, window=window)


def test_window_zero_means_every_key():
    q, k, v = _qkv(5, 5)
    torch.testing.assert_close(attend(q, k, v, causal=True, window=0).out, attend(q, k, v, causal=True).out)


@pytest.mark.parametrize("sliding_window", [0, -1, -4096])
def test_the_transformers_adapter_refuses_a_non_positive_sliding_window(sliding_window):
    pytest.importorskip("transformers")
    from axiomformer.surgery.hf_attention import axiomformer_attention_forward

    class Module(torch.nn.Module):
        training, is_causal = False, True

    q, k, v = _qkv(5, 5, batch=1)
    with pytest.raises(ValueError, match="sliding_window must be a positive number"):
        axiomformer_attention_forward(Module(), q, k, v, None, is_causal=True, sliding_window=sliding_window)


def test_per_head_arguments_of_the_wrong_shape_are_refused_naming_both_shapes():
    q, k, v = _qkv(6, 5)
    with pytest.raises(ValueError, match=r"alibi_slopes of shape \(3,\) must be \(heads,\) = \(2,\)"):
        attend(q, k, v, causal=True, alibi_slopes=torch.ones(3))
    with pytest.raises(ValueError, match=r"scale of shape \(1, 3, 1, 1\) does not broadcast"):
        attend(q, k, v, scale=torch.ones(1, 3, 1, 1))
    attend(q, k, v, scale=torch.ones(1, 2, 1, 1))  # the learned per-head temperature fits


def test_a_kv_cache_of_another_batch_is_refused_naming_both_shapes():
    from axiomformer.attention import KVCache

    att, cache = Attention(AttentionSpec.standard(DIM, HEADS, causal=True)), KVCache()
    att(torch.randn(2, 3, DIM), cache=cache)
    with pytest.raises(ValueError, match=r"\(3, 2, 1, 8\).*\(2, 2, 3, 8\)"):
        att(torch.randn(3, 1, DIM), cache=cache)
