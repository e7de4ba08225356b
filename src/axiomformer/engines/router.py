"""``attend``: the one entry to the engines, and the router that picks one.

``Attention``, ``bench``, ``surgery`` and the transformers integration all call :func:`attend`. The router decides
once per *plan and kind of problem* -- the plan's route key (choice names and default-ness of their options, see
``engines/plan.py``), the :class:`~axiomformer.engines.plan.ProblemKind` (device, dtype, mask kind, bias, ALiBi form,
causal alignment, mode, shape class) and the request (engine, need_weights, double_backward) -- never on lengths or
on values such as a temperature, and caches the decision in a bounded cache (``ROUTE_CACHE_MAX`` entries, the oldest
dropped first; :func:`route_cache_size`, :func:`route_cache_clear`). Every fallback lives here:

- ``need_weights=True`` goes to an engine that returns the weights its output was computed from (``returns_weights``:
  the reference engine), whatever engine is requested, so ``out == contribution(weights, v)`` holds on every route,
  Gumbel noise and dropout included (the weights are a (q_len x k_len) matrix then anyway);
- ``double_backward=True`` goes to an engine whose every kernel is differentiable to every order
  (``double_backward``); the default engines are too on CPU (see ``engines/autograd.py``), flex is not;
- an engine that turns out unavailable at run time (``EngineUnavailable``, e.g. a kernel that fails to compile)
  is skipped for that kind from then on;
- otherwise the first engine in ``ENGINE_ORDER`` that accepts the problem and finds it worthwhile.

While ``torch.compile`` traces, the decision is made afresh (it is folded into the graph) and the cache is not touched.
It also applies the policy of ``engines/problem.py`` (non-finite keys, empty rows) around the engine, so engines see
clean keys and values.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings
from collections.abc import Iterator
from typing import Any, NamedTuple

from torch import Tensor

from axiomformer.axes.plugins import PluginWarning
from axiomformer.axes.scale import constant_scale
from axiomformer.engines.base import EVERY_CHOICE, Engine
from axiomformer.engines.chunked import ChunkedEngine
from axiomformer.engines.elementwise import ElementwiseEngine
from axiomformer.engines.flex import EngineUnavailable, FlexEngine
from axiomformer.engines.linear import LinearEngine
from axiomformer.engines.plan import Plan, ProblemKind, problem_kind
from axiomformer.engines.plugins import load_engines
from axiomformer.engines.problem import AttentionProblem, clean_nonfinite, poison_rows, zero_rows_without_keys
from axiomformer.engines.recurrent import RecurrentEngine
from axiomformer.engines.reference import ReferenceEngine
from axiomformer.engines.rowwise import RowwiseEngine
from axiomformer.engines.sdpa import SDPAEngine
from axiomformer.engines.selected import SelectedEngine
from axiomformer.engines.sparse import SparseEngine
from axiomformer.engines.transport_chunked import ChunkedTransportEngine
from axiomformer.engines.validate import as_problem_4d, check_per_head, check_window, empty_output, problem_shape
from axiomformer.spec import AttentionSpec

ENGINES: dict[str, Any] = {}
ENGINE_ORDER: list[str] = []
ROUTE_CACHE_MAX = 256
"""Routing decisions kept; the oldest is dropped first. Keys hold no lengths or values, so a model uses a handful."""
_ROUTES: dict[tuple, str] = {}
_WARNED: set[str] = set()
"""Plug-in engines already warned about (one warning each per process)."""
_PREFERRED: list[str] = []
"""The stack of :func:`prefer_engine` blocks (a plain list: ``torch.compile`` traces it, not a ``ContextVar``)."""


def route_cache_size() -> int:
    """Number of routing decisions cached (at most ``ROUTE_CACHE_MAX``)."""
    return len(_ROUTES)


def route_cache_clear() -> None:
    """Forget every cached routing decision (the next call of each kind decides afresh)."""
    _ROUTES.clear()


def register_engine(engine: Engine, *, before: str | None = "reference") -> None:
    """Add an engine (see ``engines/base.py`` for the protocol) to the registry, tried before ``before`` (default:
    just before the reference); an engine of the same name is replaced in place."""
    ENGINES[engine.name] = engine
    if engine.name not in ENGINE_ORDER:
        if before in ENGINE_ORDER:
            ENGINE_ORDER.insert(ENGINE_ORDER.index(before), engine.name)
        else:
            ENGINE_ORDER.append(engine.name)
    _ROUTES.clear()


def unregister_engine(name: str) -> None:
    """Remove an engine from the registry (the reference engine stays)."""
    if name == "reference":
        raise ValueError("the reference engine cannot be removed")
    ENGINES.pop(name, None)
    ENGINE_ORIGINS.pop(name, None)
    if name in ENGINE_ORDER:
        ENGINE_ORDER.remove(name)
    _ROUTES.clear()


register_engine(ReferenceEngine(), before=None)
register_engine(SDPAEngine())
register_engine(FlexEngine(), before="sdpa")
register_engine(LinearEngine())
register_engine(ElementwiseEngine())
register_engine(SparseEngine())
register_engine(RowwiseEngine())
register_engine(ChunkedEngine())
register_engine(RecurrentEngine())
register_engine(ChunkedTransportEngine())
register_engine(SelectedEngine())
ENGINE_ORIGINS: dict[str, str] = dict.fromkeys(ENGINE_ORDER, "axiomformer")
"""Who registered each engine of the entry points' loading: ``"axiomformer"`` or a distribution's name."""
PLUGIN_ENGINES: list[str] = load_engines(register_engine, ENGINE_ORIGINS, unregister=unregister_engine)
"""Names of the engines other packages registered through the entry-point group ``axiomformer.engines``
(``engines/plugins.py``)."""


def describe_engines() -> list[tuple[str, str]]:
    """``(name, what it computes)`` of every registered engine in routing order: its ``computes`` declaration over
    the traits of the plan's choices (``engines/base.py``) in words, e.g. ``("elementwise", "normalizer:
    elementwise, none of ...; score: plain_dot; contribution: proportional")``."""
    return [(name, getattr(ENGINES[name], "computes", EVERY_CHOICE).describe()) for name in ENGINE_ORDER]


@contextlib.contextmanager
def prefer_engine(name: str) -> Iterator[None]:
    """Within the block, every layer that ``name`` can run uses it (``"reference"`` runs all); like the environment
    variable ``AXIOMFORMER_ENGINE=<name>``, scoped and without touching the environment."""
    if name != "auto" and name not in ENGINES:
        raise ValueError(f"unknown engine {name!r}; choose one of: auto, {', '.join(ENGINE_ORDER)}")
    _PREFERRED.append(name)
    try:
        yield
    finally:
        _PREFERRED.pop()


def _usable(engine: Engine, kind: ProblemKind, need_weights: bool, double_backward: bool) -> bool:
    return (engine.returns_weights or not need_weights) and (not double_backward or engine.twice_differentiable(kind))


def engine_accepts(engine: Engine, plan: Plan, kind: ProblemKind) -> bool:
    """Whether the traits of the plan's choices meet ``engine.computes`` (``engines/base.py``), a plan with a
    transport only for an engine that computes transports, a lazy selection (``kind.select``) only for one that
    computes selections, and ``engine.accepts``."""
    return (
        (getattr(engine, "transports", False) or not plan.transported)
        and (getattr(engine, "selects", False) or not kind.select)
        and getattr(engine, "computes", EVERY_CHOICE).admits(plan)
        and engine.accepts(plan, kind)
    )


def route(
    parts: Plan,
    problem: AttentionProblem,
    engine: str = "auto",
    *,
    need_weights: bool = False,
    double_backward: bool = False,
) -> str:
    """The name of the engine that runs ``problem`` (cached per plan and kind of problem).

    Args:
        engine: an engine name to force, or ``"auto"``; with ``"auto"``, :func:`prefer_engine` or the environment
            variable ``AXIOMFORMER_ENGINE`` state a preference that layers the engine cannot run ignore.

    Raises:
        ValueError: unknown engine name (naming the registered ones), or a forced engine that cannot run this problem
            (with the reason: the spec or ``double_backward``). ``need_weights=True`` overrides a forced engine.
    """
    if need_weights:
        engine = "auto"
    requested, explicit = _requested(engine)
    kind = problem_kind(parts, problem)
    if kind.compiling:
        return _decide(parts, kind, requested, explicit, need_weights, double_backward)
    # The engines' identities too: replacing a registry entry directly (a test's monkeypatch) starts afresh.
    key = (parts.key, kind, requested, explicit, need_weights, double_backward, tuple(map(id, ENGINES.values())))
    name = _ROUTES.get(key)
    if name is None:
        name = _decide(parts, kind, requested, explicit, need_weights, double_backward)
        if len(_ROUTES) >= ROUTE_CACHE_MAX:
            del _ROUTES[next(iter(_ROUTES))]  # the oldest decision
        _ROUTES[key] = name
    return name


def _requested(engine: str) -> tuple[str, bool]:
    """(the engine asked for: ``engine``, else :func:`prefer_engine`'s or ``AXIOMFORMER_ENGINE``'s, else "auto";
    whether ``engine`` forced it).

    Raises:
        ValueError: an unknown engine name (naming the registered ones).
    """
    explicit = engine not in (None, "auto")
    preferred = _PREFERRED[-1] if _PREFERRED else os.environ.get("AXIOMFORMER_ENGINE", "auto")
    requested = engine if explicit else preferred
    if requested != "auto" and requested not in ENGINES:
        raise ValueError(f"unknown engine {requested!r}; choose one of: auto, {', '.join(ENGINE_ORDER)}")
    return requested, explicit


def _decide(
    plan: Plan, kind: ProblemKind, requested: str, explicit: bool, need_weights: bool, double_backward: bool
) -> str:
    if requested != "auto":
        chosen = ENGINES[requested]
        if engine_accepts(chosen, plan, kind) and _usable(chosen, kind, need_weights, double_backward):
            return requested
        if explicit:
            if not engine_accepts(chosen, plan, kind):
                raise ValueError(
                    f"engine {requested!r} cannot run {plan.spec.variant} on this problem "
                    f"({kind.device}, {kind.dtype}, mask={kind.mask}, alibi={kind.alibi}, "
                    f"window={kind.window}); use 'auto' or 'reference'"
                )
            raise ValueError(
                f"engine {requested!r} is not differentiable twice (double_backward=True); use 'auto' or 'reference'"
            )
    for name in ENGINE_ORDER:
        if _takes(name, plan, kind, need_weights, double_backward):
            return name
    return "reference"


def _takes(name: str, plan: Plan, kind: ProblemKind, need_weights: bool, double_backward: bool) -> bool:
    """Whether automatic routing gives the problem to engine ``name``. A plug-in engine whose own code raises
    while being asked is passed over with one :class:`PluginWarning` (the rest of the routing goes on); a built-in
    engine's error is a bug of axiomformer and propagates."""
    candidate = ENGINES[name]
    try:
        worthwhile = getattr(candidate, "worthwhile", None)
        return bool(
            _usable(candidate, kind, need_weights, double_backward)
            and engine_accepts(candidate, plan, kind)
            and (worthwhile is None or worthwhile(plan, kind))
        )
    except Exception as err:
        origin = ENGINE_ORIGINS.get(name, "axiomformer")
        if origin == "axiomformer":
            raise
        if name not in _WARNED:
            _WARNED.add(name)
            warnings.warn(
                f"axiomformer: the plug-in engine {name!r} of the distribution {origin} raised "
                f"{type(err).__name__} while being asked whether it runs {plan.spec.variant}: {err}; "
                "routing passes it over",
                PluginWarning,
                stacklevel=4,
            )
        return False


class Attended(NamedTuple):
    """What :func:`attend` returns."""

    out: Tensor
    """(batch, heads, q_len, head_dim_v) in the value dtype."""
    weights: Tensor | None
    """(batch, heads, q_len, k_len) in max(input dtype, float32), the weights ``out`` was computed from, before
    dropout; or None."""
    engine: str
    """The name of the engine that ran."""


def default_parts(spec: AttentionSpec) -> Plan:
    """Parts of a spec whose score and contribution have no learned parameters (e.g. the standard spec).

    Raises:
        ValueError: the spec's score or contribution is learned (pass the trained modules as ``parts``).
    """
    from axiomformer.axes import build_contribution, build_score

    score, contribution = build_score(spec), build_contribution(spec)
    if any(True for _ in score.parameters()) or any(True for _ in contribution.parameters()):
        raise ValueError(f"{spec.variant} has learned score or contribution parameters; pass parts=Parts(...)")
    return Plan(spec, score, contribution)


def _resolve_options(
    q: Tensor,
    spec: AttentionSpec | None,
    parts: Plan | None,
    scale: float | Tensor | None,
    causal: bool | None,
    window: int | None,
) -> tuple[Plan, float | Tensor, bool, int]:
    """:func:`attend`'s defaults filled in: ``(parts, scale, causal, window)``, with its ValueErrors."""
    if parts is None:
        if spec is None:
            heads = q.shape[1]
            spec = AttentionSpec.standard(heads * q.shape[-1], heads, causal=bool(causal))
        parts = default_parts(spec)
    spec = parts.spec
    if "halves" in parts.normalizer_traits and (q.shape[-1] % 2 or q.shape[-1] < 2):
        raise ValueError(
            f"normalizer={spec.normalizer!r} splits each head's query and key in two halves and needs an even "
            f"head_dim (>= 2), got q {tuple(q.shape)}"
        )
    if scale is None:
        scale = constant_scale(spec, q.shape[-1])  # ValueError for a learned or per-row scale
    causal = spec.causal if causal is None else causal
    if not causal and "causal" in parts.normalizer_traits:
        raise ValueError(f"normalizer={spec.normalizer!r} is defined only under a causal mask: it needs causal=True")
    if causal and "noncausal" in parts.normalizer_traits:
        raise ValueError(
            f"normalizer={spec.normalizer!r} is defined only without a causal mask (it normalizes over the queries "
            f"too): it needs causal=False"
        )
    window = check_window(spec.window if window is None else window)
    return parts, scale, causal, window


class _Options(NamedTuple):
    """:func:`attend`'s options checked, with their defaults filled in."""

    parts: Plan
    mask: Tensor | None
    bias: Tensor | None
    scale: float | Tensor
    causal: bool
    window: int

    def problem(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        alibi_slopes: Tensor | None,
        q_offset: int | None,
        dropout_p: float | None,
        training: bool,
        transport: Any,
        select: Any = None,
    ) -> AttentionProblem:
        """The problem of these options (``q_offset`` and ``dropout_p`` defaulted as :func:`attend` says)."""
        return AttentionProblem(
            q=q,
            k=k,
            v=v,
            causal=self.causal,
            mask=self.mask,
            bias=self.bias,
            alibi_slopes=alibi_slopes,
            q_offset=k.shape[-2] - q.shape[-2] if q_offset is None else q_offset,
            dropout_p=self.parts.spec.dropout if dropout_p is None else dropout_p,
            training=training,
            scale=self.scale,
            window=self.window,
            transport=transport,
            select=select,
        )


LAZY_SELECTION = object()
"""The lazy selection of :func:`layer_problem`'s problems: not None, so the problem's kind says it has one."""


def layer_problem(
    parts: Plan, q: Tensor, k: Tensor, v: Tensor, *, alibi_slopes: Tensor | None = None, training: bool = False
) -> AttentionProblem:
    """The problem :func:`attend` poses for a layer of ``parts`` given only q, k, v (batch, heads, seq, head_dim):
    no mask, bias or transport, scale 1, and the spec's causal rule, window and dropout, the keys aligned
    bottom-right; a plan with a selection poses it lazily, as ``Attention`` passes it (:data:`LAZY_SELECTION`
    stands in for it: only the routing reads this problem). What routing sees for an unmasked call of the layer (the
    bench asks it which engine would run)."""
    spec = parts.spec
    options = _Options(parts, None, None, 1.0, spec.causal, spec.window)
    select = LAZY_SELECTION if parts.select_traits else None
    return options.problem(q, k, v, alibi_slopes, None, None, training, None, select)


def _checked_options(
    q: Tensor,
    target: tuple[int, int, int, int],
    spec: AttentionSpec | None,
    parts: Plan | None,
    mask: Tensor | None,
    bias: Tensor | None,
    scale: float | Tensor | None,
    causal: bool | None,
    window: int | None,
    alibi_slopes: Tensor | None,
    transport: Any,
) -> _Options:
    """:func:`attend`'s options checked against the problem's shape ``target`` and its defaults filled in.

    Raises:
        ValueError: mask or bias shapes that do not fit (naming them, see ``engines/validate.py``), a negative window;
            no ``scale`` for a scale choice that is not a constant (``learned``, ``log_n``, or any choice a package
            registers without a value), naming the constant ones; a causal-only normalizer without a causal mask, a
            non-causal-only one (sinkhorn) with one; an odd head_dim for a normalizer that splits heads in halves
            (``diff``); a nonzero float bias for a normalizer blind to the scores' sign (``power``); a plan with a
            transport without its gates.
    """
    mask, bias = as_problem_4d("mask", mask, target), as_problem_4d("bias", bias, target)
    check_per_head("alibi_slopes", alibi_slopes, target)
    check_per_head("scale", scale, target)
    parts, scale, causal, window = _resolve_options(q, spec, parts, scale, causal, window)
    spec = parts.spec
    if bias is not None and "sign_blind" in parts.normalizer_traits and bool((bias != 0).any()):
        raise ValueError(
            f"normalizer={spec.normalizer!r} weighs a score by its magnitude whatever its sign, so a float bias or "
            f"mask (a large negative entry) would become weight; pass a boolean mask (True = may attend)"
        )
    if parts.transported and transport is None:
        raise ValueError(
            f"transport={spec.transport!r} needs its gates (transport=TransportGates(...)) computed from the key "
            f"input; call the Attention layer"
        )
    return _Options(parts, mask, bias, scale, causal, window)


def _lazy_or_mask(
    parts: Plan,
    problem: AttentionProblem,
    engine: str,
    need_weights: bool,
    double_backward: bool,
    *,
    bad: Tensor | None,
) -> AttentionProblem:
    """``problem`` with its lazy selection (``problem.select``) kept where an engine that computes selections
    (``selects``) takes it -- the one requested, or under ``auto`` the first in ``ENGINE_ORDER`` -- else folded into
    its mask (``Selection.mask()``: the mask every other engine runs, as before there were lazy selections). Also
    folded when a key is non-finite (``bad``): the NaN rows of :func:`poison_rows` are those that may see it through
    the mask."""
    select = problem.select
    if select is None:
        return problem
    requested, explicit = _requested(engine)
    if not need_weights and (bad is None or not bool(bad.any())):
        kind = problem_kind(parts, problem)
        for name in [requested] if requested != "auto" else ENGINE_ORDER:
            candidate = ENGINES[name]
            if getattr(candidate, "selects", False) and (
                _takes(name, parts, kind, need_weights, double_backward)
                or (
                    explicit
                    and engine_accepts(candidate, parts, kind)
                    and _usable(candidate, kind, False, double_backward)
                )
            ):
                return problem
    chosen = select.mask()
    mask = chosen if problem.mask is None else problem.mask & chosen
    return dataclasses.replace(problem, mask=mask, select=None)


def _solve(
    parts: Plan, problem: AttentionProblem, engine: str, need_weights: bool, double_backward: bool
) -> tuple[Tensor, Tensor | None, str]:
    """``(out, weights, engine name)`` of a non-empty problem: non-finite keys/values set aside, the routed engine
    run (re-routing when it turns out unavailable), then the zero and NaN rows of :func:`attend`'s contract."""
    k_clean, v_clean, bad = clean_nonfinite(problem)
    problem = _lazy_or_mask(parts, problem, engine, need_weights, double_backward, bad=bad)
    clean = dataclasses.replace(problem, k=k_clean, v=v_clean)
    if problem.transport is not None and bad is not None:  # a set-aside key transports nothing either
        clean = dataclasses.replace(clean, transport=problem.transport.masked(~bad))
    while True:
        name = route(parts, clean, engine, need_weights=need_weights, double_backward=double_backward)
        try:
            out, weights = ENGINES[name](parts, clean, need_weights)
            break
        except EngineUnavailable:
            _ROUTES.clear()  # the engine's accepts() now says no on this device
    out = poison_rows(zero_rows_without_keys(out, problem), problem, bad)
    return out, weights, name


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    spec: AttentionSpec | None = None,
    parts: Plan | None = None,
    mask: Tensor | None = None,
    bias: Tensor | None = None,
    scale: float | Tensor | None = None,
    causal: bool | None = None,
    q_offset: int | None = None,
    alibi_slopes: Tensor | None = None,
    dropout_p: float | None = None,
    training: bool = False,
    need_weights: bool = False,
    engine: str = "auto",
    double_backward: bool = False,
    window: int | None = None,
    transport: Any = None,
    select: Any = None,
) -> Attended:
    """Attention of queries to keys and values, on the engine the router picks.

    Args:
        q, k, v: (batch, heads, q_len, head_dim), (batch, heads, k_len, head_dim), (batch, heads, k_len, head_dim_v);
            batch and heads may broadcast.
        spec: the point of the design space (default: the standard spec, ``causal`` as given); parts: the layer's
            :class:`~axiomformer.engines.plan.Plan`, its spec resolved once with its modules (default: built from
            ``spec`` when its score and contribution have no parameters).
        mask: bool, True = may attend; bias: float added to the scores (finite); both broadcastable to (batch, heads,
            q_len, k_len) (``masks.prepare_masks`` turns user masks into this pair).
        scale: a float, a (1, heads, 1, 1) or a per-row (batch|1, heads, q_len, 1) tensor (``scale=log_n``), for
            every normalizer (the linear one as phi(s q)); default: the ``constant`` scale choice's value
            (``axes/scale.py``), 1/sqrt(head_dim) for ``"inv_sqrt_d"`` (of head_dim / 2 for diff; 1 if linear), 1
            for ``"none"``.
        causal: bottom-right aligned causal mask (default ``spec.causal``); q_offset: position of query 0 among the
            keys (default ``k_len - q_len``); window: sliding window of keys (default ``spec.window``,
            ``engines.problem.window_mask``); alibi_slopes: (heads,) ALiBi slopes, or None.
        dropout_p: dropout on the weights in training (default ``spec.dropout``); need_weights: also return the
            weights; engine: ``"auto"`` or an engine to force; double_backward: an engine differentiable to every
            order; transport: a plan's gates over the key positions (``axes.transport.TransportGates``); select: a
            plan's ``Selection``, gathered by ``engines/selected.py`` or else folded into ``mask``.

    Returns:
        :class:`Attended` ``(out, weights, engine)``; a query with no visible key gets a zero row, one that sees a
        non-finite key or value a NaN row (engines/problem.py).

    Raises:
        ValueError: shapes that do not fit, naming them, or a spec's condition on scale, causal mask, head_dim, bias
            or transport not met (:func:`_checked_options`); see also :func:`route` and :func:`default_parts`.
    """
    target = problem_shape(q, k, v)
    options = _checked_options(q, target, spec, parts, mask, bias, scale, causal, window, alibi_slopes, transport)
    if 0 in target[2:]:  # no query or no key: nothing for an engine to compute
        empty, no_weights = empty_output(q, k, v, target)
        return Attended(empty, no_weights if need_weights else None, "reference")
    problem = options.problem(q, k, v, alibi_slopes, q_offset, dropout_p, training, transport, select)
    out, weights, name = _solve(options.parts, problem, engine, need_weights, double_backward)
    return Attended(out, weights if need_weights else None, name)
