"""Property checks on the map (q, k, v) -> out, each tied to one assumption of the derivation.

Source of the assumptions: Somani, "A Minimal Route to Transformer Attention" (``docs/SOURCES.md``). Each check
draws seeded random inputs (batch 2, seq 8, the target's width), measures one statistic and compares it with a stated
tolerance. ``passed`` is None when a check does not apply; the detail says why. Statistics are relative to the size of
the quantity compared unless stated; a non-finite statistic is reported as 1e30. See ``docs/audit.md``.
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from axiomformer.audit.adapters import Adapter

BIG = 1e30
TOL = 1e-4
"""Tolerance of the equality-type checks (relative): float32 normalizers leave errors near 1e-7."""
ENTROPY_TOL = 0.25
HEAD_DIMS = (8, 32, 128)


@dataclass
class AuditCheck:
    """One check's outcome; ``passed`` is None when the check does not apply (never a vacuous pass)."""

    name: str
    assumption: str
    passed: bool | None
    statistic: float
    tolerance: float
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "assumption": self.assumption, "passed": self.passed,
                "statistic": self.statistic, "tolerance": self.tolerance, "detail": self.detail}


def _finite(x: float) -> float:
    return x if math.isfinite(x) else BIG


def rel(a: Tensor, b: Tensor, ref: Tensor | None = None) -> float:
    """max |a - b| / max |ref| (ref defaults to b); 1e30 if anything is non-finite."""
    ref = b if ref is None else ref
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return BIG
    return _finite(float((a - b).abs().max() / ref.abs().max().clamp_min(1e-12))) if a.numel() else 0.0


def _result(name: str, tag: str, stat: float, tol: float, detail: str) -> AuditCheck:
    return AuditCheck(name, tag, bool(stat <= tol), _finite(float(stat)), tol, detail)


def _na(name: str, tag: str, tol: float, why: str) -> AuditCheck:
    return AuditCheck(name, tag, None, 0.0, tol, f"not applicable: {why}")


class Probe:
    """Seeded inputs and calls for one target in one mode (causal or not)."""

    def __init__(self, adapter: Adapter, causal: bool, seed: int = 0, batch: int = 2, seq: int = 8):
        self.a, self.causal, self.batch, self.seq = adapter, causal, batch, seq
        self.g = torch.Generator().manual_seed(seed)

    def randn(self, *shape: int, scale: float = 1.0) -> Tensor:
        return scale * torch.randn(*shape, generator=self.g, dtype=torch.float64).to(self.a.dtype)

    def qkv(self, seq: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
        n = seq or self.seq
        return tuple(self.randn(self.batch, n, self.a.dim) for _ in range(3))

    def f(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        with torch.no_grad():
            return self.a(q, k, v, causal=self.causal).to(torch.float64)

    def visible(self, q_len: int, k_len: int) -> Tensor:
        """Bool (q_len, k_len): True where key j is visible to query i (bottom-right causal alignment)."""
        if not (self.causal or self.a.causal):
            return torch.ones(q_len, k_len, dtype=torch.bool)
        return torch.arange(k_len).unsqueeze(0) <= torch.arange(q_len).unsqueeze(-1) + (k_len - q_len)

    def weights(self, q: Tensor, k: Tensor) -> tuple[Tensor | None, str]:
        """Weights (batch, heads, q_len, k_len) in float64 and how they were obtained (None + reason if unknown).

        Targets that do not expose weights are probed through linearity in the values, one coordinate at a time:
        with v = 0 except v_j = 1, out_i[m] - out_i[m](v=0) is the weight of key j in coordinate m. The probe is
        verified on random values before it is trusted; then the first coordinate of each head gives its weights.
        """
        if self.a.exposes_weights:
            with torch.no_grad():
                w = self.a.weights(q, k, causal=self.causal)
            if w is not None:
                return w.to(torch.float64), "weights exposed by the target"
        b, s, d = k.shape
        probes = torch.zeros(s + 1, b, s, d, dtype=k.dtype)
        probes[torch.arange(1, s + 1), :, torch.arange(s)] = 1.0
        n = s + 1
        out = self.f(q.repeat(n, 1, 1), k.repeat(n, 1, 1), probes.reshape(n * b, s, d)).view(n, b, q.shape[1], d)
        base, w = out[0], (out[1:] - out[0]).permute(1, 3, 2, 0)                     # (batch, dim, q_len, k_len)
        v = self.randn(b, s, d)
        predicted = base + torch.einsum("bmls,bsm->blm", w, v.to(torch.float64))
        err = rel(self.f(q, k, v), predicted)
        if err > TOL:
            return None, (f"weights not recoverable: the output is not linear per coordinate in the values "
                          f"(probe error {err:.2g})")
        # Every coordinate of a head carries that head's weights: keep the first coordinate of each head.
        heads = torch.arange(self.a.num_heads) * (d // self.a.num_heads)
        return w[:, heads], "weights probed through linearity in the values"


def random_rotation(d: int, g: torch.Generator, reflections: int = 4) -> Tensor:
    """A (d, d) rotation, the product of ``reflections`` (even) random Householder reflections.

    Generic (no axis alignment) and cheap; not Haar-distributed, which no check needs **(our choice)**.
    """
    m = torch.eye(d, dtype=torch.float64)
    for _ in range(reflections):
        u = torch.randn(d, generator=g, dtype=torch.float64)
        m = m - 2 * torch.outer(m @ u, u) / u.dot(u)
    return m


def _heads(x: Tensor, heads: int) -> Tensor:
    return x.view(*x.shape[:-1], heads, x.shape[-1] // heads)


# ------------------------------------------------------------------------------------------------ A0 .. A3
def set_symmetry(p: Probe) -> AuditCheck:
    q, k, v = p.qkv()
    out = p.f(q, k, v)
    if p.causal or p.a.causal:
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
    return _result("set_symmetry", "A0", max(stats), TOL, what)


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
        return _na("token_additivity", "A1", TOL, "changing token 0's value changes nothing")
    return _result("token_additivity", "A1", rel(d[1], d[0]), TOL,
                   "the output change from changing token 0's value is the same whatever the other tokens' values")


def proportionality(p: Probe) -> AuditCheck:
    q, k, v = p.qkv()
    v[:, 1] = v[:, 0]
    delta = p.randn(p.batch, p.a.dim)
    base = p.f(q, k, v)
    d = []
    for j in (0, 1):
        changed = v.clone()
        changed[:, j] = changed[:, j] + delta
        d.append(_heads(p.f(q, k, changed) - base, p.a.num_heads))
    na, nb = d[0].norm(dim=-1), d[1].norm(dim=-1)
    scale = max(float(na.max()), float(nb.max()), 1e-300)
    ok = (na > 1e-6 * scale) & (nb > 1e-6 * scale)
    if not bool(ok.any()):
        return _na("proportionality", "A2", TOL, "changing tokens 0 and 1 leaves every output unchanged")
    cos = (d[0] * d[1]).sum(-1) / (na * nb).clamp_min(1e-300)
    sine = (1 - cos[ok] ** 2).clamp_min(0).sqrt()
    return _result("proportionality", "A2", float(sine.max()), TOL,
                   "tokens 0 and 1 share a value but not a key; the same change to either moves each head's output "
                   "along parallel directions (statistic: largest sine of the angle)")


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
    return _result("linearity", "A3", rel(second, torch.zeros_like(second), f1 - f0), TOL,
                   "token 0's contribution is affine in its value: second differences in v_0 vanish")


def learned_values(p: Probe) -> AuditCheck:
    """A3 says values are a *learned* change of coordinates, v(x) = W_v x. A target that owns a value map passes when
    that map is not the fixed identity (statistic: max |W_v - I| / max |I|, its linear part probed on the basis);
    for a plain function of (q, k, v) the values arrive already mapped and the check does not apply."""
    vmap = p.a.value_map()
    name, tol = "learned_values", TOL
    if vmap is None:
        return _na(name, "A3", tol, "the target has no value map of its own (a function of already-mapped values)")
    with torch.no_grad():
        eye = torch.eye(p.a.dim, dtype=p.a.dtype)
        linear_part = vmap(eye) - vmap(torch.zeros_like(eye))
    distance = rel(linear_part, eye)
    return AuditCheck(name, "A3", bool(distance > tol), _finite(distance), tol,
                      "the value map is a learned change of coordinates, not the fixed identity (passes when "
                      "max |W_v - I| / max |I| exceeds the tolerance)")


# ------------------------------------------------------------------------------------------------ A4
def rotation_invariance(p: Probe) -> AuditCheck:
    q, k, v = p.qkv()
    hd = p.a.dim // p.a.num_heads
    blocks = [random_rotation(hd, p.g) for _ in range(p.a.num_heads)]
    rot = torch.block_diag(*blocks).to(p.a.dtype)
    return _result("rotation_invariance", "A4", rel(p.f(q @ rot, k @ rot, v), p.f(q, k, v)), TOL,
                   f"a joint orthogonal rotation of q and k within each of the {p.a.num_heads} head(s) leaves the "
                   "outputs unchanged")


def bilinear_scores(p: Probe, weights_ok: bool, why: str) -> AuditCheck:
    name = "bilinear_scores"
    if not weights_ok:
        return _na(name, "A4", TOL, why)
    q, k, _ = p.qkv()
    k2 = p.randn(*k.shape)
    vis = p.visible(q.shape[1], k.shape[1])

    def scores(qq: Tensor, kk: Tensor) -> Tensor | None:
        w, _ = p.weights(qq, kk)
        if w is None or bool((w.masked_select(vis) <= 0).any()):
            return None
        logw = torch.log(w.clamp_min(1e-300)).masked_fill(~vis, 0.0)
        mean = logw.sum(-1, keepdim=True) / vis.sum(-1, keepdim=True).clamp_min(1)
        return (logw - mean).masked_fill(~vis, 0.0)

    got = [scores(q, k), scores(2 * q, k), scores(q, k2), scores(q, k + k2)]
    if any(s is None for s in got):
        return _na(name, "A4", TOL, "some visible key has weight 0, so its score cannot be recovered")
    s, s2q, sk2, ssum = got
    resid = torch.stack([s2q - 2 * s, ssum - s - sk2])
    return _result(name, "A4", rel(resid, torch.zeros_like(resid), s), TOL,
                   "scores recovered as row-centred log-weights (exact for softmax) satisfy s(2q, k) = 2 s(q, k) and "
                   "s(q, k + k') = s(q, k) + s(q, k')")


# ------------------------------------------------------------------------------------------------ A5
def weight_checks(p: Probe) -> tuple[list[AuditCheck], bool, str]:
    """nonnegative_weights, weights_sum_to_one, ratio_independence; and whether log-weights are usable as scores."""
    names = ("nonnegative_weights", "weights_sum_to_one", "ratio_independence")
    q, k, _ = p.qkv()
    w, how = p.weights(q, k)
    if w is None:
        return [_na(n, "A5", TOL, how) for n in names], False, how
    vis = p.visible(q.shape[1], k.shape[1])
    nonneg = _result(names[0], "A5", max(0.0, -float(w.min())), 1e-6, f"every weight is >= 0 ({how})")
    sums = w.masked_fill(~vis, 0.0).sum(-1)
    total = _result(names[1], "A5", float((sums - 1).abs().max()), TOL,
                    f"the weights of each query over its visible keys sum to one ({how})")
    k2 = k.clone()
    k2[:, 0] = p.randn(p.batch, p.a.dim, scale=3.0)
    w2, _ = p.weights(q, k2)
    pair_vis = vis.clone()
    pair_vis[:, 0] = False
    a1, a2 = w.unsqueeze(-1), w2.unsqueeze(-1)
    num = (a1 * a2.transpose(-1, -2) - a2 * a1.transpose(-1, -2)).abs()
    den = a1 * a2.transpose(-1, -2) + a2 * a1.transpose(-1, -2)
    cross = torch.where(den > 0, num / den.clamp_min(1e-300), torch.zeros_like(num))
    pairs = pair_vis.unsqueeze(-1) & pair_vis.unsqueeze(-2)
    ratio = _result(names[2], "A5", float(cross.masked_fill(~pairs, 0.0).max()), TOL,
                    "changing key 0 leaves the ratio w_ij / w_il of every other pair unchanged (Luce's choice axiom; "
                    "with shift invariance it singles out the softmax)")
    usable = bool(total.passed and ratio.passed)
    why = "" if usable else "weights do not sum to one or their ratios depend on other keys, so log-weights are " \
                            "not scores up to a row constant"
    return [nonneg, total, ratio], usable, why


def shift_invariance(p: Probe, a4: list[AuditCheck]) -> AuditCheck:
    if any(c.passed is False for c in a4):
        return _na("shift_invariance", "A5", TOL, "scores are not a bilinear q.k (an A4 check failed), so translating "
                   "the keys is not a shift of the scores")
    q, k, v = p.qkv()
    t = p.randn(p.batch, 1, p.a.dim)
    return _result("shift_invariance", "A5", rel(p.f(q, k + t, v), p.f(q, k, v)), TOL,
                   "translating every key by the same t adds q_i.t to all scores of row i; the outputs do not change")


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
    return _result("deterministic", "A5", stat if math.isfinite(stat) else BIG, 0.0, detail)


def _entropy_deficit(p: Probe, w: Tensor) -> tuple[float, float]:
    vis = p.visible(w.shape[-2], w.shape[-1])
    w = w.masked_fill(~vis, 0.0).clamp_min(0)
    total = w.sum(-1, keepdim=True)
    rows = (total.squeeze(-1) > 0) & (vis.sum(-1) > 1)
    pr = w / total.clamp_min(1e-300)
    h = -(pr * torch.log(pr.clamp_min(1e-300))).sum(-1)
    deficit = torch.log(vis.sum(-1).double()) - h
    return float(h[rows].mean()), float(deficit[rows].mean())


def entropy_inputs(heads: int, head_dims: tuple[int, ...], batch: int = 4, n: int = 8, seed: int = 0,
                   dtype: torch.dtype = torch.float64) -> list[tuple[Tensor, Tensor]]:
    """(q, k) at each head_dim, (batch, n, heads * head_dim), with q.k = sqrt(d) z_ij for the same z at every d.

    Per head, the n keys are orthogonal with norm sqrt(d) (the geometry of d-dim unit-variance random keys, which
    are nearly orthogonal with norm ~ sqrt(d), without the sampling noise) in a random orientation R; the queries are
    R z with z ~ N(0, I_d), whose first n coordinates are shared by every d. So Var(q.k) = d exactly as for random
    unit-variance vectors, and a change of entropy across d is the target's, not noise **(our choice)**.
    Needs n <= min(head_dims).
    """
    g = torch.Generator().manual_seed(seed)
    shared = torch.randn(batch, heads, n, n, generator=g, dtype=torch.float64)      # z_ij, j < n
    out = []
    for d in head_dims:
        z = torch.cat([shared, torch.randn(batch, heads, n, d - n, generator=g, dtype=torch.float64)], dim=-1)
        rot = torch.stack([random_rotation(d, g) for _ in range(heads)])                 # (heads, d, d)
        q = z @ rot.transpose(-1, -2)                                                # rows R z_i
        k = (math.sqrt(d) * rot.transpose(-1, -2)[:, :n, :]).expand(batch, heads, n, d)  # rows sqrt(d) R e_j
        merge = lambda t: t.transpose(1, 2).reshape(batch, n, heads * d).to(dtype)  # noqa: E731
        out.append((merge(q), merge(k)))
    return out


def scale_entropy(p: Probe, seed: int, a4: list[AuditCheck] = ()) -> AuditCheck:
    name = "scale_entropy"
    hs, ds = [], []
    inputs = entropy_inputs(p.a.num_heads, HEAD_DIMS, seed=seed, dtype=p.a.dtype)
    for hd, (q, k) in zip(HEAD_DIMS, inputs):
        other = p.a.with_head_dim(hd)
        if other is None:
            return _na(name, "A5", ENTROPY_TOL, "the target's head_dim cannot be changed")
        sub = Probe(other, p.causal, seed + hd, batch=q.shape[0], seq=q.shape[1])
        try:
            w, how = sub.weights(q, k)
        except (RuntimeError, ValueError) as err:
            return _na(name, "A5", ENTROPY_TOL, f"the target fails at head_dim {hd}: {err}")
        if w is None:
            return _na(name, "A5", ENTROPY_TOL, how)
        h, d = _entropy_deficit(sub, w)
        hs.append(h)
        ds.append(max(d, 1e-12))
    stat = max(abs(math.log(d / ds[0])) for d in ds)
    table = ", ".join(f"d={hd}: H={h:.3f} deficit={d:.3g}" for hd, h, d in zip(HEAD_DIMS, hs, ds))
    if any(c.passed is False for c in a4):
        table += "; an A4 check failed and the 1/sqrt(d) argument assumes q.k scores, so the score may be the cause"
    return _result(name, "A5", stat, ENTROPY_TOL,
                   f"Var(q.k) = d (orthogonal keys of norm sqrt(d), Gaussian queries); the entropy deficit "
                   f"log(n_keys) - H stays put as head_dim grows (statistic: max |log(deficit(d) / "
                   f"deficit({HEAD_DIMS[0]}))|); {table}")


# ------------------------------------------------------------------------------------------------ causal, parallel
def causality(p: Probe) -> AuditCheck:
    if not (p.causal or p.a.causal):
        return _na("causality", "causal", TOL, "the target is not causal (audit it with causal=True / --causal)")
    q, k, v = p.qkv()
    i0 = p.seq // 2
    out = p.f(q, k, v)[:, : i0 + 1]
    stats = []
    for fill in ("random", "nan"):
        qq, kk, vv = q.clone(), k.clone(), v.clone()
        for t in (qq, kk, vv):
            t[:, i0 + 1:] = float("nan") if fill == "nan" else p.randn(p.batch, p.seq - i0 - 1, p.a.dim, scale=3.0)
        new = p.f(qq, kk, vv)[:, : i0 + 1]
        finite = torch.isfinite(new)
        stats.append(float((~finite).double().mean()))
        stats.append(rel(torch.where(finite, new, out), out))
    leak = stats[2]
    return _result("causality", "causal", max(stats), TOL,
                   f"outputs at i <= {i0} do not change when tokens after {i0} change, or become NaN "
                   f"(fraction of earlier outputs turned non-finite by NaN: {leak:.3g})")


class _OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def _reference_routing():
    """Auto-routed axiomformer modules run on the reference engine: the check is about the spec's map, and the
    memory-lean engines loop over chunks (and, for sparsemax/entmax15, over threshold iterations)."""
    before = os.environ.get("AXIOMFORMER_ENGINE")
    os.environ["AXIOMFORMER_ENGINE"] = "reference"
    try:
        yield
    finally:
        if before is None:
            del os.environ["AXIOMFORMER_ENGINE"]
        else:
            os.environ["AXIOMFORMER_ENGINE"] = before


def parallel(p: Probe) -> AuditCheck:
    counts = []
    for n in (p.seq, 2 * p.seq):
        q, k, v = p.qkv(seq=n)
        with torch.no_grad(), _reference_routing(), _OpCounter() as counter:
            p.a(q, k, v, causal=p.causal)
        counts.append(counter.count)
    return _result("parallel", "A4", float(counts[1] - counts[0]), 0.0,
                   f"ATen operations dispatched in one forward: {counts[0]} at seq {p.seq}, {counts[1]} at seq "
                   f"{2 * p.seq}; a parallel map does not grow with the sequence (an RNN's loop does)")


def run_checks(adapter: Adapter, causal: bool, seed: int = 0) -> list[AuditCheck]:
    """Every check, in report order: A0, A1, A2, A3 (x2), A4 (x2), A5 (x6), causality, parallel."""
    def probe(offset: int) -> Probe:
        return Probe(adapter, causal, seed + offset)

    first: list[Callable[[Probe], AuditCheck]] = [set_symmetry, token_additivity, proportionality, linearity,
                                                  learned_values]
    head = [check(probe(i)) for i, check in enumerate(first)]
    weight_results, usable, why = weight_checks(probe(10))
    a4 = [bilinear_scores(probe(20), usable, why), rotation_invariance(probe(21))]
    a5 = weight_results[:2] + [shift_invariance(probe(30), a4), weight_results[2], deterministic(probe(31)),
                               scale_entropy(probe(32), seed, a4)]
    return head + a4 + a5 + [causality(probe(40)), parallel(probe(41))]
