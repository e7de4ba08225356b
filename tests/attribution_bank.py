"""A second bank of attention functions for the audit's attribution, each (q, k, v) -> out on (batch, seq, dim).

Written for issue 23 (audit and derive name the assumption a departure breaks, or say which they cannot tell apart).
``WRONG`` functions each break one assumption in a way that earlier versions of the audit misattributed; ``IN_CLASS``
functions are reparametrizations inside every assumption's class and must pass. ``tests/test_audit_attribution.py``
pins the verdict and the candidates theory predicts for each. Fixed matrices are seeded, never the global RNG.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

DIM = 16
_G = torch.Generator().manual_seed(23)
GATE = torch.randn(DIM, DIM, generator=_G, dtype=torch.float64) / math.sqrt(DIM)
W_VALUE = torch.randn(DIM, DIM, generator=_G, dtype=torch.float64) / math.sqrt(DIM)
W_OUT = torch.randn(DIM, DIM, generator=_G, dtype=torch.float64) / math.sqrt(DIM)
W_SCORE = torch.randn(DIM, DIM, generator=_G, dtype=torch.float64) / math.sqrt(DIM)
VEC = torch.randn(DIM, generator=_G, dtype=torch.float64)
TEMPERATURES = torch.linspace(0.5, 2.0, DIM, dtype=torch.float64)


def _mat(m: Tensor, x: Tensor) -> Tensor:
    return m.to(x.dtype)


def _sdpa(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, bias: Tensor | None = None) -> Tensor:
    """One-head softmax(q.k / sqrt(d) + bias) v with a bottom-right causal mask."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if bias is not None:
        s = s + bias
    if causal:
        L, S = q.shape[1], k.shape[1]
        blocked = torch.ones(L, S, dtype=torch.bool).triu(S - L + 1)
        s = s.masked_fill(blocked, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


# ----------------------------------------------------------------------------------------------- wrong functions
def query_output_gate(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """An elementwise sigmoid gate computed from the query token times SDPA (the output gate of gated attention)."""
    return torch.sigmoid(q @ _mat(GATE, q)) * _sdpa(q, k, v, causal)


def query_scalar_gate(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """One scalar per query, 1 + tanh(q . w), times SDPA: the weights of a row sum to that scalar."""
    return (1 + torch.tanh(q @ _mat(VEC, q))).unsqueeze(-1) * _sdpa(q, k, v, causal)


def value_reading_score(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """softmax((q.k + q.v / 2) / sqrt(d)) v: the score reads the values (A4)."""
    return _sdpa(q, k + 0.5 * v, v, causal)


def scalable_softmax(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """Scalable-Softmax: temperature proportional to log n, n the number of keys query i sees (Nakanishi 2025)."""
    L, S = q.shape[1], k.shape[1]
    seen = torch.arange(S - L + 1, S + 1, dtype=q.dtype) if causal else torch.full((L,), float(S), dtype=q.dtype)
    return _sdpa(q * torch.log(seen).clamp_min(0.5).unsqueeze(-1), k, v, causal)


def key_content_bias(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """A per-key content bias w . k_j added to every score of key j (what a query-projection bias contributes)."""
    return _sdpa(q, k, v, causal, bias=(k @ _mat(VEC, k)).unsqueeze(-2) / math.sqrt(q.shape[-1]))


def per_coordinate_temperature(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """Coordinate m of the output uses softmax(tau_m q.k / sqrt(d)): a vector of relevances per key (A2)."""
    cols = [_sdpa(t * q, k, v[..., m : m + 1], causal) for m, t in enumerate(TEMPERATURES.tolist())]
    return torch.cat(cols, dim=-1)


def key_gated_values(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """Values gated elementwise by their own key, sigmoid(k_j G) * v_j: per-coordinate weights set by the key."""
    return _sdpa(q, k, torch.sigmoid(k @ _mat(GATE, k)) * v, causal)


def tanh_after_sum(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """rho = tanh applied after the weighted sum (A1)."""
    return torch.tanh(_sdpa(q, k, v, causal))


def faint_output_gate(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """SDPA times (1 + 1e-6 sigmoid(q G)): an output gate of relative strength 1e-6 (float64 tolerance 1e-9)."""
    return (1 + 1e-6 * torch.sigmoid(q @ _mat(GATE, q))) * _sdpa(q, k, v, causal)


# ----------------------------------------------------------------------------------------- in-class functions
def own_value_map(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """Standard attention with its own value map v W_v^T."""
    return _sdpa(q, k, v @ _mat(W_VALUE, v).T, causal)


def bilinear_score(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """softmax(q^T W k / sqrt(d)) v: W folds into the key projection."""
    return _sdpa(q, k @ _mat(W_SCORE, k).T, v, causal)


def fixed_output_map(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """0.5 SDPA followed by a fixed linear map: a linear rho folds into W_v."""
    return 0.5 * _sdpa(q, k, v, causal) @ _mat(W_OUT, v).T


def query_row_bias(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """softmax((q.k + q.b) / sqrt(d)) v: q.b is the same for every key of a row, which the softmax removes."""
    return _sdpa(q, k, v, causal, bias=(q @ _mat(VEC, q)).unsqueeze(-1))


def two_heads_mixed_values(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """Two heads (head_dim 8) whose values are v W_v^T before the split: W_v mixes the heads' inputs."""
    b, n, d = q.shape

    def split(t: Tensor) -> Tensor:
        return t.view(b, t.shape[1], 2, d // 2).transpose(1, 2)

    vv = v @ _mat(W_VALUE, v).T
    out = F.scaled_dot_product_attention(split(q), split(k), split(vv), is_causal=causal and q.shape[1] == k.shape[1])
    return out.transpose(1, 2).reshape(b, n, d)


WRONG = {
    "query_output_gate": query_output_gate,
    "query_scalar_gate": query_scalar_gate,
    "value_reading_score": value_reading_score,
    "scalable_softmax": scalable_softmax,
    "key_content_bias": key_content_bias,
    "per_coordinate_temperature": per_coordinate_temperature,
    "key_gated_values": key_gated_values,
    "tanh_after_sum": tanh_after_sum,
    "faint_output_gate": faint_output_gate,
}
IN_CLASS = {
    "own_value_map": own_value_map,
    "bilinear_score": bilinear_score,
    "fixed_output_map": fixed_output_map,
    "query_row_bias": query_row_bias,
    "two_heads_mixed_values": two_heads_mixed_values,
}


def query_norm_temperature(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """softmax(q.k / |q|): a temperature set by each query's norm (a row-dependent temperature)."""
    return _sdpa(q / q.norm(dim=-1, keepdim=True) * math.sqrt(q.shape[-1]) ** 0.5, k, v, causal)


WRONG["query_norm_temperature"] = query_norm_temperature


# ------------------------------------------------------------------------- two-head functions and more of the kinds
def _heads(t: Tensor) -> Tensor:
    b, n, d = t.shape
    return t.view(b, n, 2, d // 2).transpose(1, 2)


def _merge(t: Tensor) -> Tensor:
    b, h, n, e = t.shape
    return t.transpose(1, 2).reshape(b, n, h * e)


def _two_heads(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
    causal = causal and q.shape[1] == k.shape[1]
    return F.scaled_dot_product_attention(_heads(q), _heads(k), _heads(v), is_causal=causal)


def gated_two_heads(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """Two heads whose concatenated output is gated elementwise by sigmoid(q G) (gated attention, Qwen3-Next)."""
    return _merge(_two_heads(q, k, v, causal)) * torch.sigmoid(q @ _mat(GATE, q))


def head_scalar_gates(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """Two heads, each scaled by its own query-dependent scalar 1 + tanh(sum of its query)."""
    return _merge(_two_heads(q, k, v, causal) * (1 + torch.tanh(_heads(q).sum(-1, keepdim=True))))


def value_norm_score(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """softmax(q.k / sqrt(d) + |v_j|^2 / 4) v: a per-key term read from the values (A4)."""
    return _sdpa(q, k, v, causal, bias=(v * v).sum(-1).unsqueeze(-2) / 4)


def silu_after_sum(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """y * sigmoid(y) after the weighted sum: a gate computed from the output itself (a nonlinear rho, A1)."""
    y = _sdpa(q, k, v, causal)
    return y * torch.sigmoid(y)


def two_heads_with_projections(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """Two heads with a value map and bias before the split and an output map that mixes the heads, plus a bias:
    in class, but which weights belong to which head is not identifiable from outside."""
    vv = v @ _mat(W_VALUE, v).T + _mat(VEC, v)
    return _merge(_two_heads(q, k, vv, causal)) @ _mat(W_OUT, v).T + 1.0


WRONG.update(
    {
        "gated_two_heads": gated_two_heads,
        "head_scalar_gates": head_scalar_gates,
        "value_norm_score": value_norm_score,
        "silu_after_sum": silu_after_sum,
    }
)
IN_CLASS_MIXED_HEADS = {"two_heads_with_projections": two_heads_with_projections}
HEADS = {"two_heads_mixed_values": 2, "gated_two_heads": 2, "head_scalar_gates": 2, "two_heads_with_projections": 2}
"""Heads of the functions that have more than one."""


def softmax_in_float32(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """SDPA on float64 tensors whose softmax runs in float32 (for stability): in class, at float32 precision."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        L, S = q.shape[1], k.shape[1]
        s = s.masked_fill(torch.ones(L, S, dtype=torch.bool).triu(S - L + 1), float("-inf"))
    return torch.softmax(s.float(), dim=-1).to(v.dtype) @ v


IN_CLASS["softmax_in_float32"] = softmax_in_float32


def context_gate(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """SDPA gated elementwise by sigmoid(mean_j k_j G): a gate computed from the whole context (every key)."""
    return _sdpa(q, k, v, causal) * torch.sigmoid(k.mean(1, keepdim=True) @ _mat(GATE, k))


WRONG["context_gate"] = context_gate


# ----------------------------------------------------------------------------------------------- issue 26's stretch
def _scores(q: Tensor, k: Tensor, causal: bool) -> tuple[Tensor, Tensor]:
    """q.k / sqrt(d) and the bool visibility (bottom-right causal)."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    L, S = q.shape[1], k.shape[1]
    visible = ~torch.ones(L, S, dtype=torch.bool).triu(S - L + 1) if causal else torch.ones(L, S, dtype=torch.bool)
    return s, visible


def power_normalizer(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """u = s^2 / sum_l s_l^2 of the bilinear scores (symmetric power attention, p = 2): a normalizer other than the
    softmax (A5) whose log-weights 2 log|q.k| are a function of one bilinear form, as a score g(q.k) (A4) gives."""
    s, visible = _scores(q, k, causal)
    w = s.square() * visible
    return (w / w.sum(-1, keepdim=True)) @ v


def sinkhorn_normalizer(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """exp(s) normalized over rows, columns, rows (Sinkformers): a query's weights read the other queries (A5)."""
    s, visible = _scores(q, k, causal)
    w = torch.exp(s - s.amax((-2, -1), keepdim=True)) * visible
    for dim in (-1, -2, -1):
        w = w / w.sum(dim, keepdim=True)
    return w @ v


WRONG.update({"power_normalizer": power_normalizer, "sinkhorn_normalizer": sinkhorn_normalizer})
