"""The audit: standard attention passes every applicable check, each relaxation fails a check of its own axis,
and every check has a target on which it must fail."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from typer.testing import CliRunner

from axiomformer import Attention, AttentionSpec
from axiomformer.audit import FunctionAdapter, audit, make_adapter, register_adapter
from axiomformer.audit.adapters import _ADAPTERS, AttentionAdapter, MultiheadAttentionAdapter
from axiomformer.audit.matrix import AXIS_TAG, matrix_markdown, relaxation_matrix, tanh_rnn
from axiomformer.cli import app

# The relaxation-by-check matrix, pinned: for each target, the checks that fail and those that do not apply.
# Why each failure is expected is in docs/audit.md; failures beyond the row's own axis are consequences (e.g. a
# non-linear rho also breaks proportionality and linearity in the values).
# shift_invariance needs bilinear scores; causality needs a causal target.
NA_SHIFT = {"causality", "shift_invariance"}
EXPECTED = {
    "standard": (set(), {"causality"}),
    "aggregator=mlp": ({"token_additivity", "proportionality", "linearity"}, {"causality"}),
    "contribution=joint": ({"proportionality", "linearity"}, {"causality"}),
    "value=identity": ({"learned_values"}, {"causality"}),
    "value=mlp": ({"linearity"}, {"causality"}),
    "score=bilinear": ({"rotation_invariance"}, NA_SHIFT),
    "score=additive": ({"bilinear_scores", "rotation_invariance", "scale_entropy"}, NA_SHIFT),
    "score=cosine": ({"bilinear_scores", "scale_entropy"}, NA_SHIFT),
    "score=neg_l2": ({"bilinear_scores"}, NA_SHIFT),
    "score=mlp": ({"bilinear_scores", "rotation_invariance", "scale_entropy"}, NA_SHIFT),
    "normalizer=sigmoid": ({"weights_sum_to_one", "shift_invariance"}, {"causality", "bilinear_scores"}),
    "normalizer=relu": ({"weights_sum_to_one", "shift_invariance"}, {"causality", "bilinear_scores"}),
    "normalizer=sparsemax": ({"ratio_independence"}, {"causality", "bilinear_scores"}),
    "normalizer=entmax15": ({"ratio_independence"}, {"causality", "bilinear_scores"}),
    "normalizer=gumbel_softmax": ({"deterministic"}, {"causality"}),
    "normalizer=linear": ({"bilinear_scores", "rotation_invariance", "scale_entropy"}, NA_SHIFT),
    "scale=none": ({"scale_entropy"}, {"causality"}),
    "scale=learned": ({"scale_entropy"}, {"causality"}),
    "position=sinusoidal": ({"set_symmetry", "bilinear_scores", "rotation_invariance"}, NA_SHIFT),
    "position=learned": ({"set_symmetry", "bilinear_scores", "rotation_invariance"}, NA_SHIFT),
    "position=rope": ({"set_symmetry", "rotation_invariance"}, NA_SHIFT),
    "position=alibi": ({"set_symmetry", "bilinear_scores"}, NA_SHIFT),
    "standard, causal": (set(), set()),
    "torch SDPA": (set(), {"causality", "learned_values"}),     # a function: values arrive already mapped
    "torch SDPA, causal": ({"causality"}, {"learned_values"}),   # NaN in later keys leaks through 0 * NaN
    "torch MHA": (set(), {"causality"}),
    "torch MHA, causal": ({"causality"}, set()),
    "tanh RNN": ({"set_symmetry", "token_additivity", "proportionality", "linearity", "parallel"},
                 {"learned_values", "bilinear_scores", "causality", "nonnegative_weights", "weights_sum_to_one",
                  "ratio_independence", "scale_entropy"}),
}


@pytest.fixture(scope="module")
def matrix():
    return {row.label: row for row in relaxation_matrix()}


def _failed(report):
    return {c.name for c in report.checks if c.passed is False}


def _not_applicable(report):
    return {c.name for c in report.checks if c.passed is None}


def test_relaxation_matrix_matches_the_pinned_pattern(matrix):
    assert set(matrix) == set(EXPECTED)
    for label, (failed, na) in EXPECTED.items():
        report = matrix[label].report
        assert (_failed(report), _not_applicable(report)) == (failed, na), label


def test_standard_mha_and_sdpa_pass_every_applicable_check(matrix):
    for label in ("standard", "standard, causal", "torch SDPA", "torch MHA"):
        report = matrix[label].report
        assert report.passed and all(c.passed is not False for c in report.checks), label


def test_every_single_axis_relaxation_fails_a_check_of_its_own_axis(matrix):
    relaxations = [row for row in matrix.values() if row.axis is not None]
    assert len(relaxations) == 21
    for row in relaxations:
        assert row.tag == AXIS_TAG[row.axis]
        assert row.own_axis_failed, row.label


def test_tanh_rnn_fails_set_symmetry_and_parallel(matrix):
    report = matrix["tanh RNN"].report
    assert report["set_symmetry"].passed is False and report["parallel"].passed is False
    assert report["parallel"].statistic > 0


@pytest.mark.parametrize("check,label", [
    ("set_symmetry", "position=rope"), ("token_additivity", "aggregator=mlp"),
    ("proportionality", "contribution=joint"), ("linearity", "value=mlp"), ("learned_values", "value=identity"),
    ("bilinear_scores", "score=cosine"),
    ("rotation_invariance", "score=bilinear"), ("weights_sum_to_one", "normalizer=sigmoid"),
    ("shift_invariance", "normalizer=sigmoid"), ("ratio_independence", "normalizer=sparsemax"),
    ("deterministic", "normalizer=gumbel_softmax"), ("scale_entropy", "scale=none"), ("parallel", "tanh RNN"),
    ("causality", "torch SDPA, causal"),
])
def test_check_fails_where_its_property_is_broken(matrix, check, label):
    c = matrix[label].report[check]
    # learned_values fails when the value map is the identity, i.e. when its distance from I is within tolerance.
    beyond = c.statistic <= c.tolerance if check == "learned_values" else c.statistic > c.tolerance
    assert c.passed is False and beyond


def test_nonnegative_weights_fails_for_a_signed_kernel():
    report = audit("spec:normalizer=linear,feature_map=identity")      # phi(q).phi(k) = q.k can be negative
    assert report["nonnegative_weights"].passed is False


def test_causality_catches_a_target_that_looks_ahead():
    peeking = FunctionAdapter(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), "peeks", causal=True)
    report = audit(peeking)
    assert report["causality"].passed is False and report["causality"].statistic > 1e-2


def test_causal_axiomformer_attention_keeps_nan_in_later_tokens_out(matrix):
    c = matrix["standard, causal"].report["causality"]
    assert c.passed is True and "non-finite by NaN: 0" in c.detail


def test_mha_adapter_converts_mask_polarity_and_matches_axiomformer():
    torch.manual_seed(0)
    mha = nn.MultiheadAttention(16, 2, batch_first=True)
    ours = AttentionAdapter(Attention.from_multihead_attention(mha))
    theirs = MultiheadAttentionAdapter(mha)
    q, k, v = (torch.randn(2, 6, 16, dtype=torch.float64) for _ in range(3))
    for causal in (False, True):
        assert torch.allclose(theirs(q, k, v, causal=causal), ours(q, k, v, causal=causal), atol=1e-6)
        w_ours = ours.weights(q, k, causal=causal).double()
        assert torch.allclose(theirs.weights(q, k, causal=causal), w_ours, atol=1e-6)
    w = theirs.weights(q, k, causal=True)
    assert float(w[..., 0, 1:].detach().abs().max()) == 0.0                   # query 0 sees key 0 only


def test_audit_accepts_objects_and_strings():
    spec = AttentionSpec.standard(16, 2)
    assert isinstance(make_adapter(spec), AttentionAdapter)
    assert isinstance(make_adapter(Attention(spec)), AttentionAdapter)
    assert isinstance(make_adapter(nn.MultiheadAttention(16, 2)), MultiheadAttentionAdapter)
    assert isinstance(make_adapter(lambda q, k, v: v), FunctionAdapter)
    sdpa = make_adapter("module:torch.nn.functional:scaled_dot_product_attention")
    assert sdpa.supports_causal and sdpa.name.startswith("module:")
    with pytest.raises(ValueError, match="cannot audit"):
        make_adapter("nonsense")
    with pytest.raises(ValueError, match="causal"):
        audit(lambda q, k, v: v, causal=True)


def test_register_adapter_lets_a_plugin_add_a_target_kind():
    class Wrapped:
        def __init__(self, fn):
            self.fn = fn

    register_adapter(Wrapped, lambda t, **o: FunctionAdapter(t.fn, "wrapped", dim=o.get("dim", 16)))
    register_adapter("toy:", lambda t, **o: FunctionAdapter(lambda q, k, v: v, t))
    try:
        assert make_adapter(Wrapped(lambda q, k, v: q)).name == "wrapped"
        assert make_adapter("toy:x").name == "toy:x"
    finally:
        del _ADAPTERS[:2]


def test_audit_cli_json_and_bad_target():
    result = CliRunner().invoke(app, ["audit", "spec:score=bilinear", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output.strip().splitlines()[-1])
    assert data["target"] == "spec:score=bilinear" and len(data["checks"]) == 15
    for c in data["checks"]:
        assert set(c) == {"name", "assumption", "passed", "statistic", "tolerance", "detail"}
    assert {c["name"] for c in data["checks"] if c["passed"] is False} == {"rotation_invariance"}
    bad = CliRunner().invoke(app, ["audit", "spec:scor=cosine"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output


def test_matrix_markdown_has_one_row_per_target(matrix):
    text = matrix_markdown(list(matrix.values()))
    assert text.startswith("| target") and text.count("\n| ") == len(matrix)


def test_tanh_rnn_target_reads_values_in_order():
    rnn = tanh_rnn(8)
    v = torch.randn(1, 5, 8, dtype=torch.float64)
    out = rnn(v, v, v)
    assert torch.allclose(rnn(v[:, :3], v[:, :3], v[:, :3]), out[:, :3])   # a prefix does not see the future
