"""The chain A0 -> A5 as data: one step per assumption, each with the property it states and the check of it.

Source: Somani, "A Minimal Route to Transformer Attention" (``docs/SOURCES.md``). A step narrows the module before it
(:mod:`axiomformer.derive.modules`) to the module after it. Its check measures the assumption's *property*
(:mod:`axiomformer.derive.properties`) on both: the module before must violate it clearly (otherwise the step is
**vacuous**: nothing was derived), the module after must satisfy it within the tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from axiomformer.derive import properties as prop
from axiomformer.derive.modules import DTYPE, PLANTS, GeneralForm, StandardForm, sdpa_reference

TOLERANCE = 1e-9
"""Largest relative violation of a property that counts as holding (float64 round-off is near 1e-15)."""
VACUOUS_FACTOR = 100.0
"""A step whose module before it violates the property by no more than this many times the step's tolerance is
vacuous: nothing was derived **(our choice: a clear separation from the tolerance)**."""
VACUOUS_BELOW = VACUOUS_FACTOR * TOLERANCE
"""The vacuity threshold of a step with the default tolerance."""
FINAL_TOL = 1e-9
"""Tolerance of the final comparison, relative, in float64: the A5 module against PyTorch's SDPA on the same
projections (a composition error of 1e-6 fails it)."""
SDPA_TOL = 1e-5
"""Tolerance (max abs) of axiomformer's ``Attention`` against SDPA: its reference engine normalizes in float32."""
SCALE_DIMS = (16, 64, 256)


@dataclass(frozen=True)
class StepDef:
    """One step of the derivation: the assumption, the property it states, how the module narrows, and the check.

    ``label`` is ``"forced"`` when the source calls the step forced by the constraints (permutation symmetry,
    separability, linear projections), ``"choice"`` when it calls it a choice (identity rho, dot product, softmax).
    """

    id: str
    assumption: str
    property: str
    label: str
    formula: str
    latex: str
    narrow: Callable[[GeneralForm], GeneralForm]
    measure: Callable[[GeneralForm, Tensor, int], float]
    limits: str = ""
    """What the check cannot tell apart."""


STEPS: tuple[StepDef, ...] = (
    StepDef(
        "A0",
        "symmetry: once relevances are known, the output does not depend on the order of the visible "
        "tokens (Deep Sets, Zaheer et al. 2017, Thm 2)",
        "set symmetry: permuting the visible tokens (keys and values together) leaves every y_i unchanged, "
        "causal and not, on the composed map, over at least as many tokens as the A4 fit",
        "forced",
        "y_i = rho( sum_j phi(x_j, u_ij) ), j over the visible tokens",
        r"y_i = \rho\Big(\sum_{j} \phi(x_j, u_{ij})\Big)",
        lambda m: m.without("order"),
        prop.set_symmetry,
        "an order dependence that the probe's random tokens and permutations do not excite, or one beyond the "
        "probe's length (3 d tokens, as long as the A4 fit, so the fit cannot see an order dependence A0 missed)",
    ),
    StepDef(
        "A1",
        "simplicity: the aggregator rho is the identity",
        "additivity: with the relevances frozen, the output for a token set is the sum of the outputs for two "
        "disjoint parts of it, on the aggregator and on the composed forward (any linear rho passes: it folds "
        "into W_v)",
        "choice",
        "y_i = sum_j phi(x_j, u_ij)",
        r"y_i = \sum_j \phi(x_j, u_{ij})",
        lambda m: m.without("p"),
        prop.additivity,
        "a linear rho from the identity: a linear rho folds into W_v, so it lies inside A1's class (a chain whose "
        "rho is already linear reports A1 vacuous); a rho that is linear but depends on the query (an output "
        "gate) is additive too, so no step sees it and the final comparison reports it as unlocalized",
    ),
    StepDef(
        "A2",
        "relevance-contribution proportionality: scaling u_ij by k scales token j's contribution by k",
        "homogeneity of the contribution map: phi(x, k u) = k phi(x, u) for k in {2, 1/2, -1, 3}, on the "
        "contribution and on the composed forward with relevances k u",
        "forced",
        "y_i = sum_j u_ij v(x_j)",
        r"y_i = \sum_j u_{ij}\, v(x_j)",
        lambda m: m.without("g"),
        prop.homogeneity,
        "u v(x) from u h(x) for any other h: homogeneity says nothing about how the contribution depends on the "
        "token (that is A3)",
    ),
    StepDef(
        "A3",
        "linear change of coordinates: v(x) = W_v x",
        "linearity of the value map: second differences v(a+b) - v(a) - v(b) + v(0) and v(2a) - 2v(a) + v(0) "
        "vanish, for value() and for the composed forward as a function of the tokens at frozen relevances "
        "(phi linear in x at fixed u)",
        "forced",
        "y_i = sum_j u_ij W_v x_j",
        r"y_i = \sum_j u_{ij}\, W_v x_j",
        lambda m: m.without("n"),
        prop.value_linearity,
        "an affine value map W_v x + b from a linear one (second differences vanish for both)",
    ),
    StepDef(
        "A4",
        "efficient parallel scoring: relevance from the score s_ij = q_i . k_j, q = W_q x, k = W_k x "
        "(parallel scoring is forced; the dot product among parallel scores is a choice)",
        "bilinear score: s(x_i, x_j) = x_i^T M x_j with rank(M) <= head_dim; M fitted by least squares, "
        "relative residual (plus 1 if the rank is too high)",
        "choice",
        "y_i = sum_j r(s_i)_j W_v x_j, s_ij = (W_q x_i) . (W_k x_j)",
        r"y_i = \sum_j r(s_{i\cdot})_j\, W_v x_j,\quad s_{ij} = (W_q x_i)^\top (W_k x_j)",
        lambda m: m.without("m"),
        prop.bilinear_violation,
        "the dot product from any other bilinear form x^T M x' (q^T W k is a reparametrization: W folds into "
        "W_k); with one head, head_dim = d and the rank bound cannot bind; measured on score() only, so a "
        "score departure in how forward uses it is left to the final comparison (unlocalized)",
    ),
    StepDef(
        "A5",
        "normalization: relevance is relative (shift-invariant), sums to one, is differentiable, and the "
        "1/sqrt(d) keeps the logits O(1)",
        "normalizer: shift invariance r(s + c) = r(s), ratio independence, ratios that do not depend on the "
        "number of keys (a temperature that varies with it fails), hidden keys get weight 0 (causality of the row "
        "map), rows sum to one, non-negative, and "
        "the attention entropy stays put as head_dim grows with Var(q.k) = d (the 1/sqrt(d) argument)",
        "choice",
        "y_i = sum_j softmax_j(q_i . k_j / sqrt(d)) W_v x_j",
        r"y_i = \sum_j \mathrm{softmax}_j\!\Big(\frac{q_i^\top k_j}{\sqrt{d}}\Big)\, W_v x_j",
        lambda m: m.with_softmax(),
        prop.normalizer_violation,
        "a temperature c / sqrt(d) from 1 / sqrt(d): the entropy stays put for any constant c; measured on the "
        "row map r only, so a departure in how forward applies it is left to the final comparison "
        "(unlocalized)",
    ),
)


@dataclass
class Step:
    """A step as run: its definition, the modules before and after it, and the measured property."""

    spec: StepDef
    before: GeneralForm
    after: GeneralForm
    violation_before: float
    error_after: float
    tolerance: float = TOLERANCE

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def vacuous(self) -> bool:
        """The module before the step already has the property (a violation within ``VACUOUS_FACTOR`` times the
        step's tolerance): the step derives nothing."""
        return not self.violation_before > VACUOUS_FACTOR * self.tolerance

    @property
    def passed(self) -> bool:
        """The property holds after the step and the step is not vacuous."""
        return self.error_after <= self.tolerance and not self.vacuous

    def to_dict(self) -> dict[str, Any]:
        """``{"id", "assumption", "property", "violation_before", "error_after", "tolerance", "passed", "vacuous",
        "label"}``; a non-finite measurement is reported as 1e30."""
        finite = lambda v: v if math.isfinite(v) else 1e30
        return {
            "id": self.id,
            "assumption": self.spec.assumption,
            "property": self.spec.property,
            "violation_before": finite(self.violation_before),
            "error_after": finite(self.error_after),
            "tolerance": self.tolerance,
            "passed": self.passed,
            "vacuous": self.vacuous,
            "label": self.spec.label,
        }


@dataclass
class Chain:
    """The derivation as run: ``steps`` A0..A5, the final comparisons with PyTorch's SDPA, the 1/sqrt(d) argument.

    ``final_vs_sdpa_rel_err``: the A5 module against SDPA on the same projections, relative, float64 (tolerance
    :data:`FINAL_TOL`); ``final_vs_sdpa_max_abs_err``: the larger max abs error of the A5 module and of axiomformer's
    ``Attention`` with the same weights against SDPA (tolerance :data:`SDPA_TOL`).
    """

    steps: list[Step]
    final_vs_sdpa_max_abs_err: float
    scale_argument: dict[str, Any] = field(default_factory=dict)
    plant: str | None = None
    final_vs_sdpa_rel_err: float = 0.0

    @property
    def first_failed_step(self) -> str | None:
        """Id of the first step that did not pass (vacuous counts as not passed), or None."""
        return next((s.id for s in self.steps if not s.passed), None)

    @property
    def final_passed(self) -> bool:
        return self.final_vs_sdpa_rel_err <= FINAL_TOL and self.final_vs_sdpa_max_abs_err <= SDPA_TOL

    @property
    def unlocalized(self) -> bool:
        """Every step passed but the final comparison failed: a departure that no step's property explains."""
        return self.first_failed_step is None and not self.final_passed

    @property
    def reason(self) -> str | None:
        """Why the chain failed without a failed step (None unless :attr:`unlocalized`)."""
        if not self.unlocalized:
            return None
        return (
            f"every step's property holds, but the A5 module differs from scaled_dot_product_attention on the "
            f"same projections by {self.final_vs_sdpa_rel_err:.3g} (relative; tolerance {FINAL_TOL:g}) and "
            f"{self.final_vs_sdpa_max_abs_err:.3g} (max abs, with axiomformer's Attention; tolerance "
            f"{SDPA_TOL:g}): the departure is in something no step measures (the composition is measured "
            "for A0-A3 only; the score and the row map as named parts)"
        )

    @property
    def passed(self) -> bool:
        return self.first_failed_step is None and self.final_passed

    def to_dict(self) -> dict[str, Any]:
        """``{"passed", "first_failed_step", "unlocalized", "reason", "final_vs_sdpa_rel_err", "final_tolerance",
        "final_vs_sdpa_max_abs_err", "scale_argument", "steps": [...]}`` (plus ``"plant"`` when a wrong step was
        planted). ``"first_failed_step": null`` with ``"unlocalized": true`` is a failure no step explains."""
        rel_err = self.final_vs_sdpa_rel_err if math.isfinite(self.final_vs_sdpa_rel_err) else 1e30
        out = {
            "passed": self.passed,
            "first_failed_step": self.first_failed_step,
            "unlocalized": self.unlocalized,
            "reason": self.reason,
            "final_vs_sdpa_rel_err": rel_err,
            "final_tolerance": FINAL_TOL,
            "final_vs_sdpa_max_abs_err": self.final_vs_sdpa_max_abs_err,
            "scale_argument": self.scale_argument,
            "steps": [s.to_dict() for s in self.steps],
        }
        if self.plant is not None:
            out["plant"] = self.plant
        return out


def scale_argument(
    dims: tuple[int, ...] = SCALE_DIMS, n_keys: int = 64, samples: int = 4096, seed: int = 0
) -> dict[str, Any]:
    """The 1/sqrt(d) argument on random vectors (Somani A5; Vaswani et al. 2017, footnote 4).

    For q, k with i.i.d. unit-variance entries, Var(q.k) = d. With ``n_keys`` keys per query, the mean attention
    entropy (nats) of softmax(q.k / sqrt(d)) stays put as d grows, while that of softmax(q.k) collapses toward 0.

    Returns:
        ``{"dims", "var_qk", "entropy_scaled", "entropy_unscaled", "max_entropy", "n_keys", "samples"}``.
    """
    g = torch.Generator().manual_seed(seed)
    out: dict[str, Any] = {
        "dims": list(dims),
        "var_qk": [],
        "entropy_scaled": [],
        "entropy_unscaled": [],
        "max_entropy": math.log(n_keys),
        "n_keys": n_keys,
        "samples": samples,
    }

    def entropy(logits: Tensor) -> float:
        p = torch.softmax(logits, dim=-1)
        return float(-(p * torch.log_softmax(logits, dim=-1)).sum(-1).mean())

    for d in dims:
        q = torch.randn(samples, d, generator=g, dtype=DTYPE)
        k = torch.randn(samples, d, generator=g, dtype=DTYPE)
        out["var_qk"].append(float((q * k).sum(-1).var()))
        s = q[: samples // n_keys] @ k[:n_keys].T
        out["entropy_scaled"].append(entropy(s / math.sqrt(d)))
        out["entropy_unscaled"].append(entropy(s))
    return out


def run_chain(general: GeneralForm, x: Tensor, seed: int = 0, plant: str | None = None) -> Chain:
    """Run :data:`STEPS` from ``general`` (the module before A0) on tokens ``x`` (batch, seq, d), float64."""
    steps: list[Step] = []
    module = general
    for i, spec in enumerate(STEPS):
        after = spec.narrow(module)
        steps.append(Step(spec, module, after, spec.measure(module, x, seed + i), spec.measure(after, x, seed + i)))
        module = after
    errs, rels = [], []
    standard = StandardForm(module)
    with torch.no_grad():
        for causal in (False, True):
            ref = sdpa_reference(module, x, causal)
            got = module(x, causal=causal)
            rels.append(prop.rel(got, ref))
            errs.append(float((got - ref).abs().max()))
            errs.append(float((standard(x, causal=causal) - ref).abs().max()))
    final = max(errs) if all(math.isfinite(e) for e in errs) else 1e30
    return Chain(steps, final, scale_argument(seed=seed), plant, max(rels))


def run_derivation(
    seed: int = 0, plant: str | None = None, d: int = 8, hidden: int = 16, batch: int = 2, seq: int = 6
) -> Chain:
    """Build the chain A0 -> A5 and check every step's property on seeded float64 tokens x (batch, seq, d).

    Args:
        seed: seed of the modules, the tokens and each check's random draws.
        plant: ``"A0"`` .. ``"A5"`` puts the standard wrong version of that step into every module
            (:data:`~axiomformer.derive.modules.PLANTS`); the chain must then fail first at that step.

    Returns:
        A :class:`Chain`: ``passed`` iff every step passes (not vacuous, property within tolerance after it), the A5
        module matches ``torch.nn.functional.scaled_dot_product_attention`` on the same projections within 1e-9
        relative (float64), and it and axiomformer's standard ``Attention`` with its weights match it within 1e-5
        max abs, causal and not. A failure that no step explains is ``unlocalized``.

    Raises:
        ValueError: unknown ``plant``, naming the valid ones.
    """
    if plant is not None and plant not in PLANTS:
        raise ValueError(f"unknown plant {plant!r}; choose one of: {', '.join(PLANTS)}")
    x = torch.randn(batch, seq, d, generator=torch.Generator().manual_seed(seed), dtype=DTYPE)
    return run_chain(GeneralForm.general(d, hidden, seed, plant), x, seed, plant)
