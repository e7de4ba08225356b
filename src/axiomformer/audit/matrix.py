"""The relaxation-by-check matrix: every single-axis relaxation of AttentionSpec, audited.

``relaxation_matrix()`` runs :func:`axiomformer.audit.audit` on ``spec:standard``, on every non-standard choice of every
axis (``feature_map`` excluded: it only matters with ``normalizer=linear``), and on reference targets (a causal
spec, PyTorch's SDPA and MultiheadAttention, causal and not, and a tanh RNN). ``matrix_markdown()`` renders it as the
table in ``docs/audit_matrix.md``.

Axis -> assumption tag: aggregator A1, contribution A2, value A3, score A4, normalizer and scale A5, position A0
(positions break set symmetry).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from axiomformer.audit.adapters import FunctionAdapter
from axiomformer.audit.report import NOT_ASSUMPTIONS
from axiomformer.audit.report import run_audit as audit
from axiomformer.runtime import seeded
from axiomformer.spec import AXES, required_fields

AXIS_TAG = {
    "aggregator": "A1",
    "contribution": "A2",
    "value": "A3",
    "score": "A4",
    "normalizer": "A5",
    "scale": "A5",
    "position": "A0",
    "transport": "A4",
    "select": "A4",
}
"""Which assumption each axis relaxes (a transport relaxes A0 too: its rows list both among the candidates)."""

EXCEPTIONS: dict[str, str] = {
    "value=identity": "the identity is a linear change of coordinates, inside A3's class; what it gives up is a "
    "*learned* value map, a design choice (`learned_values`, outside the assumption columns)",
    "score=bilinear": "q^T W k is bilinear, inside A4's class: W folds into the key projection, so it is a "
    "reparametrization of the dot product (`bilinear_fit` reports M != c I)",
    "normalizer=gumbel_softmax": "in eval mode Gumbel-softmax is the softmax; its difference is sampling in training, "
    "a design choice (`deterministic`, outside the assumption columns)",
}
"""Relaxations that fail no check of their own axis, and why: they stay inside that assumption's function class."""


@dataclass
class MatrixRow:
    """One audited target: ``label`` (e.g. ``score=cosine``), its axis and tag (None for references), the report."""

    label: str
    axis: str | None
    tag: str | None
    report: Any

    @property
    def results(self) -> dict[str, bool | None]:
        return {c.name: c.passed for c in self.report.checks}

    @property
    def own_axis_failed(self) -> bool | None:
        """A failed check tests the row's assumption, or lists it among its ``candidates`` (the departures that
        assumption alone produces at the audited interface)."""
        if self.tag is None:
            return None
        return any(
            c.passed is False and (c.assumption == self.tag or self.tag in c.candidates) for c in self.report.checks
        )


def tanh_rnn(dim: int = 16, seed: int = 0) -> FunctionAdapter:
    """A tanh RNN (``torch.nn.RNN``) as a target: out = the hidden states of the RNN run over the values.

    It ignores q and k and reads the values in order, so it is the A0 relaxation the derivation starts from.
    """
    with seeded(seed):
        rnn = nn.RNN(dim, dim, nonlinearity="tanh", batch_first=True).double()

    def run(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return rnn(v)[0]

    return FunctionAdapter(run, "tanh RNN (torch.nn.RNN over the values)", dim=dim, has_positions=None)


def single_axis_relaxations() -> list[tuple[str, str]]:
    """(axis, relax string) for every non-standard choice of every axis except ``feature_map``."""
    return [(axis, f"{axis}={choice}") for axis, choices in AXES.items() if axis in AXIS_TAG for choice in choices[1:]]


def relaxation_matrix(dim: int = 16, num_heads: int = 2, seed: int = 0, references: bool = True) -> list[MatrixRow]:
    """Audit ``spec:standard``, every single-axis relaxation and (optionally) the reference targets."""
    rows = [MatrixRow("standard", None, None, audit("spec:standard", dim=dim, num_heads=num_heads, seed=seed))]
    for axis, relax in single_axis_relaxations():
        # A choice defined only under a causal mask is audited with one (required_fields); its label stays.
        target = ",".join([relax] + [f"{k}={v}" for k, v in required_fields(*relax.split("=", 1)).items()])
        rows.append(
            MatrixRow(relax, axis, AXIS_TAG[axis], audit(f"spec:{target}", dim=dim, num_heads=num_heads, seed=seed))
        )
    if references:
        refs: list[tuple[str, Any, dict[str, Any]]] = [
            ("standard, causal", "spec:causal=true", {}),
            ("torch SDPA", "torch.nn.functional.scaled_dot_product_attention", {}),
            ("torch SDPA, causal", "torch.nn.functional.scaled_dot_product_attention", {"causal": True}),
            ("torch MHA", "torch.nn.MultiheadAttention", {}),
            ("torch MHA, causal", "torch.nn.MultiheadAttention", {"causal": True}),
            ("tanh RNN", tanh_rnn(dim, seed), {}),
        ]
        for label, target, kw in refs:
            rows.append(MatrixRow(label, None, None, audit(target, dim=dim, num_heads=num_heads, seed=seed, **kw)))
    return rows


def blamed(report: Any) -> str:
    """The candidates of a report's failed assumption checks, distinct groups in check order: "A4; A5 or A1"."""
    groups: list[str] = []
    for c in report.checks:
        group = " or ".join(c.candidates)
        if c.passed is False and group and group not in groups:
            groups.append(group)
    return "; ".join(groups)


def matrix_markdown(rows: list[MatrixRow]) -> str:
    """The matrix as a Markdown table: pass, **FAIL** or n/a per check, whether the row's own axis failed, and the
    candidates of its failures (``A5 or A1``: the failure cannot tell these apart)."""
    every = [(c.name, c.assumption) for c in rows[0].report.checks]
    checks = [c for c in every if c[1] not in NOT_ASSUMPTIONS]
    others = [c for c in every if c[1] in NOT_ASSUMPTIONS]
    mark = {True: "pass", False: "**FAIL**", None: "n/a"}
    head = (
        "| target | axis tag | " + " | ".join(f"{name} ({tag})" for name, tag in checks) + " | own axis fails | "
        "candidates | " + " | ".join(f"{name} ({tag})" for name, tag in others) + " |"
    )
    lines = [head, "|" + "---|" * (len(every) + 4)]
    for row in rows:
        own = {None: "", True: "yes", False: "no (see note)"}[row.own_axis_failed]
        cells = " | ".join(mark[row.results[name]] for name, _ in checks)
        rest = " | ".join(mark[row.results[name]] for name, _ in others)
        lines.append(f"| {row.label} | {row.tag or ''} | {cells} | {own} | {blamed(row.report)} | {rest} |")
    notes = [
        "*candidates*: for each failed assumption check, the assumptions whose violation alone produces that "
        "departure at the (q, k, v) -> out interface; `A5 or A1` means the audit cannot tell them apart from "
        "outside (docs/audit.md says why for each pair). Columns after *candidates* test no assumption "
        "(design choices and numerics).",
        "",
    ]
    notes += [f"- `{k}`: {v}." for k, v in EXCEPTIONS.items()]
    return "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n"
