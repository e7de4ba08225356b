"""Engines: how an attention problem is executed. ``select_engine`` routes from which assumptions hold.

Each engine has a ``name``, ``accepts(module, problem) -> bool`` and
``run(module, problem, need_weights) -> (out, weights | None)`` with out (batch, heads, q_len, head_dim_v).
Engines are tried in ``ENGINE_ORDER``: ``flex`` (softmax with ALiBi on CUDA), ``sdpa`` (softmax with dot-product-like
scores), ``linear`` (the linear normalizer), ``chunked`` (everything, without an L x S matrix), ``reference`` (the
ground truth, everything). ``AXIOMFORMER_ENGINE=reference`` routes every layer to the reference. The environment variable
``AXIOMFORMER_ENGINE=<name>`` prefers one engine for every layer that it can run (``reference`` runs all);
``Attention(spec, engine=<name>)`` forces it and raises if it cannot run the spec.
"""

from __future__ import annotations

import os

from axiomformer.engines.problem import AttentionProblem, causal_mask
from axiomformer.engines.reference import ReferenceEngine
from axiomformer.engines.chunked import ChunkedEngine
from axiomformer.engines.flex import FlexEngine
from axiomformer.engines.linear import LinearEngine
from axiomformer.engines.sdpa import SDPAEngine

ENGINES: dict[str, object] = {}
ENGINE_ORDER: list[str] = []


def register_engine(engine, *, before: str | None = "reference") -> None:
    """Add an engine to the registry, tried before ``before`` (default: just before the reference)."""
    ENGINES[engine.name] = engine
    if engine.name in ENGINE_ORDER:
        ENGINE_ORDER.remove(engine.name)
    if before in ENGINE_ORDER:
        ENGINE_ORDER.insert(ENGINE_ORDER.index(before), engine.name)
    else:
        ENGINE_ORDER.append(engine.name)


register_engine(ReferenceEngine(), before=None)
register_engine(SDPAEngine())
register_engine(FlexEngine(), before="sdpa")
register_engine(LinearEngine())
register_engine(ChunkedEngine())


def select_engine(module, problem: AttentionProblem, forced: str | None = None):
    """The engine that runs ``problem`` for ``module``.

    Args:
        forced: an engine name, or ``"auto"``/``None`` to route. ``AXIOMFORMER_ENGINE`` in the environment
            overrides ``"auto"``.

    Raises:
        ValueError: unknown engine name (naming the registered ones), or a forced engine that cannot run this spec.
    """
    explicit = forced not in (None, "auto")
    name = forced if explicit else os.environ.get("AXIOMFORMER_ENGINE", "auto")
    if name and name != "auto":
        if name not in ENGINES:
            raise ValueError(f"unknown engine {name!r}; choose one of: auto, {', '.join(ENGINE_ORDER)}")
        engine = ENGINES[name]
        if engine.accepts(module, problem):
            return engine
        if explicit:
            raise ValueError(f"engine {name!r} cannot run {module.spec.variant}; use 'auto' or 'reference'")
        # The environment variable is a preference for every layer; layers the engine cannot run are routed.
    for candidate in ENGINE_ORDER:
        engine = ENGINES[candidate]
        # An engine may accept a problem yet know that a later one runs it better (e.g. a problem small enough for
        # a single chunk); only automatic routing honours that.
        worthwhile = getattr(engine, "worthwhile", None)
        if engine.accepts(module, problem) and (worthwhile is None or worthwhile(module, problem)):
            return engine
    return ENGINES["reference"]


__all__ = ["AttentionProblem", "ENGINES", "ENGINE_ORDER", "causal_mask", "register_engine", "select_engine"]
