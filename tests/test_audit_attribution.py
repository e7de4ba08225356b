"""Attribution: each wrong function of tests/attribution_bank.py fails the checks theory predicts, with the candidates
theory predicts (several where the interface cannot tell them apart); in-class functions pass; projection biases are
kept and reported; tolerances follow the target's dtype."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

import attribution_bank as bank
from axiomformer.audit import run_audit
from axiomformer.audit.attribution import CONTRIBUTION_CAVEAT, SAME_MAP
from axiomformer.audit.probe import leading_direction, rank1_residual, tolerance
from axiomformer.cli import app

NOT_CAUSAL = {"causality", "nan_isolation"}
NO_WEIGHTS = {
    "bilinear_scores",
    "bilinear_fit",
    "nonnegative_weights",
    "weights_sum_to_one",
    "ratio_independence",
    "scale_entropy",
    "length_scale",
}
# name -> {failed check: candidates}, predicted by theory (docs/audit.md), non-causal audit.
EXPECTED = {
    # out_i = g(q_i) * sum_j w_ij v_j: coordinates see different weights; the same map as per-coordinate relevances
    # that factor through the query (A2), so both candidates.
    "query_output_gate": {"scalar_relevance": ["A1", "A2"]},
    "faint_output_gate": {"scalar_relevance": ["A1", "A2"]},  # strength 1e-6, float64 tolerance 1e-9
    # rows sum to 1 + tanh(q.w): a normalizer that does not normalize, a query-side scalar rho, or (the contribution
    # map being invisible) a contribution g(u) v after a normalizer.
    "query_scalar_gate": {"weights_sum_to_one": ["A5", "A1", "A2"]},
    # the relevance reads the values: the map is neither affine nor additive in v, and its Jacobian factors through
    # neither the query nor the key.
    "value_reading_score": {"token_additivity": ["A4"], "linearity": ["A4"], "value_free_relevance": ["A4"]},
    # temperature ~ log n: only a check that varies the number of visible keys sees it.
    "scalable_softmax": {"length_scale": ["A5", "A4"]},
    "key_content_bias": {"bilinear_scores": ["A4"], "bilinear_fit": ["A4"]},
    # a temperature set by the query's norm: doubling q rescales each row's scores by one factor, the same map as a
    # score nonlinear in q.
    "query_norm_temperature": {
        "bilinear_scores": ["A4", "A5"],
        "bilinear_fit": ["A4", "A5"],
        "scale_entropy": ["A5", "A4"],
    },
    "per_coordinate_temperature": {"scalar_relevance": ["A2"]},
    "key_gated_values": {"scalar_relevance": ["A2", "A3"]},
    "tanh_after_sum": {"token_additivity": ["A1"], "linearity": ["A1"]},
    "silu_after_sum": {"token_additivity": ["A1"], "linearity": ["A1"]},
    "gated_two_heads": {"scalar_relevance": ["A1", "A2"], "head_independence": ["A4", "A1"]},  # the gate reads q
    "context_gate": {"scalar_relevance": ["A1", "A2", "A3"]},  # a gate from every key: rho, relevance or values
    "head_scalar_gates": {"weights_sum_to_one": ["A5", "A1", "A2"]},
    "value_norm_score": {"token_additivity": ["A4"], "linearity": ["A4"], "value_free_relevance": ["A4"]},
    # s^2 / sum s^2: log-weights are a function of the one bilinear form q.k per query (their key gradients point one
    # way, also at 2q), as a score g(q.k) gives; a key bias (q + w).k (key_content_bias above) stays A4 alone.
    "power_normalizer": {"bilinear_scores": ["A4", "A5"], "bilinear_fit": ["A4", "A5"]},
    # Sinkhorn's column sums: a query's output reads the other queries, as scores that read them would.
    "sinkhorn_normalizer": {"parallel": ["A4", "A5"], "ratio_independence": ["A5"], "length_scale": ["A5", "A4"]},
}
CAUSAL_EXTRA = {"scalable_softmax": {"bilinear_fit": ["A4", "A5"]}}
"""With a causal mask rows see different numbers of keys, so one bilinear form no longer fits every row."""


def _audit(fn, causal=None):
    return run_audit(fn, causal=causal, num_heads=bank.HEADS.get(fn.__name__))


def _failures(report):
    return {c.name: c.candidates for c in report.checks if c.passed is False and c.assumption != "numerics"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_wrong_function_fails_where_theory_says_with_its_candidates(name):
    report = _audit(bank.WRONG[name])
    assert _failures(report) == EXPECTED[name], report.to_text()


@pytest.mark.parametrize(
    "name", ["query_output_gate", "query_scalar_gate", "value_reading_score", "scalable_softmax", "key_content_bias"]
)
def test_verdicts_hold_with_a_causal_mask(name):
    report = _audit(bank.WRONG[name], causal=True)
    assert _failures(report) == {**EXPECTED[name], **CAUSAL_EXTRA.get(name, {})}, report.to_text()


@pytest.mark.parametrize("name", sorted(bank.IN_CLASS))
@pytest.mark.parametrize("causal", [None, True])
def test_in_class_functions_pass_every_assumption_check(name, causal):
    report = _audit(bank.IN_CLASS[name], causal)
    assert report.passed and not _failures(report), report.to_text()
    # the weights are measured, not n/a, also for a function with its own value map
    assert all(
        report[c].passed is True
        for c in ("scalar_relevance", "weights_sum_to_one", "bilinear_fit", "ratio_independence", "length_scale")
    ), report.to_text()


@pytest.mark.parametrize("causal", [None, True])
def test_an_output_map_that_mixes_heads_passes_but_its_weights_per_head_are_not_identifiable(causal):
    report = _audit(bank.two_heads_with_projections, causal)
    assert report.passed and report["scalar_relevance"].passed is True, report.to_text()
    assert report["weights_sum_to_one"].passed is None
    assert "which weights belong to which head is not identifiable" in report["weights_sum_to_one"].detail


def test_an_output_gate_is_not_blamed_on_the_normalizer():
    report = _audit(bank.query_output_gate)
    assert all(report[c].passed is None for c in NO_WEIGHTS)
    assert "no single scalar relevance per key" in report["weights_sum_to_one"].detail


def test_several_candidates_are_explained_in_text_and_markdown():
    report = _audit(bank.query_scalar_gate)
    check = report["weights_sum_to_one"]
    assert check.why.startswith(SAME_MAP[("A5", "A1")]) and "Cannot be told apart from outside" in check.detail
    assert CONTRIBUTION_CAVEAT in check.why
    for text in (report.to_text(), report.to_markdown()):
        assert "weights_sum_to_one (A5): breaks A5 or A1 or A2 (cannot be told apart from outside" in text
    assert "| `weights_sum_to_one` | A5 | **FAIL** |" in report.to_markdown()


def test_every_candidate_is_explained_where_there_are_several():
    reports = [_audit(fn) for fn in bank.WRONG.values()] + [
        run_audit(t)
        for t in (
            "spec:normalizer=sigmoid",
            "spec:position=learned",
            "spec:score=cosine",
            "module:audit_bank:u_squared",
        )
    ]
    seen = 0
    for report in reports:
        for c in report.checks:
            if len(c.candidates) > 1:
                seen += 1
                assert c.why and all(tag in c.why for tag in c.candidates), (report.target, c.name, c.why)
                assert c.why in c.detail
    assert seen >= 10


def test_candidates_are_empty_unless_an_assumption_check_failed():
    report = _audit(bank.tanh_after_sum, causal=True)
    for c in report.checks:
        if c.passed is not False or c.assumption in ("design", "numerics"):
            assert c.candidates == [], c.name
    assert report["nan_isolation"].passed is False and report["nan_isolation"].candidates == []


def test_order_dependence_adds_a0_to_every_other_candidate_list():
    report = run_audit("spec:position=rope")
    assert report["set_symmetry"].candidates == ["A0"]
    assert report["bilinear_fit"].candidates == ["A4", "A0"] and "order dependence (A0)" in report["bilinear_fit"].why


def _mha_with_biases(seed=0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        mha = nn.MultiheadAttention(16, 2, batch_first=True)
        with torch.no_grad():
            mha.in_proj_bias.normal_()
            mha.out_proj.bias.normal_()
    return mha


def test_mha_keeps_its_projection_biases_and_the_query_bias_fails_a4():
    report = run_audit(_mha_with_biases())
    assert _failures(report) == {"bilinear_scores": ["A4"], "bilinear_fit": ["A4"]}, report.to_text()
    assert any("b_q.k_j" in n and "per-key content term" in n for n in report.notes)
    assert any("key projection bias" in n for n in report.notes)
    assert "notes" in report.to_dict() and "b_q.k_j" in report.to_text()
    default = run_audit(nn.MultiheadAttention(16, 2, batch_first=True))  # PyTorch initialises the biases to 0
    assert default.passed and not default.notes


def test_mha_with_only_a_key_bias_passes_the_key_bias_is_a_row_constant():
    mha = _mha_with_biases()
    with torch.no_grad():
        mha.in_proj_bias[:16].zero_()  # keep b_k and b_v only
    assert run_audit(mha).passed


def test_tolerances_follow_the_targets_dtype():
    def sdpa32(q, k, v):
        q, k, v = (t.float() for t in (q, k, v))
        return torch.nn.functional.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]

    assert tolerance(torch.float64) == 1e-9 and tolerance(torch.float32) == 1e-4
    report32 = run_audit(sdpa32)
    assert report32.passed and report32["linearity"].tolerance == 1e-4, report32.to_text()
    report64 = run_audit(bank.own_value_map)
    assert report64["linearity"].tolerance == 1e-9
    assert run_audit("spec:standard")["weights_sum_to_one"].tolerance == 1e-4  # float32 normalizers
    assert run_audit(bank.faint_output_gate)["scalar_relevance"].statistic < 1e-5  # caught only by a tight tol
    rounding = run_audit(bank.softmax_in_float32)  # float64 in and out, a float32 softmax inside
    assert rounding["weights_sum_to_one"].tolerance == 1e-4 and rounding.passed


def test_rank1_residual_is_exact_for_rank_one_and_positive_otherwise():
    g = torch.Generator().manual_seed(0)
    u, a = (
        torch.randn(3, 40, 1, generator=g, dtype=torch.float64),
        torch.randn(3, 1, 12, generator=g, dtype=torch.float64),
    )
    assert rank1_residual(u * a) < 1e-14
    noise = 1e-3 * torch.randn(3, 40, 12, generator=g, dtype=torch.float64)
    best = float((torch.linalg.svdvals(u * a + noise)[..., 1:].pow(2).sum() / (u * a + noise).pow(2).sum()).sqrt())
    assert best * (1 - 1e-12) <= rank1_residual(u * a + noise) <= 1.5 * best  # near the SVD's optimum (ULP slack)
    direction = leading_direction(u * a)
    assert torch.allclose(direction.abs(), (a / a.norm(dim=-1, keepdim=True)).squeeze(1).abs(), atol=1e-12)


def test_cli_markdown_and_json_carry_the_candidates():
    result = CliRunner().invoke(app, ["audit", "module:attribution_bank:query_output_gate", "--json"])
    assert result.exit_code == 0, result.output
    checks = {c["name"]: c for c in json.loads(result.output.strip().splitlines()[-1])["checks"]}
    assert checks["scalar_relevance"]["candidates"] == ["A1", "A2"] and checks["scalar_relevance"]["passed"] is False
    md = CliRunner().invoke(app, ["audit", "module:attribution_bank:query_output_gate", "--markdown"])
    assert md.exit_code == 0 and "## Departures" in md.output and "A1 or A2" in md.output
