"""Positions come from position_ids (given, or counted from the key padding mask), never from raw indices of a padded
row: left padding leaves the real tokens' outputs unchanged in Attention, TransformerLM and the KV cache."""

import pytest
import torch

from axiomformer import Attention, AttentionSpec
from axiomformer.attention import KVCache
from axiomformer.axes.position import positions_from_padding, token_positions
from axiomformer.models.transformer import TransformerLM

POSITIONS = ("none", "sinusoidal", "learned", "rope", "alibi")
NORMALIZERS = ("softmax", "sigmoid", "linear", "sparsemax")


def _layer(position: str, normalizer: str, causal: bool = True, dim: int = 8) -> Attention:
    torch.manual_seed(1)
    return Attention(
        AttentionSpec.standard(dim, 2, causal=causal).relax(position=position, normalizer=normalizer)
    ).eval()


def _left_padded(real: torch.Tensor, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    padded = torch.cat([torch.randn(real.shape[0], pad, real.shape[-1]), real], 1)
    keep = torch.ones(real.shape[0], pad + real.shape[1], dtype=torch.bool)
    keep[:, :pad] = False
    return padded, keep


def test_positions_from_padding_counts_real_tokens():
    keep = torch.tensor([[False, False, True, True, True], [True, True, True, False, False]])
    assert positions_from_padding(keep).tolist() == [[0, 1, 0, 1, 2], [0, 1, 2, 3, 4]]
    # Right padding keeps the index positions: the fast path (default positions) is taken.
    assert token_positions(5, 5, 0, torch.device("cpu"), key_padding_mask=keep[1:]).default
    assert not token_positions(5, 5, 0, torch.device("cpu"), key_padding_mask=keep[:1]).default


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("normalizer", NORMALIZERS)
@pytest.mark.parametrize("position", POSITIONS)
def test_left_padding_leaves_real_tokens_unchanged(position, normalizer, causal):
    torch.manual_seed(0)
    real = torch.randn(1, 4, 8)
    padded, keep = _left_padded(real, 3)
    att = _layer(position, normalizer, causal)
    with torch.no_grad():
        expected = att(real)
        got = att(padded, key_padding_mask=keep)[:, 3:]
        explicit = att(padded, key_padding_mask=keep, position_ids=positions_from_padding(keep))[:, 3:]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(explicit, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position", ["sinusoidal", "learned", "rope"])
def test_raw_index_positions_would_fail(position):
    """The planted fault: positions taken as raw indices of the padded row move the real tokens."""
    torch.manual_seed(0)
    real = torch.randn(1, 4, 8)
    padded, keep = _left_padded(real, 3)
    att = _layer(position, "linear" if position == "rope" else "softmax")
    with torch.no_grad():
        raw = att(padded, key_padding_mask=keep, position_ids=torch.arange(7))[:, 3:]
        assert (raw - att(real)).abs().max() > 1e-3


@pytest.mark.parametrize("position", POSITIONS)
def test_kv_cache_continues_padded_positions(position):
    """Prefill a left-padded batch, decode token by token: each step equals the unpadded full forward."""
    torch.manual_seed(0)
    real = torch.randn(1, 6, 8)
    padded, keep = _left_padded(real, 2)
    att = _layer(position, "softmax")
    with torch.no_grad():
        full = att(real)
        cache = KVCache()
        prefill = att(padded[:, :5], key_padding_mask=keep[:, :5], cache=cache)
        torch.testing.assert_close(prefill[:, 2:], full[:, :3], atol=1e-5, rtol=1e-5)
        for t in range(5, 8):
            step = att(padded[:, t : t + 1], key_padding_mask=keep[:, : t + 1], cache=cache)
            torch.testing.assert_close(step, full[:, t - 2 : t - 1], atol=1e-5, rtol=1e-5)
        assert cache.positions[0, 2:].tolist() == list(range(6))


def test_kv_cache_without_mask_continues_stored_positions():
    torch.manual_seed(0)
    x = torch.randn(1, 5, 8)
    att = _layer("sinusoidal", "softmax")
    with torch.no_grad():
        shifted = att(x, position_ids=torch.arange(10, 15))
        cache = KVCache()
        att(x[:, :3], position_ids=torch.arange(10, 13), cache=cache)
        step = att(x[:, 3:5], cache=cache)  # continues at 13, 14
    torch.testing.assert_close(step, shifted[:, 3:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position", POSITIONS)
def test_transformer_lm_left_padding_and_cache(position):
    spec = AttentionSpec.standard(16, 2, causal=True, position=position)
    torch.manual_seed(0)
    model = TransformerLM(
        spec, vocab_size=11, num_layers=2, max_len=16, input_position="learned" if position == "none" else "auto"
    ).eval()
    ids = torch.randint(0, 11, (1, 5))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], 1)
    keep = torch.ones(1, 8, dtype=torch.bool)
    keep[:, :3] = False
    with torch.no_grad():
        expected = model(ids)
        torch.testing.assert_close(model(padded, key_padding_mask=keep)[:, 3:], expected, atol=1e-4, rtol=1e-4)
        caches = model.new_caches()
        model(padded[:, :6], caches=caches, key_padding_mask=keep[:, :6])
        step = model(padded[:, 6:], caches=caches, key_padding_mask=keep)
    torch.testing.assert_close(step, expected[:, 3:], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("position", POSITIONS)
def test_query_longer_than_keys_runs_for_every_position(position, causal):
    att = _layer(position, "softmax", causal)
    out = att(torch.randn(1, 7, 8), torch.randn(1, 5, 8))
    assert out.shape == (1, 7, 8) and bool(out.isfinite().all())


def test_learned_negative_positions_take_the_first_row():
    att = _layer("learned", "softmax", causal=False)
    q, kv = torch.randn(1, 7, 8), torch.randn(1, 5, 8)
    with torch.no_grad():
        out = att(q, kv)  # queries at -2 .. 4
        clipped = att(q, kv, position_ids=torch.tensor([0, 0, 0, 1, 2, 3, 4]), key_position_ids=torch.arange(5))
    torch.testing.assert_close(out, clipped)


def test_bad_position_ids_name_the_shapes():
    att = _layer("rope", "softmax")
    with pytest.raises(ValueError, match=r"position_ids .* seq=4; got dtype torch.int64, shape \(3,\)"):
        att(torch.randn(1, 4, 8), position_ids=torch.arange(3))
