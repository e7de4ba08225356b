"""torch.compile: every choice of every axis traces without a graph break (with and without a key padding mask) and
compiles at most 2 graphs over 12 sequence lengths (a static one, then one with a dynamic length), with the compiled
output equal to the eager one. The choices are read from the registries (``spec.AXES``), so a new choice is checked
without a new test. Dynamo only (``backend="eager"``): breaks and length specialisations happen while tracing.
"""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
import torch._dynamo as dynamo
from torch._dynamo.utils import counters

from axiomformer import Attention, AttentionSpec
from axiomformer.spec import AXES, required_fields

DIM, HEADS = 8, 2
LENGTHS = list(range(8, 20))
"""12 distinct lengths, as variable-length batches give."""
MAX_GRAPHS = 2
CHOICES = [(axis, name) for axis, names in AXES.items() for name in names]


@pytest.fixture(autouse=True)
def _quiet_dynamo():
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
    dynamo.reset()


def _layer(axis: str, name: str) -> Attention:
    causal = required_fields(axis, name).get("causal", True)  # sinkhorn: only without a causal mask
    spec = AttentionSpec.standard(DIM, HEADS, causal=causal).relax({**required_fields(axis, name), axis: name})
    if axis == "feature_map":
        spec = spec.relax(normalizer="linear")
    torch.manual_seed(0)
    return Attention(spec).eval()


def graph_breaks(layer: Attention, padded: bool) -> tuple[int, list[str]]:
    x = torch.randn(2, 7, DIM)
    kwargs = {}
    if padded:
        keep = torch.ones(2, 7, dtype=torch.bool)
        keep[1, 5:] = False
        kwargs["key_padding_mask"] = keep
    dynamo.reset()
    explanation = dynamo.explain(layer)(x, **kwargs)
    return explanation.graph_break_count, [str(b.reason)[:200] for b in explanation.break_reasons]


def graphs_over_lengths(layer: Attention) -> tuple[int, float]:
    """(graphs compiled for the 12 lengths, largest |compiled - eager| difference)."""
    dynamo.reset()
    counters.clear()
    compiled = torch.compile(layer, backend="eager")
    worst = 0.0
    with torch.no_grad():
        for n in LENGTHS:
            x = torch.randn(2, n, DIM)
            worst = max(worst, float((compiled(x) - layer(x)).abs().max()))
    return int(counters["stats"]["unique_graphs"]), worst


@pytest.mark.slow
@pytest.mark.parametrize("padded", [False, True], ids=["no-mask", "key-padding"])
@pytest.mark.parametrize("axis, name", CHOICES, ids=[f"{a}={n}" for a, n in CHOICES])
def test_every_choice_traces_without_a_graph_break(axis, name, padded):
    count, reasons = graph_breaks(_layer(axis, name), padded)
    assert count == 0, reasons


@pytest.mark.slow
@pytest.mark.parametrize("axis, name", CHOICES, ids=[f"{a}={n}" for a, n in CHOICES])
def test_every_choice_compiles_at_most_two_graphs_over_twelve_lengths(axis, name):
    graphs, worst = graphs_over_lengths(_layer(axis, name))
    assert graphs <= MAX_GRAPHS, f"{graphs} graphs for {len(LENGTHS)} lengths"
    assert worst <= 1e-5, worst  # the compiled routes compute what the eager ones do


MLA = [{"kv_latent": 6}, {"kv_latent": 6, "kv_rope_dim": 2}]
"""MLA's latent (an economy, not an axis choice), with and without its decoupled RoPE key (issue 34 item 8)."""


@pytest.mark.slow
@pytest.mark.parametrize("fields", MLA, ids=["kv_latent", "kv_latent+kv_rope_dim"])
def test_mla_traces_without_a_graph_break_and_compiles_at_most_two_graphs(fields):
    torch.manual_seed(0)
    layer = Attention(AttentionSpec.standard(DIM, HEADS, causal=True, **fields)).eval()
    for padded in (False, True):
        count, reasons = graph_breaks(layer, padded)
        assert count == 0, reasons
    graphs, worst = graphs_over_lengths(layer)
    assert graphs <= MAX_GRAPHS, f"{graphs} graphs for {len(LENGTHS)} lengths"
    assert worst <= 1e-5, worst


# ---------------------------------------------------------------------------------------------- the checks can fail
def test_the_recompile_check_sees_a_python_loop_over_the_length(monkeypatch):
    # Plant the old fault: an engine step that loops over query chunks in Python specialises every length.
    import axiomformer.engines.router as router

    real = router.zero_rows_without_keys

    def looping(out, problem):
        parts = [out[..., start : start + 4, :] for start in range(0, out.shape[-2], 4)]
        return real(torch.cat(parts, dim=-2), problem)

    monkeypatch.setattr(router, "zero_rows_without_keys", looping)
    graphs, _ = graphs_over_lengths(_layer("normalizer", "softmax"))
    assert graphs > MAX_GRAPHS


def test_the_graph_break_check_sees_a_host_sync_in_a_choice(monkeypatch):
    # Plant a host read in one normalizer's implementation: only that choice's check fails.
    import dataclasses

    from axiomformer.axes.normalizer import NORMALIZERS

    real = NORMALIZERS["sigmoid"]
    syncing = dataclasses.replace(real, impl=lambda s, n: real.impl(s, n) * (2.0 if bool((s > 1e9).any()) else 1.0))
    monkeypatch.setitem(NORMALIZERS._choices, "sigmoid", syncing)
    assert graph_breaks(_layer("normalizer", "sigmoid"), padded=False)[0] >= 1
    assert graph_breaks(_layer("normalizer", "relu"), padded=False)[0] == 0
