"""One module per axis of the design space: every choice and its formula lives in exactly one place.

``aggregator`` (A1), ``contribution`` (A2), ``value`` (A3), ``score`` (A4), ``normalizer`` (A5 and its scale),
``position`` (how order re-enters).
"""

from axiomformer.axes.aggregator import build_aggregator
from axiomformer.axes.contribution import build_contribution
from axiomformer.axes.normalizer import Normalizer, Scale, feature_map, normalize
from axiomformer.axes.position import Position, alibi_bias, alibi_slopes, apply_rope, sinusoidal_table
from axiomformer.axes.score import build_score
from axiomformer.axes.value import build_value

__all__ = [
    "build_aggregator", "build_contribution", "build_score", "build_value", "Normalizer", "Scale", "feature_map",
    "normalize", "Position", "alibi_bias", "alibi_slopes", "apply_rope", "sinusoidal_table",
]
