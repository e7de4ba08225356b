"""Engines: how an attention problem is computed. :func:`attend` is the one entry; the router picks the engine.

Every engine follows one protocol over tensors (``engines/base.py``): ``engine(plan, problem, need_weights)`` with
``problem`` an :class:`AttentionProblem` of (batch, heads, seq, head_dim) tensors, and ``accepts(plan, kind)``. A spec
is resolved once per layer into a :class:`Plan` (``engines/plan.py``: its modules and the registry traits of its
choices); the router keys its bounded cache on the plan's route key and the :class:`ProblemKind` (device, dtype,
mask kind, shape class; never lengths or values): :func:`route_cache_size`, :func:`route_cache_clear`.

Engines are tried in ``ENGINE_ORDER``: ``flex`` (softmax with ALiBi on CUDA), ``sdpa`` (softmax with dot-product-like
scores), ``linear`` (the linear normalizer), ``elementwise`` (normalizers with the trait ``elementwise``: sigmoid,
relu), ``sparse`` (alpha-entmax of a fixed alpha, trait ``entmax``: sparsemax, entmax15; sort-free thresholds),
``rowwise`` (normalizers with a closed-form backward, trait ``closed_vjp``, and logit soft-capping), ``chunked``
(everything, without an L x S matrix), ``recurrent`` and ``chunked_transport`` (transports), ``selected`` (a
selection, trait ``blocks`` or ``tokens``, weighed by a softmax: the kept keys gathered per query, never a mask over
every key), ``reference`` (the ground truth, everything, and the weights); an engine another package registers goes
before the one its ``before`` names (default: the reference). ``prefer_engine("reference")`` (a context manager) or the environment variable
``AXIOMFORMER_ENGINE=<name>`` prefers one engine for every layer that it can run; ``Attention(spec, engine=<name>)``
or ``attend(..., engine=<name>)`` forces it and raises if it cannot run the problem.

**Engines read traits.** Each engine declares what it computes as a :class:`Computes` over the traits of the plan's
choices (``engine.computes``, ``engines/base.py``; :func:`describe_engines` lists them), and refines it in
``accepts(plan, kind)`` with the problem's kind; the router asks every registered engine, in order, both
(:func:`engine_accepts`). No engine names a choice, so a new choice runs on every engine its traits earn:

- ``reference`` and ``chunked`` accept every choice (normalizer traits ``row``, ``elementwise`` or ``kernel`` say
  how ``normalize`` calls its ``impl``; ``chunked`` declines ``columns``);
- ``sdpa`` (and ``flex`` on CUDA): a score with ``dot_form`` (and ``extra["dot_form"]``), a ``proportional``
  contribution, a normalizer with ``softmax`` (or ``softmax_in_eval`` at its default options, or ``sink`` with a
  ``dot_form_exact`` score);
- ``linear``: a normalizer with ``kernel`` and a ``proportional`` contribution;
- ``elementwise``: a normalizer with ``elementwise`` (its in-place forms and closed-form derivative when it has
  ``closed_grad``, else autograd of its ``impl`` per chunk); ``sparse``: a normalizer with ``entmax`` whose
  ``extra["alpha"]`` is one of ``sparse.ALPHAS`` (2, 1.5); both with a ``plain_dot`` score and a ``proportional``
  contribution;
- ``rowwise``: a normalizer with ``closed_vjp`` (and ``extra["vjp"]``, its backward in closed form), a
  ``plain_dot`` score, a ``proportional`` contribution, any scale and ``softcap``;
- ``selected``: a selection with ``blocks`` or ``tokens`` (``axes/select.py``), a normalizer with ``softmax``, a
  ``plain_dot`` score and a ``proportional`` contribution; it is the one engine with ``selects = True``, so it alone
  is routed a problem whose selection is left lazy (``ProblemKind.select``); for every other engine the router folds
  the selection into the mask first.

**Adding an engine.** An object following the protocol of ``engines/base.py`` (``EngineBase`` gives the defaults)
with its ``computes``, registered with :func:`register_engine` (here) or, from another package, through the
entry-point group ``axiomformer.engines`` (``engines/plugins.py``): the router asks it, ``Attention(spec,
engine=<name>)`` forces it, and the equivalence matrix checks it.

``Plan`` resolves the traits once (``plan.normalizer_traits``, ``plan.score_traits``, ``plan.softmax_like(...)``,
``plan.options``, ...), so ``computes`` and ``accepts`` read attributes, never a registry. The equivalence matrix
(``tests/test_engine_matrix.py``) is generated from the registries and ``ENGINE_ORDER``: every choice on every
registered engine that accepts it, plug-ins included, under every mask kind, forward and backward against the
reference, with no test to write for a new choice or engine.
"""

from __future__ import annotations

from axiomformer.engines.base import Computes, Engine, EngineBase
from axiomformer.engines.plan import Parts, Plan, ProblemKind, problem_kind
from axiomformer.engines.problem import AttentionProblem, causal_mask
from axiomformer.engines.router import (
    ENGINE_ORDER,
    ENGINES,
    ROUTE_CACHE_MAX,
    Attended,
    attend,
    default_parts,
    describe_engines,
    engine_accepts,
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
    "Computes",
    "Engine",
    "EngineBase",
    "Parts",
    "Plan",
    "ProblemKind",
    "attend",
    "causal_mask",
    "default_parts",
    "describe_engines",
    "engine_accepts",
    "prefer_engine",
    "problem_kind",
    "register_engine",
    "route",
    "route_cache_clear",
    "route_cache_size",
    "unregister_engine",
]
