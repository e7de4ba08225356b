"""Robust attributions: a probed compute precision, compiled targets, maps whose weights read other keys, and a
causal leak blamed on causality alone. Each planted departure is caught and attributed to its assumption."""

import torch
import torch.nn.functional as F

from axiomformer import Attention, AttentionSpec
from axiomformer.audit import run_audit
from axiomformer.audit.adapters import COMPILED_NOTE, FunctionAdapter, output_grid


def _sdpa(q, k, v, causal=False):
    return F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], is_causal=causal)[:, 0]


def _in(dtype, inner=_sdpa, before=None, after=None):
    """(q, k, v) -> out computed in ``dtype`` and returned as float64, with an optional map of the values before and
    of the output after (computed in float32, rounded back to ``dtype``)."""

    def fn(q, k, v):
        v = v if before is None else before(v)
        out = inner(q.to(dtype), k.to(dtype), v.to(dtype))
        out = out if after is None else after(out.float()).to(dtype)
        return out.to(q.dtype)

    return fn


def _assumption_failures(report) -> list[str]:
    return [c.name for c in report.checks if c.passed is False and c.assumption.startswith("A")]


def test_output_grid_detects_the_dtype_a_float64_output_was_computed_in():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, generator=g, dtype=torch.float64)
    assert output_grid(x) is None
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        assert output_grid(x.to(dtype).double()) == dtype


def test_half_precision_sdpa_passes_and_bfloat16_rounding_is_not_a_departure():
    for dtype in (torch.float16, torch.bfloat16):
        adapter = FunctionAdapter(_in(dtype), f"sdpa in {dtype}")
        assert adapter.precision == dtype
        report = run_audit(adapter)
        assert report.passed, report.departures()
    linearity = run_audit(FunctionAdapter(_in(torch.bfloat16), "bf16"))["linearity"]
    assert linearity.passed is None and linearity.detail.startswith("n/a (precision)")


def test_half_precision_departures_keep_their_assumption():
    """Planted at float16 and bfloat16: GELU of the values (A3) and a LayerNorm after the sum (A1)."""
    for dtype in (torch.float16, torch.bfloat16):
        gelu = run_audit(FunctionAdapter(_in(dtype, before=F.gelu), "gelu"))
        assert _assumption_failures(gelu) == ["linearity"] and gelu["linearity"].candidates == ["A3"]
        norm = run_audit(FunctionAdapter(_in(dtype, after=lambda o: F.layer_norm(o, o.shape[-1:])), "ln"))
        assert "A4" not in {a for c in norm.checks if c.passed is False for a in c.candidates}
        assert norm["token_additivity"].passed is False and norm["token_additivity"].candidates == ["A1"]


def test_compiled_modules_are_audited_with_their_adapter():
    for module in (torch.nn.MultiheadAttention(16, 2, batch_first=True), Attention(AttentionSpec.standard(16, 2))):
        plain, compiled = run_audit(module), run_audit(torch.compile(module))
        assert compiled.passed and COMPILED_NOTE in compiled.notes
        assert [c.passed for c in compiled.checks] == [c.passed for c in plain.checks]
    report = run_audit(torch.compile(_sdpa), causal=True)
    assert report.passed and COMPILED_NOTE in report.notes


def hopfield(q, k, v, beta=0.5):
    """Iterated Hopfield retrieval (Ramsauer et al. 2021): xi <- K^T softmax(beta K xi), then attend to the values
    (two update steps in all): the second step's weights read every key through xi."""
    xi = torch.softmax(beta * q @ k.transpose(-1, -2), -1) @ k
    return torch.softmax(beta * xi @ k.transpose(-1, -2), -1) @ v


def test_weights_that_read_other_keys_are_blamed_on_a4():
    report = run_audit(FunctionAdapter(hopfield, "hopfield"))
    check = report["bilinear_scores"]
    assert check.passed is False and check.candidates[0] == "A4"
    assert report["shift_invariance"].passed is None  # its premise (bilinear scores) failed
    one_step = run_audit(FunctionAdapter(lambda q, k, v: torch.softmax(0.5 * q @ k.transpose(-1, -2), -1) @ v))
    assert one_step["bilinear_scores"].passed is not False  # the same map without the iteration


def test_a_causal_leak_is_blamed_on_causality_only():
    def leak(q, k, v, causal=False):
        return 0.95 * _sdpa(q, k, v, causal) + 0.05 * _sdpa(q, k, v)

    report = run_audit(FunctionAdapter(leak, "leak"), causal=True)
    failed = [c for c in report.checks if c.passed is False and c.assumption not in ("design", "numerics")]
    assert [c.name for c in failed] == ["causality"] and failed[0].candidates == ["causal"]
    assert report["weights_sum_to_one"].passed
