"""Every choice runs in bfloat16/float16, with parameters and inputs in any floating dtypes (issue 36).

A layer whose parameters, buffers and inputs are not all one floating dtype computes in their promoted dtype
(``torch.promote_types``, as ``a + b`` does): its output equals that of the same layer converted to the promoted dtype
on the inputs converted to it, and each parameter's gradient comes back in the parameter's own dtype. LASER lifts q and
k to float32 while the parameters of a learned score (bilinear W_h) or of CoPE stay in bfloat16/float16: these run too,
and agree with float64 within the dtype's precision."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from axiomformer import Attention, AttentionSpec
from axiomformer.spec import AXES, required_fields

DT = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32, "f64": torch.float64}
PAIRS = [("bf16", "bf16"), ("f16", "f16"), ("bf16", "f32"), ("f32", "f16"), ("f16", "f64"), ("f64", "bf16")]
CHOICES = [(axis, name) for axis, names in AXES.items() for name in names[1:]] + [("aggregator", "identity")]


def _spec(axis: str, name: str, aggregator: str) -> AttentionSpec:
    fields = {"causal": name != "sinkhorn", **required_fields(axis, name), "aggregator": aggregator, axis: name}
    return AttentionSpec(dim=8, num_heads=2, topk=2, **fields)


@pytest.mark.parametrize("aggregator", ["identity", "laser"])
@pytest.mark.parametrize(("axis", "name"), CHOICES)
def test_every_choice_runs_with_parameters_and_inputs_in_any_floating_dtypes(axis, name, aggregator):
    try:
        spec = _spec(axis, name, aggregator)
    except ValueError as refused:  # a pair the spec refuses (laser needs u >= 0 and the proportional contribution)
        assert aggregator == "laser", refused
        return
    for params, inputs in PAIRS:
        torch.manual_seed(0)
        layer = Attention(spec).to(DT[params])
        x = torch.randn(2, 5, 8, dtype=DT[inputs], requires_grad=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # gumbel_softmax's sampling note
            out = layer(x)
            out.float().square().sum().backward()
        promoted = torch.promote_types(DT[params], DT[inputs])
        assert out.dtype == promoted and torch.isfinite(out).all(), (params, inputs)
        assert x.grad is not None and x.grad.dtype == DT[inputs] and torch.isfinite(x.grad).all()
        for p in layer.parameters():
            assert p.grad is None or (p.grad.dtype == DT[params] and torch.isfinite(p.grad).all()), (params, inputs)
        if params != inputs and name != "gumbel_softmax":  # the same layer converted to the promoted dtype
            torch.manual_seed(0)
            same = copy.deepcopy(layer).to(promoted)(x.detach().to(promoted))
            torch.testing.assert_close(out.detach(), same.detach(), rtol=0, atol=0)


def test_parameters_in_several_dtypes_are_promoted_too():
    spec = AttentionSpec(dim=8, num_heads=2, aggregator="laser", score="bilinear", position="cope", causal=True)
    layer = Attention(spec).to(torch.bfloat16)
    layer.score_fn.to(torch.float16)  # a learned score in another dtype than the projections
    x = torch.randn(2, 5, 8, dtype=torch.bfloat16)
    out = layer(x)
    assert out.dtype == torch.float32  # promote(bfloat16, float16)
    torch.testing.assert_close(out, copy.deepcopy(layer).float()(x.float()), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("score", AXES["score"])
def test_laser_with_learned_scores_and_cope_in_low_precision_agrees_with_float64(score, dtype):
    # the handed case laser-low-precision.py: "expected scalar type Float but found BFloat16" on every engine (the
    # differential fuzzer then found score=mlp with cope: CoPE's gates called the score on the lifted q and k)
    spec = AttentionSpec(dim=16, num_heads=2, aggregator="laser", score=score, position="cope", causal=True)
    torch.manual_seed(0)
    layer = Attention(spec).to(dtype)
    x = torch.randn(2, 6, 16).to(dtype)
    wide = copy.deepcopy(layer).double()
    expected = wide(x.double())
    for engine in ("auto", "reference", "chunked"):
        layer.engine = engine
        out = layer(x)
        eps = torch.finfo(dtype).eps
        torch.testing.assert_close(out.double(), expected, rtol=8 * eps, atol=8 * eps * expected.abs().max().item())
