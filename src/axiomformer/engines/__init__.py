"""Engines: how an attention problem is computed. :func:`attend` is the one entry; the router picks the engine.

Every engine follows one protocol (``engines/base.py``): a function of tensors on (batch, heads, seq, head_dim).
Engines are tried in ``ENGINE_ORDER``: ``flex`` (softmax with ALiBi on CUDA), ``sdpa`` (softmax with dot-product-like
scores), ``linear`` (the linear normalizer), ``chunked`` (everything, without an L x S matrix), ``reference`` (the
ground truth, everything, and the weights). ``prefer_engine("reference")`` (a context manager) or the environment
variable ``AXIOMFORMER_ENGINE=<name>`` prefers one engine for every layer that it can run; ``Attention(spec,
engine=<name>)`` or ``attend(..., engine=<name>)`` forces it and raises if it cannot run the problem.
"""

from __future__ import annotations

from axiomformer.engines.base import Engine, EngineBase, Parts
from axiomformer.engines.problem import AttentionProblem, causal_mask
from axiomformer.engines.router import (
    ENGINE_ORDER, ENGINES, Attended, attend, default_parts, prefer_engine, register_engine, route,
)

__all__ = ["AttentionProblem", "Attended", "ENGINES", "ENGINE_ORDER", "Engine", "EngineBase", "Parts", "attend",
           "causal_mask", "default_parts", "prefer_engine", "register_engine", "route"]
