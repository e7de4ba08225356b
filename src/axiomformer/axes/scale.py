"""A5's temperature: the factor multiplying the scores before the normalizer.

Source: Somani, assumption A5, u_ij = softmax_j(s_ij / sqrt(d_k)); the 1/sqrt(d_k) keeps the logits O(1) because
Var(q.k) = d_k for unit-variance entries (Vaswani et al. 2017, footnote 4). ``d_k`` is the *score width*: the head_dim,
or half of it for a normalizer that scores the two halves of each head apart (trait ``halves``, differential attention).

Every choice is one entry of :data:`SCALES` with its formula, source, implementation and traits. The implementation is
``impl(module, n_visible) -> float | Tensor``: ``module`` is the :class:`Scale` holding the learned parameters,
``n_visible`` the float (batch|1, heads|1, q_len, 1) count n_i of the keys query i may see (only read by ``per_row``
choices). The result is a float, a (1, heads, 1, 1) tensor, or for ``per_row`` a (batch|1, heads, q_len, 1) tensor:
every engine folds it into the queries (scale * q . k = (scale q) . k for a per-row scale too).

Choices:
    inv_sqrt_d  scale = 1 / sqrt(d_k)                          (A5 holds); 1 for a ``kernel`` normalizer, whose kernel
                                                               phi(q).phi(k) is no scaled score (Katharopoulos et al.
                                                               2020 apply none; the taylor map has its own 1/sqrt(d))
    none        scale = 1                                      (Luong et al. 2015)
    learned     scale_h = exp(theta_h), theta_h from -log(d_k) / 2  (**our choice**: a per-head temperature)
    log_n       scale_hi = c_h log(n_i) / sqrt(d_k), c_h learned per head: Scalable-Softmax (Nakanishi 2025,
                arXiv:2501.19399, eq. 2, on the scaled score). c_h starts at 0.43, the value of the paper's Fig. 1
                **(our choice: the paper does not state an initialisation)**; n_i counts keys, so appended masked keys
                change nothing, and a query with one visible key gets scale 0 (its weight is 1 anyway).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from axiomformer.axes.registry import Choice, Registry
from axiomformer.precision import compute_dtype

if TYPE_CHECKING:
    from axiomformer.spec import AttentionSpec

LOG_N_INIT = 0.43
"""Initial c_h of ``scale=log_n`` (Nakanishi 2025, Fig. 1)."""

SCALE_TRAITS = {
    "constant": "a number fixed by the spec and the score width: extra['value'](spec, width) -> float (what "
    "``attend`` uses when no scale is given)",
    "parametric": "has learned parameters: extra['parameters'](spec, width) creates them",
    "per_row": "depends on n_i, the number of keys query i may see: impl reads n_visible",
}


def _inv_sqrt_d(spec: AttentionSpec, width: int) -> float:
    from axiomformer.axes.normalizer import NORMALIZERS  # the normalizer module imports nothing of this one

    return 1.0 if NORMALIZERS.has(spec.normalizer, "kernel") else 1.0 / math.sqrt(width)


def _learned_parameters(spec: AttentionSpec, width: int) -> dict[str, nn.Parameter]:
    return {"log_scale": nn.Parameter(torch.full((spec.num_heads,), -0.5 * math.log(width)))}


def _log_n_parameters(spec: AttentionSpec, width: int) -> dict[str, nn.Parameter]:
    return {"log_n_coef": nn.Parameter(torch.full((spec.num_heads,), LOG_N_INIT))}


# Module-level functions, not lambdas: a Scale module keeps its choice's impl, and models must pickle (copy.deepcopy,
# torch.save of a whole model).
def _fixed(module: Scale, n_visible: Tensor | None) -> float:
    assert module.fixed is not None  # set for every constant choice, the only ones with this impl
    return module.fixed


def _one(module: Scale, n_visible: Tensor | None) -> float:
    return 1.0


def _one_for(spec: AttentionSpec, width: int) -> float:
    return 1.0


def _learned(module: Scale, n_visible: Tensor | None) -> Tensor:
    return module.log_scale.exp().view(1, -1, 1, 1)


def _log_n(module: Scale, n_visible: Tensor | None) -> Tensor:
    if n_visible is None:
        raise ValueError("scale='log_n' needs n_visible, the number of keys each query may see")
    coef = module.log_n_coef.view(1, -1, 1, 1)
    n = n_visible.to(compute_dtype(coef.dtype))  # float64 kept
    return coef * n.clamp_min(1.0).log() / math.sqrt(module.width)


SCALES = Registry(
    "scale",
    [
        Choice(
            "inv_sqrt_d",
            "scale = 1 / sqrt(d_k) (1 for the kernel normalizer)",
            "Vaswani et al. 2017, eq. 1 and footnote 4; Katharopoulos et al. 2020 (no temperature in the kernel)",
            _fixed,
            frozenset({"constant"}),
            {"value": _inv_sqrt_d},
        ),
        Choice(
            "none",
            "scale = 1",
            "Luong et al. 2015 (unscaled dot score)",
            _one,
            frozenset({"constant"}),
            {"value": _one_for},
            relaxes="A5's temperature: none, logits grow like sqrt(d_k)",
        ),
        Choice(
            "learned",
            "scale_h = exp(theta_h), theta_h initialised to -log(d_k) / 2",
            "our choice: a per-head temperature, as in QK-norm attention (Henry et al. 2020)",
            _learned,
            frozenset({"parametric"}),
            {"parameters": _learned_parameters},
            relaxes="A5's temperature: learned per head",
        ),
        Choice(
            "log_n",
            "scale_hi = c_h log(n_i) / sqrt(d_k), n_i the keys query i may see, c_h learned per head "
            "(Scalable-Softmax)",
            "Nakanishi 2025, arXiv:2501.19399, eq. 2",
            _log_n,
            frozenset({"parametric", "per_row"}),
            {"parameters": _log_n_parameters},
            relaxes="A5's temperature: grows with log n_i, the number of keys the query sees",
        ),
    ],
    SCALE_TRAITS,
)
"""A5's temperature: every scale choice (see the module docstring)."""


def score_width(spec: AttentionSpec, head_dim: int | None = None) -> int:
    """d_k, the width of one score's dot product: ``head_dim`` (default the spec's, plus MLA's ``kv_rope_dim``), halved
    for a ``halves`` normalizer."""
    from axiomformer.axes.normalizer import NORMALIZERS

    head_dim = spec.head_dim + spec.kv_rope_dim if head_dim is None else head_dim  # MLA's decoupled RoPE key widens q.k
    return head_dim // 2 if NORMALIZERS.has(spec.normalizer, "halves") else head_dim


def constant_scale(spec: AttentionSpec, head_dim: int | None = None) -> float:
    """The scale of a ``constant`` choice for queries of width ``head_dim`` (default the spec's), for callers that
    have no :class:`Scale` module (``attend``).

    Raises:
        ValueError: the spec's scale is learned or per row (pass it as ``scale=``), naming the constant choices.
    """
    choice = SCALES[spec.scale]
    if not choice.has("constant"):
        constant = ", ".join(c.name for c in SCALES if c.has("constant"))
        raise ValueError(
            f"scale={spec.scale!r} is not a constant (it has learned parameters or depends on the "
            f"keys a query sees); pass the temperature as scale= (Scale(spec)), or use one of: {constant}"
        )
    return choice.extra["value"](spec, score_width(spec, head_dim))


def default_scale(spec: AttentionSpec, head_dim: int) -> float:
    """:func:`constant_scale` for queries of width ``head_dim`` (the former name)."""
    return constant_scale(spec, head_dim)


class Scale(nn.Module):
    """The temperature of ``spec.scale`` (:data:`SCALES`): owns its learned parameters.

    ``forward(n_visible=None)`` returns a float, a (1, heads, 1, 1) tensor, or for a ``per_row`` choice a
    (batch|1, heads, q_len, 1) tensor from ``n_visible`` (float (batch|1, heads|1, q_len, 1), the keys each query may
    see; see ``engines.problem.KeyVisibility.counts``).
    """

    # Registered only for the parametric choices that use them: declared for the type checker.
    log_scale: Tensor
    log_n_coef: Tensor

    def __init__(self, spec: AttentionSpec):
        super().__init__()
        self.kind = spec.scale
        self.head_dim = spec.head_dim
        self.width = score_width(spec)
        choice = SCALES[spec.scale]
        self.per_row = choice.has("per_row")
        self.fixed: float | None = choice.extra["value"](spec, self.width) if choice.has("constant") else None
        if choice.has("parametric"):
            for name, parameter in choice.extra["parameters"](spec, self.width).items():
                self.register_parameter(name, parameter)
        self._impl = choice.implementation()

    def forward(self, n_visible: Tensor | None = None) -> float | Tensor:
        return self._impl(self, n_visible)
