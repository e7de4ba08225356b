"""The modules of the derivation chain: one general form y_i = rho(sum_j phi(x_j, u_ij)), narrowed one assumption
at a time.

Source: Somani, "A Minimal Route to Transformer Attention" (see ``docs/SOURCES.md``); the Deep Sets form of A0 is
Zaheer et al. 2017, Theorem 2. The parametrization is **(our choice)**: every assumption removes one term (A0..A4)
or sets the row map (A5), so "the module before the step" and "the module after it" are concrete maps whose
properties can be measured (:mod:`axiomformer.derive.properties`).

General form (single head, width d, float64)::

    s_ij  = (W_q x_i) . (W_k x_j) + m([x_i; x_j]) + b_j              b: a bias per key position (A0 removes it)
                                                                     m: MLP -> scalar           (A4 removes it)
    u_i.  = r(s_i.),  r(s)_j = h_j / ((1 - c) + c sum_k h_k),  h_j = a s_j + b' exp(tau(d) (s_j - max_k s_k)),
            tau(d) = d ** -power                                     raw scores before A5; softmax(s / sqrt(d)) after
    v(x)  = W_v x + n(x)                                             n: MLP                     (A3 removes it)
    phi   = u_ij v(x_j) + g([x_j; u_ij])                             g: MLP                     (A2 removes it)
    y_i   = rho(sum_j phi(x_j, u_ij)),  rho(z) = z + p(z)            p: MLP                     (A1 removes it)

The sums run over the visible keys (j <= i + (S - L) when causal: bottom-right alignment).

Plants (``plant="A0"`` .. ``"A5"``) put the standard wrong version of one step into *every* module of the chain, so
the check of that step must fail: A0 the position bias is never removed (order-dependent weights), A1 rho = tanh,
A2 phi = u|u| v(x), A3 v(x) = tanh(W_v x), A4 the cosine score, A5 the softmax without 1/sqrt(d).
"""

from __future__ import annotations

import copy
import math
import types

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from axiomformer.attention import Attention
from axiomformer.runtime import seeded
from axiomformer.spec import AttentionSpec

DTYPE = torch.float64
MAX_LEN = 64
"""Longest context the position bias b_j covers."""
PLANTS = {
    "A0": "order-dependent weights: the bias b_j of key position j stays in every module",
    "A1": "rho = tanh",
    "A2": "contribution u |u| v(x) instead of u v(x)",
    "A3": "values tanh(W_v x) instead of W_v x",
    "A4": "cosine score instead of the dot product",
    "A5": "softmax without the 1/sqrt(d) temperature",
}
"""The standard wrong version of each step, planted by ``axiomformer derive --plant STEP``."""


class MLP(nn.Module):
    """``Linear(in, hidden) -> tanh -> Linear(hidden, out)`` on the last dimension."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.Tanh(), nn.Linear(hidden, out_dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class RowRelevance(nn.Module):
    """r(s)_j = h_j / ((1 - c) + c sum_k h_k), h_j = a s_j + b exp(tau (s_j - max_k s_k)), tau = d ** -power.

    (..., L, S) -> (..., L, S). Masked keys (``mask`` False) get relevance 0 and do not enter the row sum. The family
    **(our choice)** holds the raw score (a=1, b=0, c=0) and the softmax at temperature d ** -power (a=0, b=1, c=1);
    ``d`` is an argument so that the 1/sqrt(d) rule can be evaluated at other head dims.
    """

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.power = 1.0, 0.0, 0.0, 0.5

    def forward(self, s: Tensor, mask: Tensor, d: int) -> Tensor:
        row_max = s.masked_fill(~mask, float("-inf")).amax(-1, keepdim=True).clamp_min(-1e30)
        tau = float(d) ** -self.power
        h = self.a * s + self.b * torch.exp(tau * (s - row_max))
        h = h.masked_fill(~mask, 0.0)
        return h / ((1 - self.c) + self.c * h.sum(-1, keepdim=True))

    def softmax(self, power: float = 0.5) -> RowRelevance:
        """A new row map: softmax(s * d ** -power); A5 uses power 0.5, i.e. softmax(s / sqrt(d))."""
        r = RowRelevance()
        r.a, r.b, r.c, r.power = 0.0, 1.0, 1.0, power
        return r


def visible(q_len: int, k_len: int, causal: bool, device: torch.device | str | None = None) -> Tensor:
    """Bool (q_len, k_len), True = key j visible to query i (bottom-right causal alignment)."""
    if not causal:
        return torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    i = torch.arange(q_len, device=device).unsqueeze(-1) + (k_len - q_len)
    return torch.arange(k_len, device=device).unsqueeze(0) <= i


class GeneralForm(nn.Module):
    """y_i = rho(sum_j phi(x_j, u_ij)) in the parametrization of the module docstring.

    A term set to ``None`` is absent (its assumption holds). Parameters are shared, not copied, down the chain.
    The parts the checks measure are public: :meth:`score`, :meth:`row_map`, :meth:`value`, :meth:`contribution`,
    :meth:`aggregate`; the checks of A0-A3 also measure the composed :meth:`forward` (with the relevances frozen for
    A1-A3), so a departure placed in how ``forward`` composes the parts is caught at its step. Narrowing keeps the
    class, so a subclass that changes a part or ``forward`` stays itself down the chain.

    Forward: ``x`` (batch, L, d) queries, ``context`` (batch, S, d) keys/values (default ``x``) -> (batch, L, d).
    """

    def __init__(
        self,
        d: int,
        w_q: nn.Linear,
        w_k: nn.Linear,
        w_v: nn.Linear,
        r: RowRelevance,
        order: Tensor | None,
        m: MLP | None,
        n: MLP | None,
        g: MLP | None,
        p: MLP | None,
        plant: str | None = None,
    ):
        super().__init__()
        if plant is not None and plant not in PLANTS:
            raise ValueError(f"unknown plant {plant!r}; choose one of: {', '.join(PLANTS)}")
        self.d, self.plant = d, plant
        self.w_q, self.w_k, self.w_v, self.r = w_q, w_k, w_v, r
        self.order = order
        self.m, self.n, self.g, self.p = m, n, g, p

    @classmethod
    def general(cls, d: int, hidden: int = 16, seed: int = 0, plant: str | None = None) -> GeneralForm:
        """The module before A0: every term present, raw-score row map, seeded (PyTorch's default init)."""
        with seeded(seed):
            w_q, w_k, w_v = (nn.Linear(d, d, bias=False).to(DTYPE) for _ in range(3))
            order = torch.randn(MAX_LEN, dtype=DTYPE)
            parts = [MLP(2 * d, hidden, 1), MLP(d, hidden, d), MLP(d + 1, hidden, d), MLP(d, hidden, d)]
        m, n, g, p = (q.to(DTYPE) for q in parts)
        return cls(d, w_q, w_k, w_v, RowRelevance(), order, m, n, g, p, plant=plant)

    def _clone(self) -> GeneralForm:
        """A shallow copy of the same class (a subclass that overrides a part or ``forward`` stays itself down the
        chain) whose own term slots can be changed without touching this module; parameters stay shared."""
        other = copy.copy(self)
        other._modules, other._parameters, other._buffers = (
            dict(self._modules),
            dict(self._parameters),
            dict(self._buffers),
        )
        for name, value in list(vars(other).items()):  # a method patched onto this instance follows it
            if isinstance(value, types.MethodType) and value.__self__ is self:
                object.__setattr__(other, name, types.MethodType(value.__func__, other))
        return other

    def without(self, part: str) -> GeneralForm:
        """The next module: the same (shared) parameters with term ``part`` removed. Under plant A0 the position
        bias stays (that is the plant)."""
        other = self._clone()
        if not (part == "order" and self.plant == "A0"):
            setattr(other, part, None)
        return other

    def with_softmax(self) -> GeneralForm:
        """The A5 module: the row map becomes softmax(s / sqrt(d)) (without the temperature under plant A5)."""
        other = self._clone()
        other.r = self.r.softmax(power=0.0 if self.plant == "A5" else 0.5)
        return other

    # ---------------------------------------------------------------------------------------- the parts
    def score(self, x: Tensor, ctx: Tensor) -> Tensor:
        """s (batch, L, S) for x (batch, L, d), ctx (batch, S, d)."""
        q, k = self.w_q(x), self.w_k(ctx)
        if self.plant == "A4":
            s = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        else:
            s = q @ k.transpose(-2, -1)
        if self.m is not None:
            shape = (*x.shape[:-1], ctx.shape[-2], self.d)
            pair = torch.cat([x.unsqueeze(-2).expand(shape), ctx.unsqueeze(-3).expand(shape)], dim=-1)
            s = s + self.m(pair).squeeze(-1)
        if self.order is not None:
            s = s + self.order[: ctx.shape[-2]]
        return s

    def row_map(self, s: Tensor, mask: Tensor, d: int | None = None) -> Tensor:
        """u = r(s) (batch, L, S), with the temperature rule evaluated at head dim ``d`` (default: this module's)."""
        return self.r(s, mask, d or self.d)

    def value(self, x: Tensor) -> Tensor:
        """v(x) (..., d)."""
        v = self.w_v(x) if self.n is None else self.w_v(x) + self.n(x)
        return torch.tanh(v) if self.plant == "A3" else v

    def contribution(self, ctx: Tensor, u: Tensor) -> Tensor:
        """phi(x_j, u_ij) (batch, L, S, d) for ctx (batch, S, d) and relevances u (batch, L, S)."""
        w = u * u.abs() if self.plant == "A2" else u
        c = w.unsqueeze(-1) * self.value(ctx).unsqueeze(-3)
        if self.g is not None:
            pair = torch.cat([ctx.unsqueeze(-3).expand(*u.shape, self.d), u.unsqueeze(-1)], dim=-1)
            c = c + self.g(pair)
        return c

    def aggregate(self, c: Tensor, mask: Tensor) -> Tensor:
        """y = rho(sum over visible j of c_ij) (batch, L, d) for contributions c (batch, L, S, d)."""
        z = (c * mask.unsqueeze(-1)).sum(-2)
        if self.p is not None:
            z = z + self.p(z)
        return torch.tanh(z) if self.plant == "A1" else z

    def forward(
        self, x: Tensor, context: Tensor | None = None, causal: bool = False, relevance: Tensor | None = None
    ) -> Tensor:
        """y (batch, L, d). ``relevance`` (batch, L, S): use these u_ij instead of r(s(x, context)), so that the
        checks of A1-A3 can measure the composed map with the relevances frozen."""
        ctx = x if context is None else context
        mask = visible(x.shape[-2], ctx.shape[-2], causal, x.device)
        u = self.row_map(self.score(x, ctx), mask) if relevance is None else relevance
        return self.aggregate(self.contribution(ctx, u), mask)


class StandardForm(nn.Module):
    """axiomformer's standard :class:`Attention` (one head, no biases, out_proj = identity) with W_q, W_k, W_v taken
    from a chain module. ``engine="reference"`` **(our choice)**: the comparison with PyTorch's SDPA is then
    between two independent implementations."""

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
            for ours, theirs in ((attn.q_proj, prev.w_q), (attn.k_proj, prev.w_k), (attn.v_proj, prev.w_v)):
                assert isinstance(ours, nn.Linear)  # the standard spec's projections are linear
                ours.weight.copy_(theirs.weight)
            attn.out_proj.weight.copy_(torch.eye(prev.d, dtype=DTYPE))
        return attn.eval()

    def forward(self, x: Tensor, context: Tensor | None = None, causal: bool = False) -> Tensor:
        ctx = x if context is None else context
        return (self.causal_attn if causal else self.attn)(x, ctx, ctx)


def sdpa_reference(module: GeneralForm, x: Tensor, causal: bool) -> Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` on W_q x, W_k x, W_v x (one head, scale 1/sqrt(d))."""
    with torch.no_grad():
        q, k, v = (w(x)[:, None] for w in (module.w_q, module.w_k, module.w_v))
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=1 / math.sqrt(module.d))[:, 0]
