"""The derivation chain A0 -> A5: each step's property is violated before it and holds after it, a planted wrong step
fails at that step, a step that derives nothing is vacuous, and the end is PyTorch's SDPA."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from axiomformer.cli import app
from axiomformer.derive import (
    FINAL_TOL,
    PLANTS,
    SDPA_TOL,
    VACUOUS_FACTOR,
    GeneralForm,
    RowRelevance,
    run_chain,
    run_derivation,
    scale_argument,
    to_markdown,
    to_text,
    visible,
)
from axiomformer.derive import properties as prop

STEP_IDS = ["A0", "A1", "A2", "A3", "A4", "A5"]
STEP_FIELDS = {
    "id",
    "assumption",
    "property",
    "violation_before",
    "error_after",
    "tolerance",
    "passed",
    "vacuous",
    "label",
}


@pytest.fixture(scope="module")
def chain():
    return run_derivation()


def _x(d=8, seed=0):
    return torch.randn(2, 6, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_every_step_is_non_vacuous_and_passes_and_the_last_matches_sdpa(chain):
    assert [s.id for s in chain.steps] == STEP_IDS
    for s in chain.steps:
        assert s.violation_before > 1e-2 and not s.vacuous, s.id  # the module before clearly violates
        assert s.error_after <= s.tolerance and s.passed, s.id
    assert chain.final_vs_sdpa_max_abs_err <= SDPA_TOL
    assert chain.passed and chain.first_failed_step is None


def test_labels_follow_the_source(chain):
    assert {s.id: s.spec.label for s in chain.steps} == {
        "A0": "forced",
        "A1": "choice",
        "A2": "forced",
        "A3": "forced",
        "A4": "choice",
        "A5": "choice",
    }


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
    linear = nn.Linear(8, 8, bias=False).double()  # rho(z) = z + W z is linear: already additive
    chain = run_chain(_a0_module(p=linear), _x())
    a1 = chain.steps[1]
    assert a1.vacuous and not a1.passed and a1.violation_before < 1e-12
    assert chain.first_failed_step == "A1" and not chain.passed
    assert chain.to_dict()["steps"][1]["vacuous"] is True and chain.to_dict()["steps"][1]["passed"] is False


def test_an_already_proportional_contribution_makes_a2_vacuous_not_passed():
    chain = run_chain(_a0_module(g=None), _x())  # phi = u v(x) from the start
    a2 = chain.steps[2]
    assert a2.vacuous and not a2.passed and chain.first_failed_step == "A2"


def test_homogeneity_tells_u_times_v_from_u_squared_weighting():
    x = _x()
    module = GeneralForm.general(8).without("p").without("g")  # as at the A2 step: rho = identity
    assert prop.homogeneity(module, x, 0) < 1e-12
    module.plant = "A2"  # phi = u |u| v(x)
    assert prop.homogeneity(module, x, 0) > 0.5


def test_value_linearity_passes_the_identity_and_fails_tanh():
    x = _x()
    module = GeneralForm.general(8).without("p").without("g").without("n")  # as at the A3 step
    module.w_v = nn.Identity()
    assert prop.value_linearity(module, x, 0) < 1e-12
    module.plant = "A3"
    assert prop.value_linearity(module, x, 0) > 1e-2


def test_bilinear_fit_recovers_m_and_reports_a_reparametrization_of_dot():
    x = _x()
    module = GeneralForm.general(8).without("order").without("m")
    residual, rank, from_dot = prop.bilinear_fit(module, x, 0)
    expected_m = module.w_q.weight.T @ module.w_k.weight  # s = x_i^T W_q^T W_k x_j
    assert residual < 1e-12 and rank == 8 and from_dot > 0.1
    with torch.no_grad():
        module.w_q.weight.copy_(torch.eye(8))
        module.w_k.weight.copy_(2 * torch.eye(8))
    assert prop.bilinear_fit(module, x, 0)[2] < 1e-12  # 2 x_i . x_j: a dot product up to scale
    assert not torch.allclose(expected_m, 2 * torch.eye(8, dtype=torch.float64))
    module.plant = "A4"  # cosine: not bilinear
    assert prop.bilinear_fit(module, x, 0)[0] > 0.05


def test_entropy_spread_is_zero_with_the_scale_and_large_without():
    module = GeneralForm.general(8).with_softmax()
    assert prop.entropy_spread(module, 0) < 1e-9
    module.plant = "A5"
    assert prop.entropy_spread(module.with_softmax(), 0) > 0.1
    assert prop.entropy_spread(GeneralForm.general(8), 0) is None  # raw scores are no distribution


def test_softmax_endpoint_of_the_relevance_family_is_torch_softmax():
    d, s = 8, torch.randn(3, 5, 7, dtype=torch.float64)
    mask = visible(5, 7, causal=True)
    expected = torch.softmax((s / math.sqrt(d)).masked_fill(~mask, float("-inf")), dim=-1)
    assert torch.allclose(RowRelevance().softmax()(s, mask, d), expected, atol=1e-12)


def test_var_qk_grows_like_d_and_the_scale_keeps_entropy():
    sa = scale_argument(samples=4096)
    for d, var in zip(sa["dims"], sa["var_qk"]):
        assert abs(var / d - 1) < 0.1  # Var(q.k) = d for unit-variance entries
    assert max(sa["entropy_scaled"]) - min(sa["entropy_scaled"]) < 0.1
    unscaled = sa["entropy_unscaled"]
    assert unscaled[0] > unscaled[1] > unscaled[2] and unscaled[2] < 0.5 * sa["entropy_scaled"][2]


def test_derive_json_is_one_object_with_the_named_fields():
    result = CliRunner().invoke(app, ["derive", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output.strip().splitlines()[-1])
    assert set(data) == {
        "passed",
        "first_failed_step",
        "unlocalized",
        "reason",
        "final_vs_sdpa_rel_err",
        "final_tolerance",
        "final_vs_sdpa_max_abs_err",
        "scale_argument",
        "steps",
    }
    assert data["passed"] is True and data["first_failed_step"] is None and data["unlocalized"] is False
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


def test_headings_are_plain_text_so_the_table_of_contents_shows_no_raw_latex(chain):
    # The site's table of contents lists headings unrendered: math belongs in the body.
    headings = [line for line in to_markdown(chain).splitlines() if line.startswith("#")]
    assert len(headings) >= 9 and [h for h in headings if "$" in h or "\\" in h] == []
    committed = (Path(__file__).parent.parent / "docs" / "derive.md").read_text(encoding="utf-8")
    assert [h for h in committed.splitlines() if h.startswith("#")] == headings


# ------------------------------------------------------------------ departures placed in the composition (issue 23)
STRENGTH = 1e-6


class NonlinearPhiOutsideValue(GeneralForm):
    """phi = u (v(x) + 1e-6 v(x)^2): homogeneous in u, value() linear, but phi is not linear in x."""

    def contribution(self, ctx, u):
        return super().contribution(ctx, u) + STRENGTH * u.unsqueeze(-1) * self.value(ctx).unsqueeze(-3) ** 2


class NonlinearAfterAggregate(GeneralForm):
    """forward applies y + 1e-6 y^3 after aggregate(): rho is the identity in aggregate(), not in the map."""

    def forward(self, x, context=None, causal=False, relevance=None):
        y = super().forward(x, context, causal, relevance)
        return y + STRENGTH * y**3


class LateOrderBias(GeneralForm):
    """A score bias on key positions beyond 6 only, never removed: an order dependence the old 6-token probe missed."""

    def score(self, x, ctx):
        s = super().score(x, ctx)
        bias = torch.zeros(ctx.shape[-2], dtype=s.dtype)
        bias[6:] = STRENGTH * torch.arange(1, ctx.shape[-2] - 5, dtype=s.dtype)
        return s + bias


class RelevanceRescaledInForward(GeneralForm):
    """forward multiplies the relevances by 1 + 1e-6 before the contributions: no step's property sees it."""

    def forward(self, x, context=None, causal=False, relevance=None):
        if relevance is None:
            ctx = x if context is None else context
            mask = visible(x.shape[-2], ctx.shape[-2], causal)
            relevance = (1 + STRENGTH) * self.row_map(self.score(x, ctx), mask)
        return super().forward(x, context, causal, relevance)


def _general(cls, d=8, seed=0):
    base = GeneralForm.general(d, seed=seed)
    return cls(base.d, base.w_q, base.w_k, base.w_v, base.r, base.order, base.m, base.n, base.g, base.p)


@pytest.mark.parametrize(
    "cls,step", [(NonlinearPhiOutsideValue, "A3"), (NonlinearAfterAggregate, "A1"), (LateOrderBias, "A0")]
)
def test_a_departure_in_the_composition_fails_first_at_its_step_at_strength_1e_6(cls, step):
    chain = run_chain(_general(cls), _x())
    assert chain.first_failed_step == step and not chain.passed and not chain.unlocalized, to_text(chain)
    failed = next(s for s in chain.steps if s.id == step)
    assert failed.error_after > failed.tolerance and failed.error_after < 1e-3  # a faint departure


def test_an_order_dependence_beyond_the_tokens_of_x_is_seen_by_a0_not_a4():
    x = _x()  # 6 tokens
    module = _general(LateOrderBias).without("order")
    assert prop.set_symmetry(module, x, 0) > 1e-8  # the A0 probe is 3 d = 24 tokens long
    assert prop.fit_length(module) <= max(x.shape[1], 3 * module.d)


def test_a_failure_no_step_explains_is_unlocalized_with_its_reason():
    chain = run_chain(_general(RelevanceRescaledInForward), _x())
    assert all(s.passed for s in chain.steps) and chain.first_failed_step is None
    assert chain.unlocalized and not chain.passed and chain.final_vs_sdpa_rel_err > FINAL_TOL
    data = chain.to_dict()
    assert data["first_failed_step"] is None and data["unlocalized"] is True and "no step measures" in data["reason"]
    assert "UNLOCALIZED" in to_text(chain) and "Unlocalized failure" in to_markdown(chain)
    assert run_derivation().to_dict()["unlocalized"] is False and run_derivation().to_dict()["reason"] is None


def test_vacuity_is_relative_to_the_step_tolerance():
    chain = run_derivation()
    step = chain.steps[0]
    step.violation_before = VACUOUS_FACTOR * step.tolerance
    assert step.vacuous
    step.tolerance = step.violation_before / (2 * VACUOUS_FACTOR)
    assert not step.vacuous


def test_the_final_comparison_is_relative_in_float64(chain):
    assert chain.final_vs_sdpa_rel_err < 1e-12 and FINAL_TOL == 1e-9


def test_a_method_patched_onto_the_general_module_follows_it_down_the_chain():
    import types

    general = GeneralForm.general(8)
    base_forward = GeneralForm.forward

    def forward(self, x, context=None, causal=False, relevance=None):
        y = base_forward(self, x, context, causal, relevance)
        return y + STRENGTH * y**3

    general.forward = types.MethodType(forward, general)
    chain = run_chain(general, _x())
    assert chain.first_failed_step == "A1", to_text(chain)


class LengthTemperature(GeneralForm):
    """The row map scales each row's scores by 1 + 1e-6 log(number of visible keys) (a Scalable-Softmax-like
    temperature, placed in the row map itself, never removed)."""

    def row_map(self, s, mask, d=None):
        n = mask.sum(-1, keepdim=True).to(s.dtype).clamp_min(1)
        return super().row_map(s * (1 + STRENGTH * torch.log(n)), mask, d)


def test_a_temperature_that_varies_with_the_number_of_keys_fails_at_a5():
    chain = run_chain(_general(LengthTemperature), _x())
    assert chain.first_failed_step == "A5" and not chain.unlocalized, to_text(chain)
    assert prop.normalizer_properties(chain.steps[-1].after, _x(), 0)["length"] > 1e-9
    assert (
        prop.normalizer_properties(run_chain(GeneralForm.general(8, seed=0), _x()).steps[-1].after, _x(), 0)["length"]
        < 1e-12
    )


class LeakyRowMap(GeneralForm):
    """The row map gives 1e-6 of each row's weight to the softmax over every key, hidden ones included."""

    def row_map(self, s, mask, d=None):
        full = torch.ones_like(mask)
        return (1 - STRENGTH) * super().row_map(s, mask, d) + STRENGTH * super().row_map(s, full, d)


def test_a_leak_past_the_causal_mask_in_the_row_map_fails_at_a5():
    chain = run_chain(_general(LeakyRowMap), _x())
    assert chain.first_failed_step == "A5" and not chain.unlocalized, to_text(chain)
    assert prop.normalizer_properties(chain.steps[-1].after, _x(), 0)["masked"] > 1e-9
