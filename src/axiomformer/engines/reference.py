"""The reference engine: the full (q_len x k_len) score matrix in plain tensor ops.

It runs every spec, is the ground truth every other engine is tested against (forward and backward), returns the
weights that produced its output, and is differentiable to every order.
Formula: y_i = sum_j phi(v_j, u_ij), u_ij = normalize_j(scale * score(q_i, k_j) + bias_ij), masked j dropped.
Scores, scale, bias and weights are computed in max(input dtype, float32) (``axiomformer.precision``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from axiomformer.axes.normalizer import normalize
from axiomformer.axes.transport import transported_scores
from axiomformer.engines.base import EngineBase
from axiomformer.engines.plan import Plan
from axiomformer.engines.problem import AttentionProblem
from axiomformer.precision import compute_dtype


def call_in(module: nn.Module, args: tuple[Tensor, ...], dtype: torch.dtype) -> Tensor:
    """``module(*args)`` computed in ``dtype``: the tensors and the module's parameters are cast (the parameters
    through ``torch.func.functional_call``, so their gradients flow back to the module in its own dtype)."""
    args = tuple(a.to(dtype) for a in args)
    params = dict(module.named_parameters())
    if all(p.dtype == dtype for p in params.values()):
        return module(*args)
    return torch.func.functional_call(module, {name: p.to(dtype) for name, p in params.items()}, args)


def contribute(contribution: nn.Module, weights: Tensor, v: Tensor) -> Tensor:
    """The contribution module's output in max(weights, v dtype, float32): a float16 value path accumulates its
    weighted sum in float32, as the fused kernels do; the caller casts back to the value dtype."""
    return call_in(contribution, (weights, v), compute_dtype(weights.dtype, v.dtype))


def scaled_query(q: Tensor, scale: float | Tensor) -> Tensor:
    """``scale * q``: the temperature of a kernel normalizer enters through the query, phi(scale q).phi(k), so that
    f(q, scale=s) == f(s q, scale=1) on every engine and a learned scale gets its gradient (the default scale of a
    kernel normalizer is 1: ``axes.scale.constant_scale``)."""
    return q if not isinstance(scale, Tensor) and scale == 1.0 else q * scale


def scaled_scores(
    parts: Plan,
    q: Tensor,
    k: Tensor,
    scale: float | Tensor,
    bias: Tensor | None,
    transport: Any = None,
    q_offset: int = 0,
) -> Tensor:
    """``softcap(scale * score(q, k)) + bias`` (or, for the linear normalizer, the kernel phi(scale q).phi(k)
    exp(bias)) in max(input dtype, float32) (``axiomformer.precision``): float16 inputs are upcast before the product,
    float64 is never lowered. For a ``halves`` normalizer the two halves' scores stacked, (2, batch, heads, q_len,
    k_len). ``scale`` is a float or broadcastable to (batch, heads, q_len, 1). With ``transport`` (the gates of a plan
    with a transport) the transported scores s_ij = gamma_j k_j^T T_{i<-j} q_i, query i at key position
    ``q_offset + i``."""
    dtype = compute_dtype(q.dtype, k.dtype)
    scale = scale.to(dtype) if isinstance(scale, Tensor) else scale
    if "kernel" in parts.normalizer_traits:
        # Katharopoulos et al. 2020, eq. 6: the kernel phi(q).phi(k) takes the place of exp(scaled score); a float
        # bias b multiplies it by exp(b), as it would multiply exp(s) inside a softmax.
        scores = torch.matmul(
            parts.feature_map(scaled_query(q.to(dtype), scale)), parts.feature_map(k.to(dtype)).transpose(-2, -1)
        )
        return scores if bias is None else scores * bias.to(dtype).exp()
    if "halves" in parts.normalizer_traits:
        # Differential attention: the two halves of each head scored apart, stacked (2, batch, heads, q_len, k_len).
        h = q.shape[-1] // 2
        scores = (
            torch.stack(
                [
                    call_in(parts.score_fn, (q[..., :h], k[..., :h]), dtype),
                    call_in(parts.score_fn, (q[..., h:], k[..., h:]), dtype),
                ]
            )
            * scale
        )
    elif transport is not None:
        # The transported relevance (axes/transport.py), its quadratic parallel form.
        scores = transported_scores(q.to(dtype), k.to(dtype), transport.cast(dtype), q_offset) * scale
    else:
        scores = call_in(parts.score_fn, (q, k), dtype) * scale
    cap = parts.spec.softcap
    if cap:
        scores = cap * torch.tanh(scores / cap)  # Gemma 2's soft-capping, before any bias
    return scores if bias is None else scores + bias.to(dtype)


def attention_weights(parts: Plan, problem: AttentionProblem, k: Tensor | None = None) -> Tensor:
    """Attention weights (batch, heads, q_len, k_len) in max(input dtype, float32), before dropout."""
    k = problem.k if k is None else k
    scores = scaled_scores(parts, problem.q, k, problem.scale, problem.full_bias(), problem.transport, problem.q_offset)
    return normalize(
        scores,
        problem.full_mask(),
        parts.normalizer_choice,
        training=problem.training,
        params=parts.normalizer_params(),
    )


class ReferenceEngine(EngineBase):
    """Runs every spec by materializing the scores; the ground truth."""

    name = "reference"
    returns_weights = True
    double_backward = True
    transports = True

    def __call__(
        self, plan: Plan, problem: AttentionProblem, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        weights = attention_weights(plan, problem)
        dropped = F.dropout(weights, p=problem.dropout_p) if problem.training and problem.dropout_p > 0 else weights
        out = contribute(plan.contribution, dropped, problem.v).to(problem.v.dtype)
        return out, (weights if need_weights else None)
