"""The linear normalizer honours A5's temperature on every engine: the scale enters through the query,
f(q, scale=s) == f(s q, scale=1), and a learned scale gets its gradient (the kernel once ignored it)."""

from __future__ import annotations

import pytest
import torch

from axiomformer import Attention, AttentionSpec
from axiomformer.axes.normalizer import FEATURE_MAPS
from axiomformer.engines import ENGINES, attend
from axiomformer.engines.chunked import ChunkedEngine
from axiomformer.engines.linear import LinearEngine


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch):
    monkeypatch.setitem(ENGINES, "chunked", ChunkedEngine(query_chunk=2, key_chunk=2))
    monkeypatch.setitem(ENGINES, "linear", LinearEngine(chunk=2))


def _gap(feature_map: str, engine: str, causal: bool, scale) -> float:
    spec = AttentionSpec(dim=8, num_heads=2, causal=causal, normalizer="linear", feature_map=feature_map)
    q, k, v = (torch.randn(1, 2, 6, 4, dtype=torch.float64) for _ in range(3))
    scaled = attend(q, k, v, spec=spec, scale=scale, engine=engine).out
    folded = attend(scale * q, k, v, spec=spec, scale=1.0, engine=engine).out
    return float((scaled - folded).abs().max())


@pytest.mark.parametrize("feature_map", FEATURE_MAPS.names())
@pytest.mark.parametrize("engine", ["reference", "chunked", "linear", "auto"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale", [0.5, "per_head"])
def test_the_scale_of_linear_attention_is_the_scale_of_the_query(feature_map, engine, causal, scale):
    if scale == "per_head":
        scale = torch.tensor([0.3, 2.0], dtype=torch.float64).view(1, 2, 1, 1)
    assert _gap(feature_map, engine, causal, scale) < 1e-12


def test_the_scale_check_sees_an_ignored_scale(monkeypatch):
    from axiomformer.engines import linear, reference

    monkeypatch.setattr(reference, "scaled_query", lambda q, scale: q)
    monkeypatch.setattr(linear, "scaled_query", lambda q, scale: q)
    assert _gap("elu", "reference", True, 0.5) > 1e-3
    assert _gap("elu", "linear", True, 0.5) > 1e-3


@pytest.mark.parametrize("engine", ["reference", "chunked", "linear"])
def test_a_learned_scale_of_linear_attention_gets_its_gradient(engine):
    layer = Attention(AttentionSpec.standard(8, 2, causal=True, normalizer="linear", scale="learned"), engine=engine)
    layer(torch.randn(1, 5, 8)).sum().backward()
    grad = layer.scale.log_scale.grad
    assert grad is not None and bool(torch.isfinite(grad).all()) and float(grad.abs().max()) > 0
