"""The derivation chain A0 -> A5: every step checked, the end is PyTorch's SDPA, and the 1/sqrt(d) argument."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from typer.testing import CliRunner

from axiomformer.cli import app
from axiomformer.derive import SDPA_TOL, derive, scale_argument, to_markdown
from axiomformer.derive_modules import GeneralForm, RowRelevance, visible


@pytest.fixture(scope="module")
def chain():
    return derive()


def test_every_step_passes_and_the_last_matches_sdpa(chain):
    assert [s.id for s in chain.steps] == ["A0", "A1", "A2", "A3", "A4", "A5"]
    assert all(s.check.passed for s in chain.steps)
    assert chain.final_vs_sdpa_max_abs_err <= 1e-5
    assert chain.passed


def test_each_step_needs_its_assumption(chain):
    # Before the parameters are set, the previous module computes something else: the checks are not vacuous.
    for step in chain.steps[1:]:
        assert step.check.gap_without_assumption > 1e-2, step.id


def test_steps_share_parameters_down_the_chain(chain):
    a0, a4 = chain.steps[0].module, chain.steps[4].module
    assert a4.w_q is a0.w_q and a4.w_v is a0.w_v and a4.m is None and a4.rho is None


def test_softmax_endpoint_of_the_relevance_family_is_torch_softmax():
    d, s = 8, torch.randn(3, 5, 7, dtype=torch.float64)
    mask = visible(5, 7, causal=True)
    r = RowRelevance()
    r.impose_softmax(d)
    expected = torch.softmax((s / math.sqrt(d)).masked_fill(~mask, float("-inf")), dim=-1)
    assert torch.allclose(r(s, mask), expected, atol=1e-12)


def test_a5_step_fails_with_the_wrong_temperature(chain):
    a4, a5 = chain.steps[4].module, chain.steps[5].module
    wrong = copy.deepcopy(a4)
    wrong.r.impose_softmax(1)                                       # tau = 1 instead of 1/sqrt(d)
    x = torch.randn(2, 6, a4.d, dtype=torch.float64)
    with torch.no_grad():
        assert float((wrong(x) - a5(x)).abs().max()) > 1e-2


def test_a0_check_detects_an_order_dependent_map():
    from axiomformer.derive import _symmetry_err

    general = GeneralForm.general(4)

    def ordered(x, ctx, causal=False):                              # adds a running sum: order matters
        return general(x, ctx.cumsum(1), causal=causal)

    x = torch.randn(2, 5, 4, dtype=torch.float64)
    assert _symmetry_err(ordered, x, 0) > 1e-3
    assert _symmetry_err(general, x, 0) < 1e-10


def test_var_qk_grows_like_d_and_the_scale_keeps_entropy():
    sa = scale_argument(samples=4096)
    for d, var in zip(sa["dims"], sa["var_qk"]):
        assert abs(var / d - 1) < 0.1                               # Var(q.k) = d for unit-variance entries
    assert max(sa["entropy_scaled"]) - min(sa["entropy_scaled"]) < 0.1
    unscaled = sa["entropy_unscaled"]
    assert unscaled[0] > unscaled[1] > unscaled[2] and unscaled[2] < 0.5 * sa["entropy_scaled"][2]


def test_derive_json_is_one_object_with_the_named_fields():
    result = CliRunner().invoke(app, ["derive", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output.strip().splitlines()[-1])
    assert set(data) >= {"steps", "final_vs_sdpa_max_abs_err"}
    assert [s["id"] for s in data["steps"]] == ["A0", "A1", "A2", "A3", "A4", "A5"]
    for s in data["steps"]:
        assert set(s) == {"id", "assumption", "formula", "check"}
        assert set(s["check"]) == {"description", "max_abs_err", "passed"} and s["check"]["passed"] is True
    assert data["final_vs_sdpa_max_abs_err"] <= SDPA_TOL
    assert len(data["scale_argument"]["var_qk"]) == 3


def test_markdown_has_latex_and_every_step(chain, tmp_path):
    text = to_markdown(chain)
    assert text.count("$$") >= 14 and all(f"## {i}" in text for i in ("A0", "A1", "A2", "A3", "A4", "A5"))
    out = tmp_path / "derive.md"
    result = CliRunner().invoke(app, ["derive", "--format", "md", "--out", str(out)])
    assert result.exit_code == 0 and out.read_text().startswith("# The derivation")
    bad = CliRunner().invoke(app, ["derive", "--format", "pdf"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output
