"""RoPE is rotated into q and k before the score and the normalizer (docs/positions.md). The result depends only on
p_i - p_j where the score of rotated vectors does (dot, cosine, neg_l2: rotations preserve inner products and norms)
and on absolute positions elsewhere (the linear normalizer's feature map, bilinear, additive and MLP scores). Both
halves are pinned here; left padding changes nothing in either case because positions come from position_ids."""

import pytest
import torch

from axiomformer import Attention, AttentionSpec

SHIFT = 5


def _shift_change(score: str, normalizer: str) -> float:
    torch.manual_seed(0)
    spec = AttentionSpec(dim=16, num_heads=4, causal=True, position="rope", score=score, normalizer=normalizer)
    layer = Attention(spec).eval()
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        plain = layer(x, position_ids=torch.arange(6))
        shifted = layer(x, position_ids=torch.arange(SHIFT, SHIFT + 6))
    return float((shifted - plain).abs().max())


@pytest.mark.parametrize("normalizer", ["softmax", "sigmoid", "sparsemax"])
@pytest.mark.parametrize("score", ["dot", "cosine", "neg_l2"])
def test_relative_where_the_score_of_rotated_vectors_is(score, normalizer):
    assert _shift_change(score, normalizer) < 1e-5


@pytest.mark.parametrize(
    "score, normalizer", [("dot", "linear"), ("bilinear", "softmax"), ("additive", "softmax"), ("mlp", "softmax")]
)
def test_absolute_where_documented(score, normalizer):
    assert _shift_change(score, normalizer) > 1e-4
