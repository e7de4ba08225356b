"""The A5 checks: properties of the normalizer, read from the attention weights (exposed or probed).

Source: Somani, assumption A5 (relevance is relative: shift invariance, normalization, and the 1/sqrt(d) argument);
Luce's choice axiom for ratio independence. See ``docs/audit.md``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from axiomformer.audit.probe import AuditCheck, Probe, cannot_tell, random_rotation, rel, result

ENTROPY_TOL = 0.25
HEAD_DIMS = (8, 32, 128)


def weight_checks(p: Probe) -> tuple[list[AuditCheck], bool, str]:
    """nonnegative_weights, weights_sum_to_one, ratio_independence; and whether log-weights are usable as scores."""
    names = ("nonnegative_weights", "weights_sum_to_one", "ratio_independence")
    q, k, _ = p.qkv()
    w, how = p.weights(q, k)
    if w is None:
        return [cannot_tell(n, "A5", p.tol, how) for n in names], False, how
    vis = p.visible(q.shape[1], k.shape[1])
    nonneg = result(names[0], "A5", max(0.0, -float(w.min())), p.tol, f"every weight is >= 0 ({how})")
    # The full row, hidden keys included: weight that leaks past the mask is a causality failure (causality sees
    # it), not weights that fail to sum to one.
    sums = w.sum(-1)[:, :, vis.any(-1)]
    total = result(
        names[1],
        "A5",
        float((sums - 1).abs().max()),
        p.tol,
        f"the weights of each query over all keys (visible or not) sum to one ({how}; probed weights are scaled "
        "to a mean row sum of 1, since a constant factor folds into the value map)",
    )
    k2 = k.clone()
    k2[:, 0] = p.randn(p.batch, p.a.dim, scale=3.0)
    w2, how2 = p.weights(q, k2)
    if w2 is None:
        return [nonneg, total, cannot_tell(names[2], "A5", p.tol, how2)], False, how2
    pair_vis = vis.clone()
    pair_vis[:, 0] = False
    pairs = pair_vis.unsqueeze(-1) & pair_vis.unsqueeze(-2)
    ratio = result(
        names[2],
        "A5",
        _cross_ratio(w, w2, pairs),
        p.tol,
        "changing key 0 leaves the ratio w_ij / w_il of every other pair unchanged (Luce's choice axiom; "
        "with shift invariance it singles out the softmax)",
    )
    usable = bool(total.passed and ratio.passed)
    why = (
        ""
        if usable
        else "weights do not sum to one or their ratios depend on other keys, so log-weights are "
        "not scores up to a row constant"
    )
    return [nonneg, total, ratio], usable, why


def shift_invariance(p: Probe, a4: list[AuditCheck], scalar: AuditCheck | None = None) -> AuditCheck:
    if scalar is not None and scalar.passed is False:
        return cannot_tell(
            "shift_invariance",
            "A5",
            p.tol,
            "the coordinates of a head do not see one scalar "
            "relevance per key (scalar_relevance failed), so the keys may reach the outputs other "
            "than through the scores, and translating them is not a shift of the scores",
        )
    if any(c.passed is False for c in a4):
        return cannot_tell(
            "shift_invariance",
            "A5",
            p.tol,
            "scores are not a bilinear q.k (an A4 check failed), so translating the keys is not a shift of the scores",
        )
    q, k, v = p.qkv()
    t = p.randn(p.batch, 1, p.a.dim)
    return result(
        "shift_invariance",
        "A5",
        rel(p.f(q, k + t, v), p.f(q, k, v)),
        p.tol,
        "translating every key by the same t adds q_i.t to all scores of row i; the outputs do not change",
    )


def _cross_ratio(a: Tensor, b: Tensor, pairs: Tensor) -> float:
    """max over the pairs (j, l) of |a_j b_l - b_j a_l| / (a_j b_l + b_j a_l): 0 iff every ratio w_j / w_l agrees."""
    a1, b1 = a.unsqueeze(-1), b.unsqueeze(-1)
    num = (a1 * b1.transpose(-1, -2) - b1 * a1.transpose(-1, -2)).abs()
    den = (a1 * b1.transpose(-1, -2)).abs() + (b1 * a1.transpose(-1, -2)).abs()
    cross = torch.where(den > 0, num / den.clamp_min(1e-300), torch.zeros_like(num))
    return float(cross.masked_fill(~pairs, 0.0).max())


def length_scale(p: Probe) -> AuditCheck:
    """A5 scale at a varying number of visible keys: the ratios of two keys' weights do not depend on how many
    other keys are visible (a temperature that depends on the number of keys, as Scalable-Softmax, breaks it)."""
    name = "length_scale"
    extra = p.seq
    q, k, _ = p.qkv()
    qe, ke = p.randn(p.batch, extra, p.a.dim), p.randn(p.batch, extra, p.a.dim)
    try:
        short, how = p.weights(q, k)
        long, _ = p.weights(torch.cat([qe, q], 1), torch.cat([ke, k], 1)) if short is not None else (None, "")
    except (RuntimeError, ValueError) as err:
        return cannot_tell(name, "A5", p.tol, f"the target fails at another length: {err}")
    if short is None or long is None:
        return cannot_tell(name, "A5", p.tol, how)
    vis = p.visible(p.seq, p.seq)
    pairs = vis.unsqueeze(-1) & vis.unsqueeze(-2)
    stat = _cross_ratio(short, long[..., extra:, extra:], pairs)
    seen = (
        f"causal: query i sees {extra} + i + 1 keys instead of i + 1"
        if p.is_causal
        else f"each query sees {p.seq + extra} keys instead of {p.seq}"
    )
    return result(
        name,
        "A5",
        stat,
        p.tol,
        f"{extra} more tokens put before the {p.seq} of the probe ({seen}) leave the ratio w_ij / w_il of "
        "every pair of the original keys unchanged (statistic as ratio_independence): the temperature does "
        f"not depend on the number of visible keys ({how})",
    )


def _entropy_deficit(p: Probe, w: Tensor) -> tuple[float, float]:
    vis = p.visible(w.shape[-2], w.shape[-1])
    w = w.masked_fill(~vis, 0.0).clamp_min(0)
    total = w.sum(-1, keepdim=True)
    rows = (total.squeeze(-1) > 0) & (vis.sum(-1) > 1)
    pr = w / total.clamp_min(1e-300)
    h = -(pr * torch.log(pr.clamp_min(1e-300))).sum(-1)
    deficit = torch.log(vis.sum(-1).double()) - h
    return float(h[rows].mean()), float(deficit[rows].mean())


def entropy_inputs(
    heads: int,
    head_dims: tuple[int, ...],
    batch: int = 4,
    n: int = 8,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> list[tuple[Tensor, Tensor]]:
    """(q, k) at each head_dim, (batch, n, heads * head_dim), with q.k = sqrt(d) z_ij for the same z at every d.

    Per head, the n keys are orthogonal with norm sqrt(d) (the geometry of d-dim unit-variance random keys, which
    are nearly orthogonal with norm ~ sqrt(d), without the sampling noise) in a random orientation R; the queries are
    R z with z ~ N(0, I_d), whose first n coordinates are shared by every d. So Var(q.k) = d exactly as for random
    unit-variance vectors, and a change of entropy across d is the target's, not noise **(our choice)**.
    Needs n <= min(head_dims).
    """
    g = torch.Generator().manual_seed(seed)
    shared = torch.randn(batch, heads, n, n, generator=g, dtype=torch.float64)  # z_ij, j < n
    out = []
    for d in head_dims:
        z = torch.cat([shared, torch.randn(batch, heads, n, d - n, generator=g, dtype=torch.float64)], dim=-1)
        rot = torch.stack([random_rotation(d, g) for _ in range(heads)])  # (heads, d, d)
        q = z @ rot.transpose(-1, -2)  # rows R z_i
        k = (math.sqrt(d) * rot.transpose(-1, -2)[:, :n, :]).expand(batch, heads, n, d)  # rows sqrt(d) R e_j
        merge = lambda t: t.transpose(1, 2).reshape(batch, n, heads * d).to(dtype)  # noqa: B023 - used in this iteration
        out.append((merge(q), merge(k)))
    return out


def scale_entropy(p: Probe, seed: int, a4: Sequence[AuditCheck] = ()) -> AuditCheck:
    name = "scale_entropy"
    hs, ds = [], []
    inputs = entropy_inputs(p.a.num_heads, HEAD_DIMS, seed=seed, dtype=p.a.dtype)
    for hd, (q, k) in zip(HEAD_DIMS, inputs):
        other = p.a.with_head_dim(hd)
        if other is None:
            return cannot_tell(name, "A5", ENTROPY_TOL, "the target's head_dim cannot be changed")
        sub = Probe(other, p.causal, seed + hd, batch=q.shape[0], seq=q.shape[1])
        try:
            w, how = sub.weights(q, k)
        except (RuntimeError, ValueError) as err:
            return cannot_tell(name, "A5", ENTROPY_TOL, f"the target fails at head_dim {hd}: {err}")
        if w is None:
            return cannot_tell(name, "A5", ENTROPY_TOL, how)
        h, d = _entropy_deficit(sub, w)
        hs.append(h)
        ds.append(max(d, 1e-12))
    stat = max(abs(math.log(d / ds[0])) for d in ds)
    table = ", ".join(f"d={hd}: H={h:.3f} deficit={d:.3g}" for hd, h, d in zip(HEAD_DIMS, hs, ds))
    if any(c.passed is False for c in a4):
        table += "; an A4 check failed and the 1/sqrt(d) argument assumes q.k scores, so the score may be the cause"
    return result(
        name,
        "A5",
        stat,
        ENTROPY_TOL,
        f"Var(q.k) = d (orthogonal keys of norm sqrt(d), Gaussian queries); the entropy deficit "
        f"log(n_keys) - H stays put as head_dim grows (statistic: max |log(deficit(d) / "
        f"deficit({HEAD_DIMS[0]}))|); {table}",
    )
