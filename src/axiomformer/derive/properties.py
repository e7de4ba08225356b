"""The property each assumption states, measured on a chain module (:class:`~axiomformer.derive.modules.GeneralForm`).

Source: Somani, "A Minimal Route to Transformer Attention" (``docs/SOURCES.md``): each assumption is a property of a
function class, so each function here measures that property on the map, never by comparing two code paths of one
computation. Every function returns a relative violation (0 when the property holds exactly) and takes the module,
seeded float64 tokens ``x`` (batch, seq, d) and a seed for its own random draws.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from axiomformer.derive.modules import DTYPE, GeneralForm, visible

ENTROPY_DIMS = (16, 64, 256)
"""Head dims at which the temperature rule is evaluated (A5)."""


def rel(a: Tensor, b: Tensor, ref: Tensor | None = None) -> float:
    """max |a - b| / max |ref| (ref defaults to b); inf if anything is non-finite."""
    ref = b if ref is None else ref
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return math.inf
    return float((a - b).abs().max() / ref.abs().max().clamp_min(1e-300))


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def fit_length(module: GeneralForm) -> int:
    """Tokens per side of the A4 fit (3 d); the A0 probe is at least this long, so that an order dependence the
    fit would see is seen by A0 first."""
    return 3 * module.d


@torch.no_grad()
def set_symmetry(module: GeneralForm, x: Tensor, seed: int) -> float:
    """A0: permuting the tokens visible to query i (keys and values together) leaves y_i unchanged.

    On seeded tokens as long as the A4 fit (:func:`fit_length`; ``x`` when longer), composed map ``module(x, ctx)``.
    Non-causal: one random permutation of the whole context. Causal: for every i, a random permutation of the
    visible prefix j <= i. Relative to max |y|."""
    g = _gen(seed)
    n = max(x.shape[1], fit_length(module))
    x = torch.randn(x.shape[0], n, x.shape[2], generator=g, dtype=DTYPE) if n > x.shape[1] else x
    y = module(x, x, causal=False)
    errs = [rel(module(x, x[:, torch.randperm(n, generator=g)], causal=False), y)]
    y = module(x, x, causal=True)
    for i in range(1, n):
        prefix = torch.randperm(i + 1, generator=g)
        ctx = torch.cat([x[:, prefix], x[:, i + 1 :]], dim=1)
        errs.append(rel(module(x, ctx, causal=True)[:, i], y[:, i], y))
    return max(errs)


def _split(n: int, g: torch.Generator) -> Tensor:
    """A random bool split of n tokens with both parts non-empty (token 0 in A, token 1 in B)."""
    in_a = torch.rand(n, generator=g) < 0.5
    in_a[0], in_a[1] = True, False
    return in_a


@torch.no_grad()
def additivity(module: GeneralForm, x: Tensor, seed: int) -> float:
    """A1: the output is additive over the tokens' contributions, y(A u B) = y(A) + y(B) for disjoint token sets.

    Measured twice, the larger violation counts: on the parts (contributions c_ij = phi(x_j, u_ij) computed once on
    the full context, the aggregator applied to those of a subset A, its complement B, and both) and on the composed
    map (``module(x, ctx_A, relevance=u_A) + module(x, ctx_B, relevance=u_B)`` against the full context, the
    relevances u frozen at their full-context values), three random splits each. Holds for rho = identity and for any
    linear rho (which folds into W_v); fails for rho = tanh, an MLP, or a nonlinearity ``forward`` applies after
    ``aggregate``."""
    g = _gen(seed)
    mask = visible(x.shape[1], x.shape[1], causal=False)
    u = module.row_map(module.score(x, x), mask)
    c = module.contribution(x, u)
    y = module.aggregate(c, mask)
    composed = module(x, x, relevance=u)
    errs = []
    for _ in range(3):
        in_a = _split(x.shape[1], g)
        a, b = mask & in_a, mask & ~in_a
        errs.append(rel(module.aggregate(c, a) + module.aggregate(c, b), y))
        parts = [module(x, x[:, keep], relevance=u[..., keep]) for keep in (in_a, ~in_a)]
        errs.append(rel(parts[0] + parts[1], composed))
    return max(errs)


@torch.no_grad()
def homogeneity(module: GeneralForm, x: Tensor, seed: int) -> float:
    """A2: the contribution map is homogeneous in the relevance, phi(x, k u) = k phi(x, u), for k in {2, 1/2, -1, 3}
    and random relevances u ~ N(0, 1): on :meth:`contribution` and on the composed map ``module(x, relevance=k u)``
    (rho is the identity from A1 on). u |u| or u^2 weighting fails (for k = 2 it gives 4 phi)."""
    g = _gen(seed)
    u = torch.randn(x.shape[0], x.shape[1], x.shape[1], generator=g, dtype=DTYPE)
    base, y = module.contribution(x, u), module(x, x, relevance=u)
    return max(
        max(rel(module.contribution(x, k * u), k * base), rel(module(x, x, relevance=k * u), k * y))
        for k in (2.0, 0.5, -1.0, 3.0)
    )


@torch.no_grad()
def value_linearity(module: GeneralForm, x: Tensor, seed: int) -> float:
    """A3: the value map is linear: second differences F(a+b) - F(a) - F(b) + F(0) and F(2a) - 2F(a) + F(0) vanish,
    relative to the first difference F(a) - F(0), for F = :meth:`value` and for F(c) = ``module(x, c,
    relevance=u)``, the composed map as a function of the context tokens at frozen relevances u (phi linear in the
    token at fixed u). The identity and W_v x pass; tanh(W_v x), or a nonlinearity of the value inside phi but
    outside ``value()``, fail."""
    g = _gen(seed)
    a, b = (torch.randn(*x.shape, generator=g, dtype=DTYPE) for _ in range(2))
    u = torch.randn(x.shape[0], x.shape[1], x.shape[1], generator=g, dtype=DTYPE)
    errs = []
    for f in (module.value, lambda ctx: module(x, ctx, relevance=u)):
        zero = f(torch.zeros_like(a))
        first = f(a) - zero
        second = torch.stack([f(a + b) - f(a) - f(b) + zero, f(2 * a) - 2 * f(a) + zero])
        errs.append(rel(second, torch.zeros_like(second), first))
    return max(errs)


@torch.no_grad()
def bilinear_fit(module: GeneralForm, x: Tensor, seed: int) -> tuple[float, int, float]:
    """A4: the score is a bilinear form s(x_i, x_j) = x_i^T M x_j of rank <= head_dim.

    M is fitted by least squares to the scores of 3d x 3d random token pairs (9 d^2 equations, d^2 unknowns;
    :func:`fit_length`).

    Returns:
        (relative residual ||s - x_i^T M x_j|| / ||s||, numerical rank of M, distance of M from the nearest c I
        relative to ||M||: 0 means a dot product up to scale, anything else a reparametrization q^T W k of it).
    """
    g = _gen(seed)
    d = module.d
    n = fit_length(module)
    xi, xj = (torch.randn(1, n, d, generator=g, dtype=DTYPE) for _ in range(2))
    s = module.score(xi, xj)[0].reshape(-1)  # (n * n,)
    features = torch.einsum("ia,jb->ijab", xi[0], xj[0]).reshape(n * n, d * d)
    m = torch.linalg.lstsq(features, s.unsqueeze(-1)).solution.reshape(d, d)
    residual = float((features @ m.reshape(-1) - s).norm() / s.norm().clamp_min(1e-300))
    sv = torch.linalg.svdvals(m)
    rank = int((sv > 1e-8 * sv.max().clamp_min(1e-300)).sum())
    scale = torch.trace(m) / d
    from_dot = float((m - scale * torch.eye(d, dtype=DTYPE)).norm() / m.norm().clamp_min(1e-300))
    return (residual if math.isfinite(residual) else math.inf), rank, from_dot


def bilinear_violation(module: GeneralForm, x: Tensor, seed: int) -> float:
    """A4 as one number: the relative residual of the bilinear fit, plus 1 when the fitted M has rank > head_dim
    (the chain has one head, so head_dim = d)."""
    residual, rank, _ = bilinear_fit(module, x, seed)
    return residual + (1.0 if rank > module.d else 0.0)


def _orthonormal(d: int, g: torch.Generator) -> Tensor:
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=DTYPE))
    return q * torch.sign(torch.diagonal(r))


def entropy_spread(module: GeneralForm, seed: int, n_keys: int = 8, rows: int = 16) -> float | None:
    """The 1/sqrt(d) argument on the module's row map: attention entropy does not move as the head dim grows.

    At each d in :data:`ENTROPY_DIMS`: n_keys orthogonal keys of norm sqrt(d) in a random orientation R and queries
    R z whose first n_keys coordinates z are shared across d, so q . k_j = sqrt(d) z_j and Var(q . k) = d, as for
    unit-variance random vectors, without sampling noise **(our choice of geometry)**. The row map is evaluated with
    its temperature rule at that d. Returns max_d |H(d) - H(d_0)| / log(n_keys), or None when the row map does not
    give a distribution (negative weights or rows not summing to one): there is no entropy to compare.
    """
    g = _gen(seed)
    shared = torch.randn(rows, n_keys, generator=g, dtype=DTYPE)
    mask = torch.ones(rows, n_keys, dtype=torch.bool)
    entropies = []
    for d in ENTROPY_DIMS:
        rot = _orthonormal(d, g)
        z = torch.cat([shared, torch.randn(rows, d - n_keys, generator=g, dtype=DTYPE)], dim=-1)
        q, k = z @ rot.T, math.sqrt(d) * rot.T[:n_keys]
        with torch.no_grad():
            w = module.row_map(q @ k.T, mask, d)
        if bool((w < 0).any()) or float((w.sum(-1) - 1).abs().max()) > 1e-6:
            return None
        entropies.append(-(w * torch.log(w.clamp_min(1e-300))).sum(-1))
    return max(float((h - entropies[0]).abs().max()) for h in entropies) / math.log(n_keys)


@torch.no_grad()
def _cross_ratio(w: Tensor, w2: Tensor, keys: Tensor) -> float:
    """max over the pairs (j, l) of ``keys`` (bool, broadcast over rows) of |w_j w2_l - w2_j w_l| / (|w_j w2_l| +
    |w2_j w_l|): 0 iff every ratio w_j / w_l is the same in ``w`` and ``w2`` (batch, L, S)."""
    a1, a2 = w.unsqueeze(-1), w2.unsqueeze(-1)
    num = (a1 * a2.transpose(-1, -2) - a2 * a1.transpose(-1, -2)).abs()
    den = (a1 * a2.transpose(-1, -2)).abs() + (a2 * a1.transpose(-1, -2)).abs()
    pairs = (keys.unsqueeze(-1) & keys.unsqueeze(-2)) & (den > 0)
    return float(torch.where(pairs, num / den.clamp_min(1e-300), torch.zeros_like(num)).max())


def _length_ratio(module: GeneralForm, s: Tensor, g: torch.Generator) -> float:
    """``length``: as many more keys put before a row's scores leave the ratios of its keys' weights unchanged,
    without a mask (a temperature that depends on the number of keys, as Scalable-Softmax's s log n, breaks it)."""
    b, n, _ = s.shape
    extra = torch.randn(b, n, n, generator=g, dtype=DTYPE)
    short = module.row_map(s, visible(n, n, causal=False))
    long = module.row_map(torch.cat([extra, s], -1), visible(n, 2 * n, causal=False))[..., n:]
    return _cross_ratio(short, long, torch.ones(n, n, dtype=torch.bool))


def normalizer_properties(module: GeneralForm, x: Tensor, seed: int) -> dict[str, float]:
    """A5 on the row map r, each a relative violation: ``shift`` r(s + c 1) = r(s) for a per-row constant c;
    ``ratio`` changing s_0 leaves w_j / w_l unchanged for the other keys (Luce's choice axiom); ``sum`` the weights
    of a row sum to one; ``length`` the ratios do not depend on how many keys the row has (:func:`_length_ratio`);
    ``masked`` keys hidden by the causal mask get weight 0 (a leak past the mask placed in the row map);
    ``nonnegative``; ``entropy`` the 1/sqrt(d) argument (:func:`entropy_spread`, omitted when
    the row map gives no distribution). Scores s ~ N(0, 1), causal mask, so rows see 1..seq keys."""
    g = _gen(seed)
    n = x.shape[1]
    mask = visible(n, n, causal=True)
    s = torch.randn(x.shape[0], n, n, generator=g, dtype=DTYPE)
    w = module.row_map(s, mask)
    c = 3 * torch.randn(x.shape[0], n, 1, generator=g, dtype=DTYPE)
    out = {"shift": rel(module.row_map(s + c, mask), w)}
    s2 = s.clone()
    s2[..., 0] = s2[..., 0] + 2.0
    w2 = module.row_map(s2, mask)
    others = mask.clone()
    others[:, 0] = False
    out["ratio"] = _cross_ratio(w, w2, others)
    out["length"] = _length_ratio(module, s, g)
    out["sum"] = float((w.masked_fill(~mask, 0).sum(-1) - 1).abs().max())
    out["masked"] = float(w.masked_fill(mask, 0).abs().max())  # causality of the row map: hidden keys get 0
    out["nonnegative"] = max(0.0, -float(w.min()))
    spread = entropy_spread(module, seed)
    if spread is not None:
        out["entropy"] = spread
    return out


def normalizer_violation(module: GeneralForm, x: Tensor, seed: int) -> float:
    """A5 as one number: the largest of :func:`normalizer_properties`."""
    return max(normalizer_properties(module, x, seed).values())
