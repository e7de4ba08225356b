"""Position — how token order re-enters a map that A0 made permutation invariant.

Positions are absolute indices. Keys sit at 0..k_len-1; queries are aligned bottom-right, at
q_offset..q_offset+q_len-1 with q_offset = k_len - q_len (the last query sits with the last key, as a KV cache needs).

Choices:
    none        no position information: without a causal mask the layer is permutation equivariant.
    sinusoidal  PE(p, 2i) = sin(p / 10000^(2i/dim)), PE(p, 2i+1) = cos(...) (Vaswani et al. 2017, sec. 3.5), added to
                the query and key *inputs* before their projections, not to the values **(our choice: position enters
                only through the scores)**.
    learned     a learned (max_len, dim) table, added like ``sinusoidal``.
    rope        rotary embedding (Su et al. 2021, eq. 34) on q and k per head, "rotate-half" pairing (i, i + head_dim/2),
                theta_i = 10000^(-2i/head_dim).
    alibi       score bias -m_h (p_i - p_j) (Press et al. 2022, sec. 3) with their head slopes m_h; without a causal
                mask the bias is -m_h |p_i - p_j| **(our choice)**.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from axiomformer.spec import AttentionSpec

ROPE_BASE = 10000.0


def sinusoidal_table(positions: Tensor, dim: int) -> Tensor:
    """Sinusoidal encodings (len(positions), dim) in float32 for integer ``positions`` (Vaswani et al. 2017, 3.5)."""
    pos = positions.float().unsqueeze(-1)
    i = torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32)
    angle = pos * torch.exp(-math.log(10000.0) * i / dim)
    table = torch.zeros(positions.shape[0], dim, device=positions.device)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : dim // 2])
    return table


def rope_cos_sin(positions: Tensor, head_dim: int, base: float = ROPE_BASE) -> tuple[Tensor, Tensor]:
    """cos and sin of the RoPE angles p * base^(-2i/head_dim), each (len(positions), head_dim / 2), float32."""
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    angle = positions.float().unsqueeze(-1) * inv_freq                # (L, head_dim / 2)
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
    def forward(ctx, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        ctx.save_for_backward(cos, sin)
        return _rotate_(torch.empty_like(x), x, cos, sin)

    @staticmethod
    def backward(ctx, grad: Tensor):
        cos, sin = ctx.saved_tensors
        return _Rope.apply(grad, cos, -sin), None, None          # differentiable again (double backward)


def apply_rope(x: Tensor, positions: Tensor, base: float = ROPE_BASE) -> Tensor:
    """Rotate x (batch, heads, seq, head_dim) by its positions (seq,), rotate-half convention (Su et al. 2021,
    eq. 34): x cos + rotate_half(x) sin. Angles in float32; the rotation in x's dtype (float32 for half types).

    Raises:
        ValueError: odd head_dim (RoPE rotates pairs of coordinates).
    """
    if x.shape[-1] % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {x.shape[-1]}")
    cos, sin = rope_cos_sin(positions, x.shape[-1], base)
    work = x if x.dtype in (torch.float32, torch.float64) else x.float()
    return _Rope.apply(work, cos.to(work.dtype), sin.to(work.dtype)).to(x.dtype)


def alibi_slopes(num_heads: int) -> Tensor:
    """ALiBi head slopes m_h (Press et al. 2022): geometric 2^(-8/n) for n a power of two, else interleaved."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        return torch.tensor(power_of_two(num_heads))
    closest = 2 ** math.floor(math.log2(num_heads))
    extra = alibi_slopes(2 * closest).tolist()[0::2][: num_heads - closest]
    return torch.tensor(power_of_two(closest) + extra)


def alibi_bias(slopes: Tensor, q_positions: Tensor, k_positions: Tensor, causal: bool) -> Tensor:
    """ALiBi score bias (1, heads, q_len, k_len): -m_h (p_i - p_j), or -m_h |p_i - p_j| when not causal."""
    distance = q_positions.float().unsqueeze(-1) - k_positions.float().unsqueeze(-2)
    distance = distance if causal else distance.abs()
    return -slopes.float().view(1, -1, 1, 1) * distance.unsqueeze(0)


class Position(nn.Module):
    """The position choice of a spec: adds input encodings, rotates q/k, or provides ALiBi slopes."""

    def __init__(self, spec: AttentionSpec):
        super().__init__()
        self.kind = spec.position
        self.dim = spec.dim
        self.max_len = spec.max_len
        if self.kind == "learned":
            self.table = nn.Embedding(spec.max_len, spec.dim)
            nn.init.normal_(self.table.weight, std=0.02)
        if self.kind == "alibi":
            self.register_buffer("slopes", alibi_slopes(spec.num_heads), persistent=False)

    def encode_inputs(self, x: Tensor, positions: Tensor) -> Tensor:
        """x (batch, seq, dim) plus the absolute encodings of ``positions`` (seq,) for sinusoidal/learned."""
        if self.kind == "sinusoidal":
            return x + sinusoidal_table(positions, self.dim).to(x.dtype)
        if self.kind == "learned":
            if positions.numel() and int(positions.max()) >= self.max_len:
                raise ValueError(
                    f"position {int(positions.max())} is beyond the learned table of max_len={self.max_len}; "
                    f"raise AttentionSpec.max_len"
                )
            return x + self.table(positions).to(x.dtype)
        return x

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """RoPE on q or k (batch, heads, seq, head_dim); identity for the other choices."""
        return apply_rope(x, positions) if self.kind == "rope" else x
