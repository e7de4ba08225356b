"""axiomformer: Transformer attention derived from its assumptions — every assumption a switch you can flip, check
and measure.

>>> from axiomformer import AttentionSpec, Attention
>>> spec = AttentionSpec.standard(dim=64, num_heads=4, causal=True).relax("A5=sigmoid")

The names below are imported on first use (PEP 562), so that ``import axiomformer`` and the command line's ``--help``
do not import PyTorch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

_LAZY = {
    "Attention": "axiomformer.attention",
    "KVCache": "axiomformer.attention",
    "ALIASES": "axiomformer.spec",
    "ASSUMPTIONS": "axiomformer.spec",
    "AXES": "axiomformer.spec",
    "AttentionSpec": "axiomformer.spec",
    # The theory made executable: ``axiomformer.derive`` and ``axiomformer.audit`` are packages, their entry points
    # are ``run_derivation`` and ``run_audit``.
    "AuditReport": "axiomformer.audit",
    "run_audit": "axiomformer.audit",
    "run_derivation": "axiomformer.derive",
}

__all__ = [
    "ALIASES",
    "ASSUMPTIONS",
    "AXES",
    "Attention",
    "AttentionSpec",
    "AuditReport",
    "KVCache",
    "__version__",
    "run_audit",
    "run_derivation",
]

if TYPE_CHECKING:
    from axiomformer.attention import Attention, KVCache
    from axiomformer.audit import AuditReport, run_audit
    from axiomformer.derive import run_derivation
    from axiomformer.spec import ALIASES, ASSUMPTIONS, AXES, AttentionSpec


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'axiomformer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
