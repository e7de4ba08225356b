"""A spec resolved once into a plan, and an attention problem reduced to its kind: what the router keys on.

:class:`Plan` (also exported as ``Parts``) holds what the axes contribute to the core beyond tensors -- the spec, the
score module (A4), the contribution module (A2), the normalizer module when it has learned parameters -- and every
registry lookup an engine needs, done once when the plan is built (``Attention`` builds one per layer and rebuilds it
only when its spec object is replaced): the normalizer's implementation and traits, the score's dot form, the feature
map, the pair width. Engines read these attributes; no engine looks a choice up by name while it runs.

:func:`problem_kind` reduces an :class:`~axiomformer.engines.problem.AttentionProblem` to a :class:`ProblemKind`: the
device type, dtype, mask kind, bias, ALiBi form, causal alignment, mode and a *shape class* (a few booleans such as
"too large for the reference engine"). Never a length and never a value such as a temperature: a decode loop or an
annealed temperature reuses one routing decision.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from axiomformer.axes.aggregator import AGGREGATORS
from axiomformer.axes.contribution import CONTRIBUTIONS
from axiomformer.axes.normalizer import FEATURE_MAPS, NORMALIZERS, at_defaults, spec_options
from axiomformer.axes.position import POSITIONS
from axiomformer.axes.registry import Choice
from axiomformer.axes.scale import SCALES
from axiomformer.axes.score import SCORES
from axiomformer.axes.select import SELECTS
from axiomformer.axes.transport import TRANSPORTS
from axiomformer.engines.problem import AttentionProblem
from axiomformer.spec import AttentionSpec

REFERENCE_MAX_ELEMENTS = 2**24
"""Problems up to this many score elements (64 MiB in float32) are left to the reference engine by auto-routing."""

DEFAULT_BUDGET = 2**21
"""Elements of one score block (8 MiB in float32), summed over batch and heads **(our choice)**."""

ALIBI_F32_MAX_SPAN = 2.0**10
"""Largest m_h |p_j - c| folded into a float32 key column (rounding error <= 2 * 2^-24 * 2^10 = 2^-13 per logit: the
column's own, and the query column's 1 / scale, ``engines/sdpa.py``)."""


def _pair_width(spec: AttentionSpec, score_fn: nn.Module, contribution: nn.Module) -> int:
    width = 1
    score, contrib = SCORES[spec.score], CONTRIBUTIONS[spec.contribution]
    if score.has("pairwise"):
        width = score.extra["pair_width"](score_fn)
    if contrib.has("pairwise"):
        width = max(width, contrib.extra["pair_width"](contribution), spec.head_dim)
    return width


@dataclass(frozen=True, eq=False)
class Plan:
    """The learned and chosen pieces of one attention core, with their registry entries resolved.

    Args:
        spec: the point of the design space.
        score_fn: maps q (batch, heads, q_len, head_dim) and k (batch, heads, k_len, head_dim) to scores
            (batch, heads, q_len, k_len) (``axes/score.py``).
        contribution: maps weights (batch, heads, q_len, k_len) and v (batch, heads, k_len, head_dim_v) to the
            output (batch, heads, q_len, head_dim_v) (``axes/contribution.py``).
        normalizer: the ``Normalizer`` module when its choice has learned parameters (``parametric``), else None.
        alibi_max_slope: the largest |ALiBi slope| of the layer (read once here, so that routing never reads a
            tensor back to the host), or None.

    Attributes (resolved once): ``normalizer_choice`` (the registry :class:`~axiomformer.axes.registry.Choice`),
    ``normalizer_traits``, ``score_traits``, ``contribution_traits``, ``position_traits``, ``aggregator_traits`` (read by
    ``Attention``, not by engines), ``transport_traits`` (empty for ``transport=none``; only engines with
    ``transports = True`` are routed a plan with a transport), ``select_traits`` (empty for ``select=none``),
    ``dot_form`` (the score's
    dot-form function or None), ``feature_map`` (the linear normalizer's phi), ``options`` (a ``configured``
    normalizer's keyword arguments), ``at_defaults``, ``pair_width``, ``per_row_scale`` (the scale differs between
    queries: trait ``per_row``, ``scale=log_n``) and ``key``, the hashable part of the router's key: choice names and
    trait-bearing flags only, never a value such as ``gumbel_tau``.
    """

    spec: AttentionSpec
    score_fn: nn.Module
    contribution: nn.Module
    normalizer: nn.Module | None = None
    alibi_max_slope: float | None = None
    normalizer_choice: Choice = field(init=False, repr=False)
    normalizer_traits: frozenset = field(init=False, repr=False)
    score_traits: frozenset = field(init=False, repr=False)
    contribution_traits: frozenset = field(init=False, repr=False)
    position_traits: frozenset = field(init=False, repr=False)
    aggregator_traits: frozenset = field(init=False, repr=False)
    transport_traits: frozenset = field(init=False, repr=False)
    select_traits: frozenset = field(init=False, repr=False)
    dot_form: Callable | None = field(init=False, repr=False)
    feature_map: Callable = field(init=False, repr=False)
    options: dict = field(init=False, repr=False)
    params_fn: Callable | None = field(init=False, repr=False)
    at_defaults: bool = field(init=False, repr=False)
    pair_width: int = field(init=False, repr=False)
    per_row_scale: bool = field(init=False, repr=False)
    key: tuple = field(init=False, repr=False)

    def __post_init__(self) -> None:
        spec = self.spec
        choice = NORMALIZERS[spec.normalizer]
        score = SCORES[spec.score]
        resolved = {
            "normalizer_choice": choice,
            "normalizer_traits": choice.traits,
            "score_traits": score.traits,
            "contribution_traits": CONTRIBUTIONS[spec.contribution].traits,
            "position_traits": POSITIONS[spec.position].traits,
            "aggregator_traits": AGGREGATORS[spec.aggregator].traits,
            "transport_traits": TRANSPORTS[spec.transport].traits,
            "select_traits": SELECTS[spec.select].traits,
            "dot_form": score.extra.get("dot_form"),
            "feature_map": FEATURE_MAPS[spec.feature_map].impl,
            "options": spec_options(spec),
            "at_defaults": at_defaults(spec),
            "params_fn": choice.extra["params"] if "parametric" in choice.traits else None,
            "pair_width": _pair_width(spec, self.score_fn, self.contribution),
        }
        resolved["per_row_scale"] = SCALES.has(spec.scale, "per_row")
        resolved["key"] = (
            spec.normalizer,
            spec.score,
            spec.contribution,
            spec.feature_map if "kernel" in choice.traits else None,
            resolved["at_defaults"],
            bool(spec.softcap),
            resolved["per_row_scale"],
            spec.transport,
            spec.select,
        )
        for name, value in resolved.items():
            object.__setattr__(self, name, value)

    # ------------------------------------------------------------------ traits as flags
    def softmax_like(self, training: bool) -> bool:
        """The normalizer is a plain softmax in this mode (``softmax``, or ``softmax_in_eval`` at default options)."""
        traits = self.normalizer_traits
        return "softmax" in traits or ("softmax_in_eval" in traits and not training and self.at_defaults)

    @property
    def transported(self) -> bool:
        """The spec has a transport (``axes/transport.py``): scores come from :func:`transported_scores`."""
        return bool(self.transport_traits)

    @property
    def sink(self) -> bool:
        return "sink" in self.normalizer_traits

    @property
    def proportional(self) -> bool:
        return "proportional" in self.contribution_traits

    def parameters(self) -> Iterator[nn.Parameter]:
        yield from self.score_fn.parameters()
        yield from self.contribution.parameters()
        if self.normalizer is not None:
            yield from self.normalizer.parameters()

    def normalizer_params(self) -> dict:
        """Keyword arguments of the normalizer's implementation (``axes/normalizer.py``): a ``parametric`` one's
        learned parameters, a ``configured`` one's spec options; else empty."""
        if self.params_fn is None or self.normalizer is None:
            return self.options
        return {**self.options, **self.params_fn(self.normalizer)}


Parts = Plan
"""The former name of :class:`Plan` (same constructor: ``Parts(spec, score_fn, contribution, normalizer)``)."""


class ProblemKind(NamedTuple):
    """Everything about a problem that an engine's ``accepts`` or ``worthwhile`` may read (bounded: no lengths).

    ``mask``: ``"none"``, ``"key"`` (depends on the key only) or ``"full"``; ``alibi``: ``"none"``, ``"column"``
    (causal ALiBi folds into a key column without losing float32 precision), ``"small"`` (small enough to materialize,
    ``heads * q_len * k_len <= DEFAULT_BUDGET``) or ``"large"``; ``aligned``: ``q_offset == k_len - q_len``;
    ``large``: the score block exceeds ``REFERENCE_MAX_ELEMENTS``; ``compiling``: traced by ``torch.compile`` (engines
    that loop over chunks of a length in Python decline then, since each length would compile a new graph);
    ``select``: the problem carries its selection lazily (``AttentionProblem.select``), so that only an engine that
    computes selections (``selects = True``) may run it.
    """

    device: str
    dtype: torch.dtype
    mask: str
    mask_heads: bool
    bias: bool
    alibi: str
    causal: bool
    aligned: bool
    offset_ok: bool
    training: bool
    dropout: bool
    window: bool
    large: bool
    compiling: bool
    select: bool = False


def _alibi_span_ok(problem: AttentionProblem, max_slope: float | None) -> bool:
    if problem.q.dtype == torch.float64:
        return True
    if problem.q.dtype != torch.float32:
        return False
    if max_slope is None:
        if torch.compiler.is_compiling():
            return False  # no host read while tracing: take the materialized (exact) path
        assert problem.alibi_slopes is not None  # alibi_form's caller checked
        max_slope = float(problem.alibi_slopes.abs().max())
    center = (problem.k_len - 1) // 2
    return max_slope * max(center, problem.k_len - 1 - center) <= ALIBI_F32_MAX_SPAN


def alibi_form(problem: AttentionProblem, max_slope: float | None = None) -> str:
    """The ``alibi`` field of :class:`ProblemKind` (see there); ``max_slope`` saves reading the slopes."""
    if problem.alibi_slopes is None:
        return "none"
    if problem.causal and _alibi_span_ok(problem, max_slope):
        return "column"
    return "small" if problem.alibi_slopes.numel() * problem.q_len * problem.k_len <= DEFAULT_BUDGET else "large"


def mask_kind(mask: Tensor | None) -> str:
    if mask is None:
        return "none"
    return "key" if mask.dim() < 2 or mask.shape[-2] == 1 else "full"


def problem_kind(plan: Plan, problem: Any) -> ProblemKind:
    """The kind of ``problem`` under ``plan`` (see :class:`ProblemKind`)."""
    q, mask = problem.q, problem.mask
    rows = q.shape[0] * q.shape[1]
    return ProblemKind(
        device=q.device.type,
        dtype=q.dtype,
        mask=mask_kind(mask),
        mask_heads=mask is not None and mask.dim() == 4 and mask.shape[1] != 1,
        bias=problem.bias is not None,
        alibi=alibi_form(problem, plan.alibi_max_slope),
        causal=problem.causal,
        aligned=problem.q_offset == problem.k_len - problem.q_len,
        offset_ok=problem.q_offset >= 0,
        training=problem.training,
        dropout=problem.training and problem.dropout_p > 0,
        window=bool(problem.window),
        large=rows * problem.q_len * problem.k_len * plan.pair_width > REFERENCE_MAX_ELEMENTS,
        compiling=torch.compiler.is_compiling(),
        select=getattr(problem, "select", None) is not None,
    )


def plain_dot(plan: Plan, kind: ProblemKind) -> bool:
    """Dot scores, proportional contributions, no soft-capping, one scale for every query, no mask but the causal one,
    no bias, ALiBi, window or dropout, float32/64: the problems whose weights are a function of one row of q k^T alone (the closed-form engines')."""
    return (
        "plain_dot" in plan.score_traits
        and plan.proportional
        and not plan.spec.softcap
        and not plan.per_row_scale
        and kind.mask == "none"
        and not kind.bias
        and kind.alibi == "none"
        and not kind.dropout
        and not kind.window
        and kind.dtype in (torch.float32, torch.float64)
    )


def closed_form_chunk(problem: AttentionProblem, memory_budget: int, blocks: int, most: int = 128) -> int:
    """Queries per chunk on the paths that hold whole rows of keys (``engines/sparse.py``, the rowwise engine's
    chunked kernels): score blocks of at most ``blocks * memory_budget`` elements (over batch and heads) and at most
    ``most`` queries.

    At L = 4096, batch 1, 8 heads, causal, 128 queries (16 MiB blocks) ran 10-15% faster than 64 (the plain budget)
    for sparsemax and 1.5-entmax, which reuse two workspaces, and peaked at 66-67 MiB against SDPA's 43 MiB
    (``blocks=2``); the rowwise kernels hold about six blocks in the backward (``blocks=1``) **(our choice)**. The
    tiled engines size their tiles by :func:`~axiomformer.engines.blocks.tile_shape` instead.
    """
    rows = problem.q.shape[0] * problem.q.shape[1]
    return max(1, min(problem.q_len, most, blocks * memory_budget // max(1, rows * problem.k_len)))
