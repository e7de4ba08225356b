"""The sdpa engine: specs that reduce exactly to ``torch.nn.functional.scaled_dot_product_attention``.

Accepts softmax (and Gumbel-softmax in eval at gumbel_tau=1, soft, which is a softmax) with proportional contributions, any value map and
aggregator (they act outside the attention core), RoPE (applied to q and k before), any scale (a learned per-head
scale is folded into q), and every score that is a dot product of transformed queries and keys:

    bilinear  q^T W_h k            = (q W_h) . k
    cosine    tau_h cos(q, k)      = (tau_h q / |q|) . (k / |k|)                  (QK-norm with learned temperature)
    neg_l2    -|q - k|^2           = [2q, 1] . [k, -|k|^2]  - |q|^2               (augmented q and k; the -|q|^2 is
                                                                                  constant in j and cancels in softmax)
ALiBi with a causal mask is a dot product too: -m_h (p_i - p_j) = m_h p_j - m_h p_i, whose query term is constant in
j, so q and k gain one column [1] and [m_h (p_j - c)] (c, the middle key position, keeps the column small). v is
zero-padded to the same width (the kernels need one head size); no further padding: with torch 2.13 on CPU, head
dims 65 and 66 ran as fast as 72 and hold 10% less **(our choice)**. In
float32 this column adds a rounding error of about 2^-24 m_h |p_j - c| to each logit (twice that with a float scale,
whose reciprocal the query column carries), so it is used only while that stays below 2^-13 (for float64 always); other ALiBi problems, and any float ``attn_mask``, go to SDPA as a
float mask when it is small, and to the flex or chunked engine when it is not.

ALiBi makes the logits of far keys very negative, so exp() in the CPU kernels yields denormal numbers, which made
SDPA's forward + backward about 3x slower (torch 2.13, L = 4096). Flushing them is a process-wide floating-point mode,
which a library must not set: the command-line entry points turn ``torch.set_flush_denormal`` on at start, and
library users who want the speed do the same in their program (see docs/ARCHITECTURE.md).

Half-precision problems with a float bias are declined (the router sends them to an engine that adds the bias in
float32): a finite float32 bias converted to float16 may overflow to -inf and empty a row.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from axiomformer.engines import autograd
from axiomformer.engines.autograd import sdpa
from axiomformer.engines.base import Computes, EngineBase
from axiomformer.engines.plan import ALIBI_F32_MAX_SPAN, Plan, ProblemKind, alibi_form
from axiomformer.engines.problem import AttentionProblem, causal_mask, window_mask

__all__ = ["ALIBI_F32_MAX_SPAN", "SDPAEngine", "alibi_column_ok", "dot_form"]


def dot_form(
    plan: Plan, q: Tensor, k: Tensor, scale: float | Tensor
) -> tuple[Tensor, Tensor, float | Tensor, list[tuple[Tensor, Tensor]]]:
    """Queries, keys, scale and extra (query column, key column) pairs of a dot-product form of the scores.

    softmax_j(scale * score(q_i, k_j)) = softmax_j(scale * q'_i . k'_j + sum_c qcol_c[i] kcol_c[j]) for every
    score with the ``dot_form`` trait; the form itself lives with the score in ``axes/score.py``.
    """
    if plan.dot_form is None:
        raise ValueError(f"score {plan.spec.score!r} has no dot form (trait dot_form)")
    return plan.dot_form(plan.score_fn, q, k, scale)


def _with_sink(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, is_causal: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Prepend the sink: a zero key (logit exactly 0) with a zero value, visible to every query. With SDPA's
    top-left ``is_causal`` a zero query is prepended too, so query i + 1 sees the sink and keys 0..i (its row is
    dropped by the caller)."""
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    k = torch.cat([k.new_zeros(lead + (1, k.shape[-1])), torch.broadcast_to(k, lead + k.shape[-2:])], dim=-2)
    v = torch.cat([v.new_zeros(lead + (1, v.shape[-1])), torch.broadcast_to(v, lead + v.shape[-2:])], dim=-2)
    if is_causal:
        q = torch.cat([q.new_zeros(q.shape[:-2] + (1, q.shape[-1])), q], dim=-2)
    if attn_mask is not None:
        column = (torch.ones if attn_mask.dtype == torch.bool else torch.zeros)(
            attn_mask.shape[:-1] + (1,), dtype=attn_mask.dtype, device=attn_mask.device
        )
        attn_mask = torch.cat([column, attn_mask], dim=-1)
    return q, k, v, attn_mask


def alibi_column_ok(problem: AttentionProblem, max_slope: float | None = None) -> bool:
    """Causal ALiBi folds into one key column without losing float32 precision (see the module docstring)."""
    return alibi_form(problem, max_slope) == "column"


def _augment(
    q: Tensor, k: Tensor, v: Tensor, scale: float | Tensor, extras: list[tuple[Tensor, Tensor]]
) -> tuple[Tensor, Tensor, Tensor, float]:
    """Append the extra columns to q and k, and zero-pad v to their width (one ``cat`` per tensor: its backward only
    slices). A nonzero float scale stays the kernel's, and the query columns are divided by it (no pass over q); a
    tensor scale (per head) is folded into q."""
    if isinstance(scale, Tensor) or not (scale != 0 and math.isfinite(scale)):
        q = q * (scale.to(q.dtype) if isinstance(scale, Tensor) else scale)
        scale = 1.0
    else:
        extras = [(qcol / scale, kcol) for qcol, kcol in extras]
    lead = (q.shape[0], q.shape[1])
    width = max(q.shape[-1] + len(extras), v.shape[-1])

    def widen(x: Tensor, cols: list[Tensor]) -> Tensor:
        cols = [torch.broadcast_to(c.to(x.dtype), lead + (x.shape[-2], 1)) for c in cols]
        x = torch.broadcast_to(x, lead + x.shape[2:])
        pad = width - x.shape[-1] - len(cols)
        zeros = [x.new_zeros(lead + (x.shape[-2], pad))] if pad else []
        return torch.cat([x, *cols, *zeros], dim=-1) if cols or zeros else x

    return (widen(q, [c for c, _ in extras]), widen(k, [c for _, c in extras]), widen(v, []), float(scale))


WINDOW_CHUNK_MIN = 64
"""Fewest queries per block of the sliding-window path (blocks hold max(window, this) queries) **(our choice)**."""


def _windowed_sdpa(
    q: Tensor, k: Tensor, v: Tensor, problem: AttentionProblem, scale: float, dropout_p: float
) -> Tensor:
    """Sliding-window attention in query blocks: each block reads only the keys some query of it may see, so the
    work is O(q_len (window + block)) instead of O(q_len k_len). Rows without a key are left for the router to zero."""
    window, offset, causal = problem.window, problem.q_offset, problem.causal
    q_len, k_len = q.shape[-2], k.shape[-2]
    size = max(window, WINDOW_CHUNK_MIN)
    outs = []
    for start in range(0, q_len, size):
        stop = min(start + size, q_len)
        lo = max(0, offset + start - window + 1)
        hi = min(k_len, offset + stop if causal else offset + stop - 1 + window)
        if hi <= lo:
            outs.append(q.new_zeros(torch.broadcast_shapes(q.shape[:-2], v.shape[:-2]) + (stop - start, v.shape[-1])))
            continue
        band = window_mask(stop - start, hi - lo, offset + start - lo, window, causal, q.device)
        if causal:
            band = band & causal_mask(stop - start, hi - lo, offset + start - lo, q.device)
        band = band | ~band.any(-1, keepdim=True)
        outs.append(
            sdpa(
                q[..., start:stop, :],
                k[..., lo:hi, :],
                v[..., lo:hi, :],
                attn_mask=band,
                dropout_p=dropout_p,
                scale=scale,
            )
        )
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)


class SDPAEngine(EngineBase):
    """PyTorch's fused scaled dot-product attention for the standard point and the scores that reduce to it."""

    name = "sdpa"
    computes = Computes(
        all_of={"score": {"dot_form"}, "contribution": {"proportional"}},
        any_of={"normalizer": {"softmax", "softmax_in_eval", "sink"}},
    )
    """Softmax-like normalizers (``softmax_in_eval`` only outside training at default options, ``sink`` only with
    ``dot_form_exact``: ``accepts``) with a score that has a dot form."""

    def accepts(self, plan: Plan, kind: ProblemKind) -> bool:
        if plan.spec.softcap:  # tanh of the logits: no fused kernel computes it
            return False
        if not (plan.softmax_like(kind.training) or (plan.sink and "dot_form_exact" in plan.score_traits)):
            return False
        if kind.bias and kind.dtype not in (torch.float32, torch.float64):
            return False
        if kind.window and plan.sink:
            return False
        if kind.alibi != "none" and (plan.sink or kind.alibi != "column"):
            return kind.alibi == "small"  # non-causal ALiBi only as a materialized float mask, while small
        return True

    def twice_differentiable(self, kind: ProblemKind) -> bool:
        """Dropout in training would be redrawn by the second-order formula (``engines/autograd.py``)."""
        return not kind.dropout

    def __call__(self, plan: Plan, problem: AttentionProblem, need_weights: bool = False) -> tuple[Tensor, None]:
        q, k, v = problem.q, problem.k, problem.v
        if torch.is_grad_enabled() and q.dtype in autograd.LOW_PRECISION:
            # A backward in float32 (autograd.LOW_PRECISION says why), and the dot forms' extra columns
            # (neg_l2's -|k|^2, ALiBi's m_h p_j) formed in float32 too: in bfloat16 their rounding alone was 4x the
            # reference engine's gradient error.
            q, k, v = q.float(), k.float(), v.float()
        out, _ = self._run(plan, problem, q, k, v)
        return out.to(problem.v.dtype), None

    def _run(self, plan: Plan, problem: AttentionProblem, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, None]:
        sink = plan.sink
        q, k_dot, scale, extras = dot_form(plan, q, k, problem.scale)
        bias = problem.bias
        if problem.alibi_slopes is not None:
            if not sink and alibi_column_ok(problem, plan.alibi_max_slope):  # the column drops a per-query constant
                center = (problem.k_len - 1) // 2
                slopes = problem.alibi_slopes.to(q.dtype).view(1, -1, 1, 1)
                positions = (problem.k_positions - center).to(q.dtype).view(1, 1, -1, 1)
                extras.append((torch.ones_like(q[..., :1]), slopes * positions))
            else:
                bias = problem.full_bias()
        head_dim_v = v.shape[-1]
        v_in = v
        if extras:
            q, k_dot, v_in, scale = _augment(q, k_dot, v, scale, extras)
        elif isinstance(scale, Tensor):
            q, scale = q * scale.to(q.dtype), 1.0
        dropout_p = problem.dropout_p if problem.training else 0.0
        if (
            problem.window and problem.mask is None and bias is None and not torch.compiler.is_compiling()
        ):  # its loop over query blocks fixes the length
            return _windowed_sdpa(q, k_dot, v_in, problem, float(scale), dropout_p)[..., :head_dim_v], None
        out = _full_sdpa(q, k_dot, v_in, problem, bias, sink, float(scale), dropout_p)
        if out.shape[-1] != head_dim_v:
            out = out[..., :head_dim_v]
        return out, None


def _full_sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    problem: AttentionProblem,
    bias: Tensor | None,
    sink: bool,
    scale: float,
    dropout_p: float,
) -> Tensor:
    """One SDPA call over every key, the mask and bias materialized as needed."""
    # SDPA's is_causal is aligned top-left; ours is bottom-right, which coincides only when q_len == k_len.
    use_is_causal = (
        problem.causal
        and problem.mask is None
        and bias is None
        and problem.q_len == problem.k_len
        and not problem.window
    )
    mask = None if use_is_causal else problem.full_mask()
    if mask is not None:
        # SDPA returns NaN for a row with no visible key; such rows see every key here and are zeroed by the
        # router (engines/problem.py's policy).
        mask = mask | ~mask.any(-1, keepdim=True)
    attn_mask = mask
    if bias is not None:
        attn_mask = bias.to(q.dtype) if mask is None else bias.to(q.dtype).masked_fill(~mask, float("-inf"))
    if sink:
        q, k, v, attn_mask = _with_sink(q, k, v, attn_mask, use_is_causal)
    out = sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=use_is_causal, scale=scale)
    return out[..., 1:, :] if sink and use_is_causal else out
