"""The derivation chain A0 -> A5: each step's property is violated before it and holds after it, a planted wrong step
fails at that step, a step that derives nothing is vacuous, and the end is PyTorch's SDPA."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from axiomformer.cli import app
from axiomformer.derive import (
    PLANTS, SDPA_TOL, GeneralForm, RowRelevance, run_chain, run_derivation, scale_argument, to_markdown, visible,
)
from axiomformer.derive import properties as prop

STEP_IDS = ["A0", "A1", "A2", "A3", "A4", "A5"]
STEP_FIELDS = {"id", "assumption", "property", "violation_before", "error_after", "tolerance", "passed", "vacuous",
               "label"}


@pytest.fixture(scope="module")
def chain():
    return run_derivation()


def _x(d=8, seed=0):
    return torch.randn(2, 6, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_every_step_is_non_vacuous_and_passes_and_the_last_matches_sdpa(chain):
    assert [s.id for s in chain.steps] == STEP_IDS
    for s in chain.steps:
        assert s.violation_before > 1e-2 and not s.vacuous, s.id            # the module before clearly violates
        assert s.error_after <= s.tolerance and s.passed, s.id
    assert chain.final_vs_sdpa_max_abs_err <= SDPA_TOL
    assert chain.passed and chain.first_failed_step is None


def test_labels_follow_the_source(chain):
    assert {s.id: s.spec.label for s in chain.steps} == {
        "A0": "forced", "A1": "choice", "A2": "forced", "A3": "forced", "A4": "choice", "A5": "choice"}


@pytest.mark.parametrize("step", STEP_IDS)
def test_a_planted_wrong_step_fails_first_at_that_step(step):
    chain = run_derivation(plant=step)
    assert chain.first_failed_step == step and not chain.passed
    planted = next(s for s in chain.steps if s.id == step)
    assert planted.error_after > 1e-2 and not planted.vacuous


def _a0_module(**replace) -> GeneralForm:
    general = GeneralForm.general(8)
    for name, part in replace.items():
        setattr(general, name, part)
    return general


def test_a_linear_rho_makes_a1_vacuous_not_passed():
    linear = nn.Linear(8, 8, bias=False).double()                   # rho(z) = z + W z is linear: already additive
    chain = run_chain(_a0_module(p=linear), _x())
    a1 = chain.steps[1]
    assert a1.vacuous and not a1.passed and a1.violation_before < 1e-12
    assert chain.first_failed_step == "A1" and not chain.passed
    assert chain.to_dict()["steps"][1]["vacuous"] is True and chain.to_dict()["steps"][1]["passed"] is False


def test_an_already_proportional_contribution_makes_a2_vacuous_not_passed():
    chain = run_chain(_a0_module(g=None), _x())                    # phi = u v(x) from the start
    a2 = chain.steps[2]
    assert a2.vacuous and not a2.passed and chain.first_failed_step == "A2"


def test_homogeneity_tells_u_times_v_from_u_squared_weighting():
    x = _x()
    module = GeneralForm.general(8).without("g")
    assert prop.homogeneity(module, x, 0) < 1e-12
    module.plant = "A2"                                            # phi = u |u| v(x)
    assert prop.homogeneity(module, x, 0) > 0.5


def test_value_linearity_passes_the_identity_and_fails_tanh():
    x = _x()
    module = GeneralForm.general(8).without("n")
    module.w_v = nn.Identity()
    assert prop.value_linearity(module, x, 0) < 1e-12
    module.plant = "A3"
    assert prop.value_linearity(module, x, 0) > 1e-2


def test_bilinear_fit_recovers_m_and_reports_a_reparametrization_of_dot():
    x = _x()
    module = GeneralForm.general(8).without("order").without("m")
    residual, rank, from_dot = prop.bilinear_fit(module, x, 0)
    expected_m = module.w_q.weight.T @ module.w_k.weight             # s = x_i^T W_q^T W_k x_j
    assert residual < 1e-12 and rank == 8 and from_dot > 0.1
    with torch.no_grad():
        module.w_q.weight.copy_(torch.eye(8))
        module.w_k.weight.copy_(2 * torch.eye(8))
    assert prop.bilinear_fit(module, x, 0)[2] < 1e-12                 # 2 x_i . x_j: a dot product up to scale
    assert not torch.allclose(expected_m, 2 * torch.eye(8, dtype=torch.float64))
    module.plant = "A4"                                             # cosine: not bilinear
    assert prop.bilinear_fit(module, x, 0)[0] > 0.05


def test_entropy_spread_is_zero_with_the_scale_and_large_without():
    module = GeneralForm.general(8).with_softmax()
    assert prop.entropy_spread(module, 0) < 1e-9
    module.plant = "A5"
    assert prop.entropy_spread(module.with_softmax(), 0) > 0.1
    assert prop.entropy_spread(GeneralForm.general(8), 0) is None   # raw scores are no distribution


def test_softmax_endpoint_of_the_relevance_family_is_torch_softmax():
    d, s = 8, torch.randn(3, 5, 7, dtype=torch.float64)
    mask = visible(5, 7, causal=True)
    expected = torch.softmax((s / math.sqrt(d)).masked_fill(~mask, float("-inf")), dim=-1)
    assert torch.allclose(RowRelevance().softmax()(s, mask, d), expected, atol=1e-12)


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
    assert set(data) == {"passed", "first_failed_step", "final_vs_sdpa_max_abs_err", "scale_argument", "steps"}
    assert data["passed"] is True and data["first_failed_step"] is None
    assert [s["id"] for s in data["steps"]] == STEP_IDS
    for s in data["steps"]:
        assert set(s) == STEP_FIELDS and s["passed"] is True and s["vacuous"] is False
        assert s["label"] in ("forced", "choice")
    assert len(data["scale_argument"]["var_qk"]) == 3


def test_derive_plant_flag_fails_at_the_planted_step_and_rejects_unknown_steps():
    result = CliRunner().invoke(app, ["derive", "--json", "--plant", "A3"])
    assert result.exit_code == 1
    data = json.loads(result.output.strip().splitlines()[-1])
    assert data["first_failed_step"] == "A3" and data["plant"] == "A3" and data["passed"] is False
    bad = CliRunner().invoke(app, ["derive", "--plant", "A9"])
    assert bad.exit_code == 2 and "A0, A1" in bad.output and "Traceback" not in bad.output
    with pytest.raises(ValueError, match="choose one of"):
        run_derivation(plant="A9")
    assert set(PLANTS) == set(STEP_IDS)


def test_markdown_has_latex_labels_and_every_step(chain, tmp_path):
    text = to_markdown(chain)
    assert text.count("$$") >= 14 and all(f"## {i} (" in text for i in STEP_IDS)
    assert "(forced)" in text and "(choice)" in text
    out = tmp_path / "derive.md"
    result = CliRunner().invoke(app, ["derive", "--format", "md", "--out", str(out)])
    assert result.exit_code == 0 and out.read_text().startswith("# The derivation")
    bad = CliRunner().invoke(app, ["derive", "--format", "pdf"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output
