"""The engine protocol: what an engine is given and what it returns.

An engine is an object with

    name: str                      the registry name (``engines.ENGINES``), what ``Attended.engine`` and
                                   ``Attention.last_engine`` report
    returns_weights: bool          it can return the weights its output was computed from
    double_backward: bool          every kernel it runs is differentiable to every order
    transports: bool               it computes plans with a transport (``plan.transported``); the router routes
                                   such plans only to engines that say so (default False)
    accepts(plan, kind) -> bool    whether it computes problems of this kind under this plan exactly
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
"""

from __future__ import annotations

from typing import Protocol

from torch import Tensor

from axiomformer.engines.plan import Plan, ProblemKind
from axiomformer.engines.problem import AttentionProblem


class Engine(Protocol):
    """The typed protocol every engine follows (see the module docstring)."""

    name: str
    returns_weights: bool
    double_backward: bool

    def accepts(self, plan: Plan, kind: ProblemKind) -> bool: ...

    def twice_differentiable(self, kind: ProblemKind) -> bool: ...

    def __call__(
        self, plan: Plan, problem: AttentionProblem, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]: ...


class EngineBase:
    """Defaults of the protocol: accepts everything, first- and second-order differentiable, no weights."""

    name = "engine"
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
