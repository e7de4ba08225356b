"""Engines: how an attention problem is computed. :func:`attend` is the one entry; the router picks the engine.

Every engine follows one protocol over tensors (``engines/base.py``): ``engine(plan, problem, need_weights)`` with
``problem`` an :class:`AttentionProblem` of (batch, heads, seq, head_dim) tensors, and ``accepts(plan, kind)``. A spec
is resolved once per layer into a :class:`Plan` (``engines/plan.py``: its modules and the registry traits of its
choices); the router keys its bounded cache on the plan's route key and the :class:`ProblemKind` (device, dtype,
mask kind, shape class; never lengths or values): :func:`route_cache_size`, :func:`route_cache_clear`.

Engines are tried in ``ENGINE_ORDER``: ``flex`` (softmax with ALiBi on CUDA), ``sdpa`` (softmax with dot-product-like
scores), ``linear`` (the linear normalizer), ``elementwise`` (sigmoid, relu: closed-form backward), ``sparse``
(sparsemax, entmax15: sort-free thresholds), ``rowwise`` (normalizers with a closed-form backward, trait
``closed_vjp``, and logit soft-capping), ``chunked`` (everything, without an L x S matrix), ``reference`` (the
ground truth, everything, and the weights). ``prefer_engine("reference")`` (a context manager) or the environment
variable ``AXIOMFORMER_ENGINE=<name>`` prefers one engine for every layer that it can run; ``Attention(spec,
engine=<name>)`` or ``attend(..., engine=<name>)`` forces it and raises if it cannot run the problem.

**Adding a choice.** A new choice of an axis declares its traits in its registry entry (``axes/<axis>.py``, the
trait names and meanings are each registry's ``*_TRAITS``); engines accept by traits, so the choice runs on every
engine its traits earn without touching the engines:

- ``reference`` and ``chunked`` accept every choice (normalizer traits ``row``, ``elementwise`` or ``kernel`` say
  how ``normalize`` calls its ``impl``);
- ``sdpa`` (and ``flex`` on CUDA): a score with ``dot_form`` (and ``extra["dot_form"]``), a ``proportional``
  contribution, a normalizer with ``softmax`` (or ``softmax_in_eval`` at its default options, or ``sink`` with a
  ``dot_form_exact`` score);
- ``linear``: a normalizer with ``kernel`` and a ``proportional`` contribution;
- ``elementwise`` and ``sparse`` have hand-written kernels per choice and accept by name (their ``KINDS``), with a
  ``plain_dot`` score and a ``proportional`` contribution;
- ``rowwise``: a normalizer with ``closed_vjp`` (and ``extra["vjp"]``, its backward in closed form), a
  ``plain_dot`` score, a ``proportional`` contribution, any scale and ``softcap``.

``Plan`` resolves the traits once (``plan.normalizer_traits``, ``plan.score_traits``, ``plan.softmax_like(...)``,
``plan.options``, ...), so an engine's ``accepts`` reads attributes, never a registry. The equivalence matrix
(``tests/test_engine_matrix.py``) is generated from the registries: every choice on every engine that accepts it,
under every mask kind, forward and backward against the reference, with no test to write for a new choice.
"""

from __future__ import annotations

from axiomformer.engines.base import Engine, EngineBase
from axiomformer.engines.plan import Parts, Plan, ProblemKind, problem_kind
from axiomformer.engines.problem import AttentionProblem, causal_mask
from axiomformer.engines.router import (
    ENGINE_ORDER,
    ENGINES,
    ROUTE_CACHE_MAX,
    Attended,
    attend,
    default_parts,
    prefer_engine,
    register_engine,
    route,
    route_cache_clear,
    route_cache_size,
    unregister_engine,
)

__all__ = [
    "ENGINES",
    "ENGINE_ORDER",
    "ROUTE_CACHE_MAX",
    "Attended",
    "AttentionProblem",
    "Engine",
    "EngineBase",
    "Parts",
    "Plan",
    "ProblemKind",
    "attend",
    "causal_mask",
    "default_parts",
    "prefer_engine",
    "problem_kind",
    "register_engine",
    "route",
    "route_cache_clear",
    "route_cache_size",
    "unregister_engine",
]
