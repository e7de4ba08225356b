"""Property checks on the map (q, k, v) -> out, each a statement about the function class of the whole map.

Source of the assumptions: Somani, "A Minimal Route to Transformer Attention" (``docs/SOURCES.md``). Each check draws
seeded random inputs (batch 2, seq 8, the target's width), measures one statistic and compares it with a stated
tolerance. ``passed`` is None when a check does not apply or cannot tell; the detail says why. The A5 checks are in
:mod:`axiomformer.audit.normalizer_checks`; what each check can and cannot tell apart is in ``docs/audit.md``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from axiomformer.audit.adapters import Adapter
from axiomformer.audit.attribution import attribute
from axiomformer.audit.normalizer_checks import length_scale, scale_entropy, shift_invariance, weight_checks
from axiomformer.audit.probe import (
    BIG,
    PROBE_ELEMENTS,
    AuditCheck,
    Probe,
    cannot_tell,
    finite,
    heads,
    rank1_residual,
    rel,
    result,
)
from axiomformer.audit.structure import fd_tolerance, scalar_relevance, value_free_relevance

FIT_SEQ = 16
"""Sequence length of the bilinear fit; the batch grows until there are 4 score equations per unknown of M."""


# ------------------------------------------------------------------------------------------------ A0 .. A3
def set_symmetry(p: Probe) -> AuditCheck:
    q, k, v = p.qkv()
    out = p.f(q, k, v)
    if p.is_causal:
        stats = []
        for i in (p.seq // 2, p.seq - 1):
            perm = torch.cat([torch.randperm(i + 1, generator=p.g), torch.arange(i + 1, p.seq)])
            stats.append(rel(p.f(q, k[:, perm], v[:, perm])[:, i], out[:, i]))
        what = "permuting the keys/values visible to query i (j <= i, causal) leaves out_i unchanged"
    else:
        perm = torch.randperm(p.seq, generator=p.g)
        stats = [rel(p.f(q, k[:, perm], v[:, perm]), out), rel(p.f(q[:, perm], k, v), out[:, perm])]
        what = "permuting keys and values together leaves the outputs unchanged; permuting queries permutes them"
    if p.a.has_positions:
        what += " (the target injects positions, which break set symmetry by design)"
    return result("set_symmetry", "A0", max(stats), p.tol, what)


def token_additivity(p: Probe) -> AuditCheck:
    q, k, v = p.qkv()
    new = p.randn(p.batch, p.a.dim)
    others = p.randn(*v.shape)
    others[:, 0] = v[:, 0]
    d = []
    for base in (v, others):
        changed = base.clone()
        changed[:, 0] = new
        d.append(p.f(q, k, changed) - p.f(q, k, base))
    if float(d[0].abs().max()) < 1e-12:
        return cannot_tell("token_additivity", "A1", p.tol, "changing token 0's value changes nothing")
    return result(
        "token_additivity",
        "A1",
        rel(d[1], d[0]),
        p.tol,
        "the output change from changing token 0's value is the same whatever the other tokens' values "
        "(the output is a sum of per-token contributions, rho = identity up to a linear map)",
    )


def homogeneity(p: Probe) -> AuditCheck:
    name = "homogeneity"
    phi = p.a.contribution_map()
    if phi is None:
        return cannot_tell(
            name,
            "A2",
            p.tol,
            "only (q, k, v) -> out is visible: a contribution g(u) v with g not linear (u^2, u|u|) "
            "after a normalizer r is the same map as u v after the normalizer g(r), so A2 cannot be "
            "told apart from A5 here (a non-proportional contribution shows up in the A5 checks)",
        )
    hd = p.a.dim // p.a.num_heads
    w = torch.randn(p.batch, p.a.num_heads, p.seq, p.seq, generator=p.g, dtype=torch.float64).to(p.a.dtype)
    v = p.randn(p.batch, p.a.num_heads, p.seq, hd)
    one = torch.zeros_like(w)
    one[..., 0] = w[..., 0]  # the contribution of key 0 alone
    with torch.no_grad():
        stats = [rel(phi(c * u, v).double(), c * phi(u, v).double()) for u in (w, one) for c in (2.0, 0.5, -1.0, 3.0)]
    return result(
        name,
        "A2",
        max(stats),
        p.tol,
        "the target's contribution map phi(v, u) is homogeneous in the relevance: phi(v, c u) = c phi(v, u) "
        "for c in {2, 1/2, -1, 3}, for all keys at once and for key 0 alone",
    )


def linearity(p: Probe) -> AuditCheck:
    q, k, v = p.qkv()
    d1, d2 = p.randn(p.batch, p.a.dim), p.randn(p.batch, p.a.dim)

    def at(x: Tensor) -> Tensor:
        changed = v.clone()
        changed[:, 0] = x
        return p.f(q, k, changed)

    v0 = v[:, 0]
    f0, f1, f2 = at(v0), at(v0 + d1), at(v0 + d2)
    second = torch.stack([at(v0 + d1 + d2) - f1 - f2 + f0, at(v0 + 2 * d1) - 2 * f1 + f0])
    return result(
        "linearity",
        "A3",
        rel(second, torch.zeros_like(second), f1 - f0),
        p.tol,
        "the output is affine in each token's value (second differences in v_0 vanish): the value map is "
        "a linear change of coordinates (the identity and W_v x both pass)",
    )


# ------------------------------------------------------------------------------------------------ A4
def recovered_scores(p: Probe, q: Tensor, k: Tensor) -> Tensor | None:
    """Row-centred log-weights (batch, heads, q_len, k_len), 0 where not visible: the scores up to a row constant
    when the normalizer is a softmax; None when the weights are unknown or some visible weight is 0."""
    vis = p.visible(q.shape[1], k.shape[1])
    w, _ = p.weights(q, k)
    if w is None or bool((w.masked_select(vis) <= 0).any()):
        return None
    logw = torch.log(w.clamp_min(1e-300)).masked_fill(~vis, 0.0)
    mean = logw.sum(-1, keepdim=True) / vis.sum(-1, keepdim=True).clamp_min(1)
    return (logw - mean).masked_fill(~vis, 0.0)


def key_order(p: Probe, name: str, why: str) -> AuditCheck:
    """The premise-free A4 test, where the log-weights are not scores (Luce's axiom fails): a score that reads its
    own key only, under any normalizer of the derivation or its relaxations (softmax, sparsemax, entmax, sigmoid, a
    temperature per row; nonnegative weights), keeps the order of the other keys' weights when key 0 changes. A failure means the weight
    of a pair reads other keys (iterated Hopfield retrieval, Ramsauer et al. 2021), or a normalizer that reorders
    the scores. Without a failure the check stays not applicable (``why``): a kept order proves no bilinearity."""
    q, k, _ = p.qkv()
    k2 = k.clone()
    k2[:, 0] = p.randn(p.batch, p.a.dim, scale=3.0)
    (w, _), (w2, _) = p.weights(q, k), p.weights(q, k2)
    if w is None or w2 is None:
        return cannot_tell(name, "A4", p.tol, why)
    if min(float(w.min()), float(w2.min())) < -p.tol:  # signed weights (a difference of softmaxes) may reorder
        return cannot_tell(name, "A4", p.tol, f"{why}; some weights are negative, so their order proves nothing")
    vis = p.visible(q.shape[1], k.shape[1]).clone()
    vis[:, 0] = False
    gap = 10 * p.tol * float(w.abs().max())
    d1, d2 = w.unsqueeze(-1) - w.unsqueeze(-2), w2.unsqueeze(-1) - w2.unsqueeze(-2)
    pairs = (vis.unsqueeze(-1) & vis.unsqueeze(-2)) & (d1.abs() > gap) & (d2.abs() > gap)  # no ties
    pairs &= (w.unsqueeze(-1) > gap) & (w.unsqueeze(-2) > gap)  # zero weights (sparsemax) tell no order
    swapped = float(((d1 * d2 < 0) & pairs).sum()) / max(1, int(pairs.sum()))
    if swapped == 0:
        return cannot_tell(name, "A4", p.tol, f"{why}; the other keys' weights keep their order when key 0 changes")
    check = result(
        name,
        "A4",
        swapped,
        0.0,
        f"log-weights are not scores here ({why}); without that premise: changing key 0 reorders the weights of "
        f"other keys in {swapped:.2g} of the pairs, so the weight of a pair reads other keys (statistic: fraction of "
        "the pairs whose order flips)",
    )
    check.facts["key_order"] = True
    return check


def bilinear_scores(p: Probe, weights_ok: bool, why: str, parallel: AuditCheck | None = None) -> AuditCheck:
    """A4: the recovered scores are linear in q and in k; where they cannot be recovered, :func:`key_order` (unless
    ``parallel`` failed: a normalizer over the queries too, as Sinkhorn's, reorders the weights itself)."""
    name = "bilinear_scores"
    if not weights_ok:
        if parallel is not None and parallel.passed is False:
            return cannot_tell(name, "A4", p.tol, f"{why} (and a query's output reads the other queries)")
        return key_order(p, name, why)
    q, k, _ = p.qkv()
    k2 = p.randn(*k.shape)
    recovered = [
        recovered_scores(p, q, k),
        recovered_scores(p, 2 * q, k),
        recovered_scores(p, q, k2),
        recovered_scores(p, q, k + k2),
    ]
    got = [t for t in recovered if t is not None]
    if len(got) < len(recovered):
        return cannot_tell(name, "A4", p.tol, "some visible key has weight 0, so its score cannot be recovered")
    s, s2q, sk2, ssum = got
    resid = torch.stack([s2q - 2 * s, ssum - s - sk2])
    check = result(
        name,
        "A4",
        rel(resid, torch.zeros_like(resid), s),
        p.tol,
        "scores recovered as row-centred log-weights (exact for softmax) are linear in q and in k: "
        "s(2q, k) = 2 s(q, k) and s(q, k + k') = s(q, k) + s(q, k')",
    )
    # Linear in k, and doubling q rescales each row by one factor: a row-dependent temperature, or a score whose
    # dependence on q is not linear; the two are the same map here.
    factor = (s2q * s).sum(-1, keepdim=True) / (s * s).sum(-1, keepdim=True).clamp_min(1e-300)
    zero = torch.zeros_like(s)
    check.facts["row_scale"] = bool(
        check.passed is False and rel(ssum - s - sk2, zero, s) <= p.tol and rel(s2q - factor * s, zero, s2q) <= p.tol
    )
    if check.passed is False and not check.facts["row_scale"]:
        spread = one_form_residual(p, q, k)
        check.facts["one_form"] = spread is not None and spread <= fd_tolerance(p)
        if check.facts["one_form"]:
            check.detail += (
                f"; the recovered scores of each query are a function of one linear form of the keys (their key "
                f"gradients point one way: rank-one residual {spread:.2g}), as g(q.k) or f(s) / sum f(s) give"
            )
    return check


def one_form_residual(p: Probe, q: Tensor, k: Tensor) -> float | None:
    """How far the recovered scores r_ij of each query and head are from depending on the keys through the one
    bilinear form q_i^T M k_l alone (None when a weight is 0): the rank-one residual of their key gradients
    dr_ij / dk_l, stacked over j and l and over the queries q_i and 2 q_i, by central differences along each key's
    coordinates (at most ``MAX_DIRECTIONS`` random orthonormal ones for a wide target: a rank-one stack stays rank one
    in any subspace). A normalizer f(s) / sum_l f(s_l) of bilinear scores (A5), or a score g(q.k) (A4), gives rank
    one (every gradient is along W_k^T M q_i, also at 2 q_i); a score that reads a key beyond that form (cosine, a key
    bias (q_i + w).k_j, an MLP) does not."""
    b, s, d = k.shape
    rdirs = p.directions(d).to(k.dtype)  # (d, m)
    m = rdirs.shape[1]
    h = p.fd_step
    qq, kk = torch.cat([q, 2 * q]), torch.cat([k, k])  # (2b, s, d): the doubled queries' gradients stay parallel
    chunk = max(1, PROBE_ELEMENTS // max(1, 4 * b * s * d))
    grads = []
    for start in range(0, s * m, chunk):
        idx = torch.arange(start, min(start + chunk, s * m))
        steps = torch.zeros(len(idx), 1, s, d, dtype=k.dtype)
        steps[torch.arange(len(idx)), 0, idx // m] = h * rdirs[:, idx % m].T
        moved = torch.cat([kk + steps, kk - steps]).reshape(-1, s, d)
        r = recovered_scores(p, qq.repeat(2 * len(idx), 1, 1), moved)
        if r is None:
            return None
        half = len(idx) * 2 * b
        grads.append(((r[:half] - r[half:]) / (2 * h)).view(len(idx), 2 * b, *r.shape[1:]))
    grad = torch.cat(grads)  # (s * m, 2b, heads, L, S): dr_ij / dk_l along direction c, rows (l, c)
    heads_, q_len, k_len = grad.shape[2:]
    grad = grad.view(s, m, 2, b, heads_, q_len, k_len).permute(3, 4, 5, 2, 6, 0, 1)
    return rank1_residual(grad.reshape(b, heads_, q_len, -1, m))


def bilinear_fit(p: Probe, weights_ok: bool, why: str) -> AuditCheck:
    name = "bilinear_fit"
    if not weights_ok:
        return cannot_tell(name, "A4", p.tol, why)
    hd = p.a.dim // p.a.num_heads
    vis = p.visible(FIT_SEQ, FIT_SEQ)
    per_batch = int(vis.sum()) - int((vis.sum(-1) > 0).sum())  # independent equations after row centring
    batch = max(p.batch, -(-4 * hd * hd // max(per_batch, 1)))  # at least 4 equations per unknown of M
    q, k = (p.randn(batch, FIT_SEQ, p.a.dim) for _ in range(2))
    s = recovered_scores(p, q, k)
    if s is None:
        return cannot_tell(name, "A4", p.tol, "some visible key has weight 0, so its score cannot be recovered")
    h = p.a.num_heads
    vis = vis.double()
    qh, kh = (heads(t.double(), h).transpose(1, 2) for t in (q, k))  # (batch, heads, seq, head_dim)
    # s_ij = q_i^T M k_j + c_i; the row constant c_i drops out against the row mean of the visible keys.
    k_mean = (vis @ kh) / vis.sum(-1, keepdim=True).clamp_min(1)  # (batch, heads, q_len, hd)
    centred = (kh.unsqueeze(-3) - k_mean.unsqueeze(-2)) * vis.unsqueeze(-1)  # (b, h, L, S, hd)
    features = torch.einsum("bhla,bhlsc->hblsac", qh, centred).reshape(h, -1, hd * hd)
    target = s.transpose(0, 1).reshape(h, -1, 1)
    m = torch.linalg.lstsq(features, target).solution  # (heads, hd*hd, 1)
    resid = float((features @ m - target).norm() / target.norm().clamp_min(1e-300))
    m = m.view(h, hd, hd)
    ranks = [int(r) for r in torch.linalg.matrix_rank(m)]
    scale = torch.diagonal(m, dim1=-2, dim2=-1).mean(-1)
    from_dot = float(
        (
            (m - scale[:, None, None] * torch.eye(hd, dtype=m.dtype)).flatten(1).norm(dim=1)
            / m.flatten(1).norm(dim=1).clamp_min(1e-300)
        ).max()
    )
    kind = (
        f"M = c I with c = {float(scale.mean()):.3g}: the dot product"
        if from_dot < 1e-3
        else f"M differs from c I (relative distance {from_dot:.2g}): q^T M k is a reparametrization of the dot "
        "product (M folds into the key projection)"
    )
    return result(
        name,
        "A4",
        finite(resid),
        p.tol,
        f"recovered scores fit s_ij = q_i^T M k_j + c_i per head by least squares (statistic: relative "
        f"residual); rank of M per head {ranks} <= head_dim {hd}; {kind}",
    )


def single_score(p: Probe) -> AuditCheck:
    """The keys a query weighs are the ones its score ranks highest: where some visible keys get weight exactly 0, no
    dropped key j may have a larger head score q_i . k_j than a kept key's (a selection by the score itself, as top-k,
    sparsemax or relu give, passes; a second score that chooses the keys, MoBA's block means or an indexer, fails).
    The score is the per-head dot product of the audited q and k (A4's s_ij); statistic: the fraction of rows with
    both kept and dropped keys where a dropped key outranks a kept one."""
    name = "single_score"
    q, k, _ = p.qkv()
    w, how = p.weights(q, k)
    if w is None:
        return cannot_tell(name, "A4", p.tol, how)
    heads, hd = w.shape[1], p.a.dim // w.shape[1]
    qh, kh = (t.double().unflatten(-1, (heads, hd)).transpose(1, 2) for t in (q, k))
    s = qh @ kh.transpose(-2, -1)
    visible = p.visible(q.shape[1], k.shape[1])
    kept, dropped = visible & (w != 0), visible & (w == 0)
    rows = kept.any(-1) & dropped.any(-1)
    if not bool(rows.any()):
        return cannot_tell(name, "A4", p.tol, "no visible key has weight 0: nothing was selected")
    margin = 1e-9 * float(s.abs().max())
    low = s.masked_fill(~kept, float("inf")).amin(-1)
    high = s.masked_fill(~dropped, float("-inf")).amax(-1)
    stat = float(((high > low + margin) & rows).double().sum() / rows.double().sum())
    return result(
        name,
        "A4",
        stat,
        0.0,
        "where a query gives some visible keys weight 0, the keys it keeps are those its own score q_i . k_j ranks "
        "highest (one score both selects and weighs)",
    )


def parallel(p: Probe) -> AuditCheck:
    name = "parallel"
    q, k, v = p.qkv()
    full = p.f(q, k, v)
    keep = torch.randperm(p.seq, generator=p.g)[: p.seq // 2]
    redrawn = p.randn(*q.shape)
    redrawn[:, keep] = q[:, keep]
    stats = [rel(p.f(redrawn, k, v)[:, keep], full[:, keep])]
    detail = "outputs of a subset of queries do not change when the other queries are redrawn"
    if p.a.has_positions:
        detail += (
            " (the target injects positions by index, so a run on a subset would move them: only the redraw test runs)"
        )
    elif not p.is_causal:
        try:
            stats.append(rel(p.f(q[:, keep], k, v), full[:, keep]))
            detail += ", and running only that subset of queries gives the full run's rows"
        except (RuntimeError, ValueError) as err:
            detail += f" (a run on the subset alone failed: {err}; the target needs q_len = k_len)"
    else:
        detail += " (causal: a subset run would move the causal alignment, so only the redraw test runs)"
    return result(
        name,
        "A4",
        max(stats),
        p.tol,
        detail + ": each query's output is computed on its own, in "
        "parallel (a loop over queries computes the same map and passes)",
    )


def head_independence(p: Probe) -> AuditCheck:
    """The output is a sum of per-head terms, each reading only its own head's queries and keys (a fixed linear map
    of the heads' outputs, such as W_o, keeps that): the mixed second difference under a change of head 1's q, k and
    one of the other heads' q, k vanishes. Fails for logits mixed across heads (talking heads, Shazeer et al. 2020),
    a nonlinear rho of the concatenated heads (an MLP) and a gate that reads the whole query."""
    name, heads = "head_independence", p.a.num_heads
    if heads < 2 or p.a.dim % heads:
        return cannot_tell(name, "A4", p.tol, f"{heads} head(s) of the target's width: no other head to mix in")
    hd = p.a.dim // heads
    q, k, v = p.qkv()

    def moved(first: bool, others: bool) -> Tensor:
        q2, k2 = q.clone(), k.clone()
        if first:
            q2[..., :hd], k2[..., :hd] = dq[..., :hd], dk[..., :hd]
        if others:
            q2[..., hd:], k2[..., hd:] = dq[..., hd:], dk[..., hd:]
        return p.f(q2, k2, v)

    dq, dk = p.randn(*q.shape), p.randn(*k.shape)
    base, one, rest, both = moved(False, False), moved(True, False), moved(False, True), moved(True, True)
    scale = max(float((one - base).abs().max()), float((rest - base).abs().max()))
    if scale < 1e-12:
        return cannot_tell(name, "A4", p.tol, "changing the heads' queries and keys changes nothing")
    stat = float((both - one - rest + base).abs().max()) / scale
    return result(
        name,
        "A4",
        stat,
        p.tol,
        "the output is a sum of per-head terms, each reading only its own head's q and k (heads are "
        "independent, as A4's s_ij = q_i . k_j per head; a fixed map of the heads' outputs keeps it): the "
        "mixed second difference under a change of head 1's and the other heads' q, k, relative to the "
        "first differences",
    )


# ------------------------------------------------------------------------------------------------ causal
def _later_changed(p: Probe, fill: str) -> tuple[Tensor, Tensor, int]:
    q, k, v = p.qkv()
    i0 = p.seq // 2
    out = p.f(q, k, v)[:, : i0 + 1]
    qq, kk, vv = q.clone(), k.clone(), v.clone()
    for t in (qq, kk, vv):
        t[:, i0 + 1 :] = float("nan") if fill == "nan" else p.randn(p.batch, p.seq - i0 - 1, p.a.dim, scale=3.0)
    return p.f(qq, kk, vv)[:, : i0 + 1], out, i0


def causality(p: Probe) -> AuditCheck:
    if not p.is_causal:
        return cannot_tell(
            "causality", "causal", p.tol, "the target is not causal (audit it with causal=True / --causal)"
        )
    new, out, i0 = _later_changed(p, "random")
    return result(
        "causality",
        "causal",
        rel(new, out),
        p.tol,
        f"outputs at i <= {i0} do not change when the queries, keys and values after {i0} are redrawn",
    )


def nan_isolation(p: Probe) -> AuditCheck:
    if not p.is_causal:
        return cannot_tell(
            "nan_isolation", "numerics", 0.0, "needs a causal target: no other mask is given to an audited map"
        )
    new, _, i0 = _later_changed(p, "nan")
    leak = float((~torch.isfinite(new)).double().mean())
    return result(
        "nan_isolation",
        "numerics",
        leak,
        0.0,
        f"NaN in the tokens after {i0} leaves the outputs at i <= {i0} finite (statistic: fraction turned "
        "non-finite); not an assumption: 0 * NaN = NaN in a weights-times-values product leaks it",
    )


# ------------------------------------------------------------------------------------------------ design choices
def learned_values(p: Probe) -> AuditCheck:
    """Design choice, not an assumption: the value map is learned (not the fixed identity). A3 only asks for a linear
    map, which the identity is."""
    vmap = p.a.value_map()
    name = "learned_values"
    if vmap is None:
        return cannot_tell(
            name, "design", p.tol, "the target has no value map of its own (a function of already-mapped values)"
        )
    with torch.no_grad():
        eye = torch.eye(p.a.dim, dtype=p.a.dtype)
        linear_part = vmap(eye) - vmap(torch.zeros_like(eye))
    return result(
        name,
        "design",
        rel(linear_part, eye),
        p.tol,
        "the value map is a learned change of coordinates, not the fixed identity (passes when "
        "max |W_v - I| / max |I| exceeds the tolerance)",
        passes_above=True,
    )


def deterministic(p: Probe) -> AuditCheck:
    q, k, v = p.qkv()
    stat = float((p.f(q, k, v) - p.f(q, k, v)).abs().max())
    detail = "two calls on the same inputs agree exactly in eval mode"
    if p.a.set_training(True):
        try:
            if p.a.dropout == 0:
                stat = max(stat, float((p.f(q, k, v) - p.f(q, k, v)).abs().max()))
                detail += " and in training mode (dropout is 0, so no randomness is sanctioned)"
            else:
                detail += f"; training mode not checked (dropout {p.a.dropout} is random by design)"
        finally:
            p.a.set_training(False)
    return result("deterministic", "design", stat if stat == stat else BIG, 0.0, detail)


def run_checks(adapter: Adapter, causal: bool, seed: int = 0) -> list[AuditCheck]:
    """Every check, in report order: the assumptions A0..A5, causality, then the checks that are not assumptions
    (``nan_isolation``, ``learned_values``, ``deterministic``); candidates attributed from all of them."""

    def probe(offset: int) -> Probe:
        return Probe(adapter, causal, seed + offset)

    first: list[Callable[[Probe], AuditCheck]] = [set_symmetry, token_additivity, homogeneity]
    head = [check(probe(i)) for i, check in enumerate(first)]
    scalar, linear_facts = scalar_relevance(probe(3))
    a3 = linearity(probe(4))
    value_free, nonlinear_facts = value_free_relevance(probe(5), a3, head[1])
    weight_results, usable, why = weight_checks(probe(10))
    independent = parallel(probe(22))
    a4 = [
        value_free,
        bilinear_scores(probe(20), usable, why, independent),
        bilinear_fit(probe(21), usable, why),
        independent,
        head_independence(probe(23)),
        single_score(probe(24)),
    ]
    a5 = weight_results[:2] + [
        shift_invariance(probe(30), a4[1:3], scalar),
        weight_results[2],
        scale_entropy(probe(32), seed, a4[1:3]),
        length_scale(probe(33)),
    ]
    rest = [causality(probe(40)), nan_isolation(probe(41)), learned_values(probe(42)), deterministic(probe(43))]
    p = probe(0)
    facts = {"linear": linear_facts, "nonlinear": nonlinear_facts, "tol": p.tol, "fd_tol": fd_tolerance(p)}
    checks = under_rounding(head + [scalar, a3] + a4 + a5 + rest, adapter.precision or adapter.dtype, p.tol)
    return attribute(checks, facts)


ROUNDING_STEPS = 8
"""A failed equality-type check whose statistic is within this many rounding steps (eps) of the target's precision
cannot tell a departure from that rounding **(our choice: 8 eps covers the growth of rounding through a second
difference; a bfloat16 SDPA's linearity statistic is ~3 eps)**."""


def under_rounding(checks: list[AuditCheck], precision: torch.dtype, tol: float) -> list[AuditCheck]:
    """Mark ``n/a (precision)`` (``passed`` None) every failed equality-type assumption check (tolerance ``tol``) whose
    statistic is at most :data:`ROUNDING_STEPS` eps of ``precision``: at bfloat16 that floor exceeds the tolerance."""
    floor = ROUNDING_STEPS * float(torch.finfo(precision).eps)
    for c in checks:
        if (
            c.passed is False
            and c.assumption not in ("design", "numerics")
            and c.tolerance == tol
            and c.statistic <= floor
        ):
            c.passed = None
            c.detail = (
                f"n/a (precision): statistic {c.statistic:.3g} is within {ROUNDING_STEPS} rounding steps of "
                f"{precision} (floor {floor:.3g}), so a departure cannot be told from rounding; the check: {c.detail}"
            )
    return checks
