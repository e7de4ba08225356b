"""torch.compile with the inductor backend on CPU (issue 36): the compiled layer's output and gradients equal eager
ones (to float32 rounding: inductor fuses and reorders), in one graph (dynamo's graph-break count is 0).

Inductor compiles C++ for each graph, about 20-30 s per choice on a shared 2-core machine, so the default run
compiles a representative pair (the standard point; a learned score with ALiBi and a per-row scale); every choice of
every axis runs with ``AXIOMFORMER_INDUCTOR=all`` (minutes per axis), e.g.::

    AXIOMFORMER_INDUCTOR=all nice -n 10 python -m pytest -q -p no:cacheprovider tests/test_compile_inductor.py

The graph-break and recompile checks for every choice under dynamo (backend ``eager``) are in tests/test_compile.py.
"""

from __future__ import annotations

import logging
import os
import warnings

import pytest
import torch
import torch._dynamo as dynamo

from axiomformer import Attention, AttentionSpec
from axiomformer.spec import AXES, required_fields

DIM, HEADS = 8, 2
ALL = os.environ.get("AXIOMFORMER_INDUCTOR") == "all"
REPRESENTATIVE = [{}, {"score": "bilinear", "position": "alibi", "scale": "log_n"}]
CHOICES = [{axis: name} for axis, names in AXES.items() for name in names[1:]] if ALL else []


@pytest.fixture(autouse=True)
def _quiet_dynamo():
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    dynamo.reset()


def _layer(fields: dict) -> Attention:
    causal = all(required_fields(a, n).get("causal", True) for a, n in fields.items())
    spec = AttentionSpec.standard(DIM, HEADS, causal=causal).relax(fields)
    if "feature_map" in fields:
        spec = spec.relax(normalizer="linear")
    torch.manual_seed(0)
    return Attention(spec).eval()


def inductor_mismatch(layer: Attention) -> tuple[int, float]:
    """(dynamo's graph breaks, largest |compiled - eager| over the output and every gradient) on one batch."""
    x = torch.randn(2, 7, DIM)
    breaks = dynamo.explain(layer)(x).graph_break_count
    dynamo.reset()
    compiled = torch.compile(layer, backend="inductor")
    results = []
    for run in (layer, compiled):
        layer.zero_grad()
        xi = x.clone().requires_grad_()
        out = run(xi)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        results.append([out.detach(), xi.grad] + [p.grad for p in layer.parameters() if p.grad is not None])
    eager, got = results
    # each tensor against its largest entry, or 1e-3 of the largest of all (the key bias's gradient is 0 in exact
    # arithmetic: float32 noise of 1e-7 either way)
    top = max(float(b.abs().max()) for b in eager)
    worst = max(float((a - b).abs().max()) / max(float(b.abs().max()), 1e-3 * top) for a, b in zip(got, eager))
    return breaks, worst


@pytest.mark.slow
@pytest.mark.parametrize("fields", REPRESENTATIVE + CHOICES, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
def test_inductor_on_cpu_equals_eager_in_one_graph(fields):
    breaks, worst = inductor_mismatch(_layer(fields))
    assert breaks == 0
    assert worst < 1e-4  # relative to each tensor's largest entry: float32 reordering, not a different function
