"""Axis A4 — the score s_ij = score(q_i, k_j) of key j for query i.

Source: Somani, assumption A4 (efficient parallel scoring from linear projections and inner products), which gives
s_ij = q_i . k_j with q = W_q x, k = W_k x. The relaxations are the parallel similarities the field uses.

Every score module maps q (batch, heads, q_len, head_dim) and k (batch, heads, k_len, head_dim) to scores
(batch, heads, q_len, k_len). The temperature (A5's 1/sqrt(d)) is applied afterwards by ``normalizer.Scale``.

Choices:
    dot       s = q . k                                         (A4 holds; Vaswani et al. 2017, eq. 1)
    bilinear  s = q^T W_h k, a learned head_dim x head_dim form per head, initialised near the identity
                                                                (Luong et al. 2015, "general" score)
    additive  s = w_h . tanh(q + k)                             (Bahdanau et al. 2015, eq. 6, with W_1, W_2 folded into
                                                                the query/key projections); O(L S head_dim) memory
    cosine    s = tau_h cos(q, k), tau_h learned, init head_dim (QK-normalised attention, Henry et al. 2020)
    neg_l2    s = -|q - k|^2                                    (distance-based attention, Kim et al. 2021)
    mlp       s = w_2 . GELU(W_q' q + W_k' k + b) + c           (an MLP on [q; k]); O(L S hidden) memory
    talking_heads  s_h = sum_g P_hg q_g . k_g, the heads' dot-product logits mixed by a learned H x H matrix P,
                initialised at the identity (Shazeer et al. 2020, arXiv:2003.02436, sec. 4, the mixing before the
                softmax only); mixed before the temperature, which is the same for a scale shared by the heads.
                The default is the paper's; ``talking_heads_residual=true`` is x-transformers' s + P s with P from
                the identity (it starts at 2 q . k)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from axiomformer.axes.registry import Choice, Registry

if TYPE_CHECKING:
    from axiomformer.spec import AttentionSpec


class DotScore(nn.Module):
    """s_ij = q_i . k_j."""

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        return torch.matmul(q, k.transpose(-2, -1))


class BilinearScore(nn.Module):
    """s_ij = q_i^T W_h k_j with one learned (head_dim, head_dim) matrix per head."""

    def __init__(self, num_heads: int, head_dim: int):
        super().__init__()
        # Near the identity so training starts close to dot-product attention, but not on it: a bilinear form that
        # is exactly the identity would be the dot product (A4 would hold).
        init = torch.eye(head_dim).expand(num_heads, head_dim, head_dim).clone()
        self.weight = nn.Parameter(init + torch.randn(num_heads, head_dim, head_dim) / head_dim)

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        # W_h in q's dtype: LASER lifts q and k to float32 while the parameters may stay in bfloat16/float16
        return torch.matmul(torch.matmul(q, self.weight.to(q.dtype)), k.transpose(-2, -1).to(q.dtype))


class AdditiveScore(nn.Module):
    """s_ij = w_h . tanh(q_i + k_j) (Bahdanau additive attention)."""

    def __init__(self, num_heads: int, head_dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(num_heads, head_dim) / head_dim**0.5)

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        hidden = torch.tanh(q.unsqueeze(-2) + k.unsqueeze(-3))  # (B, H, L, S, hd)
        return torch.einsum("bhlsd,hd->bhls", hidden, self.weight.to(hidden.dtype))


class _UnitRows(torch.autograd.Function):
    """y = scale * x / max(|x|, eps) along the last dimension, with a closed-form backward.

    For |x| > eps: dy/dx applied to g is scale (g / |x| - x (x . g) / |x|^3); dy/dscale = (x . g) / |x|. The backward
    recomputes |x| from x with out-of-place operations, so it is itself differentiable (double backward).
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, scale: Tensor | None, eps: float) -> Tensor:
        inv = torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min_(eps).reciprocal_()
        ctx.save_for_backward(x, scale)
        ctx.eps = eps
        return x * (inv if scale is None else inv * scale)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor | None, None]:
        x, scale = ctx.saved_tensors
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        inv = norm.clamp_min(ctx.eps).reciprocal()
        rate = inv if scale is None else inv * scale
        dot = (grad * x).sum(-1, keepdim=True)  # x . g per row
        coeff = rate * inv * inv * dot * (norm > ctx.eps)
        grad_x = grad * rate - x * coeff
        grad_scale = None
        if scale is not None and ctx.needs_input_grad[1]:
            grad_scale = (dot * inv).sum_to_size(scale.shape)
        return grad_x, grad_scale, None


def unit_rows(x: Tensor, scale: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """``scale * F.normalize(x, dim=-1, eps=eps)`` in two passes forward and five backward (fused for the sdpa
    engine's cosine scores; the reference engine keeps ``F.normalize``).

    Args:
        x: (..., head_dim) float.
        scale: broadcastable to (..., 1) (e.g. a (1, heads, 1, 1) temperature), or None for 1.
    """
    return _UnitRows.apply(x, scale, eps)


class CosineScore(nn.Module):
    """s_ij = tau_h * cos(q_i, k_j), tau_h = exp(log_tau_h) learned per head, initialised to head_dim."""

    def __init__(self, num_heads: int, head_dim: int, eps: float = 1e-6):
        super().__init__()
        self.log_tau = nn.Parameter(torch.full((num_heads,), math.log(head_dim)))
        self.eps = eps

    def temperature(self) -> Tensor:
        """tau, shaped (1, heads, 1, 1) to broadcast against scores."""
        return self.log_tau.exp().view(1, -1, 1, 1)

    def normalize(self, x: Tensor) -> Tensor:
        return F.normalize(x, dim=-1, eps=self.eps)

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        cos = torch.matmul(self.normalize(q), self.normalize(k).transpose(-2, -1))
        return cos * self.temperature().to(cos.dtype)


class NegL2Score(nn.Module):
    """s_ij = -|q_i - k_j|^2 = 2 q_i.k_j - |q_i|^2 - |k_j|^2."""

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        qk = torch.matmul(q, k.transpose(-2, -1))
        return 2 * qk - q.pow(2).sum(-1, keepdim=True) - k.pow(2).sum(-1).unsqueeze(-2)


class MLPScore(nn.Module):
    """s_ij = w_2 . GELU(W_q' q_i + W_k' k_j + b_1) + c: a two-layer MLP on [q_i; k_j], shared by the heads."""

    def __init__(self, head_dim: int, hidden: int | None = None):
        super().__init__()
        hidden = hidden or head_dim
        self.w_q = nn.Linear(head_dim, hidden)
        self.w_k = nn.Linear(head_dim, hidden, bias=False)
        self.out = nn.Linear(hidden, 1)

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        hidden = F.gelu(self.w_q(q).unsqueeze(-2) + self.w_k(k).unsqueeze(-3))  # (B, H, L, S, hidden)
        return self.out(hidden).squeeze(-1)


class TalkingHeadsScore(nn.Module):
    """s_hij = sum_g P_hg q_gi . k_gj: the dot-product logits of every head mixed by a learned (heads, heads) P,
    from the identity (Shazeer et al. 2020's projection). With ``residual`` (spec field ``talking_heads_residual``)
    x-transformers' layer: s_h + sum_g P_hg s_g (``sim + pre_softmax_talking_heads(sim)``, the 1x1 convolution
    initialised to the identity by ``nn.init.dirac_``), so it starts at 2 q . k, not at the standard score."""

    def __init__(self, num_heads: int, residual: bool = False):
        super().__init__()
        self.mix = nn.Parameter(torch.eye(num_heads))
        self.residual = residual

    def forward(self, q: Tensor, k: Tensor) -> Tensor:
        logits = torch.matmul(q, k.transpose(-2, -1))
        mixed = torch.einsum("hg,bgij->bhij", self.mix.to(logits.dtype), logits)
        return logits + mixed if self.residual else mixed


@torch.no_grad()
def _move_mix(module: TalkingHeadsScore, generator: torch.Generator) -> None:
    module.mix.add_(0.5 * torch.randn(module.mix.shape, generator=generator).to(module.mix))


# ---------------------------------------------------------------------------------------------- dot forms
# softmax_j(scale * score(q_i, k_j)) = softmax_j(scale * q'_i . k'_j + sum_c qcol_c[i] kcol_c[j] + r_i) for the scores
# with a dot form: ``dot_form(module, q, k, scale) -> (q', k', scale, [(qcol, kcol), ...])``, columns (..., seq, 1).
# ``dot_form_exact`` promises r_i = 0 (the logits themselves, not only their softmax, are kept).
def _dot_form_dot(module, q, k, scale):
    return q, k, scale, []


def _dot_form_bilinear(module, q, k, scale):
    return torch.matmul(q, module.weight.to(q.dtype)), k, scale, []


def _dot_form_cosine(module, q, k, scale):
    return unit_rows(q, module.temperature().to(q.dtype), module.eps), unit_rows(k, None, module.eps), scale, []


def _dot_form_neg_l2(module, q, k, scale):
    # -|q - k|^2 = [2q, 1] . [k, -|k|^2] - |q|^2; the -|q|^2 (r_i) is constant in j and cancels in a softmax. The 2
    # goes into the scale (no pass over q); extra columns add to the final logits, so the query column carries the
    # scale.
    return q, k, 2 * scale, [(torch.ones_like(q[..., :1]) * scale, -k.pow(2).sum(-1, keepdim=True))]


SCORE_TRAITS = {
    "dot_form": "extra['dot_form'] gives the scores as a dot product of transformed queries and keys, up to a "
    "per-query constant (see above)",
    "dot_form_exact": "the dot form keeps the logits exactly (no per-query constant)",
    "plain_dot": "s = q . k exactly, with no learned part",
    "pairwise": "builds a (q_len, k_len, hidden) tensor per pair; extra['pair_width'](module) is hidden",
    "any_width": "the module scores queries and keys of any width (no parameter sized by head_dim)",
    "starts_standard": "its learned parameters start where it computes the standard choice exactly; "
    "extra['move'](module, generator) moves them off that point (the audit of a spec audits the "
    "relaxation, not its starting point)",
}


def _with_dot_form(
    name: str,
    formula: str,
    source: str,
    impl: Callable[[AttentionSpec], nn.Module],
    traits: frozenset[str],
    *,
    dot_form: Callable[..., Any],
    relaxes: str = "",
) -> Choice:
    """A choice whose scores have a dot form (see above): trait ``dot_form`` and extra ``dot_form``, besides ``traits``."""
    return Choice(
        name, formula, source, impl, frozenset({"dot_form"}) | traits, {"dot_form": dot_form}, relaxes=relaxes
    )


SCORES = Registry(
    "score",
    [
        _with_dot_form(
            "dot",
            "s = q . k",
            "Vaswani et al. 2017, eq. 1 (A4 holds)",
            lambda spec: DotScore(),
            frozenset({"dot_form_exact", "plain_dot", "any_width"}),
            dot_form=_dot_form_dot,
        ),
        _with_dot_form(
            "bilinear",
            "s = q^T W_h k",
            "Luong et al. 2015, 'general' score",
            lambda spec: BilinearScore(spec.num_heads, spec.head_dim),
            frozenset({"dot_form_exact"}),
            dot_form=_dot_form_bilinear,
            relaxes="none (inside A4's class): W_h folds into the key projection",
        ),
        Choice(
            "additive",
            "s = w_h . tanh(q + k)",
            "Bahdanau et al. 2015, eq. 6",
            lambda spec: AdditiveScore(spec.num_heads, spec.head_dim),
            frozenset({"pairwise"}),
            {"pair_width": lambda module: module.weight.shape[-1]},
            relaxes="A4: a nonlinear function of q + k, not an inner product",
        ),
        _with_dot_form(
            "cosine",
            "s = tau_h cos(q, k)",
            "Henry et al. 2020, QK-norm",
            lambda spec: CosineScore(spec.num_heads, spec.head_dim),
            frozenset({"dot_form_exact", "any_width"}),
            dot_form=_dot_form_cosine,
            relaxes="A4: q and k normalised to unit length before the inner product",
        ),
        _with_dot_form(
            "neg_l2",
            "s = -|q - k|^2",
            "Kim et al. 2021, L2 attention",
            lambda spec: NegL2Score(),
            frozenset({"any_width"}),
            dot_form=_dot_form_neg_l2,
            relaxes="A4: a negative squared distance (adds -|k|^2 per key)",
        ),
        Choice(
            "mlp",
            "s = w_2 . GELU(W_q' q + W_k' k + b) + c",
            "our choice: an MLP on [q; k]",
            lambda spec: MLPScore(spec.head_dim),
            frozenset({"pairwise"}),
            {"pair_width": lambda module: module.w_q.out_features},
            relaxes="A4: a learned nonlinear score",
        ),
        Choice(
            "talking_heads",
            "s_h = sum_g P_hg q_g . k_g, P a learned H x H matrix from the identity",
            "Shazeer et al. 2020, arXiv:2003.02436, sec. 4 (talking-heads attention, the logits' projection)",
            lambda spec: TalkingHeadsScore(spec.num_heads, spec.talking_heads_residual),
            frozenset({"any_width", "starts_standard"}),
            {"move": _move_mix},
            relaxes="A4: heads stop being independent, the logits are mixed across heads before the normalizer",
        ),
    ],
    SCORE_TRAITS,
)
"""Every score (A4): formula, source, module factory ``impl(spec)`` and traits."""


def build_score(spec: AttentionSpec) -> nn.Module:
    """The score module for ``spec.score``."""
    return SCORES[spec.score].implementation()(spec)
