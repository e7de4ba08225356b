"""The audit of one target: :func:`run_audit` runs every check and returns an :class:`AuditReport`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from axiomformer.audit.adapters import make_adapter
from axiomformer.audit.checks import AuditCheck, run_checks

NOT_ASSUMPTIONS = ("design", "numerics")
"""Tags of the checks that test no assumption of the derivation (``learned_values``, ``deterministic``,
``nan_isolation``): reported in their own section, outside ``AuditReport.passed``."""


@dataclass
class AuditReport:
    """The checks of one target. ``passed`` of a check: True, False, or None (does not apply)."""

    target: str
    checks: list[AuditCheck]
    notes: tuple[str, ...] = ()
    """What the adapter kept or changed and what it contributes (e.g. projection biases)."""

    def to_dict(self) -> dict[str, Any]:
        """``{"target": str, "checks": [{"name", "assumption", "passed", "statistic", "tolerance", "detail",
        "candidates"}]}``, plus ``"notes": [str]`` when the adapter has notes."""
        out: dict[str, Any] = {"target": self.target, "checks": [c.to_dict() for c in self.checks]}
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    def departures(self) -> list[str]:
        """One line per failed assumption check: its candidates, and why they cannot be told apart when several."""
        lines = []
        for c in self.checks:
            if c.passed is False and c.candidates:
                line = f"{c.name} ({c.assumption}): breaks {' or '.join(c.candidates)}"
                lines.append(line + (f" (cannot be told apart from outside: {c.why})" if c.why else ""))
        return lines

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def __getitem__(self, name: str) -> AuditCheck:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"no check {name!r}; the checks are: {', '.join(c.name for c in self.checks)}")

    @property
    def failed(self) -> list[str]:
        """Names of the checks that failed."""
        return [c.name for c in self.checks if c.passed is False]

    @property
    def passed(self) -> bool:
        """True iff no check of an assumption (A0..A5) or of causality failed; the design and numerics checks are
        reported apart (:data:`NOT_ASSUMPTIONS`)."""
        return not any(c.passed is False and c.assumption not in NOT_ASSUMPTIONS for c in self.checks)

    def __str__(self) -> str:
        return self.to_text()

    def to_text(self) -> str:
        mark = {True: "pass", False: "FAIL", None: "n/a "}
        lines = [f"audit of {self.target}"]
        for section, own in (("assumptions", False), ("not assumptions: design choices and numerics", True)):
            lines.append(f" {section}")
            for c in self.checks:
                if (c.assumption in NOT_ASSUMPTIONS) == own:
                    lines.append(
                        f"  {mark[c.passed]}  {c.assumption:<8} {c.name:<20} statistic {c.statistic:<10.3g} "
                        f"tol {c.tolerance:<7g} {c.detail}"
                    )
        lines += [" departures and the assumptions that produce them"] + [
            f"  {d}" for d in self.departures() or ["none: no assumption check failed"]
        ]
        lines += [" notes"] + [f"  {n}" for n in self.notes] if self.notes else []
        return "\n".join(lines)

    def to_markdown(self) -> str:
        """The report as Markdown: one table row per check (with its candidates), then the departures and notes."""
        mark = {True: "pass", False: "**FAIL**", None: "n/a"}
        out = [
            f"# Audit of `{self.target}`",
            "",
            "| check | tag | verdict | statistic | tolerance | candidates |",
            "|---|---|---|---|---|---|",
        ]
        out += [
            f"| `{c.name}` | {c.assumption} | {mark[c.passed]} | {c.statistic:.3g} | {c.tolerance:g} | "
            f"{' or '.join(c.candidates)} |"
            for c in self.checks
        ]
        departures = self.departures() or ["none: no assumption check failed"]
        out += ["", "## Departures", ""] + [f"- {d}" for d in departures]
        if self.notes:
            out += ["", "## Notes", ""] + [f"- {n}" for n in self.notes]
        return "\n".join(out) + "\n"


def run_audit(
    target: Any, *, causal: bool | None = None, dim: int | None = None, num_heads: int | None = None, seed: int = 0
) -> AuditReport:
    """Run every check on ``target``.

    Args:
        target: ``"spec:standard"``, ``"spec:<relax string>"``, ``"torch.nn.MultiheadAttention"``,
            ``"torch.nn.functional.scaled_dot_product_attention"``, ``"module:<import.path>:<attr>"``, an
            :class:`~axiomformer.Attention`, an :class:`~axiomformer.AttentionSpec`, an ``nn.MultiheadAttention``,
            a callable ``(q, k, v) -> out`` on (batch, seq, dim) tensors, or an :class:`Adapter`.
        causal: audit with a causal mask (the target must be causal or accept one); default: the target's own.
        dim, num_heads: width and heads for targets built from a string (default 16 and 2; a plain callable is
            one head unless ``num_heads`` says otherwise).
        seed: seed of the targets built here and of every input.

    Raises:
        ValueError: unknown target, or ``causal=True`` for a target that cannot apply a causal mask.
    """
    options: dict[str, Any] = {"seed": seed}
    if dim is not None:
        options["dim"] = dim
    if num_heads is not None:
        options["num_heads"] = num_heads
    adapter = make_adapter(target, **options)
    mode = bool(adapter.causal or causal)
    if causal and not (adapter.causal or adapter.supports_causal):
        raise ValueError(
            f"{adapter.name} cannot apply a causal mask (a callable needs a 'causal' or 'is_causal' "
            "keyword); declare an always-causal callable with FunctionAdapter(fn, causal=True)"
        )
    name = target if isinstance(target, str) else adapter.name
    return AuditReport(name, run_checks(adapter, mode, seed), tuple(adapter.notes))
