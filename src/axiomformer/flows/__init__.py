"""Attention as implicit multinomial regression (Source 2 of ``docs/SOURCES.md``; derivation in ``docs/flows.md``).

Hold a softmax classifier fixed and let the features flow down the cross-entropy: the flow is a cross-attention update
(linear logits) or a self-attention update (quadratic logits), and a splitting step of the flow is a Transformer block.
"""

from axiomformer.flows.data import DataError, Dataset, load_dataset, read_idx
from axiomformer.flows.experiment import FlowConfig, default_config, run_flow_experiment
from axiomformer.flows.inference_flow import label_free_flow, oracle_flow
from axiomformer.flows.integrators import INTEGRATORS, euler, integrate, lie_trotter, project_to_sphere, rk4, strang
from axiomformer.flows.loss import (
    MODELS,
    TRANSPOSED_TERMS,
    feature_gradient,
    flow_rhs,
    flow_terms,
    logits,
    multinomial_loss,
    theta_from_phi,
    vector_fields,
)
from axiomformer.flows.net import FlowNet
from axiomformer.flows.operators import cross_attention, quadratic_weights, reverse_attention, self_attention

__all__ = [
    "INTEGRATORS",
    "MODELS",
    "TRANSPOSED_TERMS",
    "DataError",
    "Dataset",
    "FlowConfig",
    "FlowNet",
    "cross_attention",
    "default_config",
    "euler",
    "feature_gradient",
    "flow_rhs",
    "flow_terms",
    "integrate",
    "label_free_flow",
    "lie_trotter",
    "load_dataset",
    "logits",
    "multinomial_loss",
    "oracle_flow",
    "project_to_sphere",
    "quadratic_weights",
    "read_idx",
    "reverse_attention",
    "rk4",
    "run_flow_experiment",
    "self_attention",
    "strang",
    "theta_from_phi",
    "vector_fields",
]
