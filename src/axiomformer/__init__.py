"""axiomformer: Transformer attention derived from its assumptions — every assumption a switch you can flip, check
and measure.

>>> from axiomformer import AttentionSpec, Attention
>>> spec = AttentionSpec.standard(dim=64, num_heads=4, causal=True).relax("A5=sigmoid")
"""

from axiomformer.attention import Attention, KVCache
from axiomformer.spec import ALIASES, ASSUMPTIONS, AXES, AttentionSpec

__version__ = "0.1.0"

# The theory made executable: ``axiomformer.derive`` and ``axiomformer.audit`` are packages, their entry points are
# ``run_derivation`` and ``run_audit``.
from axiomformer.audit import AuditReport, run_audit  # noqa: E402
from axiomformer.derive import run_derivation  # noqa: E402

__all__ = ["Attention", "AttentionSpec", "KVCache", "AXES", "ALIASES", "ASSUMPTIONS", "__version__",
           "AuditReport", "run_audit", "run_derivation"]
