"""What :func:`axiomformer.engines.attend` checks before any engine sees a problem, and the trivial problems it
answers itself.

Every engine may assume what this module establishes: q, k, v are 4-D (batch, heads, seq, head_dim) with batch and
heads broadcasting, q and k share head_dim, k and v share k_len; a mask or bias is 4-D and broadcasts *to*
(batch, heads, q_len, k_len) (each dimension 1 or the full size: a tensor that only broadcasts *with* the problem,
e.g. an MHA-style (batch * heads, q_len, k_len) mask, would silently grow the output); the window is a non-negative
number of keys (0 = every key); and q_len, k_len > 0 (an empty sequence is answered here, see :func:`empty_output`).
Shape logic only: no value is read back to the host.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _shape(t: Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def problem_shape(q: Tensor, k: Tensor, v: Tensor) -> tuple[int, int, int, int]:
    """(batch, heads, q_len, k_len) of a problem, after checking the ranks and sizes of q, k and v.

    Raises:
        ValueError: not 4-D, head_dim of q and k differ, k and v lengths differ, or batch/heads do not broadcast
            (naming the shapes).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"{name} must be (batch, heads, seq, head_dim); got shape {_shape(t)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share head_dim: q {_shape(q)}, k {_shape(k)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must share k_len: k {_shape(k)}, v {_shape(v)}")
    try:
        batch, heads = torch.broadcast_shapes(q.shape[:2], k.shape[:2], v.shape[:2])
    except RuntimeError:
        raise ValueError(f"batch and heads of q {_shape(q)}, k {_shape(k)}, v {_shape(v)} do not broadcast") from None
    return batch, heads, q.shape[-2], k.shape[-2]


def as_problem_4d(name: str, t: Tensor | None, target: tuple[int, int, int, int]) -> Tensor | None:
    """``t`` viewed as 4-D (leading 1s for the missing dimensions, as broadcasting adds them), checked to broadcast
    *to* ``target`` = (batch, heads, q_len, k_len).

    Raises:
        ValueError: a non-bool mask or non-float bias, more than 4 dimensions, or a dimension that is neither 1 nor the target's (naming both shapes).
    """
    if t is None:
        return None
    if name == "mask" and t.dtype != torch.bool:
        raise ValueError(f"mask must be bool (True = may attend), got dtype {t.dtype}; pass a float mask as bias")
    if name == "bias" and not t.is_floating_point():
        raise ValueError(f"bias must be floating point (added to the scores), got dtype {t.dtype}")
    if t.dim() > 4 or any(size not in (1, want) for size, want in zip(t.shape[::-1], target[::-1])):
        raise ValueError(f"{name} of shape {_shape(t)} does not broadcast to (batch, heads, q_len, k_len) = {target}")
    return t.view((1,) * (4 - t.dim()) + _shape(t)) if t.dim() < 4 else t


def check_window(window: int | None) -> int:
    """The window as a count of keys (0 = every key).

    Raises:
        ValueError: a negative or non-integer window (a window of -1 would otherwise be an empty band).
    """
    if window is None:
        return 0
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"window must be a positive number of keys, or 0 / None for every key; got {window!r}")
    return window


def empty_output(q: Tensor, k: Tensor, v: Tensor, target: tuple[int, int, int, int]) -> tuple[Tensor, Tensor]:
    """Output (batch, heads, q_len, head_dim_v) and weights (batch, heads, q_len, k_len) of a problem with no query
    or no key: empty, or all zeros (every query without a visible key gets a zero row).

    Built as (q k^T) v, whose inner dimension is empty, so it is exactly zero and still differentiable in q, k, v
    (every gradient zero), as SDPA's math path.
    """
    scores = torch.matmul(q, k.transpose(-2, -1).to(q.dtype))
    out = torch.matmul(scores.to(v.dtype), v)
    out = torch.broadcast_to(out, target[:3] + (v.shape[-1],))
    weights_dtype = torch.promote_types(q.dtype, torch.float32)
    return out, torch.zeros(target, dtype=weights_dtype, device=q.device)


def check_per_head(name: str, t: object, target: tuple[int, int, int, int]) -> None:
    """A per-head tensor argument (``alibi_slopes`` (heads,), a tensor ``scale`` broadcastable to
    (batch, heads, q_len, 1), per row for ``scale=log_n``) fits the problem.

    Raises:
        ValueError: naming both shapes.
    """
    if not isinstance(t, Tensor):
        return
    if name == "alibi_slopes":
        if t.dim() != 1 or t.shape[0] != target[1]:
            raise ValueError(f"alibi_slopes of shape {_shape(t)} must be (heads,) = ({target[1]},)")
        return
    # A scale may differ between queries (scale=log_n): (batch|1, heads|1, q_len|1, 1).
    want = (target[0], target[1], target[2], 1)
    if t.dim() > 4 or any(size not in (1, w) for size, w in zip(t.shape[::-1], want[::-1])):
        raise ValueError(f"{name} of shape {_shape(t)} does not broadcast to (batch, heads, q_len, 1) = {want}")
