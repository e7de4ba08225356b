"""The modules of the derivation chain A0 -> A5: one parametrized general form, narrowed one assumption at a time.

Source: Somani, "A Minimal Route to Transformer Attention" (see ``docs/SOURCES.md``). The Deep Sets form of A0 is
Zaheer et al. 2017, Theorem 2. The parametrization below is **(our choice)**: the source states each assumption as a
constraint; we write the general form so that each constraint is "one sub-network is zero" (A1..A4) or "one row map
is the softmax" (A5), which makes "impose the assumption" a parameter setting that can be checked numerically.

General form (single head, width d, all in float64)::

    s_ij   = (W_q x_i) . (W_k x_j) + m([x_i; x_j])                  m: MLP -> scalar      (removed by A4)
    u_i.   = r(s_i.),   r(s)_j = h_j / ((1 - c) + c sum_k h_k),   h_j = a s_j + b exp(tau (s_j - max_k s_k))
                                                                                            (A5 sets r)
    v(x)   = W_v x + n(x)                                              n: MLP               (removed by A3)
    phi    = u_ij v(x_j) + g([x_j; u_ij])                              g: MLP               (removed by A2)
    y_i    = rho(sum_j phi(x_j, u_ij)),   rho(z) = z + p(z)            p: MLP               (removed by A1)

The sums run over the visible keys j (j <= i + (S - L) when causal: bottom-right alignment). Before A5 the row map r
is the raw score (a=1, b=0, c=0); A5 (relevance is relative, normalized, and kept O(1)) sets a=0, b=1, c=1,
tau=1/sqrt(d), i.e. r = softmax(s / sqrt(d)). The A5 module is axiomformer's standard :class:`Attention`
(one head, no biases, output projection = identity).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from axiomformer.attention import Attention
from axiomformer.spec import AttentionSpec

DTYPE = torch.float64


class MLP(nn.Module):
    """``Linear(in, hidden) -> tanh -> Linear(hidden, out)`` on the last dimension; ``zero_output()`` makes it 0."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.Tanh(), nn.Linear(hidden, out_dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)

    @torch.no_grad()
    def zero_output(self) -> None:
        """Set the output layer to zero, so the MLP computes 0 for every input."""
        self.net[-1].weight.zero_()
        self.net[-1].bias.zero_()


class RowRelevance(nn.Module):
    """r(s)_j = h_j / ((1 - c) + c sum_k h_k), h_j = a s_j + b exp(tau (s_j - max_k s_k)); (..., L, S) -> (..., L, S).

    Masked keys (``mask`` False) get relevance 0 and do not enter the row sum. **(our choice of family)**: it holds
    both the raw score (a=1, b=0, c=0) and the softmax at temperature tau (a=0, b=1, c=1).
    """

    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.tensor(1.0, dtype=DTYPE))
        self.b = nn.Parameter(torch.tensor(0.0, dtype=DTYPE))
        self.tau = nn.Parameter(torch.tensor(1.0, dtype=DTYPE))
        self.c = nn.Parameter(torch.tensor(0.0, dtype=DTYPE))

    def forward(self, s: Tensor, mask: Tensor) -> Tensor:
        # The exponential is taken relative to the row maximum of the visible scores, so nothing overflows; with
        # a=0 and c=1 the row maximum cancels and r is exactly the softmax.
        row_max = s.masked_fill(~mask, float("-inf")).amax(-1, keepdim=True).clamp_min(-1e30)
        h = self.a * s + self.b * torch.exp(self.tau * (s - row_max))
        h = h.masked_fill(~mask, 0.0)
        return h / ((1 - self.c) + self.c * h.sum(-1, keepdim=True))

    @torch.no_grad()
    def impose_softmax(self, d: int) -> None:
        """A5: relative (shift-invariant), normalized relevance with the 1/sqrt(d) temperature."""
        self.a.fill_(0.0)
        self.b.fill_(1.0)
        self.c.fill_(1.0)
        self.tau.fill_(1.0 / math.sqrt(d))


def visible(q_len: int, k_len: int, causal: bool, device=None) -> Tensor:
    """Bool (q_len, k_len), True = key j visible to query i (bottom-right causal alignment)."""
    if not causal:
        return torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    i = torch.arange(q_len, device=device).unsqueeze(-1) + (k_len - q_len)
    return torch.arange(k_len, device=device).unsqueeze(0) <= i


class GeneralForm(nn.Module):
    """y_i = rho(sum_j phi(x_j, u_ij)) in the parametrization of the module docstring.

    A sub-network set to ``None`` is absent (its assumption has been imposed): ``rho=None`` is A1, ``g=None`` A2,
    ``n=None`` A3, ``m=None`` A4. Submodules are shared, not copied, between the steps of the chain.

    Forward: ``x`` (batch, L, d) queries, ``context`` (batch, S, d) keys/values (default ``x``) -> (batch, L, d).
    """

    def __init__(self, d: int, w_q: nn.Linear, w_k: nn.Linear, w_v: nn.Linear, r: RowRelevance,
                 m: MLP | None, n: MLP | None, g: MLP | None, rho: MLP | None):
        super().__init__()
        self.d = d
        self.w_q, self.w_k, self.w_v, self.r = w_q, w_k, w_v, r
        self.m, self.n, self.g, self.rho = m, n, g, rho

    @classmethod
    def general(cls, d: int, hidden: int = 16, seed: int = 0) -> "GeneralForm":
        """The A0 module with every sub-network present, seeded (weights drawn by PyTorch's default init)."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            lin = [nn.Linear(d, d, bias=False).to(DTYPE) for _ in range(3)]
            parts = [MLP(2 * d, hidden, 1), MLP(d, hidden, d), MLP(d + 1, hidden, d), MLP(d, hidden, d)]
        return cls(d, *lin, RowRelevance(), *(p.to(DTYPE) for p in parts))

    def without(self, part: str) -> "GeneralForm":
        """The next, simpler module: the same (shared) parameters with sub-network ``part`` removed."""
        kept = {name: getattr(self, name) for name in ("m", "n", "g", "rho")}
        kept[part] = None
        return GeneralForm(self.d, self.w_q, self.w_k, self.w_v, self.r, **kept)

    def relevance(self, x: Tensor, ctx: Tensor, mask: Tensor) -> Tensor:
        """u (batch, L, S)."""
        s = self.w_q(x) @ self.w_k(ctx).transpose(-2, -1)
        if self.m is not None:
            shape = (*x.shape[:-1], ctx.shape[-2], self.d)
            pair = torch.cat([x.unsqueeze(-2).expand(shape), ctx.unsqueeze(-3).expand(shape)], dim=-1)
            s = s + self.m(pair).squeeze(-1)
        return self.r(s, mask)

    def forward(self, x: Tensor, context: Tensor | None = None, causal: bool = False) -> Tensor:
        ctx = x if context is None else context
        mask = visible(x.shape[-2], ctx.shape[-2], causal, x.device)
        u = self.relevance(x, ctx, mask)                                   # (B, L, S)
        v = self.w_v(ctx) if self.n is None else self.w_v(ctx) + self.n(ctx)
        z = u @ v                                                          # sum_j u_ij v(x_j)
        if self.g is not None:
            pair = torch.cat([ctx.unsqueeze(-3).expand(*u.shape, self.d), u.unsqueeze(-1)], dim=-1)
            z = z + (self.g(pair) * mask.unsqueeze(-1)).sum(-2)            # sum over visible j of g([x_j; u_ij])
        return z if self.rho is None else z + self.rho(z)


class StandardForm(nn.Module):
    """The A5 module: axiomformer's standard :class:`Attention` (one head, no biases, out_proj = identity).

    It takes W_q, W_k, W_v from the A4 module. ``engine="reference"`` **(our choice)** so that the final comparison
    with ``torch.nn.functional.scaled_dot_product_attention`` is between two independent implementations.
    """

    def __init__(self, prev: GeneralForm):
        super().__init__()
        self.d = prev.d
        self.attn = self._build(prev, causal=False)
        self.causal_attn = self._build(prev, causal=True)

    @staticmethod
    def _build(prev: GeneralForm, causal: bool) -> Attention:
        spec = AttentionSpec.standard(prev.d, 1, causal=causal, bias=False)
        attn = Attention(spec, engine="reference").to(DTYPE)
        with torch.no_grad():
            attn.q_proj.weight.copy_(prev.w_q.weight)
            attn.k_proj.weight.copy_(prev.w_k.weight)
            attn.v_proj.weight.copy_(prev.w_v.weight)
            attn.out_proj.weight.copy_(torch.eye(prev.d, dtype=DTYPE))
        return attn.eval()

    def forward(self, x: Tensor, context: Tensor | None = None, causal: bool = False) -> Tensor:
        ctx = x if context is None else context
        return (self.causal_attn if causal else self.attn)(x, ctx, ctx)
