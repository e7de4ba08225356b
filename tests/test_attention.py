"""Attention: the standard spec equals PyTorch, every choice of every axis runs, masks and positions behave."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from axiomformer import AXES, Attention, AttentionSpec
from axiomformer.axes.position import alibi_slopes
from axiomformer.spec import allows_causal, required_fields

DIM, HEADS = 16, 4
NORMALIZERS = AXES["normalizer"]


def single_axis_specs(causal):
    base = AttentionSpec.standard(DIM, HEADS, causal=causal)
    for axis in ("aggregator", "contribution", "value", "score", "normalizer", "scale", "position", "feature_map"):
        for choice in AXES[axis]:
            if axis == "feature_map":
                yield base.relax(normalizer="linear", feature_map=choice)
            elif allows_causal(axis, choice, causal):
                yield base.relax({axis: choice})


COMBINATIONS = [
    "A4=cosine,A5=sigmoid",
    "A1=mlp,A2=joint,A3=mlp",
    "score=additive,normalizer=entmax15,position=alibi",
    "score=neg_l2,normalizer=sparsemax,scale=learned,position=rope",
    "normalizer=linear,position=rope,value=identity",
    "score=mlp,normalizer=relu,position=sinusoidal,aggregator=mlp",
    "score=bilinear,normalizer=gumbel_softmax,position=learned,contribution=joint",
]


def mha_pair(batch_first):
    mha = nn.MultiheadAttention(DIM, HEADS, batch_first=batch_first)
    with torch.no_grad():  # non-zero biases so that they are checked too
        mha.in_proj_bias.normal_()
        mha.out_proj.bias.normal_()
    return mha, Attention.from_multihead_attention(mha)


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("padded", [False, True])
def test_standard_spec_equals_multihead_attention(batch_first, causal, padded):
    mha, att = mha_pair(batch_first)
    mha.eval(), att.eval()
    x = torch.randn(3, 7, DIM)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    if padded:
        pad[0, 5:] = True
        pad[2, 3:] = True
    causal_block = torch.triu(torch.ones(7, 7, dtype=torch.bool), 1)  # MHA polarity: True = may NOT attend
    xin = x if batch_first else x.transpose(0, 1)
    expected, expected_w = mha(
        xin,
        xin,
        xin,
        key_padding_mask=pad if padded else None,
        attn_mask=causal_block if causal else None,
        average_attn_weights=False,
    )
    expected = expected if batch_first else expected.transpose(0, 1)
    if causal:
        att = Attention.from_multihead_attention(mha, causal=True).eval()
    out, w = att(x, key_padding_mask=~pad if padded else None, need_weights=True)
    assert (out - expected).abs().max().item() <= 1e-5
    assert (w - expected_w).abs().max().item() <= 1e-5


def _engine_run(spec, engine, x, **kwargs):
    torch.manual_seed(1)
    att = Attention(spec, engine=engine)
    xx = x.clone().requires_grad_(True)
    out = att(xx, **kwargs)
    out.square().sum().backward()
    return out.detach(), xx.grad, att


@pytest.mark.parametrize(
    "relax",
    [
        "standard",
        "position=rope",
        "position=alibi",
        "scale=learned",
        "scale=none",
        "value=identity",
        "aggregator=mlp",
        "position=sinusoidal",
    ],
)
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_and_reference_engines_agree_forward_and_backward(relax, causal):
    spec = AttentionSpec.standard(DIM, HEADS, causal=causal).relax(relax)
    x = torch.randn(2, 9, DIM)
    pad = torch.ones(2, 9, dtype=torch.bool)
    pad[1, 6:] = False
    bias = torch.randn(9, 9)
    for kwargs in ({}, {"key_padding_mask": pad}, {"attn_mask": bias}):
        out_s, grad_s, att_s = _engine_run(spec, "sdpa", x, **kwargs)
        out_r, grad_r, att_r = _engine_run(spec, "reference", x, **kwargs)
        assert att_s.last_engine == "sdpa" and att_r.last_engine == "reference"
        torch.testing.assert_close(out_s, out_r, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(grad_s, grad_r, atol=1e-5, rtol=1e-4)


def test_auto_engine_routes_standard_to_sdpa_and_relaxations_elsewhere():
    x = torch.randn(1, 4, DIM)
    att = Attention(AttentionSpec.standard(DIM, HEADS))
    att(x)
    assert att.last_engine == "sdpa"
    att = Attention(AttentionSpec.standard(DIM, HEADS).relax("A5=sigmoid"), engine="reference")
    att(x)
    assert att.last_engine == "reference"
    with pytest.raises(ValueError, match="cannot run"):
        Attention(AttentionSpec.standard(DIM, HEADS).relax("A5=sigmoid"), engine="sdpa")(x)
    with pytest.raises(ValueError, match="unknown engine 'fast'; choose one of"):
        Attention(AttentionSpec.standard(DIM, HEADS), engine="fast")(x)


@pytest.mark.parametrize("causal", [False, True])
def test_every_choice_of_every_axis_runs_forward_and_backward_with_a_fully_padded_sample(causal):
    x = torch.randn(3, 6, DIM)
    pad = torch.ones(3, 6, dtype=torch.bool)
    pad[1] = False  # a fully padded sample
    pad[2, 4:] = False
    specs = list(single_axis_specs(causal)) + [
        AttentionSpec.standard(DIM, HEADS, causal=causal).relax(c) for c in COMBINATIONS
    ]
    for spec in specs:
        att = Attention(spec).train()
        xx = x.clone().requires_grad_(True)
        out, w = att(xx, key_padding_mask=pad, need_weights=True)
        out.sum().backward()
        assert out.shape == x.shape and w.shape == (3, HEADS, 6, 6), spec.variant
        assert torch.isfinite(out).all() and torch.isfinite(xx.grad).all(), spec.variant
        assert all(torch.isfinite(p.grad).all() for p in att.parameters() if p.grad is not None), spec.variant
        assert (out[1] == 0).all(), spec.variant  # no visible key -> zero output


@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_fully_masked_row_gives_zeros_with_finite_gradients_for_every_normalizer(normalizer):
    spec = AttentionSpec.standard(DIM, HEADS).relax(normalizer=normalizer, **required_fields("normalizer", normalizer))
    att = Attention(spec).train()
    x = torch.randn(2, 5, DIM, requires_grad=True)
    mask = torch.ones(5, 5, dtype=torch.bool)
    mask[2] = False  # query 2 sees nothing
    out, w = att(x, attn_mask=mask, need_weights=True)
    (out.square().sum()).backward()
    assert (out[:, 2] == 0).all() and (w[:, :, 2] == 0).all()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_nan_in_a_masked_key_does_not_reach_the_output_for_every_normalizer(normalizer):
    causal = required_fields("normalizer", normalizer).get("causal", True)  # sinkhorn: only without a causal mask
    spec = AttentionSpec.standard(DIM, HEADS, causal=causal).relax(normalizer=normalizer)
    att = Attention(spec).eval()
    x = torch.randn(2, 6, DIM)
    pad = torch.ones(2, 6, dtype=torch.bool)
    pad[0, 2] = False
    x_nan = x.clone()
    x_nan[0, 2] = float("nan")  # padded key of sample 0
    x_nan[1, 5] = float("nan")  # last token of sample 1: causally invisible to every earlier query
    clean = att(x, key_padding_mask=pad)
    dirty = att(x_nan, key_padding_mask=pad)
    torch.testing.assert_close(dirty[0, [0, 1, 3, 4, 5]], clean[0, [0, 1, 3, 4, 5]])
    if causal:
        torch.testing.assert_close(dirty[1, :5], clean[1, :5])
    assert torch.isnan(dirty[1, 5]).all()  # a visible NaN is still reported


@pytest.mark.parametrize("normalizer", NORMALIZERS)
def test_appending_masked_keys_changes_nothing_for_every_normalizer(normalizer):
    if required_fields("normalizer", normalizer).get("causal"):
        pytest.skip(
            "causal only: appended keys move the bottom-right causal alignment (tests/test_relaxations.py "
            "appends padded keys to a causal stick-breaking layer)"
        )
    spec = AttentionSpec.standard(DIM, HEADS).relax(normalizer=normalizer)
    att = Attention(spec).eval()
    q, kv = torch.randn(2, 4, DIM), torch.randn(2, 5, DIM)
    extra = torch.cat([kv, torch.randn(2, 3, DIM)], dim=1)
    pad = torch.ones(2, 8, dtype=torch.bool)
    pad[:, 5:] = False
    torch.testing.assert_close(att(q, extra, key_padding_mask=pad), att(q, kv))


def test_weights_of_the_normalizers_match_their_formulas():
    torch.manual_seed(3)
    s = torch.randn(2, 3, 4, 5)
    from entmax import sparsemax

    from axiomformer.axes.normalizer import normalize

    torch.testing.assert_close(normalize(s, None, "softmax"), torch.softmax(s, -1))
    torch.testing.assert_close(normalize(s, None, "sigmoid"), 1 / (1 + torch.exp(-(s - math.log(5)))))
    torch.testing.assert_close(normalize(s, None, "relu"), s.clamp(min=0) / 5)
    torch.testing.assert_close(normalize(s, None, "sparsemax"), sparsemax(s, dim=-1))
    k = s.abs()
    torch.testing.assert_close(normalize(k, None, "linear"), k / (k.sum(-1, keepdim=True) + 1e-6))


def test_permuting_tokens_permutes_outputs_without_positions_or_causal_mask():
    for spec in single_axis_specs(causal=False):
        if spec.position != "none":
            continue
        torch.manual_seed(0)  # per spec: the draws of one choice do not depend on how many choices come before it
        att = Attention(spec).eval()
        x = torch.randn(2, 7, DIM)
        perm = torch.randperm(7)
        torch.testing.assert_close(att(x)[:, perm], att(x[:, perm]), atol=2e-5, rtol=1e-4)


def test_alibi_slopes_match_press_et_al():
    # 8 heads: geometric sequence starting at 2^(-8/8) with ratio 2^(-8/8).
    assert alibi_slopes(8).tolist() == [2.0 ** -(i + 1) for i in range(8)]
    # 6 heads: the 4-head sequence 2^-2, 2^-4, 2^-6, 2^-8, then every other slope of the 8-head one: 2^-1, 2^-3.
    assert alibi_slopes(6).tolist() == [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]


@pytest.mark.parametrize("heads", [8, 6])
def test_alibi_attention_equals_softmax_of_biased_scores(heads):
    spec = AttentionSpec.standard(48, heads, causal=True).relax(position="alibi")
    att = Attention(spec, engine="reference").eval()
    x = torch.randn(1, 6, 48)
    _, w = att(x, need_weights=True)
    q = att.q_proj(x).view(1, 6, heads, -1).transpose(1, 2)
    k = att.k_proj(x).view(1, 6, heads, -1).transpose(1, 2)
    slopes = (
        torch.tensor([2.0 ** -(8 * (h + 1) / heads) for h in range(heads)])
        if heads == 8
        else torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3])
    )
    i, j = torch.arange(6).view(-1, 1), torch.arange(6).view(1, -1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(48 // heads) - slopes.view(-1, 1, 1) * (i - j)
    scores = scores.masked_fill(j > i, float("-inf"))
    torch.testing.assert_close(w, torch.softmax(scores, -1))


def test_rope_matches_complex_rotation_and_is_relative():
    spec = AttentionSpec.standard(DIM, HEADS).relax(position="rope")
    att = Attention(spec)
    hd = spec.head_dim
    x = torch.randn(1, HEADS, 5, hd)
    pos = torch.arange(5) + 3
    rotated = att.position.rotate(x, pos)
    # Independent formula: pair (i, i + hd/2) as a complex number, multiply by exp(i * p * 10000^(-2i/hd)).
    z = torch.complex(x[..., : hd // 2].double(), x[..., hd // 2 :].double())
    theta = 10000.0 ** (-torch.arange(0, hd, 2).double() / hd)
    z = z * torch.exp(1j * pos.double().view(-1, 1) * theta)
    expected = torch.cat([z.real, z.imag], dim=-1).float()
    torch.testing.assert_close(rotated, expected, atol=1e-5, rtol=1e-5)
    # Relative: q_m . k_n depends only on m - n.
    q, k = torch.randn(1, 1, 1, hd), torch.randn(1, 1, 1, hd)
    a = att.position.rotate(q, torch.tensor([7])) @ att.position.rotate(k, torch.tensor([4])).transpose(-1, -2)
    b = att.position.rotate(q, torch.tensor([13])) @ att.position.rotate(k, torch.tensor([10])).transpose(-1, -2)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_sinusoidal_table_matches_vaswani():
    from axiomformer.axes.position import sinusoidal_table

    table = sinusoidal_table(torch.arange(4), 6)
    for p in range(4):
        for i in range(3):
            assert table[p, 2 * i].item() == pytest.approx(math.sin(p / 10000 ** (2 * i / 6)), abs=1e-6)
            assert table[p, 2 * i + 1].item() == pytest.approx(math.cos(p / 10000 ** (2 * i / 6)), abs=1e-6)


def test_gumbel_softmax_is_random_only_in_training():
    att = Attention(AttentionSpec.standard(DIM, HEADS).relax(normalizer="gumbel_softmax"))
    x = torch.randn(2, 6, DIM)
    att.train()
    assert not torch.equal(att(x), att(x))
    att.eval()
    torch.testing.assert_close(att(x), att(x), rtol=0, atol=0)
    ref = Attention(AttentionSpec.standard(DIM, HEADS)).eval()
    ref.load_state_dict(att.state_dict())
    torch.testing.assert_close(att(x), ref(x))  # eval mode is plain softmax


def test_causal_mask_is_bottom_right_aligned_for_shorter_queries():
    spec = AttentionSpec.standard(DIM, HEADS, causal=True)
    att = Attention(spec).eval()
    x = torch.randn(1, 8, DIM)
    full = att(x)
    last3 = att(x[:, 5:], x)  # queries 5..7 against all 8 keys
    torch.testing.assert_close(last3, full[:, 5:], atol=1e-6, rtol=1e-5)


def test_kv_cache_decoding_equals_full_forward():
    from axiomformer import KVCache

    for relax in ("standard", "position=rope", "position=alibi", "normalizer=sigmoid", "position=learned"):
        att = Attention(AttentionSpec.standard(DIM, HEADS, causal=True).relax(relax)).eval()
        x = torch.randn(2, 9, DIM)
        full = att(x)
        cache = KVCache()
        parts = [att(x[:, :4], cache=cache)] + [att(x[:, t : t + 1], cache=cache) for t in range(4, 9)]
        assert (torch.cat(parts, 1) - full).abs().max().item() <= 1e-5, relax


def test_shape_errors_name_the_shapes():
    att = Attention(AttentionSpec.standard(DIM, HEADS))
    with pytest.raises(ValueError, match=r"query must be \(batch, seq, dim=16\); got shape \(2, 5, 12\)"):
        att(torch.randn(2, 5, 12))
    with pytest.raises(ValueError, match=r"batch sizes differ.*\(2, 5, 16\).*\(3, 5, 16\)"):
        att(torch.randn(2, 5, DIM), torch.randn(3, 5, DIM))
    with pytest.raises(ValueError, match=r"key and value lengths differ.*\(2, 5, 16\).*\(2, 4, 16\)"):
        att(torch.randn(2, 3, DIM), torch.randn(2, 5, DIM), torch.randn(2, 4, DIM))
    with pytest.raises(ValueError, match=r"key_padding_mask has shape \(2, 4\); expected .* \(2, 5\)"):
        att(torch.randn(2, 5, DIM), key_padding_mask=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="key_padding_mask must be bool"):
        att(torch.randn(2, 5, DIM), key_padding_mask=torch.ones(2, 5))
    with pytest.raises(ValueError, match=r"attn_mask of shape \(4, 5\) does not broadcast to .*\(2, 4, 5, 5\)"):
        att(torch.randn(2, 5, DIM), attn_mask=torch.ones(4, 5, dtype=torch.bool))
    with pytest.raises(TypeError):
        Attention("standard")


def test_float_attn_mask_is_added_to_scores_like_sdpa():
    att = Attention(AttentionSpec.standard(DIM, HEADS), engine="reference").eval()
    x = torch.randn(2, 5, DIM)
    bias = torch.randn(5, 5)
    bias[0, 3] = float("-inf")
    _, w = att(x, attn_mask=bias, need_weights=True)
    q = att.q_proj(x).view(2, 5, HEADS, -1).transpose(1, 2)
    k = att.k_proj(x).view(2, 5, HEADS, -1).transpose(1, 2)
    expected = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(DIM // HEADS) + bias, -1)
    torch.testing.assert_close(w, expected)
    v = att.v_proj(x).view(2, 5, HEADS, -1).transpose(1, 2)
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    out_ref = att.out_proj(sdpa.transpose(1, 2).reshape(2, 5, DIM))
    torch.testing.assert_close(att(x, attn_mask=bias), out_ref, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("q_len,k_len", [(5, 5), (3, 7), (7, 3)])
def test_rows_without_keys_equals_the_full_mask_scan(causal, q_len, k_len):
    from axiomformer.engines import AttentionProblem

    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(2, 3, q_len, 4), torch.randn(2, 3, k_len, 4)
    for mask in (
        None,
        torch.rand(2, 1, 1, k_len, generator=g) > 0.6,
        torch.rand(2, 3, q_len, k_len, generator=g) > 0.7,
    ):
        problem = AttentionProblem(q=q, k=k, v=k, causal=causal, mask=mask, q_offset=k_len - q_len)
        full = problem.full_mask()
        expected = None if full is None else ~torch.broadcast_to(full, (2, 3, q_len, k_len)).any(-1)
        got = problem.rows_without_keys()
        if got is None:
            assert expected is None or not expected.any()
        else:
            assert torch.equal(torch.broadcast_to(got, (2, 3, q_len)), expected)


def test_rope_backward_is_the_inverse_rotation():
    from axiomformer.axes.position import apply_rope

    x = torch.randn(2, 3, 7, 8, dtype=torch.float64, requires_grad=True)
    pos = torch.arange(7) + 2
    assert torch.autograd.gradcheck(lambda t: apply_rope(t, pos), (x,))
    assert torch.autograd.gradgradcheck(lambda t: apply_rope(t, pos), (x,))
    # A rotation preserves norms: |rope(x)| = |x| for every (batch, head, position).
    torch.testing.assert_close(apply_rope(x, pos).norm(dim=-1), x.norm(dim=-1))


def test_unit_rows_matches_f_normalize_with_its_gradients():
    from axiomformer.axes.score import unit_rows

    x = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    tau = torch.rand(1, 3, 1, 1, dtype=torch.float64) + 0.5
    assert torch.autograd.gradcheck(unit_rows, (x.clone().requires_grad_(), tau.clone().requires_grad_(), 1e-6))
    assert torch.autograd.gradcheck(unit_rows, (x.clone().requires_grad_(), None, 1e-6))
    assert torch.autograd.gradgradcheck(unit_rows, (x.clone().requires_grad_(), tau.clone().requires_grad_(), 1e-6))
    # Against autograd through F.normalize, including a row below eps (there y = tau x / eps).
    x[0, 0, 1] = 1e-9
    results = []
    for f in (unit_rows, lambda a, t, eps: torch.nn.functional.normalize(a, dim=-1, eps=eps) * t):
        a, t = x.clone().requires_grad_(), tau.clone().requires_grad_()
        y = f(a, t, 1e-6)
        y.backward(torch.linspace(-1, 1, y.numel(), dtype=y.dtype).view_as(y))
        results.append((y, a.grad, t.grad))
    for mine, theirs in zip(*results):
        torch.testing.assert_close(mine, theirs)
