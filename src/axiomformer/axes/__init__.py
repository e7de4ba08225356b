"""One module per axis of the design space: every choice and its formula lives in exactly one place.

``aggregator`` (A1), ``contribution`` (A2), ``value`` (A3), ``score`` (A4), ``normalizer`` (A5), ``scale`` (A5's
temperature), ``position`` (how order re-enters); ``plugins`` loads choices other packages register.
"""

from axiomformer.axes.aggregator import build_aggregator
from axiomformer.axes.contribution import build_contribution
from axiomformer.axes.normalizer import Normalizer, feature_map, normalize
from axiomformer.axes.position import Position, alibi_bias, alibi_slopes, apply_rope, sinusoidal_table
from axiomformer.axes.scale import Scale
from axiomformer.axes.score import build_score
from axiomformer.axes.value import build_value

__all__ = [
    "Normalizer",
    "Position",
    "Scale",
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "build_aggregator",
    "build_contribution",
    "build_score",
    "build_value",
    "feature_map",
    "normalize",
    "sinusoidal_table",
]
