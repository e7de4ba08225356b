"""Position — how token order re-enters a map that A0 made permutation invariant.

Positions are absolute token positions, resolved by :func:`token_positions` in this order:

1. ``position_ids`` given by the caller ((q_len,) or (batch, q_len); the new keys of self-attention share them);
2. derived from the key padding mask of a self-attention call: each real token's position is the number of real
   tokens before it (``cumsum(mask) - 1``, the convention of transformers' generation utilities), so left padding
   does not move the real tokens;
3. continued from the positions a :class:`~axiomformer.attention.KVCache` stored;
4. by default the indices: keys at 0..k_len-1, queries aligned bottom-right at q_offset..q_offset+q_len-1 with
   q_offset = k_len - q_len (the last query sits with the last key, as a KV cache needs). A query longer than its
   keys (q_len > k_len) therefore starts at a negative position.

The causal mask stays index-based (bottom-right); padding is excluded by the key padding mask.

Choices:
    none        no position information: without a causal mask the layer is permutation equivariant.
    sinusoidal  PE(p, 2i) = sin(p / 10000^(2i/dim)), PE(p, 2i+1) = cos(...) (Vaswani et al. 2017, sec. 3.5), added to
                the query and key *inputs* before their projections, not to the values **(our choice: position enters
                only through the scores)**.
    learned     a learned (max_len, dim) table, added like ``sinusoidal``. Negative positions (queries before the first
                key, q_len > k_len) take row 0 **(our choice: the table has no rows before position 0; clipping to
                the table's edge is what learned relative tables do, Shaw et al. 2018, sec. 3.2)**.
    rope        rotary embedding (Su et al. 2021, eq. 34) on q and k per head, "rotate-half" pairing (i, i + head_dim/2),
                theta_i = 10000^(-2i/head_dim). Rotated *before* the score and normalizer: with the dot score and a
                shift-invariant use of scores the result depends on p_i - p_j only; with the ``linear`` normalizer
                (kernel feature map applied to the rotated q, k) or a non-dot score it also depends on the absolute
                positions **(our choice; see docs/positions.md)**. Absolute positions are therefore always the
                token positions above, never raw indices of a padded row.
    alibi       score bias -m_h (p_i - p_j) (Press et al. 2022, sec. 3) with their head slopes m_h; without a causal
                mask the bias is -m_h |p_i - p_j| **(our choice)**.
    forget      the Forgetting Transformer's data-dependent decay (Lin et al. 2025, arXiv:2503.02130, eq. 5-6): score
                bias D_ij = sum_{l = j+1..i} log f_l with f_l = sigmoid(w_h . x_l + b_h) per head, x_l the layer's
                key input at token l; ALiBi is its constant case (log f_l = -m_h). Causal only. The sum runs over
                the key stream's tokens in index order (a cached key keeps its running sum, so decoding step by step
                gives the rows of the full computation); a padding token has log f = 0 **(our choice: padding is
                not a token, so left padding changes nothing)**. A query sits at key index q_offset + i.
    cope        contextual position encoding (Golovneva et al. 2024, arXiv:2405.18719, eq. 3-6): gates
                g_ij = sigmoid(s_ij) on the layer's scaled scores, positions p_ij = sum_{visible l, j <= l <= i} g_il
                (counted back from the query), and the score bias q_i . e[p_ij] with e interpolated linearly between
                the learned vectors e[floor p] and e[ceil p] (head_dim each, max_len of them, shared by the heads and
                starting at 0 as in the authors' code; p is clamped to max_len - 1). Causal only. Blocked keys
                (padding, outside the window) open no gate, so padding changes nothing.
    short_conv  a causal depthwise convolution of kernel SHORT_CONV_KERNEL = 4 with a residual on the projected q,
                k and v, h_t + sum_{r=0..3} w_r o h_{t-r} (Allen-Zhu 2025, "Physics of Language Models: Part 4.1",
                Canon layers, the Canon-B position; the ``ShortConvolution`` of the linear-attention layers, there
                without the residual and with a SiLU). A position mechanism outside the sum over keys: order enters
                through the tokens' own features. A padded token enters the convolution as zeros; a KV cache keeps
                the last three projections.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from axiomformer.axes.normalizer import NORMALIZERS
from axiomformer.axes.registry import Choice, Registry
from axiomformer.precision import compute_dtype, upcast

if TYPE_CHECKING:
    from axiomformer.spec import AttentionSpec

ROPE_BASE = 10000.0


def sinusoidal_table(positions: Tensor, dim: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Sinusoidal encodings (*positions.shape, dim) in ``dtype`` (float32 or float64) for integer ``positions`` of any
    shape, e.g. (seq,) or (batch, seq) (Vaswani et al. 2017, sec. 3.5)."""
    pos = positions.to(dtype).unsqueeze(-1)
    i = torch.arange(0, dim, 2, device=positions.device, dtype=dtype)
    angle = pos * torch.exp(-math.log(10000.0) * i / dim)
    table = torch.zeros(*positions.shape, dim, device=positions.device, dtype=dtype)
    table[..., 0::2] = torch.sin(angle)
    table[..., 1::2] = torch.cos(angle[..., : dim // 2])
    return table


def rope_cos_sin(
    positions: Tensor, head_dim: int, base: float = ROPE_BASE, dtype: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor]:
    """cos and sin of the RoPE angles p * base^(-2i/head_dim), each (len(positions), head_dim / 2), in ``dtype``
    (float32 or float64)."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=positions.device, dtype=dtype) / head_dim)
    angle = positions.to(dtype).unsqueeze(-1) * inv_freq  # (L, head_dim / 2)
    return angle.cos(), angle.sin()


def _rotate_(out: Tensor, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """out = x cos + rotate_half(x) sin, with rotate_half(x) = [-x2, x1] (x = [x1, x2] split in halves)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    torch.mul(x1, cos, out=out[..., :half]).addcmul_(x2, sin, value=-1.0)
    torch.mul(x2, cos, out=out[..., half:]).addcmul_(x1, sin)
    return out


class _Rope(torch.autograd.Function):
    """RoPE as one rotation per pair (x1_i, x2_i); the backward is the inverse rotation (angle -theta), itself a
    ``_Rope``, so every order of derivative works."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        ctx.save_for_backward(cos, sin)
        return _rotate_(torch.empty_like(x), x, cos, sin)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        cos, sin = ctx.saved_tensors
        return _Rope.apply(grad, cos, -sin), None, None  # differentiable again (double backward)


def apply_rope(x: Tensor, positions: Tensor, base: float = ROPE_BASE) -> Tensor:
    """Rotate x (batch, heads, seq, head_dim) by its positions, (seq,) or per row (batch, seq), rotate-half
    convention (Su et al. 2021, eq. 34): x cos + rotate_half(x) sin. Angles in float32; the rotation in x's dtype
    (float32 for half types).

    Raises:
        ValueError: odd head_dim (RoPE rotates pairs of coordinates).
    """
    if x.shape[-1] % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {x.shape[-1]}")
    work = upcast(x)
    cos, sin = rope_cos_sin(positions, x.shape[-1], base, work.dtype)
    if positions.dim() == 2:  # (batch, seq, hd/2) -> (batch, 1, seq, hd/2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    cos, sin = cos.to(work.dtype), sin.to(work.dtype)
    if torch.compiler.is_compiling():
        # The same rotation in plain ops: Dynamo cannot trace the in-place ``out=`` halves of ``_Rope``.
        half = work.shape[-1] // 2
        x1, x2 = work[..., :half], work[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
    return _Rope.apply(work, cos, sin).to(x.dtype)


def apply_rope_halves(x: Tensor, positions: Tensor, base: float = ROPE_BASE) -> Tensor:
    """The Differential Transformer's RoPE (``diff_authors``): each half of a head (width head_dim / 2) rotated apart
    by the same angles p * base^(-2i / (head_dim / 2)), pairs interleaved (2i, 2i + 1), as the authors' layer calls
    flash-attn's ``apply_rotary_emb(..., interleaved=True)`` on its half-width heads (microsoft/unilm
    Diff-Transformer, ``multihead_diffattn.py``). x (batch, heads, seq, head_dim), head_dim divisible by 4."""

    def interleaved(half: Tensor) -> Tensor:
        # interleaved pairs (2i, 2i + 1) are rotate-half's pairs (i, i + w/2) after taking the even, then the odd ones
        w = half.shape[-1]
        rotated = apply_rope(torch.cat([half[..., 0::2], half[..., 1::2]], -1), positions, base)
        return torch.stack([rotated[..., : w // 2], rotated[..., w // 2 :]], -1).flatten(-2)

    return _each_half(x, interleaved)


def _each_half(x: Tensor, rotate: Callable[[Tensor], Tensor]) -> Tensor:
    """``rotate`` applied to each half of every head of x (batch, heads, seq, head_dim) as to a head of its own."""
    b, h, n, d = x.shape
    halves = x.unflatten(-1, (2, d // 2)).transpose(2, 3).reshape(b, 2 * h, n, d // 2)
    return rotate(halves).view(b, h, 2, n, d // 2).transpose(2, 3).reshape(b, h, n, d)


def alibi_slope_list(num_heads: int) -> list[float]:
    """ALiBi head slopes m_h (Press et al. 2022) as Python floats: geometric 2^(-8/n) for n a power of two, else
    interleaved."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_two(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_two(closest) + alibi_slope_list(2 * closest)[0::2][: num_heads - closest]


def alibi_slopes(num_heads: int) -> Tensor:
    """ALiBi head slopes m_h (num_heads,) float32 (see :func:`alibi_slope_list`)."""
    return torch.tensor(alibi_slope_list(num_heads))


def alibi_bias(slopes: Tensor, q_positions: Tensor, k_positions: Tensor, causal: bool) -> Tensor:
    """ALiBi score bias (1 or batch, heads, q_len, k_len): -m_h (p_i - p_j), or -m_h |p_i - p_j| when not causal.
    Positions are (q_len,) and (k_len,), or per row (batch, q_len) and (batch, k_len)."""
    slopes = upcast(slopes)  # float64 slopes (a module in float64) keep their precision
    distance = q_positions.to(slopes.dtype).unsqueeze(-1) - k_positions.to(slopes.dtype).unsqueeze(-2)
    distance = distance if causal else distance.abs()
    return -slopes.view(1, -1, 1, 1) * distance.unsqueeze(-3)


SHORT_CONV_KERNEL = 4
"""Kernel width of ``position=short_conv`` (Canon layers and the linear-attention layers' ShortConvolution use 4)."""


class _CausalConv(torch.autograd.Function):
    """y = x + the causal depthwise convolution of x (see :func:`causal_conv`), as K in-place multiply-adds of x's
    shifted rows forward and 2 K backward. It keeps x, the weight and the history, no padded copy of x:
    ``F.conv1d`` on the channels-first copy took 45 ms forward and backward for q, k and v at L = 1024, dim 512
    (one thread), as much as the attention itself, and these passes 23 ms **(our choice)**."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, history: Tensor) -> Tensor:
        size, n = weight.shape[-1], x.shape[1]
        y = torch.addcmul(x, x, weight[..., size - 1])
        for r in range(1, size):  # x_{t - r}: x[t - r] for t >= r, history[size - 1 - r + t] before
            w, m = weight[..., size - 1 - r], min(r, n)
            y[:, r:].addcmul_(x[:, : max(0, n - r)], w)
            y[:, :m].addcmul_(history[:, size - 1 - r : size - 1 - r + m], w)
        ctx.save_for_backward(x, weight, history)
        return y

    @staticmethod
    def backward(ctx: Any, grad_y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x, weight, history = ctx.saved_tensors
        size, n = weight.shape[-1], x.shape[1]
        tokens = (0, 1)
        grad_x = torch.addcmul(grad_y, grad_y, weight[..., size - 1])
        grad_h = torch.zeros_like(history)
        taps = [(grad_y * x).sum(tokens)]
        for r in range(1, size):
            w, m, h = weight[..., size - 1 - r], min(r, n), slice(size - 1 - r, size - 1 - r + min(r, n))
            grad_x[:, : max(0, n - r)].addcmul_(grad_y[:, r:], w)
            grad_h[:, h].addcmul_(grad_y[:, :m], w)
            taps.append(
                (grad_y[:, r:] * x[:, : max(0, n - r)]).sum(tokens) + (grad_y[:, :m] * history[:, h]).sum(tokens)
            )
        return grad_x, torch.stack(taps[::-1], -1), grad_h


def causal_conv(x: Tensor, weight: Tensor, history: Tensor | None) -> tuple[Tensor, Tensor]:
    """x + the causal depthwise convolution of x, and the last ``kernel - 1`` inputs (the next call's history).

    x (batch, seq, *channels), any strides (a head-split view (batch, seq, heads, head_dim) stays one); weight
    (prod(channels), kernel): y_t = x_t + sum_r weight[:, kernel - 1 - r] o x_{t - r}; history (batch, kernel - 1,
    *channels), the inputs before x (zeros when None).
    """
    channels, width = x.shape[2:], weight.shape[-1] - 1
    if history is None:
        history = x.new_zeros(x.shape[0], width, *channels)
    history = history.to(x.dtype)
    y = _CausalConv.apply(x, weight.to(x.dtype).view(*channels, width + 1), history)
    return y, torch.cat([history, x[:, -width:]], dim=1)[:, -width:]


def apply_rope_each_half(x: Tensor, positions: Tensor, base: float = ROPE_BASE) -> Tensor:
    """RoPE for a normalizer that scores the two halves of a head apart (trait ``halves``, ``normalizer=diff``):
    each half (width head_dim / 2) rotated by itself in the rotate-half convention, so that q1 . k1 and q2 . k2 each
    depend on p_i - p_j only (one rotation over the whole head would pair a coordinate of q1 with one of q2).
    x (batch, heads, seq, head_dim), head_dim divisible by 4."""
    return _each_half(x, lambda half: apply_rope(half, positions, base))


def _rope_for(spec: AttentionSpec) -> Callable[[Tensor, Tensor], Tensor]:
    """The rotation a spec's queries and keys take: per half of a head for a ``halves`` normalizer (the authors'
    interleaved pairs with ``diff_authors``), over the whole head otherwise."""
    if spec.diff_head_norm:
        return apply_rope_halves
    if NORMALIZERS.has(spec.normalizer, "halves"):
        return apply_rope_each_half
    return apply_rope


class Position(nn.Module):
    """The position choice of a spec: adds input encodings, rotates q/k, or provides ALiBi slopes."""

    # Registered only for the choices that use them (alibi, conv): declared for the type checker.
    slopes: Tensor
    conv_q: Tensor
    conv_k: Tensor
    conv_v: Tensor

    def __init__(self, spec: AttentionSpec):
        super().__init__()
        self.kind = spec.position
        self.rope = _rope_for(spec)
        self.dim = spec.dim
        self.max_len = spec.max_len
        if self.kind == "learned":
            self.table = nn.Embedding(spec.max_len, spec.dim)
            nn.init.normal_(self.table.weight, std=0.02)
        if self.kind == "alibi":
            self.register_buffer("slopes", alibi_slopes(spec.num_heads), persistent=False)
        if POSITIONS.has(self.kind, "decay"):
            self.forget_gate = nn.Linear(spec.dim, spec.num_heads)
        if POSITIONS.has(self.kind, "contextual"):
            self.cope_emb = nn.Parameter(torch.zeros(spec.head_dim, spec.max_len))
        if POSITIONS.has(self.kind, "conv"):  # nn.Conv1d's default bound, 1 / sqrt(fan_in = kernel)
            bound = SHORT_CONV_KERNEL**-0.5
            for name, width in (("conv_q", spec.dim), ("conv_k", spec.kv_dim), ("conv_v", spec.kv_dim)):
                self.register_parameter(
                    name, nn.Parameter(torch.empty(width, SHORT_CONV_KERNEL).uniform_(-bound, bound))
                )

    def short_conv(
        self, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, history: tuple[Tensor, Tensor, Tensor] | None
    ) -> tuple[Tensor, Tensor, Tensor, tuple[Tensor, Tensor, Tensor]]:
        """``position=short_conv`` on the projected q (batch, q_len, dim), k, v (batch, k_len, kv_dim), or on their
        head-split views (batch, seq, heads, head_dim) with ``keep`` None: each plus its causal depthwise convolution; ``keep`` (batch, k_len) False at padded tokens (zeros in the convolution, and
        in q's too in self-attention when the lengths match); ``history`` the cache's last inputs. Returns q, k, v and
        the new history."""
        if keep is not None:
            k, v = k * keep[..., None].to(k.dtype), v * keep[..., None].to(v.dtype)
            if q.shape[1] == k.shape[1]:
                q = q * keep[..., None].to(q.dtype)
        past = history or (None, None, None)
        q, hq = causal_conv(q, self.conv_q, past[0])
        k, hk = causal_conv(k, self.conv_k, past[1])
        v, hv = causal_conv(v, self.conv_v, past[2])
        return q, k, v, (hq, hk, hv)

    def contextual_bias(self, q: Tensor, logits: Tensor) -> Tensor:
        """CoPE's score bias q_i . e[p_ij] (batch, heads, q_len, k_len) in max(q dtype, float32).

        Args:
            q: (batch, heads, q_len, head_dim) the projected queries.
            logits: (batch, heads, q_len, k_len) the scaled scores, -inf where the key is blocked (no gate opens).
        """
        dtype = compute_dtype(q.dtype, logits.dtype)
        gates = torch.sigmoid(logits.to(dtype))
        # p_ij = sum_{l >= j} g_il: a reverse cumulative sum (blocked keys, the causal future included, add 0)
        pos = gates.flip(-1).cumsum(-1).flip(-1)
        npos = min(self.max_len, logits.shape[-1] + 1)  # p <= the number of keys: the table beyond is never read
        pos = pos.clamp(max=npos - 1)
        per_position = q.to(dtype) @ self.cope_emb[:, :npos].to(dtype)  # (batch, heads, q_len, npos): q_i . e[n]
        floor = pos.floor()
        w = pos - floor  # NaN where the row sees a NaN score: the bias stays NaN there, the index must not
        low = per_position.gather(-1, floor.nan_to_num(0.0).long())
        high = per_position.gather(-1, pos.ceil().nan_to_num(0.0).long())
        return high * w + low * (1 - w)

    def forget_sums(self, x: Tensor, key_padding_mask: Tensor | None, past: Tensor | None) -> Tensor:
        """Running sums c_l = sum_{m <= l} log f_m of the forget gates, (batch, heads, k_len), float32 or float64.

        Args:
            x: (batch, new_k_len, dim) the key inputs of this call.
            key_padding_mask: (batch, k_len) bool over every key (cached ones first), True = real token, or None.
            past: (batch, heads, past_len) the running sums a KV cache kept, or None.
        """
        log_f = F.logsigmoid(upcast(self.forget_gate(x))).transpose(1, 2)  # (batch, heads, new_k_len)
        if key_padding_mask is not None:
            real = key_padding_mask[:, key_padding_mask.shape[-1] - x.shape[1] :].unsqueeze(1)
            log_f = torch.where(real, log_f, torch.zeros_like(log_f))
        sums = log_f.cumsum(-1)
        if past is not None and past.shape[-1]:
            sums = torch.cat([past, sums + past[..., -1:]], dim=-1)
        return sums

    @staticmethod
    def decay_bias(sums: Tensor, q_len: int, q_offset: int) -> Tensor:
        """D_ij = c_{q_offset + i} - c_j (batch, heads, q_len, k_len) float32 from the running sums c (batch, heads,
        k_len): sum_{l = j+1..i} log f_l for j <= i (positive beyond the diagonal, where the causal mask blocks)."""
        index = (torch.arange(q_len, device=sums.device) + q_offset).clamp(0, max(sums.shape[-1] - 1, 0))
        return sums[..., index].unsqueeze(-1) - sums.unsqueeze(-2)

    def encode_inputs(self, x: Tensor, positions: Tensor) -> Tensor:
        """x (batch, seq, dim) plus the encodings of ``positions`` ((seq,) or (batch, seq)) for sinusoidal/learned.

        Raises:
            ValueError: a learned position at or beyond ``max_len``.
        """
        if self.kind == "sinusoidal":
            return x + sinusoidal_table(positions, self.dim, compute_dtype(x.dtype)).to(x.dtype)
        if self.kind == "learned":
            # The check reads a value back to the host; while torch.compile traces it is left to the eager calls.
            if not torch.compiler.is_compiling() and positions.numel() and int(positions.max()) >= self.max_len:
                raise ValueError(
                    f"position {int(positions.max())} is beyond the learned table of max_len={self.max_len}; "
                    f"raise AttentionSpec.max_len"
                )
            return x + self.table(positions.clamp(min=0)).to(x.dtype)
        return x

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """RoPE on q or k (batch, heads, seq, head_dim), positions (seq,) or (batch, seq); identity otherwise."""
        return self.rope(x, positions) if self.kind == "rope" else x

    def score_bias(self, positions: TokenPositions, k_positions: Tensor, causal: bool) -> Tensor | None:
        """The ALiBi bias (batch|1, heads, q_len, k_len) for positions other than the indices, else None (the
        engines then apply ALiBi from the index positions themselves, with their fast paths).

        ``k_positions`` are the positions of every key (cached ones included), (k_len,) or (batch, k_len).
        """
        if self.kind != "alibi" or positions.default:
            return None
        return alibi_bias(self.slopes, positions.q, k_positions, causal)


def positions_from_padding(key_padding_mask: Tensor) -> Tensor:
    """Token positions (batch, k_len) int64 from a key padding mask (batch, k_len), True = real token: a real token
    sits at the number of real tokens before it (``cumsum - 1``); a padding token keeps its index (it is never
    attended, so its position only has to be valid)."""
    index = torch.arange(key_padding_mask.shape[-1], device=key_padding_mask.device)
    return torch.where(key_padding_mask, key_padding_mask.long().cumsum(-1) - 1, index)


@dataclass
class TokenPositions:
    """Positions of the queries and of the new keys of one attention call.

    Attributes:
        q: (q_len,) or (batch, q_len) int64.
        k: (new_k_len,) or (batch, new_k_len) int64: the keys added by this call (a cache holds the earlier ones).
        default: True when these are the index positions (see the module docstring, rule 4).
    """

    q: Tensor
    k: Tensor
    default: bool


def _as_positions(ids: Tensor, length: int, name: str) -> Tensor:
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.dim() not in (1, 2) or ids.shape[-1] != length:
        raise ValueError(
            f"{name} must be integer positions shaped (seq,) or (batch, seq) with seq={length}; got "
            f"dtype {ids.dtype}, shape {tuple(ids.shape)}"
        )
    return ids.long()


def token_positions(
    q_len: int,
    new_k_len: int,
    past: int,
    device: torch.device,
    *,
    position_ids: Tensor | None = None,
    key_position_ids: Tensor | None = None,
    key_padding_mask: Tensor | None = None,
    cached: Tensor | None = None,
    self_attention: bool = True,
) -> TokenPositions:
    """Resolve the positions of one call (rules 1-4 of the module docstring).

    Args:
        q_len, new_k_len, past: query length, number of new keys, number of cached keys.
        position_ids: positions of the queries, (q_len,) or (batch, q_len).
        key_position_ids: positions of the new keys (cross-attention); self-attention keys share ``position_ids``.
        key_padding_mask: (batch, past + new_k_len) bool, True = real token (used for self-attention only).
        cached: positions (batch, past) a KV cache stored, or None when they are the indices.
        self_attention: the keys are the queries' tokens (``key`` not given).

    Raises:
        ValueError: position ids that are not integers of the right length, naming the shapes.
    """
    k_len = past + new_k_len
    if position_ids is not None or key_position_ids is not None:
        return _given_positions(q_len, new_k_len, past, device, position_ids, key_position_ids, self_attention)
    if key_padding_mask is not None and self_attention and new_k_len == q_len:
        from_mask = _padding_positions(key_padding_mask, q_len, past, device, cached)
        if from_mask is not None:
            return from_mask
    if cached is not None and self_attention and new_k_len == q_len:
        new = cached[:, -1:] + 1 + torch.arange(new_k_len, device=device)
        return TokenPositions(new, new, default=False)
    return TokenPositions(
        torch.arange(k_len - q_len, k_len, device=device), torch.arange(past, k_len, device=device), default=True
    )


def _given_positions(
    q_len: int,
    new_k_len: int,
    past: int,
    device: torch.device,
    position_ids: Tensor | None,
    key_position_ids: Tensor | None,
    self_attention: bool,
) -> TokenPositions:
    # Rule 1: ids given; the side not given takes the indices (self-attention keys share the queries' ids).
    k_len = past + new_k_len
    q = (
        _as_positions(position_ids, q_len, "position_ids")
        if position_ids is not None
        else torch.arange(k_len - q_len, k_len, device=device)
    )
    if key_position_ids is not None:
        k = _as_positions(key_position_ids, new_k_len, "key_position_ids")
    elif self_attention and position_ids is not None and new_k_len == q_len:
        k = q
    else:
        k = torch.arange(past, k_len, device=device)
    return TokenPositions(q, k, default=False)


def _padding_positions(
    key_padding_mask: Tensor, q_len: int, past: int, device: torch.device, cached: Tensor | None
) -> TokenPositions | None:
    # Rule 2: positions counted over the real tokens of a self-attention call's key padding mask; None when the mask
    # is not a (batch, k_len) bool one (the mask check then raises) or pads nothing on the left of an uncached call.
    k_len = past + q_len
    if key_padding_mask.dtype != torch.bool or key_padding_mask.dim() != 2 or key_padding_mask.shape[-1] != k_len:
        return None
    full = positions_from_padding(key_padding_mask)
    # Whether the mask pads on the left is read back to the host; while torch.compile traces, the positions from
    # the mask are used either way (the same values when nothing pads on the left).
    if (
        cached is not None
        or torch.compiler.is_compiling()
        or not torch.equal(full, torch.arange(k_len, device=device).expand_as(full))
    ):
        return TokenPositions(full[:, k_len - q_len :], full[:, past:], default=False)
    return None


def _move_cope(module: Position, generator: torch.Generator) -> None:
    with torch.no_grad():
        module.cope_emb.add_(0.5 * torch.randn(module.cope_emb.shape, generator=generator).to(module.cope_emb))


POSITIONS = Registry(
    "position",
    [
        Choice("none", "no position information", "Somani, A0 (permutation invariance)"),
        Choice(
            "sinusoidal",
            "PE(p, 2i) = sin(p / 10000^(2i/dim)), PE(p, 2i+1) = cos(...)",
            "Vaswani et al. 2017, sec. 3.5",
            traits=frozenset({"input"}),
            relaxes="A0 (order re-enters): fixed encodings added to the q, k inputs",
        ),
        Choice(
            "learned",
            "a learned (max_len, dim) table added to the inputs",
            "Gehring et al. 2017; Devlin et al. 2019",
            traits=frozenset({"input"}),
            relaxes="A0 (order re-enters): learned encodings added to the q, k inputs",
        ),
        Choice(
            "rope",
            "q, k rotated by angles p * 10000^(-2i/head_dim)",
            "Su et al. 2021, eq. 34",
            traits=frozenset({"rotary"}),
            relaxes="A0 (order re-enters): q, k rotated by their positions",
        ),
        Choice(
            "alibi",
            "score bias -m_h (p_i - p_j)",
            "Press et al. 2022, sec. 3",
            traits=frozenset({"bias"}),
            relaxes="A0 (order re-enters): a fixed linear recency bias per head",
        ),
        Choice(
            "forget",
            "score bias sum_{l=j+1..i} log f_l, f_l = sigmoid(w_h . x_l + b_h) per head",
            "Lin et al. 2025, arXiv:2503.02130, eq. 5-6 (Forgetting Transformer)",
            traits=frozenset({"decay", "causal"}),
            relaxes="A0 (order re-enters): a learned, data-dependent recency decay per head (causal only)",
        ),
        Choice(
            "cope",
            "score bias q_i . e[p_ij], p_ij = sum_{visible l, j <= l <= i} sigmoid(s_il), e[p] interpolated "
            "between learned e[floor p] and e[ceil p]",
            "Golovneva et al. 2024, arXiv:2405.18719, eq. 3-6 (contextual position encoding, CoPE)",
            traits=frozenset({"contextual", "causal", "starts_standard"}),
            extra={"move": _move_cope},
            relaxes="A0 (order re-enters by counting): a key's position is how many gates the query opens between "
            "it and the key, so positions depend on the context and on the scores (causal only)",
        ),
        Choice(
            "short_conv",
            "h_t + sum_{r=0..3} w_r o h_{t-r} on the projected q, k, v (causal, depthwise, kernel 4)",
            "Allen-Zhu 2025, Physics of Language Models Part 4.1, Canon layers (Canon-B)",
            traits=frozenset({"conv"}),
            relaxes="A0 (order re-enters outside the sum): each token's q, k, v mix in its three predecessors' "
            "features",
        ),
    ],
    {
        "input": "added to the query and key inputs before their projections",
        "rotary": "rotates q and k",
        "bias": "a score bias from the heads' slopes (alibi_slopes)",
        "decay": "a score bias from learned gates on the key inputs (Position.forget_sums, Position.decay_bias)",
        "contextual": "a score bias from the scaled scores themselves and the queries (Position.contextual_bias)",
        "starts_standard": "its learned parameters start where it adds nothing; extra['move'](module, generator) "
        "moves them off that point (the audit of a spec audits the relaxation, not its starting point)",
        "causal": "defined only under a causal mask: the spec refuses causal=False",
        "conv": "a short causal convolution of the projected q, k, v (Position.short_conv); a KV cache keeps its "
        "last inputs",
    },
)
"""Every position choice."""
