"""Axis A1 — the aggregator rho in y_i = rho(sum_j phi(x_j, u_ij)).

Source: Somani, "A Minimal Route to Transformer Attention", assumption A1 (simplicity: rho = identity), applied to
the Deep Sets form of Zaheer et al. 2017, Theorem 2.

Choices:
    identity  rho(s) = s                                   (A1 holds)
    mlp       rho(s) = s + W_2 GELU(W_1 s)                 (A1 relaxed; bias-free so rho(0) = 0, and a query with no
                                                            visible key still gets a zero output) **(our choice)**
    gate      rho(s) = sigmoid(W_g x_i + b_g) * s          (A1 relaxed: an elementwise output gate from the query's
                                                            own input x_i; Qiu et al. 2025, arXiv:2505.06708, "G1",
                                                            as in Qwen3-Next); rho(0) = 0
    laser     y_i = log(sum_j u_ij exp(v_j)), per head and coordinate (A1 and A3 together: values through exp
                                                            before the sum, rho = log after it; Duvvuri & Dhillon
                                                            2024, arXiv:2411.03493, LASER); computed as
                                                            m + log(sum_j u_ij exp(v_j - m)), m the per-column max of
                                                            v over the keys some query may see (trait ``log_values``)
rho acts on the concatenated heads, (batch, seq, dim), before the output projection: ``rho(s, x)`` with x the layer's
query input (batch, seq, dim), which only ``gate`` reads. The Differential Transformer's released layer
(``normalizer=diff,diff_authors=true``) adds its own rho before the chosen one: each head's output through an RMSNorm
(eps 1e-5, a learned scale of width head_dim shared by the heads, computed in float32) times (1 - lambda_init)
(Ye et al. 2024, sec. 2.1, eq. 3; microsoft/unilm Diff-Transformer ``multihead_diffattn.py``, ``subln``), which
relaxes A1 (:class:`DiffHeadNorm`). A ``log_values`` aggregator acts around the weighted sum
instead (its ``rho`` is the identity): ``encode`` maps the values before the engine, ``decode`` its output after.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch
from torch import Tensor, nn

from axiomformer.axes.mlp import two_layer_mlp
from axiomformer.axes.normalizer import diff_lambda_init
from axiomformer.axes.registry import Choice, Registry
from axiomformer.precision import upcast

if TYPE_CHECKING:
    from axiomformer.spec import AttentionSpec


class LogValuesAggregator(Protocol):
    """What the trait ``log_values`` promises of an aggregator module (see the module docstring)."""

    def encode(self, v: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """(v', m): the values (batch, heads, k_len, head_dim) mapped before the weighted sum, and what ``decode``
        needs."""
        ...

    def decode(self, out: Tensor, m: Tensor) -> Tensor:
        """The engine's output (batch, heads, q_len, head_dim) mapped back."""
        ...


class IdentityAggregator(nn.Module):
    """rho(s) = s. Input and output: (batch, seq, dim)."""

    def forward(self, s: Tensor, x: Tensor | None = None) -> Tensor:
        return s


class MLPAggregator(nn.Module):
    """rho(s) = s + W_2 GELU(W_1 s), hidden width 2*dim, no biases. Input and output: (batch, seq, dim)."""

    def __init__(self, dim: int):
        super().__init__()
        self.mlp = two_layer_mlp(dim, 2 * dim, dim, bias=False)

    def forward(self, s: Tensor, x: Tensor | None = None) -> Tensor:
        return s + self.mlp(s)


class GateAggregator(nn.Module):
    """rho(s, x) = sigmoid(W_g x + b_g) * s, elementwise: the head-specific, query-dependent output gate "G1" of Qiu
    et al. 2025 (arXiv:2505.06708, sec. 2), applied to the concatenated heads before the output projection.

    Args (forward): s (batch, seq, dim) the attention output; x (batch, seq, dim) the layer's query input.

    Raises:
        ValueError: ``x`` missing or of another shape than ``s`` (naming both shapes).
    """

    def __init__(self, dim: int):
        super().__init__()
        self.gate = nn.Linear(dim, dim)

    def forward(self, s: Tensor, x: Tensor | None = None) -> Tensor:
        if x is None or x.shape != s.shape:
            raise ValueError(
                f"aggregator='gate' needs the query input x shaped like the heads' output "
                f"{tuple(s.shape)}, got {None if x is None else tuple(x.shape)}"
            )
        return torch.sigmoid(self.gate(x)).to(s.dtype) * s


class LaserAggregator(nn.Module):
    """LASER attention's y_i = log(sum_j u_ij exp(v_j)) (Duvvuri & Dhillon 2024, arXiv:2411.03493, sec. 3:
    LASER(X) = log(softmax(Q K^T) exp(V))): the values enter the weighted sum as exp(v_j - m) and leave it as m + log(.), m (batch, heads, 1, head_dim) the
    max of each value coordinate over the keys some query may see (their log-weighted-sum-exp trick; m cancels, so
    it is detached). ``forward`` is the identity (the weighted sum is already wrapped).

    A row whose sum is 0 (no visible key, or every visible exp(v_j - m) underflowing: v_j < m - 87 in float32) gets
    0 **(our convention: the zero row of a query without keys)**.
    """

    def forward(self, s: Tensor, x: Tensor | None = None) -> Tensor:
        return s

    @staticmethod
    def encode(v: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
        """(exp(v - m), m) from values v (batch, heads, k_len, head_dim) and the bool mask (True = may attend,
        broadcastable to (batch, heads, q_len, k_len)) or None; keys no query may see get the value 0."""
        with torch.no_grad():
            seen = None if mask is None else mask.any(dim=-2).unsqueeze(-1)  # (batch|1, heads|1, k_len, 1)
            top = v if seen is None else v.masked_fill(~seen, float("-inf"))
            m = top.amax(dim=-2, keepdim=True)
            m = upcast(torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
        shifted = upcast(v) - m  # exp in max(dtype, float32): float16's exp(v - m) underflows 17 below the max
        if seen is not None:
            shifted = shifted.masked_fill(~seen, float("-inf"))
        return torch.exp(shifted), m

    @staticmethod
    def decode(out: Tensor, m: Tensor) -> Tensor:
        """m + log(out), 0 where out <= 0 (see the class docstring)."""
        positive = out > 0
        return torch.where(positive, torch.log(torch.where(positive, out, torch.ones_like(out))) + m, 0.0)


class DiffHeadNorm(nn.Module):
    """rho(s) = inner((1 - lambda_init) RMSNorm(s_h) per head h) with RMSNorm(x) = x / sqrt(mean(x^2) + 1e-5) * g, g
    (head_dim,) learned from ones and shared by the heads: the Differential Transformer's ``subln`` and output scale
    (Ye et al. 2024, eq. 3; the authors' ``multihead_diffattn.py``), before the spec's own rho ``inner``. A zero head
    stays zero (a query with no visible key keeps a zero row).

    Args (forward): s (batch, seq, heads * head_dim) the concatenated heads; x the query input, for ``inner``.
    """

    def __init__(self, inner: nn.Module, num_heads: int, head_dim: int, lambda_init: float):
        super().__init__()
        self.inner = inner
        self.num_heads = num_heads
        self.scale = 1.0 - lambda_init
        self.weight = nn.Parameter(torch.ones(head_dim))

    def forward(self, s: Tensor, x: Tensor | None = None) -> Tensor:
        heads = s.unflatten(-1, (self.num_heads, -1))
        work = upcast(heads)  # the authors' RMSNorm runs in float32 (x.float()), then back to the input's dtype
        normed = (work * torch.rsqrt(work.pow(2).mean(-1, keepdim=True) + DIFF_RMS_EPS)).to(s.dtype) * self.weight
        return self.inner((normed * self.scale).flatten(-2), x)


DIFF_RMS_EPS = 1e-5
"""The epsilon of the Differential Transformer's per-head RMSNorm (``RMSNorm(2 * head_dim, eps=1e-5)``)."""

AGGREGATOR_TRAITS = {
    "log_values": "wraps the weighted sum: its module's encode(v, mask) -> (v', m) maps the values (batch, heads, "
    "k_len, head_dim) before the engine and decode(out, m) the engine's output after it; rho itself is the identity"
}

AGGREGATORS = Registry(
    "aggregator",
    [
        Choice(
            "identity", "rho(s) = s", "Somani, A1; Zaheer et al. 2017, Theorem 2", lambda spec: IdentityAggregator()
        ),
        Choice(
            "mlp",
            "rho(s) = s + W_2 GELU(W_1 s)",
            "our choice (see the module docstring)",
            lambda spec: MLPAggregator(spec.dim),
            relaxes="A1: a learned nonlinear rho after the sum over tokens",
        ),
        Choice(
            "gate",
            "rho(s, x_i) = sigmoid(W_g x_i + b_g) * s, elementwise, before the output projection",
            "Qiu et al. 2025, arXiv:2505.06708, 'G1' (gated attention; Qwen3-Next)",
            lambda spec: GateAggregator(spec.dim),
            relaxes="A1: a multiplicative gate from the query's input after the sum over tokens",
        ),
        Choice(
            "laser",
            "y_i = log(sum_j u_ij exp(v_j)) per head and coordinate, as m + log(sum_j u_ij exp(v_j - m)), m the "
            "per-column max of v (a row without keys: 0)",
            "Duvvuri & Dhillon 2024, arXiv:2411.03493, sec. 3 (LASER attention, log(softmax(Q K^T) exp(V)); its "
            "log-weighted-sum-exp trick)",
            lambda spec: LaserAggregator(),
            frozenset({"log_values"}),
            relaxes="A1 and A3 together: the values pass through exp before the weighted sum and log after it, so "
            "the output is no longer linear in the values (a smooth max over the attended values)",
        ),
    ],
    AGGREGATOR_TRAITS,
)
"""Every aggregator (A1)."""


def build_aggregator(spec: AttentionSpec, *, layer_index: int = 0) -> nn.Module:
    """The rho module for ``spec.aggregator``, after the Differential Transformer's per-head RMSNorm for
    ``diff_authors`` (its (1 - lambda_init) from the layer's 0-based ``layer_index``)."""
    rho = AGGREGATORS[spec.aggregator].implementation()(spec)
    if not spec.diff_head_norm:
        return rho
    return DiffHeadNorm(rho, spec.num_heads, spec.head_dim, diff_lambda_init(layer_index))
