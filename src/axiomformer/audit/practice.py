"""Practitioners' checks (``axiomformer audit TARGET --practice``): the silent failures users hit, one verdict each.

Each check runs the target under a causal mask (its own, or one on request) and compares two computations that must
agree; the statistic is the relative difference (:func:`axiomformer.audit.probe.rel`) and the tolerance follows the
precision the target computes in. The failures come from peers' trackers:

* ``future_tokens``: perturbing the tokens after position i changes no output at or before i (a custom attention
  function registered without its mask function silently drops the causal mask: transformers PR #45811).
* ``cache_decode``: decoding token by token through the target's own cache equals the full forward (transformers
  #48947, x-transformers #219 / #322). Targets with a cache: axiomformer ``Attention`` (:class:`KVCache`), a
  transformers model (its ``DynamicCache``, run through the whole model), a function with a ``decode`` attribute.
* ``compiled_eager``: ``torch.compile`` of the target equals the eager target, over several lengths; dynamo's
  fall-back to eager past its recompile limit is reported (flash-linear-attention #52).
* ``odd_lengths``: at odd and prime lengths (1, 3, 5, 7, 11, 13) the outputs *and* the gradients equal the first rows
  of a run at length 16 (a causal map's prefix does not depend on what follows; flash-linear-attention #1140, #1142).
* ``masked_keys``: keys hidden by the mask get weight 0 and gradient 0 (their queries' outputs do not move with
  their keys or values, to first order).
"""

from __future__ import annotations

import functools
import logging
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from axiomformer.audit.adapters import Adapter, make_adapter
from axiomformer.audit.probe import AuditCheck, Probe, cannot_tell, rel, result

ODD_LENGTHS = (1, 3, 5, 7, 11, 13)
REFERENCE_LENGTH = 16
COMPILE_LENGTHS = (8, 5, 16)
TAG = "practice"


def _causal_only(check: Callable[[Probe], AuditCheck]) -> Callable[[Probe], AuditCheck]:
    """``check``, which tests the causal mask: ``cannot_tell`` under its name where the target cannot apply one."""

    @functools.wraps(check)
    def guarded(p: Probe) -> AuditCheck:
        if not p.is_causal:
            why = "the target cannot apply a causal mask (no causal keyword, not causal)"
            return cannot_tell(check.__name__, TAG, p.tol, why)
        return check(p)

    return guarded


@_causal_only
def future_tokens(p: Probe) -> AuditCheck:
    """Outputs at i <= i0 do not change when every token after i0 is redrawn (at 3x scale)."""
    name = "future_tokens"
    q, k, v = p.qkv()
    i0 = p.seq // 2
    moved = [t.clone() for t in (q, k, v)]
    for t in moved:
        t[:, i0 + 1 :] = p.randn(p.batch, p.seq - i0 - 1, p.a.dim, scale=3.0)
    stat = rel(p.f(*moved)[:, : i0 + 1], p.f(q, k, v)[:, : i0 + 1])
    return result(name, TAG, stat, p.tol, f"redrawing the tokens after {i0} leaves the outputs at i <= {i0} unchanged")


@_causal_only
def cache_decode(p: Probe) -> AuditCheck:
    """Token-by-token decoding through the target's own cache equals the full forward."""
    name = "cache_decode"
    whole = getattr(p.a, "model_cache_gap", None)
    if callable(whole):  # a transformers model: its own cache, through every layer, in its own dtype
        measured = whole(p.seq, p.g)
        if measured is None:
            return cannot_tell(name, TAG, p.tol, "the model is bidirectional (causal only on request): no cache decode")
        stat, tol, how = measured
        return result(name, TAG, stat, tol, how)
    q, k, v = p.qkv()
    with torch.no_grad():
        stepped = p.a.decode(q, k, v)
    if stepped is None:
        return cannot_tell(name, TAG, p.tol, "the target exposes no cache (no decode)")
    stat = rel(stepped.to(torch.float64), p.f(q, k, v))
    return result(
        name, TAG, stat, p.tol, f"decoding {p.seq} tokens one at a time through its cache equals the full forward"
    )


class _DynamoLog(logging.Handler):
    """Collects dynamo's log records while a compiled target runs (scoped: removed afterwards)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _fresh_call(p: Probe) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """A call of the target with a code object of its own: dynamo keeps its compiled graphs (and counts
    recompilations) per code object, so each audit compiles afresh and leaves nothing behind when it ends."""

    def call(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return p.a(q, k, v, causal=p.causal)

    return types.FunctionType(call.__code__.replace(), call.__globals__, "call", None, call.__closure__)


RECOMPILE_LIMIT = 4096
"""Dynamo's recompile limits while ``compiled_eager`` runs (scoped): the module code an audit compiles (e.g.
``LlamaAttention.forward``) is shared by every instance, and each audited instance adds guarded entries."""


def _compiled_runs(p: Probe, backend: str) -> tuple[float, str | None]:
    """(worst relative gap, the dynamo fall-back line if dynamo ran any call uncompiled)."""
    compiled = torch.compile(_fresh_call(p), backend=backend, dynamic=False)
    log, logger = _DynamoLog(), logging.getLogger("torch._dynamo")
    logger.addHandler(log)
    stats = []
    limits: dict[str, Any] = {"recompile_limit": RECOMPILE_LIMIT, "accumulated_recompile_limit": RECOMPILE_LIMIT}
    try:
        with torch._dynamo.config.patch(**limits):
            for n in COMPILE_LENGTHS:
                q, k, v = p.qkv(n)
                with torch.no_grad():
                    stats.append(rel(compiled(q, k, v).to(torch.float64), p.f(q, k, v)))
    finally:
        logger.removeHandler(log)
    fell_back = [line for line in log.lines if "recompile_limit" in line or "cache_size_limit" in line]
    return max(stats), (fell_back[0].splitlines()[0] if fell_back else None)


def compiled_eager(p: Probe, backend: str = "aot_eager") -> AuditCheck:
    """``torch.compile`` (``backend``) of the target equals the eager target at lengths 8, 5 and 16."""
    name = "compiled_eager"
    try:
        stat, fell_back = _compiled_runs(p, backend)
    except Exception as err:  # dynamo raises many types; the verdict says which
        return cannot_tell(name, TAG, p.tol, f"torch.compile(backend={backend!r}) failed: {type(err).__name__}: {err}")
    if fell_back:
        return cannot_tell(name, TAG, p.tol, f"dynamo ran calls uncompiled past its recompile limit ({fell_back})")
    lengths = ", ".join(map(str, COMPILE_LENGTHS))
    return result(name, TAG, stat, p.tol, f"torch.compile(backend={backend!r}) equals eager at lengths {lengths}")


def _grads(p: Probe, q: Tensor, k: Tensor, v: Tensor, rows: int, r: Tensor) -> tuple[Tensor, list[Tensor]]:
    """Output rows < ``rows`` and the gradients of sum(r * out[:, :rows]) in q, k, v (their first ``rows`` tokens)."""
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out = p.a(*leaves, causal=p.causal)[:, :rows]
    grads = torch.autograd.grad((out * r.to(out.dtype)).sum(), leaves, allow_unused=True)
    return out.detach().double(), [
        torch.zeros_like(t)[:, :rows].double() if g is None else g[:, :rows].double() for t, g in zip(leaves, grads)
    ]


@_causal_only
def odd_lengths(p: Probe) -> AuditCheck:
    """At each odd / prime length n the outputs and gradients equal the first n rows of a run at length 16."""
    name = "odd_lengths"
    q, k, v = p.qkv(REFERENCE_LENGTH)
    stats: dict[int, tuple[float, float]] = {}
    try:
        for n in ODD_LENGTHS:
            r = p.randn(p.batch, n, p.a.dim)
            out, grads = _grads(p, q, k, v, n, r)
            small, small_grads = _grads(p, q[:, :n], k[:, :n], v[:, :n], n, r)
            # gradients relative to the largest of all three (one of them may be ~0, e.g. the keys at length 1)
            stats[n] = (rel(small, out), rel(torch.cat(small_grads, -1), torch.cat(grads, -1)))
    except (RuntimeError, ValueError) as err:
        return cannot_tell(name, TAG, p.tol, f"the target fails at length {n}: {err}")
    worst = max(stats, key=lambda n: max(stats[n]))
    return result(
        name,
        TAG,
        max(stats[worst]),
        p.tol,
        f"at lengths {', '.join(map(str, ODD_LENGTHS))} the outputs and the gradients in q, k, v equal the first rows "
        f"of a run at length {REFERENCE_LENGTH} (worst: length {worst}, forward {stats[worst][0]:.2g}, gradients "
        f"{stats[worst][1]:.2g})",
    )


@_causal_only
def masked_keys(p: Probe) -> AuditCheck:
    """Keys after i0 (hidden from the queries at or before i0 by the causal mask) get weight 0 and gradient 0."""
    name = "masked_keys"
    q, k, v = p.qkv()
    i0 = p.seq // 2
    r = p.randn(p.batch, i0 + 1, p.a.dim)
    _, grads = _grads(p, q, k, v, p.seq, torch.cat([r, torch.zeros(p.batch, p.seq - i0 - 1, p.a.dim)], 1))
    size = max(float(g.abs().max()) for g in grads[1:]) or 1.0
    grad_leak = max(float(g[:, i0 + 1 :].abs().max()) for g in grads[1:]) / size
    w, how = p.weights(q, k)
    weight_leak = 0.0 if w is None else float(w[..., : i0 + 1, i0 + 1 :].abs().max())
    seen = "" if w is not None else f" (weights unknown: {how}; the gradients only)"
    return result(
        name,
        TAG,
        max(grad_leak, weight_leak),
        p.tol,
        f"the keys after {i0} get weight 0 (max {weight_leak:.2g}) and their keys and values gradient 0 from the "
        f"outputs at i <= {i0} (max {grad_leak:.2g}, relative to the largest key/value gradient){seen}",
    )


PRACTICE: dict[str, Callable[..., AuditCheck]] = {
    "future_tokens": future_tokens,
    "cache_decode": cache_decode,
    "compiled_eager": compiled_eager,
    "odd_lengths": odd_lengths,
    "masked_keys": masked_keys,
}
"""The practice checks, in report order."""
CAUSAL_PREMISE = ("cache_decode", "odd_lengths", "masked_keys")
"""Checks whose comparison assumes a causal map: n/a when ``future_tokens`` failed."""


@dataclass
class PracticeReport:
    """The practice verdicts of one target: one line each, with its evidence."""

    target: str
    checks: list[AuditCheck]
    notes: tuple[str, ...] = ()

    @property
    def failed(self) -> list[str]:
        """Names of the checks that failed."""
        return [c.name for c in self.checks if c.passed is False]

    @property
    def passed(self) -> bool:
        """No practice check failed (n/a is not a failure)."""
        return not self.failed

    def __getitem__(self, name: str) -> AuditCheck:
        return next(c for c in self.checks if c.name == name)

    def to_dict(self) -> dict[str, Any]:
        """``{"target", "checks": [...], "notes"}``."""
        return {"target": self.target, "checks": [c.to_dict() for c in self.checks], "notes": list(self.notes)}

    def to_text(self) -> str:
        mark = {True: "pass", False: "FAIL", None: "n/a "}
        lines = [f"practice audit of {self.target}"]
        lines += [f"  {mark[c.passed]}  {c.name:<15} statistic {c.statistic:<10.3g} {c.detail}" for c in self.checks]
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])

    __str__ = to_text


def run_practice(
    target: Any, *, dim: int | None = None, num_heads: int | None = None, seed: int = 0, backend: str = "aot_eager"
) -> PracticeReport:
    """Run the practice checks on ``target`` (any target :func:`axiomformer.audit.run_audit` takes), under a causal
    mask when the target has or accepts one.

    Args:
        backend: ``torch.compile`` backend of ``compiled_eager`` ("aot_eager": dynamo's graph capture and
            AOTAutograd without a C++ toolchain; "inductor" for the kernels).

    Raises:
        ValueError: an unknown target (as :func:`~axiomformer.audit.adapters.make_adapter`).
    """
    options: dict[str, Any] = {"seed": seed}
    options.update({k: v for k, v in (("dim", dim), ("num_heads", num_heads)) if v is not None})
    adapter: Adapter = make_adapter(target, **options)
    causal = bool(adapter.causal or adapter.supports_causal)
    checks: list[AuditCheck] = []
    for i, (name, check) in enumerate(PRACTICE.items()):
        p = Probe(adapter, causal, seed + 50 + i)
        if checks and checks[0].passed is False and name in CAUSAL_PREMISE:
            # a leak through the mask moves every comparison that assumes it: one failure, at its place
            checks.append(cannot_tell(name, TAG, p.tol, "future_tokens failed: the target is not causal"))
            continue
        checks.append(check(p, backend) if name == "compiled_eager" else check(p))
    name = target if isinstance(target, str) else adapter.name
    return PracticeReport(name, checks, tuple(adapter.notes))
