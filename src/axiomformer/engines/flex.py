"""The flex engine: softmax with index-based score edits through ``torch.nn.attention.flex_attention``.

FlexAttention (PyTorch >= 2.5) compiles a fused kernel from two small functions of the indices: a ``score_mod`` (here
ALiBi, -m_h (p_i - p_j), or -m_h |p_i - p_j| without a causal mask) and a ``mask_mod`` (bottom-right causal, key
padding), so neither the bias nor the mask is ever materialized. Scores reducible to a dot product (see
``sdpa.dot_form``) are accepted; their extra columns are zero-padded to a multiple of 8.

Routing **(our choice, measured with torch 2.13)**: only on CUDA. On CPU the compiled kernel has no backward
("FlexAttention does not support backward on CPU"), took 25 s to compile and ran 2.5x slower than SDPA forward-only at
L = 2048, so CPU problems go to the sdpa (causal ALiBi folded into a key column) or chunked engines instead.
The first compile failure on a device type is logged once and raised as :class:`EngineUnavailable`; the router then
routes that device's problems to the next engine that accepts them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import Tensor

from axiomformer.engines.base import Computes, EngineBase
from axiomformer.engines.plan import Plan, ProblemKind
from axiomformer.engines.problem import AttentionProblem
from axiomformer.engines.sdpa import _augment, dot_form

logger = logging.getLogger(__name__)


def flex_mods(problem: AttentionProblem) -> tuple[Callable[..., Tensor] | None, Callable[..., Tensor] | None]:
    """(score_mod, mask_mod) of ``problem``: ALiBi as a score edit, bottom-right causal and key padding as a mask.

    Either may be None. Indices are those of flex_attention: (batch, head, query index, key index).
    """
    score_mod = mask_mod = None
    slopes, offset, causal = problem.alibi_slopes, problem.q_offset, problem.causal
    if slopes is not None:
        slopes = slopes.float()

        def score_mod(score, b, h, q_idx, kv_idx):
            distance = (q_idx + offset - kv_idx).to(torch.float32)
            distance = distance if causal else distance.abs()
            return score - slopes[h] * distance

    keep = None if problem.mask is None else problem.mask.reshape(problem.mask.shape[0], -1)  # (B|1, k_len)
    if causal or keep is not None:

        def mask_mod(b, h, q_idx, kv_idx):
            ok = kv_idx >= 0
            if causal:
                ok = ok & (kv_idx <= q_idx + offset)
            if keep is not None:
                ok = ok & keep[b if keep.shape[0] > 1 else 0, kv_idx]
            return ok

    return score_mod, mask_mod


class EngineUnavailable(RuntimeError):
    """An engine cannot run on this device after all (e.g. a kernel failed to compile); the router falls back."""


def _rows_with_keys(problem: AttentionProblem) -> Tensor | None:
    """(batch|1, 1, q_len, 1) bool: queries with a visible key, from the key padding mask and the causal horizon."""
    horizon = problem.q_positions  # last visible key of each query
    if problem.mask is None:
        return (horizon >= 0).view(1, 1, -1, 1) if problem.causal else None
    keep = problem.mask.reshape(problem.mask.shape[0], problem.k_len)
    if not problem.causal:
        return keep.any(-1).view(-1, 1, 1, 1)
    seen = keep.cumsum(-1)[:, horizon.clamp(0, problem.k_len - 1)] > 0
    return (seen & (horizon >= 0)).view(keep.shape[0], 1, -1, 1)


class FlexEngine(EngineBase):
    """FlexAttention for softmax with ALiBi (and causal/key-padding masks), on devices where it compiles."""

    name = "flex"
    computes = Computes(
        all_of={"score": {"dot_form"}, "contribution": {"proportional"}},
        any_of={"normalizer": {"softmax", "softmax_in_eval"}},
    )
    double_backward = False

    def __init__(self, compile: bool = True, devices: tuple[str, ...] = ("cuda",)):
        self.compile = compile
        self.devices = devices
        self.failed: dict[str, str] = {}
        self._compiled: Callable[..., Tensor] | None = None

    def accepts(self, plan: Plan, kind: ProblemKind) -> bool:
        return (
            kind.device in self.devices
            and kind.device not in self.failed
            and kind.alibi != "none"
            and plan.softmax_like(kind.training)
            and not kind.bias
            and not plan.spec.softcap
            and not kind.window
            and kind.mask in ("none", "key")
            and not kind.mask_heads
            and not kind.dropout
        )

    def _kernel(self) -> Callable[..., Tensor]:
        from torch.nn.attention.flex_attention import flex_attention

        if not self.compile:
            return flex_attention
        if self._compiled is None:
            self._compiled = torch.compile(flex_attention, dynamic=False)
        return self._compiled

    def attend(self, parts: Plan, problem: AttentionProblem, k: Tensor, v: Tensor) -> Tensor:
        """flex_attention output (batch, heads, q_len, head_dim_v) with rows without a visible key set to zero."""
        from torch.nn.attention.flex_attention import create_block_mask

        q, k_dot, scale, extras = dot_form(parts, problem.q, k, problem.scale)
        head_dim_v = v.shape[-1]
        if extras or isinstance(scale, Tensor):
            q, k_dot, v, scale = _augment(q, k_dot, v, scale, extras)
        score_mod, mask_mod = flex_mods(problem)
        block_mask = None
        if mask_mod is not None:
            batch = problem.mask.shape[0] if problem.mask is not None and problem.mask.shape[0] > 1 else None
            block_mask = create_block_mask(mask_mod, batch, None, problem.q_len, problem.k_len, device=str(q.device))
        out = self._kernel()(q, k_dot, v, score_mod=score_mod, block_mask=block_mask, scale=float(scale))
        out = out[..., :head_dim_v]
        has_key = _rows_with_keys(problem)
        return out if has_key is None else out.masked_fill(~has_key, 0.0)

    def __call__(self, plan: Plan, problem: AttentionProblem, need_weights: bool = False) -> tuple[Tensor, None]:
        try:
            return self.attend(plan, problem, problem.k, problem.v), None
        except Exception as err:
            device = problem.q.device.type
            self.failed[device] = f"{type(err).__name__}: {err}"
            logger.warning(
                "flex_attention failed on %s (%s); falling back to the next engine",
                device,
                self.failed[device].splitlines()[0][:200],
            )
            raise EngineUnavailable(self.failed[device]) from err
