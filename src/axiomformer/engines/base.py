"""The engine protocol: what an engine is given and what it returns.

An engine is a function of tensors on the (batch, heads, seq, head_dim) layout,

    engine(q, k, v, *, parts, mask, bias, scale, causal, q_offset, alibi_slopes, dropout_p, training, need_weights)
        -> (out (batch, heads, q_len, head_dim_v), weights (batch, heads, q_len, k_len) in max(dtype, float32) or None)

plus ``accepts(parts, problem) -> bool``, the traits the router reads (``returns_weights``, ``double_backward``) and a
``name``. ``parts`` (:class:`Parts`) holds what the axes contribute to the core beyond tensors: the spec, the score
module (A4) and the contribution module (A2). Engines never see an ``Attention`` module, and they are called only by
the router (``engines/router.py``), which has already applied the policy of ``engines/problem.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Protocol

from torch import Tensor, nn

from axiomformer.axes.normalizer import spec_options
from axiomformer.engines.problem import AttentionProblem
from axiomformer.spec import AttentionSpec


@dataclass(frozen=True)
class Parts:
    """The learned and chosen pieces of one attention core.

    Attributes:
        spec: the point of the design space.
        score_fn: maps q (batch, heads, q_len, head_dim) and k (batch, heads, k_len, head_dim) to scores
            (batch, heads, q_len, k_len) (``axes/score.py``).
        contribution: maps weights (batch, heads, q_len, k_len) and v (batch, heads, k_len, head_dim_v) to the
            output (batch, heads, q_len, head_dim_v) (``axes/contribution.py``).
        normalizer: the ``Normalizer`` module when its choice has learned parameters (``parametric``), else None.
    """

    spec: AttentionSpec
    score_fn: nn.Module
    contribution: nn.Module
    normalizer: nn.Module | None = None

    def parameters(self) -> Iterator[nn.Parameter]:
        yield from self.score_fn.parameters()
        yield from self.contribution.parameters()
        if self.normalizer is not None:
            yield from self.normalizer.parameters()

    def normalizer_params(self) -> dict:
        """Keyword arguments of the normalizer's implementation (``axes/normalizer.py``): a ``parametric`` one's
        learned parameters, a ``configured`` one's spec options; else empty."""
        return spec_options(self.spec) if self.normalizer is None else self.normalizer.params()


class Engine(Protocol):
    """The typed protocol every engine follows (see the module docstring)."""

    name: str
    returns_weights: bool
    double_backward: bool

    def accepts(self, parts: Parts, problem: AttentionProblem) -> bool: ...

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, *, parts: Parts, mask: Tensor | None = None,
                 bias: Tensor | None = None, scale: Any = 1.0, causal: bool = False, q_offset: int = 0,
                 alibi_slopes: Tensor | None = None, dropout_p: float = 0.0, training: bool = False,
                 need_weights: bool = False) -> tuple[Tensor, Tensor | None]: ...


class EngineBase:
    """Turns the keyword protocol into an :class:`AttentionProblem` for ``run(parts, problem, need_weights)``."""

    name = "engine"
    returns_weights = False
    double_backward = True

    def accepts(self, parts: Parts, problem: AttentionProblem) -> bool:
        return True

    def twice_differentiable(self, problem: AttentionProblem) -> bool:
        """Whether second-order gradients of this problem are exact on this engine."""
        return self.double_backward

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, *, parts: Parts, mask: Tensor | None = None,
                 bias: Tensor | None = None, scale: Any = 1.0, causal: bool = False, q_offset: int = 0,
                 alibi_slopes: Tensor | None = None, dropout_p: float = 0.0, training: bool = False,
                 need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        problem = AttentionProblem(q=q, k=k, v=v, causal=causal, mask=mask, bias=bias, alibi_slopes=alibi_slopes,
                                   q_offset=q_offset, dropout_p=dropout_p, training=training, scale=scale)
        return self.run(parts, problem, need_weights)

    def run(self, parts: Parts, problem: AttentionProblem, need_weights: bool = False):
        raise NotImplementedError
