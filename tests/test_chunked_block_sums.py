"""Low-precision gradients of the chunked engine are summed over its blocks in float32 (issue 36).

The chunked engine splits a problem into query chunks and key blocks. A parameter or an input used by every block
gets one gradient per block; if each block casts the bfloat16/float16 tensor to float32 itself, each block's gradient
is rounded back to the low dtype before autograd adds them up, and with many small blocks most of a small gradient
is lost. The engine casts once before the split (``engines/chunked._in_compute_dtype``). Expected values: the same
layer in the same dtype on the reference engine (one block, no split), so that what is measured is what the split
adds; the yardstick is each tensor's largest float64 gradient (the same rounded layer and inputs). The bound is four
units of the dtype's roundoff.
A planted per-block cast (the old behaviour) must fail the same bound, so the test can tell the two apart.
"""

from __future__ import annotations

import copy

import pytest
import torch

from axiomformer import Attention, AttentionSpec
from axiomformer.engines import ENGINES
from axiomformer.engines import chunked as chunked_module
from axiomformer.engines.chunked import ChunkedEngine

SPECS = {
    "bilinear": dict(score="bilinear"),
    "softpick": dict(normalizer="softpick"),
    "sigmoid_joint": dict(normalizer="sigmoid", contribution="joint"),
    "learned_scale": dict(scale="learned"),
    "power_softcap": dict(normalizer="power", softcap=5.0),
}
EPS = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}


def _layer(relax: dict, dtype: torch.dtype) -> tuple[Attention, Attention]:
    torch.manual_seed(0)
    spec = AttentionSpec.standard(16, 2, causal=True).relax(**relax)
    base = Attention(spec).double()
    with torch.no_grad():
        for p in base.parameters():
            p.add_(0.2 * torch.randn_like(p))
    low = copy.deepcopy(base).to(dtype)
    return low, copy.deepcopy(low).double()


def _grads(layer: Attention, engine: str, x: torch.Tensor, go: torch.Tensor) -> dict[str, torch.Tensor]:
    layer.engine = engine
    layer.zero_grad()
    xin = x.clone().requires_grad_(True)
    (layer(xin).double() * go).sum().backward()
    grads = {name: p.grad.double() for name, p in layer.named_parameters() if p.grad is not None}
    grads["input"] = xin.grad.double()
    return grads


def _worst(low: dict, same_dtype: dict, exact: dict) -> float:
    """max over tensors of |chunked - reference| in the low dtype, relative to the largest |float64 gradient| of that
    tensor; tensors whose float64 gradient is zero (a key bias under a softmax: the weights do not change when every
    score of a row moves alike) are left out, their low-precision values being rounding noise."""
    largest = max(float(g.abs().max()) for g in exact.values())
    return max(
        float((low[n] - same_dtype[n]).abs().max()) / float(exact[n].abs().max())
        for n in exact
        if float(exact[n].abs().max()) > 1e-6 * largest
    )


def _errors(relax: dict, dtype: torch.dtype, monkeypatch) -> float:
    """The chunked engine in ``dtype`` (one query and one key per block) against the reference engine in ``dtype``
    (one block): their difference is what splitting adds, the roundings of the layer itself being common to both."""
    monkeypatch.setitem(ENGINES, "chunked", ChunkedEngine(query_chunk=1, key_chunk=1))
    low, exact = _layer(relax, dtype)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 32, 16, generator=g, dtype=torch.float64)
    go = torch.randn(2, 32, 16, generator=g, dtype=torch.float64)
    exact_grads = _grads(exact, "reference", x.to(dtype).double(), go)
    same_dtype = _grads(low, "reference", x.to(dtype), go)
    return _worst(_grads(low, "chunked", x.to(dtype), go), same_dtype, exact_grads)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("name", list(SPECS))
def test_chunked_low_precision_gradients_follow_the_dtype(name, dtype, monkeypatch):
    assert _errors(SPECS[name], dtype, monkeypatch) < 4 * EPS[dtype]


@pytest.mark.parametrize("name", ["bilinear", "learned_scale"])
def test_a_per_block_cast_is_caught(name, monkeypatch):
    """Plant the old behaviour (no cast before the split): the same bound fails, for a learned score's parameter
    and a learned temperature."""
    monkeypatch.setattr(
        chunked_module, "_in_compute_dtype", lambda parts, problem, k, v, params: (parts, problem, k, v, params)
    )
    assert _errors(SPECS[name], torch.bfloat16, monkeypatch) > 4 * EPS[torch.bfloat16]
