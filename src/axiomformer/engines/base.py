"""The engine protocol: what an engine is given and what it returns.

An engine is an object with

    name: str                      the registry name (``engines.ENGINES``), what ``Attended.engine`` and
                                   ``Attention.last_engine`` report
    computes: Computes             what it can compute, in terms of the traits of the plan's choices (the router
                                   asks it before ``accepts``; default: every choice)
    returns_weights: bool          it can return the weights its output was computed from
    double_backward: bool          every kernel it runs is differentiable to every order
    transports: bool               it computes plans with a transport (``plan.transported``); the router routes
                                   such plans only to engines that say so (default False)
    accepts(plan, kind) -> bool    whether it computes problems of this kind under this plan exactly, beyond
                                   ``computes`` (the mask kind, dtype, mode...)
    worthwhile(plan, kind) -> bool whether automatic routing should pick it (optional; default True)
    twice_differentiable(kind) -> bool
    __call__(plan, problem, need_weights=False) -> (out, weights)

``plan`` is a :class:`~axiomformer.engines.plan.Plan` (the spec resolved once: its modules and traits), ``kind`` a
:class:`~axiomformer.engines.plan.ProblemKind` (no lengths, no values), ``problem`` an
:class:`~axiomformer.engines.problem.AttentionProblem`: the tensors q (batch, heads, q_len, head_dim), k, v, mask,
bias, ALiBi slopes and the causal/window/offset settings. ``out`` is (batch, heads, q_len, head_dim_v) in the value
dtype, ``weights`` (batch, heads, q_len, k_len) in max(input dtype, float32) or None. ``accepts`` and
``worthwhile`` read only the plan and the kind, so the router's cached decision is the one a fresh call would make.
Engines are called only by the router (``engines/router.py``), which has already applied the policy of
``engines/problem.py``.

An engine never names a choice: which choices it computes is a :class:`Computes` over their traits (each axis file's
``*_TRAITS`` say what a trait promises), so a choice that another package registers with the right traits runs on
it, and ``axiomformer.engines.router.describe_engines()`` (the docs' engine list) prints the declarations.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Protocol

from torch import Tensor

from axiomformer.engines.plan import Plan, ProblemKind
from axiomformer.engines.problem import AttentionProblem

AXES_WITH_TRAITS = ("normalizer", "score", "contribution", "position", "aggregator", "transport", "select")
"""The axes whose traits a :class:`~axiomformer.engines.plan.Plan` resolves (``plan.<axis>_traits``)."""


def _frozen(traits: Mapping[str, AbstractSet[str]]) -> dict[str, frozenset[str]]:
    unknown = set(traits) - set(AXES_WITH_TRAITS)
    if unknown:
        raise ValueError(f"unknown axes {sorted(unknown)} in Computes; choose from: {', '.join(AXES_WITH_TRAITS)}")
    return {axis: frozenset(names) for axis, names in traits.items()}


@dataclass(frozen=True)
class Computes:
    """What an engine can compute, stated over the traits of the plan's choices (never their names).

    A plan is admitted when, for every axis named, its choice has every trait of ``all_of[axis]``, at least one of
    ``any_of[axis]`` and none of ``none_of[axis]``. Engines refine this in ``accepts`` with the problem's kind (mask,
    dtype, mode) and trait-bearing options; the router asks ``computes`` first.

    Example: ``Computes(all_of={"normalizer": {"elementwise"}, "score": {"plain_dot"}})``.

    Raises:
        ValueError: an axis outside :data:`AXES_WITH_TRAITS` (naming them).
    """

    all_of: Mapping[str, AbstractSet[str]] = field(default_factory=dict)
    any_of: Mapping[str, AbstractSet[str]] = field(default_factory=dict)
    none_of: Mapping[str, AbstractSet[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("all_of", "any_of", "none_of"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))

    def admits(self, plan: Plan) -> bool:
        """Whether the traits of ``plan``'s choices meet the declaration (reads only the plan's attributes)."""
        for axis, traits in self.all_of.items():
            if not traits <= getattr(plan, f"{axis}_traits"):
                return False
        for axis, traits in self.any_of.items():
            if not traits & getattr(plan, f"{axis}_traits"):
                return False
        return not any(traits & getattr(plan, f"{axis}_traits") for axis, traits in self.none_of.items())

    def describe(self) -> str:
        """The declaration in words, e.g. ``"normalizer: elementwise, none of parametric/random; score:
        plain_dot"`` (``"every choice"`` when it names no trait)."""
        parts = []
        for axis in AXES_WITH_TRAITS:
            words = []
            if self.all_of.get(axis):
                words.append(" and ".join(sorted(self.all_of[axis])))
            if self.any_of.get(axis):
                words.append("one of " + "/".join(sorted(self.any_of[axis])))
            if self.none_of.get(axis):
                words.append("none of " + "/".join(sorted(self.none_of[axis])))
            if words:
                parts.append(f"{axis}: {', '.join(words)}")
        return "; ".join(parts) or "every choice"


EVERY_CHOICE = Computes()
"""The declaration of an engine that computes every choice (the reference engine's)."""


class Engine(Protocol):
    """The typed protocol every engine follows (see the module docstring)."""

    name: str
    computes: Computes
    returns_weights: bool
    double_backward: bool

    def accepts(self, plan: Plan, kind: ProblemKind) -> bool: ...

    def twice_differentiable(self, kind: ProblemKind) -> bool: ...

    def __call__(
        self, plan: Plan, problem: AttentionProblem, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]: ...


class EngineBase:
    """Defaults of the protocol: computes every choice and accepts every problem, first- and second-order
    differentiable, no weights."""

    name = "engine"
    computes = EVERY_CHOICE
    returns_weights = False
    double_backward = True
    transports = False

    def accepts(self, plan: Plan, kind: ProblemKind) -> bool:
        return True

    def worthwhile(self, plan: Plan, kind: ProblemKind) -> bool:
        return True

    def twice_differentiable(self, kind: ProblemKind) -> bool:
        """Whether second-order gradients of problems of this kind are exact on this engine."""
        return self.double_backward

    def __call__(
        self, plan: Plan, problem: AttentionProblem, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        raise NotImplementedError
