"""axiomformer: Transformer attention derived from its assumptions — every assumption a switch you can flip, check
and measure.

>>> from axiomformer import AttentionSpec, Attention
>>> spec = AttentionSpec.standard(dim=64, num_heads=4, causal=True).relax("A5=sigmoid")
"""

from axiomformer.attention import Attention, KVCache
from axiomformer.spec import ALIASES, ASSUMPTIONS, AXES, AttentionSpec

__version__ = "0.1.0"

# The theory made executable. Imported eagerly: the functions share their names with their submodules, and an eager
# binding here is what keeps ``axiomformer.derive`` / ``axiomformer.audit`` the functions once the submodules load.
from axiomformer.audit import AuditReport, audit  # noqa: E402
from axiomformer.derive import derive  # noqa: E402

__all__ = ["Attention", "AttentionSpec", "KVCache", "AXES", "ALIASES", "ASSUMPTIONS", "__version__",
           "AuditReport", "audit", "derive"]
