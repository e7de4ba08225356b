"""The sdpa engine: specs that reduce exactly to ``torch.nn.functional.scaled_dot_product_attention``.

Accepts softmax (and Gumbel-softmax in eval, which is a softmax) with proportional contributions, any value map and
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
float32 this column adds a rounding error of about 2^-24 m_h |p_j - c| to each logit, so it is used only while
that stays below 2^-14 (for float64 always); other ALiBi problems, and any float ``attn_mask``, go to SDPA as a
float mask when it is small, and to the flex or chunked engine when it is not. On CPU, ALiBi's SDPA runs with denormal
floats flushed to zero on every thread of PyTorch's OpenMP team (:func:`sdpa_flushing_denormals`).
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import threading

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from axiomformer.axes.score import unit_rows
from axiomformer.engines.chunked import DEFAULT_BUDGET
from axiomformer.engines.problem import AttentionProblem, clean_nonfinite, poison_rows
from axiomformer.engines.reference import attention_weights

REDUCIBLE_SCORES = ("dot", "bilinear", "cosine", "neg_l2")
"""Scores with softmax(score) = softmax(q' . k') for transformed q', k' (up to a per-row constant)."""

ALIBI_F32_MAX_SPAN = 2.0**10
"""Largest m_h |p_j - c| folded into a float32 key column (rounding error <= 2^-24 * 2^10 = 2^-14 per logit)."""


def softmax_like(spec, training: bool) -> bool:
    """The normalizer is a plain softmax (Gumbel-softmax is one outside training)."""
    return spec.normalizer == "softmax" or (spec.normalizer == "gumbel_softmax" and not training)


def dot_form(module, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor, float | Tensor, list[tuple]]:
    """Queries, keys, scale and extra (query column, key column) pairs of a dot-product form of the scores.

    softmax_j(scale * score(q_i, k_j)) = softmax_j(scale * q'_i . k'_j + sum_c qcol_c[i] kcol_c[j]) for every
    score in :data:`REDUCIBLE_SCORES` (see the module docstring). Columns are (..., seq, 1) tensors.
    """
    spec, score = module.spec, module.score_fn
    scale = module.scale()
    extras: list[tuple] = []
    if spec.score == "bilinear":
        q = torch.matmul(q, score.weight.to(q.dtype))
    elif spec.score == "cosine":
        q = unit_rows(q, score.temperature().to(q.dtype), score.eps)
        k = unit_rows(k, None, score.eps)
    elif spec.score == "neg_l2":
        # Extra columns add to the final logits, so the query column carries the scale.
        extras.append((torch.ones_like(q[..., :1]) * scale, -k.pow(2).sum(-1, keepdim=True)))
        q = 2 * q
    return q, k, scale, extras


def alibi_column_ok(problem: AttentionProblem) -> bool:
    """Causal ALiBi folds into one key column without losing float32 precision (see the module docstring)."""
    if problem.alibi_slopes is None or not problem.causal:
        return False
    if problem.q.dtype == torch.float64:
        return True
    center = (problem.k_len - 1) // 2
    span = float(problem.alibi_slopes.abs().max()) * max(center, problem.k_len - 1 - center)
    return problem.q.dtype == torch.float32 and span <= ALIBI_F32_MAX_SPAN


def _augment(q: Tensor, k: Tensor, v: Tensor, scale, extras) -> tuple[Tensor, Tensor, Tensor, float]:
    """Fold the scale and extra columns into q and k, and zero-pad v to their width (one ``cat`` per tensor: its
    backward only slices)."""
    q = q * (scale.to(q.dtype) if isinstance(scale, Tensor) else scale)
    lead = (q.shape[0], q.shape[1])
    width = max(q.shape[-1] + len(extras), v.shape[-1])

    def widen(x: Tensor, cols: list[Tensor]) -> Tensor:
        cols = [torch.broadcast_to(c.to(x.dtype), lead + (x.shape[-2], 1)) for c in cols]
        x = torch.broadcast_to(x, lead + x.shape[2:])
        pad = width - x.shape[-1] - len(cols)
        zeros = [x.new_zeros(lead + (x.shape[-2], pad))] if pad else []
        return torch.cat([x, *cols, *zeros], dim=-1) if cols or zeros else x

    return (widen(q, [c for c, _ in extras]), widen(k, [c for _, c in extras]), widen(v, []), 1.0)


_TEAM_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


@functools.cache
def _openmp_team_flush():
    """A function ``set(on)`` that sets flush-to-zero on every thread of the calling thread's OpenMP team (the one
    PyTorch's CPU kernels run on), or None where PyTorch does not run on libgomp (then a new thread is used).

    It runs a parallel region of the libgomp that ``libtorch_cpu`` links (``GOMP_parallel`` looked up through it)
    whose body, on each team thread, calls ``torch.set_flush_denormal`` (a ctypes callback; it takes the GIL, which
    the calling thread releases while in the region). PyTorch's OpenMP ``parallel_for`` uses the whole team of
    ``torch.get_num_threads()`` threads. About 0.15 ms per call.
    """
    library = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        if "parallel backend: OpenMP" not in torch.__config__.parallel_info() or not os.path.exists(library):
            return None
        parallel = ctypes.CDLL(library).GOMP_parallel
    except (OSError, AttributeError):
        return None
    parallel.argtypes = [_TEAM_CALLBACK, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
    bodies = {on: _TEAM_CALLBACK(lambda _, on=on: torch.set_flush_denormal(on)) for on in (True, False)}

    def set_team(on: bool) -> None:
        parallel(bodies[on], None, max(1, torch.get_num_threads()), 0)      # ``bodies`` stays alive with it

    return set_team


def _flushing_now() -> bool:
    """Whether the calling thread flushes denormals (1e-30 * 1e-10 = 1e-40 is a float32 denormal)."""
    return float(torch.tensor(1e-30) * 1e-10) == 0.0


def _in_new_thread_flushing(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` on a new thread that flushes denormals, with the OpenMP team it creates (the fallback).

    New threads inherit the creator's floating-point environment, so a thread that sets the flag before its first
    parallel region gets a flushing team. The thread (and its team) ends after the call: a second team kept alive made
    libgomp throttle the spinning of every team (more threads than cores), which made later many-small-op work on
    the main thread 2x slower in our measurements.
    """
    threads, grad_mode = torch.get_num_threads(), torch.is_grad_enabled()
    result: dict = {}

    def job():
        try:
            torch.set_flush_denormal(True)
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            with torch.set_grad_enabled(grad_mode):                  # grad mode is per thread
                result["value"] = fn(*args, **kwargs)
        except BaseException as error:                      # re-raised on the calling thread
            result["error"] = error

    worker = threading.Thread(target=job, name="axiomformer-ftz")
    worker.start()
    worker.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def _run_flushing_denormals(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` with denormal floats flushed to zero on every thread that computes it.

    ``torch.set_flush_denormal`` sets the floating-point control register of the calling thread only, not that of
    OpenMP's worker threads. Where PyTorch runs on libgomp the whole team is switched on for the call and off after
    (:func:`_openmp_team_flush`; worker threads are assumed off before, PyTorch's default, and the calling thread
    gets its own setting back); elsewhere the call runs on a new thread
    (:func:`_in_new_thread_flushing`).
    """
    set_team = _openmp_team_flush()
    if set_team is None:
        return _in_new_thread_flushing(fn, *args, **kwargs)
    caller_flushed = _flushing_now()
    set_team(True)
    try:
        return fn(*args, **kwargs)
    finally:
        set_team(False)
        if caller_flushed:                                   # the caller's own setting is put back
            torch.set_flush_denormal(True)


class _FlushedFlashSDPA(torch.autograd.Function):
    """PyTorch's CPU flash-attention kernels (forward and backward) run by :func:`_run_flushing_denormals`."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, is_causal: bool,
                scale: float) -> Tensor:
        out, lse = _run_flushing_denormals(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu, q, k, v,
                                            0.0, is_causal, attn_mask=attn_mask, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.attn_mask, ctx.is_causal, ctx.scale = attn_mask, is_causal, scale
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        q, k, v, out, lse = ctx.saved_tensors
        grads = _run_flushing_denormals(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward,
                                         grad_out.contiguous(), q, k, v, out, lse, 0.0, ctx.is_causal,
                                         attn_mask=ctx.attn_mask, scale=ctx.scale)
        return (*grads, None, None, None)


def sdpa_flushing_denormals(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                            is_causal: bool = False, scale: float | None = None) -> Tensor:
    """``F.scaled_dot_product_attention`` with denormal floats flushed to zero, forward and backward, on CPU.

    ALiBi makes the logits of far keys very negative (-m_h * distance), so exp() in the CPU kernels yields denormal
    numbers, which made SDPA's forward + backward 3x slower in our measurements (torch 2.13, L = 4096). Their weights
    are below 2^-126 of the largest, so flushing them changes nothing at float32 precision **(our choice)**. The
    flash kernels are called directly, so only inputs they take as they are go there: 4-d (batch, heads, seq, dim)
    with equal batch and heads, equal head dims, contiguous last dims, non-empty sequences, a 2-d or 4-d mask
    without grad, float32/64, no dropout, CPU; anything else calls SDPA as it is.
    """
    flash = (q.device.type == "cpu" and dropout_p == 0.0 and q.dim() == k.dim() == v.dim() == 4
             and q.shape[:2] == k.shape[:2] == v.shape[:2] and q.shape[-1] == k.shape[-1] == v.shape[-1]
             and q.shape[-2] > 0 and k.shape[-2] > 0 and all(t.stride(-1) == 1 for t in (q, k, v))
             and q.dtype in (torch.float32, torch.float64) and q.dtype == k.dtype == v.dtype
             and (attn_mask is None or (attn_mask.dim() in (2, 4) and not attn_mask.requires_grad)))
    if not flash:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                                              is_causal=is_causal, scale=scale)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill_(~attn_mask, -math.inf)
    return _FlushedFlashSDPA.apply(q, k, v, attn_mask, is_causal, float(scale))


class SDPAEngine:
    """PyTorch's fused scaled dot-product attention for the standard point and the scores that reduce to it."""

    name = "sdpa"

    def accepts(self, module, problem: AttentionProblem) -> bool:
        spec = module.spec
        if not (spec.score in REDUCIBLE_SCORES and spec.contribution == "proportional"
                and softmax_like(spec, problem.training)):
            return False
        if problem.alibi_slopes is not None and not alibi_column_ok(problem):
            # Non-causal ALiBi only as a materialized float mask, and only while it is small.
            heads, rows = problem.alibi_slopes.numel(), problem.q_len * problem.k_len
            return heads * rows <= DEFAULT_BUDGET
        return True

    def run(self, module, problem: AttentionProblem, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        k, v = clean_nonfinite(problem)
        q, k_dot, scale, extras = dot_form(module, problem.q, k)
        bias = problem.bias
        if problem.alibi_slopes is not None:
            if alibi_column_ok(problem):
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
        # SDPA's is_causal is aligned top-left; ours is bottom-right, which coincides only when q_len == k_len.
        use_is_causal = problem.causal and problem.mask is None and bias is None and problem.q_len == problem.k_len
        mask = None if use_is_causal else problem.full_mask()
        empty_rows = None
        if mask is not None:
            has_key = mask.any(-1, keepdim=True)
            if not bool(has_key.all()):
                # SDPA returns NaN for a row with no visible key; let such rows see every key, then zero them.
                empty_rows = ~has_key
                mask = mask | empty_rows
        attn_mask = mask
        if bias is not None:
            attn_mask = bias.to(q.dtype) if mask is None else bias.to(q.dtype).masked_fill(~mask, float("-inf"))
        attend = F.scaled_dot_product_attention
        if problem.alibi_slopes is not None:
            attend = sdpa_flushing_denormals
        out = attend(
            q, k_dot, v_in,
            attn_mask=attn_mask,
            dropout_p=problem.dropout_p if problem.training else 0.0,
            is_causal=use_is_causal,
            scale=float(scale),
        )
        if out.shape[-1] != head_dim_v:
            out = out[..., :head_dim_v]
        if empty_rows is not None:
            out = out.masked_fill(torch.broadcast_to(empty_rows, out.shape[:-1] + (1,)), 0.0)
        out = poison_rows(out, problem)
        return out, (attention_weights(module, problem, k) if need_weights else None)
