"""Grouped-query and multi-query attention (``num_kv_heads``): key/value head g serves query heads g * groups ..."""

from __future__ import annotations

import pytest
import torch

from axiomformer import Attention, AttentionSpec
from axiomformer.attention import KVCache

DIM, HEADS = 32, 4


def _as_multi_head(gqa: Attention) -> Attention:
    """The multi-head layer with the same map: each key/value projection block copied to every head of its group
    (an implementation of GQA independent of ``num_kv_heads``: plain multi-head attention)."""
    spec = gqa.spec
    groups, hd = spec.num_heads // spec.kv_heads, spec.head_dim
    mha = Attention(AttentionSpec(**{**spec.to_dict(), "num_kv_heads": 0}), engine=gqa.engine)
    with torch.no_grad():
        for name in ("q_proj", "out_proj"):
            getattr(mha, name).load_state_dict(getattr(gqa, name).state_dict())
        for name in ("k_proj", "v_proj"):
            src, dst = getattr(gqa, name), getattr(mha, name)
            dst.weight.copy_(src.weight.view(spec.kv_heads, 1, hd, -1).expand(-1, groups, -1, -1).reshape(spec.dim, -1))
            dst.bias.copy_(src.bias.view(spec.kv_heads, 1, hd).expand(-1, groups, -1).reshape(-1))
        for name, p in gqa.named_parameters():
            if not name.startswith(("q_proj", "k_proj", "v_proj", "out_proj")):
                dict(mha.named_parameters())[name].copy_(p)
    return mha


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize(
    "relax",
    [
        "standard",
        "causal=true",
        "normalizer=sigmoid,causal=true",
        "position=rope",
        "position=alibi,causal=true",
        "normalizer=linear,causal=true",
        "score=cosine",
    ],
)
def test_grouped_query_attention_equals_multi_head_attention_with_shared_key_value_heads(kv_heads, relax):
    spec = AttentionSpec.standard(DIM, HEADS).relax(relax).relax(num_kv_heads=kv_heads)
    torch.manual_seed(0)
    gqa = Attention(spec).eval()
    mha = _as_multi_head(gqa).eval()
    assert gqa.k_proj.out_features == kv_heads * DIM // HEADS
    x = torch.randn(2, 9, DIM)
    torch.testing.assert_close(gqa(x), mha(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("relax", ["causal=true", "normalizer=sparsemax", "normalizer=relu,causal=true"])
def test_grouped_query_attention_engines_match_the_reference_forward_and_backward(relax):
    spec = AttentionSpec.standard(DIM, HEADS).relax(relax).relax(num_kv_heads=2)
    x = torch.randn(2, 9, DIM)
    results = []
    for engine in ("auto", "reference"):
        torch.manual_seed(1)
        att = Attention(spec, engine=engine)
        xx = x.clone().requires_grad_()
        out = att(xx)
        out.square().sum().backward()
        results.append([out.detach(), xx.grad] + [p.grad for p in att.parameters()])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_the_kv_cache_holds_the_key_value_heads_and_decodes_like_the_full_forward():
    spec = AttentionSpec.standard(DIM, HEADS, causal=True).relax(num_kv_heads=1, position="rope")
    att = Attention(spec).eval()
    x = torch.randn(1, 6, DIM)
    full = att(x)
    cache = KVCache()
    steps = [att(x[:, i : i + 1], cache=cache) for i in range(6)]
    assert cache.k.shape == (1, 1, 6, DIM // HEADS)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-6)


def test_num_kv_heads_must_divide_the_heads_and_the_error_says_so():
    with pytest.raises(ValueError, match="divide num_heads=4"):
        AttentionSpec.standard(DIM, HEADS, num_kv_heads=3)
    with pytest.raises(ValueError, match="value='identity'"):
        AttentionSpec.standard(DIM, HEADS, num_kv_heads=2, value="identity")
    assert "kv_heads=2" in AttentionSpec.standard(DIM, HEADS, num_kv_heads=2).describe()
