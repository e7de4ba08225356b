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
TOL = 1e-4
"""Tolerance of the equality-type checks (relative): float32 normalizers leave errors near 1e-7."""


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

    def to_dict(self) -> dict[str, Any]:
        """``{"name", "assumption", "passed", "statistic", "tolerance", "detail", "candidates"}``."""
        return {"name": self.name, "assumption": self.assumption, "passed": self.passed,
                "statistic": self.statistic, "tolerance": self.tolerance, "detail": self.detail,
                "candidates": list(self.candidates)}


def finite(x: float) -> float:
    return x if math.isfinite(x) else BIG


def rel(a: Tensor, b: Tensor, ref: Tensor | None = None) -> float:
    """max |a - b| / max |ref| (ref defaults to b); 1e30 if anything is non-finite or the shapes differ."""
    ref = b if ref is None else ref
    if a.shape != b.shape or not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return BIG
    return finite(float((a - b).abs().max() / ref.abs().max().clamp_min(1e-12))) if a.numel() else 0.0


def result(name: str, tag: str, stat: float, tol: float, detail: str) -> AuditCheck:
    return AuditCheck(name, tag, bool(stat <= tol), finite(float(stat)), tol, detail)


def cannot_tell(name: str, tag: str, tol: float, why: str) -> AuditCheck:
    return AuditCheck(name, tag, None, 0.0, tol, f"not applicable: {why}")


class Probe:
    """Seeded inputs and calls for one target in one mode (causal or not)."""

    def __init__(self, adapter: Adapter, causal: bool, seed: int = 0, batch: int = 2, seq: int = 8):
        self.a, self.causal, self.batch, self.seq = adapter, causal, batch, seq
        self.g = torch.Generator().manual_seed(seed)

    @property
    def is_causal(self) -> bool:
        return bool(self.causal or self.a.causal)

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
        if not self.is_causal:
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


def heads(x: Tensor, n: int) -> Tensor:
    """(..., dim) -> (..., n, dim // n)."""
    return x.view(*x.shape[:-1], n, x.shape[-1] // n)
