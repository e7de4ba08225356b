"""``run_audit(target)``: which assumptions of the derivation does an attention implementation satisfy?

Each check probes the map (queries, keys, values) -> outputs on seeded inputs (see :mod:`axiomformer.audit.checks`
and ``docs/audit.md``); targets become such maps through adapters (:mod:`axiomformer.audit.adapters`).

>>> report = run_audit("spec:score=cosine")
>>> report.failed
['bilinear_scores', 'bilinear_fit', 'scale_entropy']
"""

from __future__ import annotations

from axiomformer.audit.adapters import (
    Adapter,
    AttentionAdapter,
    FunctionAdapter,
    MultiheadAttentionAdapter,
    make_adapter,
    register_adapter,
)
from axiomformer.audit.checks import AuditCheck
from axiomformer.audit.matrix import relaxation_matrix
from axiomformer.audit.practice import PracticeReport, run_practice
from axiomformer.audit.report import NOT_ASSUMPTIONS, AuditReport, run_audit

__all__ = [
    "NOT_ASSUMPTIONS",
    "Adapter",
    "AttentionAdapter",
    "AuditCheck",
    "AuditReport",
    "FunctionAdapter",
    "MultiheadAttentionAdapter",
    "PracticeReport",
    "make_adapter",
    "register_adapter",
    "relaxation_matrix",
    "run_audit",
    "run_practice",
]
