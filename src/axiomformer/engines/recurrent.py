"""The recurrent engine: a transport with a state (``axes/transport.py``, trait ``state``) chunk by chunk.

The delta-rule family and Mamba-2 have no normalizer over the keys, so their output is o_t = S_t (scale q_t) with the
(head_dim_v x head_dim) state S_t = S_{t-1} P_t + gamma_t v_t k_t^T, P_t = Diag(alpha_t) (I - beta_t w_t w_t^T). Within
a chunk the products are the UT form of ``transported_scores`` with the chunk's own cumulative log decay c (so every
exponent c_a - c_b, a >= b, is <= 0), plus the state entering the chunk S_0:

    U = (I + (M' o G(W, W)) diag beta)^-1 [ (W o e^c) S_0^T + (M' o G(W, K)) diag(gamma) V ]     (u_t = S_{t-1} w_t)
    O = (Q o e^c) S_0^T + (M o G(Q, K)) diag(gamma) V - (M o G(Q, W)) diag(beta) U
    S_end = S_0 o e^{c_end} + V^T diag(gamma) (K o e^{c_end - c}) - U^T diag(beta) (W o e^{c_end - c})

(Yang et al. 2024, DeltaNet's chunkwise form, arXiv:2406.06484, sec. 3, with the decay of Gated DeltaNet / KDA). One
chunk of the whole sequence is the parallel form, chunks of one token the recurrence; a KV cache keeps S for decoding.
Memory is O(L) in the length (O(chunk^2) per step).

:func:`state_form` is that algebra under autograd: KV-cache decoding runs it, and so does a second-order backward.
The engine runs ``engines/state_chunked.chunkwise_state_form`` -- the same output, every chunk's products at once for
a group of chunks and a written-out backward that keeps only the inputs -- which is what makes the transports' rows of
the bench O(L) in memory and faster than SDPA at L = 4096.
"""

from __future__ import annotations

import torch
from torch import Tensor

from axiomformer.axes.transport import TransportGates
from axiomformer.engines.base import Computes, EngineBase
from axiomformer.engines.plan import Plan, ProblemKind
from axiomformer.engines.problem import AttentionProblem
from axiomformer.engines.state_chunked import chunkwise_state_form
from axiomformer.engines.state_form import DEFAULT_CHUNK
from axiomformer.precision import compute_dtype


def sequential_kind(kind: ProblemKind) -> bool:
    """Whether a transport's sequential forms (state form, chunked form) run problems of this kind: a causal,
    bottom-right aligned problem with no mask but key padding, no float bias, ALiBi, dropout or window, and not while
    ``torch.compile`` traces (a Python loop over the chunks)."""
    return (
        kind.mask in ("none", "key")
        and not kind.bias
        and kind.alibi == "none"
        and not kind.dropout
        and not kind.window
        and kind.aligned
        and kind.causal
        and not kind.compiling
    )


def aligned_inputs(
    problem: AttentionProblem, scaled: bool = True
) -> tuple[Tensor, Tensor, Tensor, TransportGates, Tensor | None, int]:
    """The inputs of a transport's sequential forms (state form, chunked form), in max(q, k dtype, float32):
    ``(qs, k, v, gates, keep, lead)`` with the queries (multiplied by the scale unless ``scaled`` is False)
    front-padded by ``lead`` rows to the key length (bottom-right aligned: ``lead`` keys before the first query), the
    gates masked at padded keys and ``keep`` (batch, k_len) the key padding (None without a mask)."""
    q, k, v = problem.q, problem.k, problem.v
    dtype = compute_dtype(q.dtype, k.dtype)
    keep = None
    if problem.mask is not None:  # key padding: (batch|1, 1, 1, k_len)
        keep = torch.broadcast_to(problem.mask, (q.shape[0], 1, 1, k.shape[-2]))[:, 0, 0]
    gates = problem.transport.cast(dtype).masked(keep)
    scale = problem.scale.to(dtype) if isinstance(problem.scale, Tensor) else problem.scale
    lead = k.shape[-2] - q.shape[-2]
    qs = q.to(dtype) * scale if scaled else q.to(dtype)
    qs = torch.nn.functional.pad(qs, (0, 0, lead, 0)) if lead else qs
    return qs, k.to(dtype), v.to(dtype), gates, keep, lead


class RecurrentEngine(EngineBase):
    """A transport with a state (trait ``state``, normalizer trait ``identity``) in O(L) memory, forward and backward:
    ``engines/state_chunked.chunkwise_state_form`` in chunks of ``chunk`` tokens, ``group`` tokens at a time in the
    backward (default: its ``GROUP_ELEMENTS``). With trait ``delta`` (w_t = k_t) it reads the keys as the Householder
    vectors, one Gram matrix for both.

    Declines: weights requests (it has none), masks other than key padding (a padded key's gates are zero already:
    ``TransportGates.masked``), float biases, ALiBi, dropout, windows, a query offset other than the bottom-right one,
    and ``torch.compile`` tracing (the chunk loop would compile a graph per length)."""

    name = "recurrent"
    returns_weights = False
    double_backward = True
    transports = True
    computes = Computes(all_of={"transport": {"state"}, "normalizer": {"identity"}, "contribution": {"proportional"}})

    def __init__(self, chunk: int = DEFAULT_CHUNK, group: int | None = None):
        self.chunk = chunk
        self.group = group  # tokens per group of chunks in the backward (None: ``state_chunked.GROUP_ELEMENTS``)

    def accepts(self, plan: Plan, kind: ProblemKind) -> bool:
        return sequential_kind(kind)

    def __call__(
        self, plan: Plan, problem: AttentionProblem, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        # A number scale is applied chunk by chunk inside (no scaled copy of the queries kept for the backward).
        fold = not isinstance(problem.scale, Tensor)
        qs, k, v, gates, _, lead = aligned_inputs(problem, scaled=not fold)
        shared = "delta" in plan.transport_traits  # w_t = k_t: one Gram matrix serves the keys and the reflections
        scale = float(problem.scale) if fold else 1.0
        out, _ = chunkwise_state_form(qs, k, v, gates, scale=scale, chunk=self.chunk, group=self.group, shared=shared)
        return out[:, :, lead:].to(problem.v.dtype), None
