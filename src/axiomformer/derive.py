"""The derivation A0 -> A5 as data: each step has its assumption, its formula, a module and a numerical check.

Source: Somani, "A Minimal Route to Transformer Attention" (assumptions A0-A5, restated in ``docs/SOURCES.md``).
The modules and the parametrization in which "impose the assumption" is a parameter setting are in
:mod:`axiomformer.derive_modules`.

>>> chain = derive()
>>> [s.id for s in chain.steps], all(s.check.passed for s in chain.steps)
(['A0', 'A1', 'A2', 'A3', 'A4', 'A5'], True)
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from axiomformer.derive_modules import DTYPE, GeneralForm, StandardForm

FLOAT64_TOL = 1e-10
"""Tolerance of the float64 steps A0..A4 (round-off only)."""
SDPA_TOL = 1e-5
"""Tolerance of A5 and of the final comparison: the reference engine normalizes in float32 (see ``axes/normalizer``)."""
SCALE_DIMS = (16, 64, 256)


@dataclass
class Check:
    """The numerical check of one step: ``max_abs_err`` over causal and non-causal inputs, ``passed`` iff <= tol."""

    description: str
    max_abs_err: float
    passed: bool
    tolerance: float
    gap_without_assumption: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"description": self.description, "max_abs_err": self.max_abs_err, "passed": self.passed}


@dataclass
class Step:
    """One step of the chain: ``module`` realizes the general form once A1..A<k> hold."""

    id: str
    assumption: str
    formula: str
    latex: str
    module: nn.Module
    check: Check

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "assumption": self.assumption, "formula": self.formula, "check": self.check.to_dict()}


@dataclass
class Chain:
    """The derivation: ``steps`` A0..A5, the final comparison with PyTorch's SDPA, and the 1/sqrt(d) argument."""

    steps: list[Step]
    final_vs_sdpa_max_abs_err: float
    scale_argument: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(s.check.passed for s in self.steps) and self.final_vs_sdpa_max_abs_err <= SDPA_TOL

    def to_dict(self) -> dict[str, Any]:
        """``{"steps": [...], "final_vs_sdpa_max_abs_err": float, "scale_argument": {...}}``."""
        return {"steps": [s.to_dict() for s in self.steps],
                "final_vs_sdpa_max_abs_err": self.final_vs_sdpa_max_abs_err,
                "scale_argument": self.scale_argument}


# (id, assumption in words, plain formula, LaTeX formula, what the check imposes)
_TEXT = [
    ("A0", "symmetry: once relevances are known, the output does not depend on the order of the visible tokens "
           "(Deep Sets, Zaheer et al. 2017, Thm 2)",
     "y_i = rho( sum_j phi(x_j, u_ij) ), j over the visible tokens",
     r"y_i = \rho\Big(\sum_{j} \phi(x_j, u_{ij})\Big)", ""),
    ("A1", "simplicity: the aggregator rho is the identity",
     "y_i = sum_j phi(x_j, u_ij)", r"y_i = \sum_j \phi(x_j, u_{ij})", "rho"),
    ("A2", "relevance-contribution proportionality: scaling u_ij by k scales token j's contribution by k",
     "y_i = sum_j u_ij v(x_j)", r"y_i = \sum_j u_{ij}\, v(x_j)", "g"),
    ("A3", "linear change of coordinates: v(x) = W_v x",
     "y_i = sum_j u_ij W_v x_j", r"y_i = \sum_j u_{ij}\, W_v x_j", "n"),
    ("A4", "efficient parallel scoring: relevance from the bilinear score s_ij = q_i . k_j, q = W_q x, k = W_k x",
     "y_i = sum_j r(s_i)_j W_v x_j, s_ij = (W_q x_i) . (W_k x_j)",
     r"y_i = \sum_j r(s_{i\cdot})_j\, W_v x_j,\quad s_{ij} = (W_q x_i)^\top (W_k x_j)", "m"),
    ("A5", "normalization: relevance is relative (shift-invariant), sums to one, is differentiable, and the "
           "1/sqrt(d) keeps the logits O(1)",
     "y_i = sum_j softmax_j(q_i . k_j / sqrt(d)) W_v x_j",
     r"y_i = \sum_j \mathrm{softmax}_j\!\Big(\frac{q_i^\top k_j}{\sqrt{d}}\Big)\, W_v x_j", "r"),
]


def _inputs(d: int, batch: int, seq: int, seed: int) -> Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq, d, generator=g, dtype=DTYPE)


def _max_err(f: Callable[[Tensor, bool], Tensor], g: Callable[[Tensor, bool], Tensor], x: Tensor) -> float:
    with torch.no_grad():
        return max(float((f(x, c) - g(x, c)).abs().max()) for c in (False, True))


def _symmetry_err(module: nn.Module, x: Tensor, seed: int) -> float:
    """Max change of y_i when the tokens visible to query i are permuted (all of them; the prefix j <= i if causal)."""
    g = torch.Generator().manual_seed(seed + 1)
    n = x.shape[1]
    errs = []
    with torch.no_grad():
        y = module(x, x, causal=False)
        perm = torch.randperm(n, generator=g)
        errs.append(float((module(x, x[:, perm], causal=False) - y).abs().max()))
        y = module(x, x, causal=True)
        for i in range(n):
            prefix = torch.randperm(i + 1, generator=g)
            ctx = torch.cat([x[:, prefix], x[:, i + 1:]], dim=1)
            errs.append(float((module(x, ctx, causal=True)[:, i] - y[:, i]).abs().max()))
    return max(errs)


def scale_argument(dims: tuple[int, ...] = SCALE_DIMS, n_keys: int = 64, samples: int = 4096,
                   seed: int = 0) -> dict[str, Any]:
    """The 1/sqrt(d) argument, measured (Somani A5; Vaswani et al. 2017, footnote 4).

    For q, k with i.i.d. unit-variance entries, Var(q.k) = d. With ``n_keys`` keys per query, the mean attention
    entropy (nats) of softmax(q.k / sqrt(d)) stays put as d grows, while that of softmax(q.k) collapses toward 0.

    Returns:
        ``{"dims", "var_qk", "entropy_scaled", "entropy_unscaled", "max_entropy", "n_keys", "samples"}``.
    """
    g = torch.Generator().manual_seed(seed)
    out: dict[str, Any] = {"dims": list(dims), "var_qk": [], "entropy_scaled": [], "entropy_unscaled": [],
                           "max_entropy": math.log(n_keys), "n_keys": n_keys, "samples": samples}

    def entropy(logits: Tensor) -> float:
        p = torch.softmax(logits, dim=-1)
        return float(-(p * torch.log_softmax(logits, dim=-1)).sum(-1).mean())

    for d in dims:
        q = torch.randn(samples, d, generator=g, dtype=DTYPE)
        k = torch.randn(samples, d, generator=g, dtype=DTYPE)
        out["var_qk"].append(float((q * k).sum(-1).var()))
        queries = q[: samples // n_keys]
        keys = k[:n_keys]
        s = queries @ keys.T
        out["entropy_scaled"].append(entropy(s / math.sqrt(d)))
        out["entropy_unscaled"].append(entropy(s))
    return out


def derive(d: int = 8, hidden: int = 16, batch: int = 2, seq: int = 6, seed: int = 0) -> Chain:
    """Build and check the chain A0 -> A5 on seeded float64 inputs x (batch, seq, d).

    Each check A1..A5 takes the previous module, sets its parameters so that the new assumption holds (a deep copy;
    the previous module is left as it was) and measures the largest |difference| from the next, simpler module on the
    same inputs, causal and not. ``gap_without_assumption`` is the same difference *before* the parameters are set,
    which shows the check is not vacuous. A0 checks permutation invariance over the visible tokens.

    Returns:
        A :class:`Chain`; ``chain.passed`` iff every step passes and the A5 module matches
        ``torch.nn.functional.scaled_dot_product_attention`` within 1e-5, causal and not.
    """
    x = _inputs(d, batch, seq, seed)
    module: nn.Module = GeneralForm.general(d, hidden, seed)
    steps: list[Step] = []
    for sid, words, formula, latex, part in _TEXT:
        if sid == "A0":
            err = _symmetry_err(module, x, seed)
            check = Check("permuting the visible tokens (keys and values together) leaves y_i unchanged, "
                          "causal and not", err, err <= FLOAT64_TOL, FLOAT64_TOL)
        else:
            prev = module
            imposed = copy.deepcopy(prev)
            if part == "r":
                imposed.r.impose_softmax(d)
                module = StandardForm(prev)
                tol = SDPA_TOL
                how = "A4 module with r set to softmax(s / sqrt(d)) (a=0, b=1, c=1, tau=1/sqrt(d))"
                nxt = "axiomformer's standard Attention"
            else:
                getattr(imposed, part).zero_output()
                module = prev.without(part)
                tol = FLOAT64_TOL
                how = f"{steps[-1].id} module with its sub-network {part!r} set to zero"
                nxt = f"the {sid} module"
            err = _max_err(lambda t, c: imposed(t, causal=c), lambda t, c: module(t, causal=c), x)
            gap = _max_err(lambda t, c: prev(t, causal=c), lambda t, c: module(t, causal=c), x)
            check = Check(f"{how} computes what {nxt} computes (without it they differ by {gap:.3g})",
                          err, err <= tol, tol, gap)
        steps.append(Step(sid, words, formula, latex, module, check))

    a5 = steps[-1].module
    errs = []
    with torch.no_grad():
        wq, wk, wv = (w.weight for w in (a5.attn.q_proj, a5.attn.k_proj, a5.attn.v_proj))
        for causal in (False, True):
            ref = F.scaled_dot_product_attention((x @ wq.T)[:, None], (x @ wk.T)[:, None], (x @ wv.T)[:, None],
                                                 is_causal=causal)[:, 0]
            errs.append(float((a5(x, causal=causal) - ref).abs().max()))
    return Chain(steps, max(errs), scale_argument(seed=seed))


def to_text(chain: Chain) -> str:
    """Plain-text rendering: one block per step, the final comparison and the 1/sqrt(d) argument."""
    lines = []
    for s in chain.steps:
        c = s.check
        lines += [f"{s.id}  {s.assumption}", f"    {s.formula}",
                  f"    check: {c.description}", f"    max |err| = {c.max_abs_err:.3g} (tol {c.tolerance:g}) "
                  f"{'PASS' if c.passed else 'FAIL'}"]
    lines.append(f"final: A5 module vs torch.nn.functional.scaled_dot_product_attention, causal and not: "
                 f"max |err| = {chain.final_vs_sdpa_max_abs_err:.3g} (tol {SDPA_TOL:g})")
    sa = chain.scale_argument
    lines.append(f"1/sqrt(d): unit-variance q, k; {sa['n_keys']} keys; entropy in nats (max {sa['max_entropy']:.3f})")
    for d, var, hs, hu in zip(sa["dims"], sa["var_qk"], sa["entropy_scaled"], sa["entropy_unscaled"]):
        lines.append(f"    d={d:<4d} Var(q.k)={var:8.2f}   entropy with 1/sqrt(d): {hs:.3f}   without: {hu:.3f}")
    return "\n".join(lines)


def to_markdown(chain: Chain) -> str:
    """Markdown with LaTeX formulas (``$$ ... $$``), as written to ``docs/derive.md``."""
    out = ["# The derivation of attention, run and checked", "",
           "Generated by `axiomformer derive --format md`. Source: Somani, *A Minimal Route to Transformer "
           "Attention*; the parametrization that turns each assumption into a parameter setting is ours "
           "(`axiomformer/derive_modules.py`). Inputs: seeded float64 tokens; every check runs causal and not.", ""]
    for s in chain.steps:
        c = s.check
        out += [f"## {s.id}: {s.assumption}", "", f"$$ {s.latex} $$", "",
                f"- module: `{type(s.module).__name__}`",
                f"- check: {c.description}",
                f"- max abs error: `{c.max_abs_err:.3g}` (tolerance `{c.tolerance:g}`): "
                f"**{'passed' if c.passed else 'FAILED'}**", ""]
    out += ["## Final: the A5 module is `torch.nn.functional.scaled_dot_product_attention`", "",
            r"$$ \mathrm{Attention}(Q, K, V) = \mathrm{softmax}\Big(\frac{QK^\top}{\sqrt{d}}\Big) V $$", "",
            f"Max abs error against SDPA, causal and not: `{chain.final_vs_sdpa_max_abs_err:.3g}` "
            f"(tolerance `{SDPA_TOL:g}`).", "", "## Why $1/\\sqrt{d}$, measured", "",
            r"For $q, k$ with i.i.d. unit-variance entries, $\mathrm{Var}(q^\top k) = d$, so unscaled logits grow "
            r"like $\sqrt{d}$ and the softmax saturates. Entropies in nats over "
            f"{chain.scale_argument['n_keys']} keys (maximum {chain.scale_argument['max_entropy']:.3f}).", "",
            "| d | Var(q.k) | entropy with 1/sqrt(d) | entropy without |", "|---|---|---|---|"]
    sa = chain.scale_argument
    for d, var, hs, hu in zip(sa["dims"], sa["var_qk"], sa["entropy_scaled"], sa["entropy_unscaled"]):
        out.append(f"| {d} | {var:.2f} | {hs:.3f} | {hu:.3f} |")
    return "\n".join(out) + "\n"
