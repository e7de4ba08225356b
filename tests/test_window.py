"""Sliding-window attention (``window=W``): causal, key j is visible from position i iff i - W < j <= i."""

from __future__ import annotations

import pytest
import torch

from axiomformer import Attention, AttentionSpec
from axiomformer.attention import KVCache

DIM, HEADS = 16, 2


def band(q_len: int, k_len: int, window: int, causal: bool) -> torch.Tensor:
    """The convention written out position by position (queries aligned bottom-right, as the KV cache)."""
    offset = k_len - q_len
    allowed = torch.zeros(q_len, k_len, dtype=torch.bool)
    for i in range(q_len):
        p = offset + i
        for j in range(k_len):
            allowed[i, j] = (p - window < j <= p) if causal else abs(p - j) < window
    return allowed


def _pair(spec_window: AttentionSpec, engine: str):
    torch.manual_seed(0)
    windowed = Attention(spec_window, engine=engine)
    plain = Attention(AttentionSpec(**{**spec_window.to_dict(), "window": 0, "causal": False}), engine="reference")
    plain.load_state_dict(windowed.state_dict())
    return windowed, plain


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("relax", ["standard", "normalizer=sigmoid", "normalizer=sparsemax", "position=alibi"])
@pytest.mark.parametrize("engine", ["auto", "sdpa", "chunked", "reference"])
def test_window_equals_full_attention_with_the_band_mask_written_out(causal, relax, engine):
    spec = AttentionSpec.standard(DIM, HEADS, causal=causal).relax(relax).relax(window=5)
    windowed, plain = _pair(spec, engine)
    x = torch.randn(2, 150, DIM, generator=torch.Generator().manual_seed(1))  # longer than one 64-query block
    try:
        out = windowed(x)
    except ValueError:  # the engine does not run this spec
        return
    if relax == "position=alibi":  # ALiBi's bias depends on causal too
        plain = Attention(AttentionSpec(**{**spec.to_dict(), "window": 0}), engine="reference")
        plain.load_state_dict(windowed.state_dict())
    expected = plain(x, attn_mask=band(150, 150, 5, causal))
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("engine", ["sdpa", "chunked"])
def test_window_engines_match_the_reference_backward_with_key_padding(engine):
    spec = AttentionSpec.standard(DIM, HEADS, causal=True, window=7)
    keep = torch.ones(2, 90, dtype=torch.bool)
    keep[0, 40:50] = False  # queries 46..49 of sample 0 see nothing
    x = torch.randn(2, 90, DIM)
    grads = []
    for name in (engine, "reference"):
        torch.manual_seed(2)
        att = Attention(spec, engine=name)
        xx = x.clone().requires_grad_()
        for kwargs in ({}, {"key_padding_mask": keep}):
            out = att(xx, **kwargs)
            out.square().sum().backward()
        assert att.last_engine == name
        grads.append([out.detach(), xx.grad] + [p.grad for p in att.parameters()])
    assert torch.equal(grads[0][0][0, 46:50], torch.zeros_like(grads[0][0][0, 46:50]))
    assert not bool((grads[0][0][0, 45] == 0).all())
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_window_decoding_with_the_kv_cache_gives_the_rows_of_the_full_computation():
    spec = AttentionSpec.standard(DIM, HEADS, causal=True, window=4, position="rope")
    att = Attention(spec).eval()
    x = torch.randn(1, 12, DIM)
    cache = KVCache()
    steps = torch.cat([att(x[:, i : i + 1], cache=cache) for i in range(12)], dim=1)
    torch.testing.assert_close(steps, att(x), rtol=1e-5, atol=1e-6)


def test_a_negative_window_is_refused():
    with pytest.raises(ValueError, match="window must be a non-negative int"):
        AttentionSpec.standard(DIM, HEADS, window=-1)


@pytest.mark.parametrize("causal", [True, False])
def test_rows_without_keys_in_a_window_equal_the_full_scan(causal):
    from axiomformer.engines.problem import KeyVisibility, causal_mask, window_mask

    for q_len, k_len, offset in ((5, 5, 0), (3, 7, 4), (7, 3, -4), (4, 10, 0), (4, 4, 9)):
        for window in (1, 2, 3, 6):
            visible = window_mask(q_len, k_len, offset, window, causal)
            if causal:
                visible = visible & causal_mask(q_len, k_len, offset)
            got = KeyVisibility(q_len, k_len, causal=causal, q_offset=offset, window=window).rows_without_keys()
            assert torch.equal(got.view(-1), ~visible.any(-1)), (q_len, k_len, offset, window)


@pytest.mark.parametrize("position", ["rope", "alibi", "learned"])
def test_a_window_cache_keeps_only_the_window_and_decodes_the_full_forward(position):
    # Decoding token by token keeps at most ``window`` positions, and each step equals the full windowed forward's
    # row; a key padding mask over every token seen (the dropped ones included) is accepted.
    window, steps = 3, 12
    torch.manual_seed(0)
    layer = Attention(AttentionSpec.standard(16, 2, causal=True).relax(window=window, position=position)).eval()
    tokens = torch.randn(2, steps, 16)
    keep = torch.ones(2, steps, dtype=torch.bool)
    keep[1, 4] = False  # a padded token in the middle of row 1
    cache = KVCache()
    with torch.no_grad():
        outs = []
        for t in range(steps):
            outs.append(layer(tokens[:, t : t + 1], cache=cache, key_padding_mask=keep[:, : t + 1]))
            assert cache.length == min(t + 1, window - 1) and cache.seen == t + 1
        full = layer(tokens, key_padding_mask=keep)
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-5, atol=1e-6)


def test_a_cache_without_a_window_keeps_every_position():
    layer = Attention(AttentionSpec.standard(16, 2, causal=True)).eval()
    cache = KVCache()
    with torch.no_grad():
        for _ in range(7):
            layer(torch.randn(1, 1, 16), cache=cache)
    assert cache.length == 7 and cache.start == 0


def test_the_decode_check_catches_a_cache_that_drops_a_visible_key(monkeypatch):
    # Plant an off-by-one: keep one position fewer than the window needs; the decoded rows then differ from the full
    # ones.
    real = KVCache.keep_last
    monkeypatch.setattr(KVCache, "keep_last", lambda self, n: real(self, n - 1))
    torch.manual_seed(0)
    layer = Attention(AttentionSpec.standard(16, 2, causal=True).relax(window=3)).eval()
    tokens = torch.randn(1, 8, 16)
    cache = KVCache()
    with torch.no_grad():
        outs = torch.cat([layer(tokens[:, t : t + 1], cache=cache) for t in range(8)], 1)
        full = layer(tokens)
    assert float((outs - full).abs().max()) > 1e-3
