"""The derivation A0 -> A5 of scaled dot-product attention, run step by step, each step's property checked.

Source: Somani, "A Minimal Route to Transformer Attention" (assumptions A0-A5, restated in ``docs/SOURCES.md``).
The chain is data (:data:`~axiomformer.derive.chain.STEPS`): one step per assumption with the property it states,
measured on the module before the step (violated) and after it (holds); see ``docs/derive.md``.

>>> chain = run_derivation()
>>> [s.id for s in chain.steps], chain.passed
(['A0', 'A1', 'A2', 'A3', 'A4', 'A5'], True)
>>> run_derivation(plant="A2").first_failed_step
'A2'
"""

from axiomformer.derive.chain import (
    FINAL_TOL,
    SDPA_TOL,
    STEPS,
    TOLERANCE,
    VACUOUS_BELOW,
    VACUOUS_FACTOR,
    Chain,
    Step,
    StepDef,
    run_chain,
    run_derivation,
    scale_argument,
)
from axiomformer.derive.modules import PLANTS, GeneralForm, RowRelevance, StandardForm, visible
from axiomformer.derive.render import to_markdown, to_text

__all__ = [
    "FINAL_TOL",
    "PLANTS",
    "SDPA_TOL",
    "STEPS",
    "TOLERANCE",
    "VACUOUS_BELOW",
    "VACUOUS_FACTOR",
    "Chain",
    "GeneralForm",
    "RowRelevance",
    "StandardForm",
    "Step",
    "StepDef",
    "run_chain",
    "run_derivation",
    "scale_argument",
    "to_markdown",
    "to_text",
    "visible",
]
