"""Seeded probing of a target's map (q, k, v) -> out: inputs, calls, weights, and the outcome of one check.

Statistics are relative to the size of the quantity compared unless stated; a non-finite statistic is reported as
1e30. See ``docs/audit.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from axiomformer.audit.adapters import Adapter

BIG = 1e30
TOLERANCES = {torch.float64: 1e-9, torch.float32: 1e-4}
"""Relative tolerance of the equality-type checks by the precision the target computes in: float64 round-off leaves
errors near 1e-15, float32 near 1e-7; the tolerances leave room for error growth through the probes **(our choice)**."""
LOW_PRECISION_TOL = 1e-2
"""Tolerance for float16 / bfloat16 targets."""
TOL = TOLERANCES[torch.float32]
"""The float32 tolerance (kept for callers that do not know the target's precision)."""
MAX_DIRECTIONS = 32
"""Value directions probed per key: every coordinate up to this width, else this many random orthonormal ones."""
PROBE_ELEMENTS = 1 << 22
"""Input elements per batched call of the value probes (bounds memory)."""


def tolerance(dtype: torch.dtype) -> float:
    """The relative tolerance of equality-type checks for a target computing in ``dtype``."""
    return TOLERANCES.get(dtype, LOW_PRECISION_TOL)


@dataclass
class AuditCheck:
    """One check's outcome; ``passed`` is None when the check does not apply or cannot tell (never a vacuous pass).

    ``assumption`` is ``"A0"`` .. ``"A5"`` for the assumption checks, ``"causal"`` for causality, and ``"design"`` or
    ``"numerics"`` for properties that are no assumption of the derivation (reported in their own section).

    ``candidates``: when the check failed, the assumptions (``"A0"`` .. ``"A5"``, or ``"causal"``) whose violation
    alone produces this departure at the audited interface, most specific first; more than one means they cannot be
    told apart from outside (``why`` says why). Empty when the check passed, does not apply, or tests no assumption.
    Set by :func:`axiomformer.audit.attribution.attribute` from the outcomes of all checks.
    """

    name: str
    assumption: str
    passed: bool | None
    statistic: float
    tolerance: float
    detail: str
    candidates: list[str] = field(default_factory=list)
    why: str = ""
    """Why the candidates cannot be told apart (empty when there is one)."""
    facts: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """What the check learned beyond pass/fail, for the attribution (not serialized)."""

    def to_dict(self) -> dict[str, Any]:
        """``{"name", "assumption", "passed", "statistic", "tolerance", "detail", "candidates"}``."""
        return {
            "name": self.name,
            "assumption": self.assumption,
            "passed": self.passed,
            "statistic": self.statistic,
            "tolerance": self.tolerance,
            "detail": self.detail,
            "candidates": list(self.candidates),
        }


def finite(x: float) -> float:
    return x if math.isfinite(x) else BIG


def rel(a: Tensor, b: Tensor, ref: Tensor | None = None) -> float:
    """max |a - b| / max |ref| (ref defaults to b); 1e30 if anything is non-finite or the shapes differ."""
    ref = b if ref is None else ref
    if a.shape != b.shape or not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return BIG
    return finite(float((a - b).abs().max() / ref.abs().max().clamp_min(1e-12))) if a.numel() else 0.0


def leading_direction(mats: Tensor, steps: int = 2) -> Tensor:
    """(..., cols) unit vectors: the largest row of each matrix (..., rows, cols), refined by ``steps`` power
    iterations on M^T M. Exact when a matrix has rank one (no SVD: the probe matrices are tall)."""
    rows = mats.norm(dim=-1)
    a = torch.take_along_dim(mats, rows.argmax(-1)[..., None, None], dim=-2).squeeze(-2)
    for _ in range(steps):
        a = torch.einsum("...rc,...r->...c", mats, torch.einsum("...rc,...c->...r", mats, a))
        a = a / a.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    return a


def rank1_residual(mats: Tensor, rank: int = 1) -> float:
    """How far a stack of matrices (..., rows, cols) is from rank ``rank`` each: ||M - P(M)|| / ||M|| over the whole
    stack (Frobenius; 0 for an all-zero stack). Rank one: P(M) = M a a^T with a from :func:`leading_direction`
    (an upper bound of the best rank-one residual, exact when M has rank one); higher ranks: the SVD."""
    if mats.numel() == 0:
        return 0.0
    if not bool(torch.isfinite(mats).all()):
        return BIG
    total = mats.pow(2).sum()
    if float(total) == 0:
        return 0.0
    if rank > 1:
        sv = torch.linalg.svdvals(mats)
        return float((sv[..., rank:].pow(2).sum() / total).sqrt())
    a = leading_direction(mats)
    resid = mats - torch.einsum("...r,...c->...rc", torch.einsum("...rc,...c->...r", mats, a), a)
    return float((resid.pow(2).sum() / total).sqrt())


def result(name: str, tag: str, stat: float, tol: float, detail: str, *, passes_above: bool = False) -> AuditCheck:
    """The check's verdict from its statistic: passed when ``stat <= tol`` (``passes_above``: when ``stat > tol``)."""
    passed = stat > tol if passes_above else stat <= tol
    return AuditCheck(name, tag, bool(passed), finite(float(stat)), tol, detail)


def cannot_tell(name: str, tag: str, tol: float, why: str) -> AuditCheck:
    return AuditCheck(name, tag, None, 0.0, tol, f"not applicable: {why}")


class Probe:
    """Seeded inputs and calls for one target in one mode (causal or not); ``tol`` follows the target's precision."""

    def __init__(self, adapter: Adapter, causal: bool, seed: int = 0, batch: int = 2, seq: int = 8):
        self.a, self.causal, self.batch, self.seq = adapter, causal, batch, seq
        self.g = torch.Generator().manual_seed(seed)
        self.tol = tolerance(adapter.precision or adapter.dtype)
        self.fd_precision = adapter.derivative_precision or adapter.dtype

    @property
    def fd_step(self) -> float:
        """Central-difference step eps^(1/3) of the target's ``derivative_precision`` (else its dtype): a step below
        the rounding of what the target computes in measures that rounding, not the derivative."""
        return float(torch.finfo(self.fd_precision).eps) ** (1 / 3)

    @property
    def is_causal(self) -> bool:
        return bool(self.causal or self.a.causal)

    def randn(self, *shape: int, scale: float = 1.0) -> Tensor:
        return scale * torch.randn(*shape, generator=self.g, dtype=torch.float64).to(self.a.dtype)

    def qkv(self, seq: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
        n = seq or self.seq
        shape = (self.batch, n, self.a.dim)
        return self.randn(*shape), self.randn(*shape), self.randn(*shape)  # drawn in this order: q, k, v

    def f(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        with torch.no_grad():
            return self.a(q, k, v, causal=self.causal).to(torch.float64)

    def visible(self, q_len: int, k_len: int) -> Tensor:
        """Bool (q_len, k_len): True where key j is visible to query i (bottom-right causal alignment)."""
        if not self.is_causal:
            return torch.ones(q_len, k_len, dtype=torch.bool)
        return torch.arange(k_len).unsqueeze(0) <= torch.arange(q_len).unsqueeze(-1) + (k_len - q_len)

    def directions(self, dim: int) -> Tensor:
        """(dim, m) value directions: the basis vectors e_m when dim <= MAX_DIRECTIONS, else MAX_DIRECTIONS random
        orthonormal ones (a departure is missed only if it vanishes on that random subspace)."""
        if dim <= MAX_DIRECTIONS:
            return torch.eye(dim, dtype=torch.float64)
        return torch.linalg.qr(torch.randn(dim, MAX_DIRECTIONS, generator=self.g, dtype=torch.float64))[0]

    def value_jacobian(
        self, q: Tensor, k: Tensor, v: Tensor | None = None, rdirs: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """How the outputs move with each key's value: (base (b, L, dim), J (b, L, S, dim, m), R (dim, m)).

        ``v`` None: J[:, i, j, :, c] = f(v_j = r_c, other values 0) - f(0), exact for a map affine in the values.
        Otherwise central differences at ``v`` with step :attr:`fd_step` (the local Jacobian).
        ``rdirs`` (dim, m): the directions r_c (default :meth:`directions`).
        """
        b, s, d = k.shape
        rdirs = self.directions(d) if rdirs is None else rdirs
        m = rdirs.shape[1]
        at = torch.zeros_like(k) if v is None else v
        h = 1.0 if v is None else self.fd_step
        base = self.f(q, k, at)
        chunk = max(1, PROBE_ELEMENTS // max(1, b * s * max(d, base.shape[-1] * q.shape[1] // s)))

        def moved(idx: Tensor, step: Tensor) -> Tensor:
            """Outputs (t, b, L, dim) with value idx // m moved by step (t, 1, d), one probe per row of idx."""
            n = len(idx)
            vv = at.unsqueeze(0).repeat(n, 1, 1, 1)
            vv[torch.arange(n), :, idx // m] += step
            return self.f(q.repeat(n, 1, 1), k.repeat(n, 1, 1), vv.reshape(n * b, s, d)).view(n, b, *base.shape[1:])

        cols = []
        for start in range(0, s * m, chunk):
            idx = torch.arange(start, min(start + chunk, s * m))
            step = (h * rdirs[:, idx % m].T).to(k.dtype).unsqueeze(1)  # (t, 1, d)
            cols.append(moved(idx, step) - base if v is None else (moved(idx, step) - moved(idx, -step)) / (2 * h))
        jac = torch.cat(cols).view(s, m, *base.shape).permute(2, 3, 0, 4, 1)
        return base, jac, rdirs

    def head_blocks(self, jac: Tensor) -> Tensor:
        """(b, L, S, dim, m) -> (heads, b, L, S, head_dim * m): each head's output rows."""
        b, L, s, d, m = jac.shape
        hd = d // self.a.num_heads
        return jac.reshape(b, L, s, self.a.num_heads, hd * m).permute(3, 0, 1, 2, 4)

    def weights(self, q: Tensor, k: Tensor) -> tuple[Tensor | None, str]:
        """Weights (batch, heads, q_len, k_len) in float64 and how they were obtained (None + reason if unknown).

        Targets that do not expose weights are probed through linearity in the values (:meth:`value_jacobian`):
        with one scalar relevance per key, head h's rows of J_ij are w_hij A_h for one matrix A_h (the value map
        restricted to the head: the identity for a plain function of mapped values, W_v for a function with its own
        value map). w is the leading singular factor, scaled so that the mean row sum is 1 and signed to make it
        positive: a constant factor folds into A_h. The probe is verified on random values before it is trusted.
        """
        if self.a.exposes_weights:
            with torch.no_grad():
                w = self.a.weights(q, k, causal=self.causal)
            if w is not None:
                return w.to(torch.float64), "weights exposed by the target"
        # Every direction on (at most) two inputs; then, the structure being verified, one direction on the rest.
        few = slice(0, min(2, k.shape[0]))
        base, jac, rdirs = self.value_jacobian(q[few], k[few])
        coef = torch.randn(jac.shape[0], k.shape[1], rdirs.shape[1], generator=self.g, dtype=torch.float64)
        predicted = base + torch.einsum("blsom,bsm->blo", jac, coef)
        err = rel(self.f(q[few], k[few], (coef @ rdirs.T).to(k.dtype)), predicted)
        if err > self.tol:
            return None, (f"weights not recoverable: the output is not linear in the values (probe error {err:.2g})")
        blocks = self.head_blocks(jac)
        per_head = max(rank1_residual(blk.flatten(0, 2)) for blk in blocks)
        if per_head > self.tol:
            if self.a.num_heads > 1 and rank1_residual(jac.flatten(0, 2).flatten(-2), self.a.num_heads) <= self.tol:
                return None, (
                    "weights not recoverable per head: the Jacobians span heads-many directions, as one "
                    "scalar relevance per key and head does, but a map after the sum mixes the heads' "
                    "outputs, so which weights belong to which head is not identifiable"
                )
            return None, (
                f"weights not recoverable: no single scalar relevance per key (every coordinate of a head "
                f"does not see the same weights; rank-one residual {per_head:.2g})"
            )
        if k.shape[0] > jac.shape[0]:
            r = torch.randn(k.shape[-1], 1, generator=self.g, dtype=torch.float64)
            blocks = self.head_blocks(self.value_jacobian(q, k, rdirs=r / r.norm())[1])
        return self._scaled_factor(blocks, q.shape[1], k.shape[1]), "weights probed through linearity in the values"

    def _scaled_factor(self, blocks: Tensor, q_len: int, k_len: int) -> Tensor:
        vis = self.visible(q_len, k_len)
        out = []
        for blk in blocks:  # (b, L, S, hd * m)
            w = blk @ leading_direction(blk.flatten(0, 2))
            sums = w.sum(-1)[:, vis.any(-1)]  # full rows: weight leaking past a mask stays in the row
            c = float(sums.mean())
            size = float(w.abs().sum(-1).mean())
            out.append(w / (c if abs(c) > 1e-6 * size else (size or 1.0)))
        return torch.stack(out, dim=1)


def random_rotation(d: int, g: torch.Generator, reflections: int = 4) -> Tensor:
    """A (d, d) rotation, the product of ``reflections`` (even) random Householder reflections.

    Generic (no axis alignment) and cheap; not Haar-distributed, which no check needs **(our choice)**.
    """
    m = torch.eye(d, dtype=torch.float64)
    for _ in range(reflections):
        u = torch.randn(d, generator=g, dtype=torch.float64)
        m = m - 2 * torch.outer(m @ u, u) / u.dot(u)
    return m


def heads(x: Tensor, n: int) -> Tensor:
    """(..., dim) -> (..., n, dim // n)."""
    return x.view(*x.shape[:-1], n, x.shape[-1] // n)
