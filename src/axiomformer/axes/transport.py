"""The transport axis: the relevance of key j to query i carried through the tokens in between.

Source: the delta rule unrolled (issue 34). The recurrence S_t = S_{t-1} P_t + gamma_t v_t k_t^T, o_t = S_t q_t with
P_t = Diag(alpha_t) (I - beta_t w_t w_t^T) gives

    y_i = sum_{j <= i} gamma_j [k_j^T T_{i<-j} q_i] v_j,    T_{i<-j} = P_{j+1} P_{j+2} ... P_i   (T_{i<-i} = I),

a scalar relevance times a linear value (A2, A3 hold) whose relevance is a bilinear form *transported through the
tokens in between*: it reads more than one query and one key (A4) and the keys' order (A0). Standard attention is
T = I, gamma = 1 (``none``). Shapes: q, k, w (batch, heads, seq, head_dim); per-token gates (batch, heads, seq).

Choices (each one entry of :data:`TRANSPORTS`; the normalizer each paper pairs it with is required by the spec):
    none                    T = I                                                      (A0 and A4 hold)
    decay                   P_t = alpha_t I, alpha_t = exp(-A_h dt_t), dt_t = softplus(x_t . w_dt + b), gamma_t =
                            dt_t; normalizer none (Dao & Gu 2024, Mamba-2, arXiv:2405.21060, SSD eq. 16 with
                            B = k, C = q, x = v; the D skip and the output gate are left out)
    householder             P_t = I - beta_t w_t w_t^T, w_t = L2norm(W_w x_t), beta_t = 2 sigmoid(x_t . u + b),
                            gamma = 1; normalizer softmax (Yang et al. 2025, PaTH attention, arXiv:2505.16381, eq. 3;
                            their low-rank w projection and short convolution are a full-rank projection here)
    decay_householder       P_t = alpha_t (I - beta_t k_t k_t^T), alpha_t = exp(-A_h softplus(x_t . w_a + b)),
                            beta_t = gamma_t = sigmoid(x_t . w_b); q, k L2-normalised; normalizer none (Yang, Kautz &
                            Hatamizadeh 2025, Gated DeltaNet, arXiv:2412.06464, eq. 10; the gate as in their code)
    diag_decay_householder  P_t = Diag(alpha_t) (I - beta_t k_t k_t^T), alpha_t in (0, 1]^d per channel from a
                            low-rank projection, beta_t = gamma_t = sigmoid(x_t . w_b); q, k L2-normalised;
                            normalizer none (Kimi Team 2025, Kimi Linear, arXiv:2510.26692, KDA eq. 1)

The quadratic parallel form (:func:`transported_scores`, the reference engine) is the UT form of the products:
with G(x, y)_ab = sum_c x_ac y_bc exp(C_ac - C_bc) (C the cumulative log decay, a >= b),

    S = M o G(Q, K) - (M o G(Q, W)) diag(beta) (I + (M' o G(W, W)) diag(beta))^-1 (M' o G(W, K)),   then S diag(gamma)

(M: j <= i, M': strictly lower). The state form (``engines/recurrent.py``) runs the same algebra chunk by chunk with a
(head_dim_v x head_dim) state, and is what a KV cache keeps for the choices with trait ``state``; the others keep their
keys transported to the last token (k_j <- P_t^T k_j at each step, PaTH's decoding).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from axiomformer.axes.registry import Choice, Registry

if TYPE_CHECKING:
    from axiomformer.spec import AttentionSpec

TRANSPORT_TRAITS = {
    "causal": "defined only under a causal mask: the spec refuses causal=False",
    "ordered": "the weights depend on the order of the keys: A0 is relaxed (the audit's set_symmetry fails)",
    "decay": "a data-dependent scalar decay alpha_t in (0, 1] per head and token",
    "diag_decay": "a data-dependent decay alpha_t in (0, 1]^head_dim per head, token and key channel",
    "householder": "a generalized Householder factor (I - beta_t w_t w_t^T) per token",
    "delta": "the delta rule: w_t = k_t (L2-normalised) and the write strength gamma_t = beta_t",
    "state": "no normalizer over the keys: a (head_dim_v x head_dim) state recurrence computes it exactly (the "
    "recurrent/chunked engine, and a KV cache that keeps the state instead of the keys)",
}

DT_RANGE = (1e-3, 1e-1)
"""dt at initialisation is log-uniform in this range (Mamba-2's ``dt_min``, ``dt_max``)."""

A_RANGE = (1.0, 16.0)
"""A_h at initialisation is uniform in this range (Mamba-2's ``A_init_range``; Gated DeltaNet's code uses the same)."""


FACTOR_SPAN = 60.0
"""Largest spread of per-channel log decays that :func:`decayed_gram` factors (exp(60) ~ 1e26, far below float32's
largest number, 3e38); wider spreads take the exact (n, m, d) form."""


class TransportGates(NamedTuple):
    """The per-token pieces of the transport, over the key positions.

    Attributes:
        log_decay: (batch, heads, k_len, 1) or (batch, heads, k_len, head_dim) log alpha_t <= 0.
        beta: (batch, heads, k_len) Householder strengths, or None (no Householder factor).
        w: (batch, heads, k_len, head_dim) unit Householder vectors, or None.
        write: (batch, heads, k_len) write strengths gamma_t, or None (gamma = 1).
    """

    log_decay: Tensor
    beta: Tensor | None
    w: Tensor | None
    write: Tensor | None

    def masked(self, keep: Tensor | None) -> TransportGates:
        """A padded key (``keep`` (batch, k_len) or (batch, heads, k_len) False) neither writes, decays nor
        reflects: it changes nothing (``torch.where``, so a NaN gate of a set-aside key is dropped too)."""
        if keep is None:
            return self
        heads = self.log_decay.shape[1]
        m = (keep[:, None, :] if keep.dim() == 2 else keep).expand(-1, heads, -1)
        write = m.to(self.log_decay.dtype) if self.write is None else torch.where(m, self.write, 0.0)
        beta = None if self.beta is None else torch.where(m, self.beta, 0.0)
        w = None if self.w is None else torch.where(m[..., None], self.w, 0.0)
        return TransportGates(torch.where(m[..., None], self.log_decay, 0.0), beta, w, write)

    def cast(self, dtype: torch.dtype) -> TransportGates:
        """Every tensor in ``dtype``."""
        return self._map(lambda t: t.to(dtype))

    def tokens(self, part: slice) -> TransportGates:
        """The gates of the tokens ``part`` (a slice of the key positions)."""
        return self._map(lambda t: t[:, :, part])

    def _map(self, f: Callable[[Tensor], Tensor]) -> TransportGates:
        opt = lambda t: None if t is None else f(t)
        return TransportGates(f(self.log_decay), opt(self.beta), opt(self.w), opt(self.write))


def decayed_gram(x: Tensor, cx: Tensor, px: Tensor, y: Tensor, cy: Tensor, py: Tensor, strict: bool) -> Tensor:
    """G_ab = sum_c x_ac y_bc exp(cx_ac - cy_bc) where px_a > py_b (``strict``) or >= (else), 0 elsewhere.

    x (batch, heads, n, d), cx (batch, heads, n, 1 or d) cumulative log decays at x's positions px (n,); y, cy, py
    likewise (m). Returns (batch, heads, n, m). The exponent is blocked before exp, so no masked entry overflows.
    """
    allowed = px[:, None] > py[None, :] if strict else px[:, None] >= py[None, :]
    if cx.shape[-1] > 1 and not torch.compiler.is_compiling():
        # Per channel: exp(cx - cy) = exp(cx - lo) exp(lo - cy) with lo the smallest log decay, two (n, d) factors
        # instead of an (n, m, d) one, when no factor can overflow (a chunk's span of log decays is small).
        lo = torch.minimum(cx.amin(-2, keepdim=True), cy.amin(-2, keepdim=True))
        hi = torch.maximum(cx.amax(-2, keepdim=True), cy.amax(-2, keepdim=True))
        if float((hi - lo).detach().max()) <= FACTOR_SPAN:
            g = torch.matmul(x * (cx - lo).exp(), (y * (lo - cy).exp()).transpose(-2, -1))
            return g.masked_fill(~allowed, 0.0)
    exponent = cx.unsqueeze(-2) - cy.unsqueeze(-3)  # (batch, heads, n, m, 1 or d)
    decay = torch.where(allowed[..., None], exponent, float("-inf")).exp()
    if decay.shape[-1] == 1:
        return torch.matmul(x, y.transpose(-2, -1)) * decay[..., 0]
    return torch.einsum("bhnc,bhmc,bhnmc->bhnm", x, y, decay)


def transported_scores(q: Tensor, k: Tensor, gates: TransportGates, q_offset: int) -> Tensor:
    """The transported relevance s_ij = gamma_j k_j^T T_{i<-j} q_i, quadratic parallel (UT) form.

    Args:
        q: (batch, heads, q_len, head_dim), query i at key position ``q_offset + i``; k: (batch, heads, k_len,
            head_dim); gates: over the k_len key positions (:class:`TransportGates`).

    Returns:
        (batch, heads, q_len, k_len) in q's dtype; entries with j > q_offset + i are 0 (the causal mask blocks them).
    """
    k_len, q_len = k.shape[-2], q.shape[-2]
    pk = torch.arange(k_len, device=k.device)
    pq = torch.arange(q_len, device=k.device) + q_offset
    cum = gates.log_decay.cumsum(-2)
    cq = cum[..., pq.clamp(0, k_len - 1), :]
    scores = decayed_gram(q, cq, pq, k, cum, pk, strict=False)
    if gates.w is not None and gates.beta is not None:
        w, beta = gates.w, gates.beta.unsqueeze(-2)
        eye = torch.eye(k_len, dtype=q.dtype, device=q.device)
        lower = eye + decayed_gram(w, cum, pk, w, cum, pk, strict=True) * beta
        rhs = decayed_gram(w, cum, pk, k, cum, pk, strict=True)
        solved = torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True)
        scores = scores - torch.matmul(decayed_gram(q, cq, pq, w, cum, pk, strict=False) * beta, solved)
    return scores if gates.write is None else scores * gates.write.unsqueeze(-2)


def transport_keys(k: Tensor, gates: TransportGates, first: int) -> Tensor:
    """Keys transported through the tokens ``first, first + 1, ...`` (the recurrent form of decoding).

    k (batch, heads, n, head_dim) holds every key, each transported to token ``first - 1``; ``gates`` are those of
    tokens ``first .. n - 1``. Token t maps every earlier key k_j (j < t) to P_t^T k_j = (I - beta_t w_t w_t^T)
    (alpha_t o k_j), so that afterwards s_ij = gamma_j k_j . q_i for a query after the last token.
    """
    for r in range(gates.log_decay.shape[-2]):
        t = first + r
        head = k[..., :t, :] * gates.log_decay[..., r : r + 1, :].exp()
        if gates.w is not None and gates.beta is not None:
            w = gates.w[..., r : r + 1, :]  # (batch, heads, 1, head_dim)
            head = head - gates.beta[..., r, None, None] * (head * w).sum(-1, keepdim=True) * w
        k = torch.cat([head, k[..., t:, :]], dim=-2)
    return k


class _LogDecay(torch.autograd.Function):
    """log alpha = -e^(a_log) softplus(raw + bias) (the gate of Gated DeltaNet and KDA), keeping only its output.

    The backward reads softplus(z) = log alpha / -e^(a_log) back from the output: sigmoid(z) = 1 - e^(-softplus(z))
    (1 where ``F.softplus`` returns z itself, z > 20, as its own backward does), so that neither raw + bias nor the
    softplus stays alive for the backward: with KDA's per-channel decay each is a (batch, heads, k_len, head_dim)
    tensor **(our choice; the values and gradients are autograd's to rounding)**. Inputs: raw (batch, heads, k_len,
    channels), bias (heads, 1, channels), a_log (heads, 1, 1)."""

    @staticmethod
    def forward(ctx: Any, raw: Tensor, bias: Tensor, a_log: Tensor) -> Tensor:
        out = -a_log.exp() * F.softplus(raw + bias)
        ctx.save_for_backward(out, a_log)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        out, a_log = ctx.saved_tensors
        rate = a_log.exp()
        d_a_log = (grad * out).sum((0, 2, 3), keepdim=True)[0]
        if torch.is_grad_enabled():  # create_graph=True: out of place, differentiable again
            soft = out / -rate
            d_raw = grad * -rate * torch.where(soft > 20.0, 1.0, -torch.expm1(-soft))
        else:  # one (batch, heads, k_len, channels) buffer: sigmoid(z) = -expm1(-softplus(z)), 1 where z > 20
            d_raw = torch.expm1(out / rate).neg_().masked_fill_(out < -20.0 * rate, 1.0).mul_(grad).mul_(-rate)
        return d_raw, d_raw.sum((0, 2), keepdim=True)[0], d_a_log


class _Unit(torch.autograd.Function):
    """``F.normalize(x, dim=-1)``, y = x / r with r = max(|x|, 1e-12), with its backward written out:
    dx = (dy - [|x| > 1e-12] x (x . dy) / r^2) / r, one new (batch, heads, seq, head_dim) tensor. Autograd of
    ``F.normalize`` differentiates the norm and the division separately, with more passes and temporaries of that
    size **(our choice: the delta-rule family normalizes q and k of every layer)**. Like ``F.normalize`` it keeps x
    and r, not y (so y is freed once the engine that read it is done); a backward with ``create_graph=True``
    differentiates ``F.normalize`` of x."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        denominator = norm.clamp_min(1e-12)
        ctx.save_for_backward(x, denominator, norm > 1e-12)
        return x / denominator

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        x, denominator, moving = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: a graph of F.normalize
            with torch.enable_grad():
                return torch.autograd.grad(F.normalize(x, dim=-1), x, grad, create_graph=True)[0]
        along = torch.matmul(x.unsqueeze(-2), grad.unsqueeze(-1)).squeeze(-1)  # x . dy, no (..., d) temporary
        along = along * moving / denominator.square()  # a clamped norm is a constant: no radial part
        return torch.addcmul(grad, x, along, value=-1.0).div_(denominator)


class _HeadSplitLinear(torch.autograd.Function):
    """x (batch, heads, n, head_dim) read as its merged (batch, n, heads * head_dim) times weight^T (out, heads *
    head_dim): a sum over heads of x_h W_h^T, saving x itself. Autograd of that sum would slice x per head and give
    each head's gradient back as a zero-filled (batch, heads, n, head_dim) tensor; here dx is one product, d out . W,
    read in head-split order (a view), and dW one (out x head_dim) block per head."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor) -> Tensor:
        ctx.save_for_backward(x, weight)
        split = weight.unflatten(1, (x.shape[1], x.shape[-1]))  # (out, heads, head_dim)
        return functools.reduce(torch.add, (torch.matmul(x[:, h], split[:, h].T) for h in range(x.shape[1])))

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None]:
        x, weight = ctx.saved_tensors
        heads, d = x.shape[1], x.shape[-1]
        dx = torch.matmul(grad, weight).unflatten(-1, (heads, d)).transpose(1, 2) if ctx.needs_input_grad[0] else None
        dw = None
        if ctx.needs_input_grad[1]:
            dw = torch.cat([torch.matmul(grad.transpose(1, 2), x[:, h]).sum(0) for h in range(heads)], 1)
        return dx, dw


class Transport(nn.Module):
    """The learned gates of ``spec.transport`` (nothing for ``none``): ``gates(x, k, keep)`` from the key input.

    Parameters follow the paper of each choice (module docstring): A_h = exp(A_log_h) per head with A in A_RANGE and a
    dt bias whose softplus is log-uniform in DT_RANGE (Mamba-2, and Gated DeltaNet / KDA's gate); linear maps of the key
    input x (batch, k_len, dim) for dt, beta and (PaTH) w.
    """

    def __init__(self, spec: AttentionSpec):
        super().__init__()
        choice = TRANSPORTS[spec.transport]
        self.traits = choice.traits
        self.l2_qk = bool(choice.extra.get("l2_qk", False))
        self.beta_scale = float(choice.extra.get("beta_scale", 1.0))
        self.write = choice.extra.get("write")
        heads, d = spec.num_heads, spec.head_dim
        self.heads, self.head_dim = heads, d
        channels = d if choice.has("diag_decay") else 1
        if choice.has("decay") or choice.has("diag_decay"):
            rank = d if choice.has("diag_decay") else spec.dim  # KDA's gate is low-rank
            self.dt_down = nn.Linear(spec.dim, rank, bias=False) if choice.has("diag_decay") else nn.Identity()
            self.dt_proj = nn.Linear(rank, heads * channels, bias=False)
            dt = torch.exp(torch.rand(heads, channels) * math.log(DT_RANGE[1] / DT_RANGE[0]) + math.log(DT_RANGE[0]))
            self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)
            self.a_log = nn.Parameter(torch.empty(heads).uniform_(*A_RANGE).log())
        if choice.has("householder"):
            self.beta_proj = nn.Linear(spec.dim, heads)
            if not choice.has("delta"):
                self.w_proj = nn.Linear(spec.dim, heads * d, bias=False)
        self.channels = channels

    def prepare(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """q, k (batch, heads, seq, head_dim) L2-normalised where the paper does (the delta-rule family)."""
        if not self.l2_qk:
            return q, k
        return _Unit.apply(q), _Unit.apply(k)

    def _heads(self, x: Tensor, width: int) -> Tensor:
        b, n, _ = x.shape
        return x.view(b, n, self.heads, width).transpose(1, 2)

    def _readers(self) -> dict[str, nn.Linear]:
        """The maps that read the key input: the decay's first (KDA's low-rank ``dt_down``, else ``dt_proj``), beta's
        and PaTH's w's, by the name of what they give."""
        first = getattr(self, "dt_down", None)
        found = {"dt": self.dt_proj if isinstance(first, nn.Identity) else first}
        found |= {"beta": getattr(self, "beta_proj", None), "w": getattr(self, "w_proj", None)}
        return {name: layer for name, layer in found.items() if isinstance(layer, nn.Linear)}

    def _read(self, x: Tensor) -> dict[str, Tensor]:
        """Each of :meth:`_readers` applied to the key input x (batch, k_len, dim). For x split into heads (batch,
        heads, k_len, head_dim), read as the merged (batch, k_len, dim) without merging it, all the maps at once
        (:class:`_HeadSplitLinear` of their stacked weights): no (batch, k_len, dim) copy of x is kept for the
        backward, and its gradient is one tensor (``Attention.core`` passes the keys so)."""
        readers = self._readers()
        if x.dim() == 3:
            return {name: layer(x) for name, layer in readers.items()}
        layers = list(readers.values())
        together = _HeadSplitLinear.apply(x, torch.cat([layer.weight for layer in layers]))
        parts = together.split([layer.weight.shape[0] for layer in layers], -1)
        return {
            name: part if layer.bias is None else part + layer.bias
            for (name, layer), part in zip(readers.items(), parts)
        }

    def gates(self, x: Tensor, k: Tensor, keep: Tensor | None = None) -> TransportGates:
        """The gates of the tokens of the key input x (batch, k_len, dim) -- or of the keys split into heads (batch,
        heads, k_len, head_dim), read as their merged (batch, k_len, dim) -- with k (batch, heads, k_len, head_dim)
        the keys after :meth:`prepare`; ``keep`` (batch, k_len) False at padded keys (they change nothing)."""
        b, n = x.shape[0], x.shape[-2]
        log_decay = k.new_zeros(b, self.heads, n, 1)
        dt = None
        read = self._read(x)
        if hasattr(self, "dt_proj"):
            raw = read["dt"] if isinstance(self.dt_down, nn.Identity) else self.dt_proj(read["dt"])
            raw = self._heads(raw, self.channels)  # (batch, heads, k_len, channels)
            if self.write == "dt":  # Mamba-2 writes with dt itself
                dt = F.softplus(raw + self.dt_bias[:, None, :])
                log_decay = -self.a_log.exp()[:, None, None] * dt
            else:
                log_decay = _LogDecay.apply(raw, self.dt_bias[:, None, :], self.a_log[:, None, None])
        beta = w = None
        if hasattr(self, "beta_proj"):
            beta = self.beta_scale * torch.sigmoid(read["beta"]).transpose(1, 2)
            w = k if "delta" in self.traits else F.normalize(self._heads(read["w"], self.head_dim), dim=-1)
        write = {"dt": None if dt is None else dt[..., 0], "beta": beta}.get(self.write or "")
        return TransportGates(log_decay, beta, w, write).masked(keep)


def _none(spec: AttentionSpec) -> None:
    return None


def _delta_rule(name: str, formula: str, source: str, *, decay: str, relaxes: str) -> Choice:
    """A gated delta rule: a ``decay`` (scalar ``decay`` or per-channel ``diag_decay``) times the Householder of the
    keys themselves (w = k, gamma = beta), with L2-normalised queries and keys, beta as the write strength and no
    normalizer, as its papers define it; ``relaxes`` says what its transport is (A0 and A4; A5 by the normalizer)."""
    return Choice(
        name,
        formula,
        source,
        Transport,
        frozenset({"causal", "ordered", decay, "householder", "delta", "state"}),
        {"requires": {"normalizer": "none"}, "l2_qk": True, "write": "beta"},
        relaxes=f"A0 and A4: {relaxes}; with normalizer=none, A5",
    )


TRANSPORTS = Registry(
    "transport",
    [
        Choice("none", "T_{i<-j} = I: s_ij = q_i . k_j", "Somani, A0 and A4 (no transport)", _none),
        Choice(
            "decay",
            "s_ij = dt_j (q_i . k_j) prod_{t=j+1..i} alpha_t, alpha_t = exp(-A_h dt_t), dt_t = softplus(w . x_t + b)",
            "Dao & Gu 2024, Mamba-2, arXiv:2405.21060, SSD (eq. 16)",
            Transport,
            frozenset({"causal", "ordered", "decay", "state"}),
            {"requires": {"normalizer": "none"}, "write": "dt"},
            relaxes="A0 and A4: a data-dependent decay through the tokens in between (order and other keys enter "
            "the relevance); with normalizer=none, A5",
        ),
        Choice(
            "householder",
            "s_ij = k_j^T H_{j+1} ... H_i q_i, H_t = I - beta_t w_t w_t^T, beta_t = 2 sigmoid(u . x_t + b)",
            "Yang et al. 2025, PaTH attention, arXiv:2505.16381, eq. 3",
            Transport,
            frozenset({"causal", "ordered", "householder"}),
            {"requires": {"normalizer": "softmax"}, "beta_scale": 2.0},
            relaxes="A0 and A4: the bilinear form is transported through the Householder reflections of the tokens "
            "in between (softmax kept: A5 holds)",
        ),
        _delta_rule(
            "decay_householder",
            "s_ij = beta_j k_j^T prod_{t=j+1..i} alpha_t (I - beta_t k_t k_t^T) q_i",
            "Yang, Kautz & Hatamizadeh 2025, Gated DeltaNet, arXiv:2412.06464, eq. 10",
            decay="decay",
            relaxes="the gated delta rule's transport (scalar decay times Householder) through the tokens in between",
        ),
        _delta_rule(
            "diag_decay_householder",
            "s_ij = beta_j k_j^T prod_{t=j+1..i} Diag(alpha_t) (I - beta_t k_t k_t^T) q_i",
            "Kimi Team 2025, Kimi Linear, arXiv:2510.26692, KDA (eq. 1)",
            decay="diag_decay",
            relaxes="the delta rule with a per-channel decay",
        ),
    ],
    TRANSPORT_TRAITS,
)
"""Every transport: see the module docstring and :data:`TRANSPORT_TRAITS`."""


def build_transport(spec: AttentionSpec) -> Transport | None:
    """The gates module of ``spec.transport``, or None for ``none``."""
    impl = TRANSPORTS[spec.transport].impl
    return None if impl is None else impl(spec)


def check_transport(spec: AttentionSpec) -> None:
    """The combinations the papers define: the paired normalizer, a causal mask, no other position mechanism or
    economy that the transport's recurrence does not define.

    Raises:
        ValueError: naming the field, the value and what the transport needs.
    """
    from axiomformer.axes.contribution import CONTRIBUTIONS
    from axiomformer.axes.position import POSITIONS
    from axiomformer.axes.score import SCORES

    choice = TRANSPORTS[spec.transport]
    if not choice.traits:
        return
    for field, needed in choice.extra.get("requires", {}).items():
        if getattr(spec, field) != needed:
            raise ValueError(
                f"transport={spec.transport!r} is defined ({choice.source}) with {field}={needed!r}, "
                f"got {field}={getattr(spec, field)!r}"
            )
    refused = {
        "position": (
            spec.position != POSITIONS.names()[0] and not POSITIONS.has(spec.position, "conv"),
            "the transport is the layer's position mechanism (a short convolution may join it)",
        ),
        "window": (spec.window != 0, "a sliding window would cut the transport's products"),
        "num_kv_heads": (spec.kv_heads != spec.num_heads, "grouped key/value heads are not defined here"),
        "softcap": (bool(spec.softcap), "soft-capping a transported score is not defined"),
        "score": (spec.score != SCORES.names()[0], "the transport acts on the dot product q_i . k_j"),
        "contribution": (spec.contribution != CONTRIBUTIONS.names()[0], "the recurrence writes u_ij v_j"),
        "dropout": (float(spec.dropout) > 0, "no paper drops transported weights"),
    }
    for field, (bad, why) in refused.items():
        if bad:
            raise ValueError(
                f"transport={spec.transport!r} needs {field} at its default ({why}), got {field}={getattr(spec, field)!r}"
            )
