"""Validation and conversion of the user-facing masks into the engines' (bool mask, float bias) pair.

Conventions (as ``torch.nn.functional.scaled_dot_product_attention``): a bool mask means True = may attend; a float
mask is added to the scores. A float entry at or below its dtype's minimum (``-inf``, or ``torch.finfo(dtype).min``,
the additive-mask convention of transformers) *blocks* the key: it becomes False in the bool mask and 0 in the bias,
so "blocked" means the same for every normalizer and engine (a sigmoid or relu normalizer does not count the key in
n_i, and no low-precision addition can overflow). ``key_padding_mask`` is (batch, k_len) with True = real token — the
*opposite* of ``nn.MultiheadAttention``'s polarity (adapters convert).

Everything here is shape logic and elementwise tensor ops: no value is read back to the host (no graph break under
``torch.compile``).
"""

from __future__ import annotations

import torch
from torch import Tensor


def _as_4d(attn_mask: Tensor) -> Tensor:
    if attn_mask.dim() == 1:  # (k_len,): the same keys for every query
        return attn_mask.view(1, 1, 1, -1)
    if attn_mask.dim() == 2:
        return attn_mask.unsqueeze(0).unsqueeze(0)
    if attn_mask.dim() == 3:
        return attn_mask.unsqueeze(1)
    if attn_mask.dim() == 4:
        return attn_mask
    raise ValueError(
        f"attn_mask must have 1 to 4 dimensions (k_len,) ... (batch, heads, q_len, k_len); "
        f"got shape {tuple(attn_mask.shape)}"
    )


def prepare_masks(
    attn_mask: Tensor | None, key_padding_mask: Tensor | None, batch: int, heads: int, q_len: int, k_len: int
) -> tuple[Tensor | None, Tensor | None]:
    """Combine ``attn_mask`` and ``key_padding_mask`` into (bool mask, float bias), each 4-D or None.

    Args:
        attn_mask: bool (True = may attend) or float (added to scores), shaped (k_len,), (q_len, k_len),
            (batch, q_len, k_len) or (batch, heads, q_len, k_len), each dimension 1 or the full size.
        key_padding_mask: bool (batch, k_len), True = real token.

    Raises:
        ValueError: a mask whose shape does not broadcast to (batch, heads, q_len, k_len) (e.g. an MHA-style
            (batch * heads, q_len, k_len) mask), naming both shapes, or a
            non-bool key padding mask.
    """
    target = (batch, heads, q_len, k_len)
    mask: Tensor | None = None
    bias: Tensor | None = None
    if key_padding_mask is not None:
        if key_padding_mask.dtype != torch.bool:
            raise ValueError(f"key_padding_mask must be bool (True = real token), got dtype {key_padding_mask.dtype}")
        if tuple(key_padding_mask.shape) != (batch, k_len):
            raise ValueError(
                f"key_padding_mask has shape {tuple(key_padding_mask.shape)}; expected (batch, k_len) "
                f"= {(batch, k_len)}"
            )
        mask = key_padding_mask[:, None, None, :]
    if attn_mask is not None:
        am = _as_4d(attn_mask)
        if any(size not in (1, want) for size, want in zip(am.shape, target)):  # broadcasts *to*, not *with*
            raise ValueError(
                f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
                f"(batch, heads, q_len, k_len) = {target}"
            )
        if am.dtype == torch.bool:
            mask = am if mask is None else mask & am
        elif am.is_floating_point():
            allowed = am > torch.finfo(am.dtype).min  # also False for -inf and NaN
            mask = allowed if mask is None else mask & allowed
            bias = am.masked_fill(~allowed, 0.0)
        else:
            raise ValueError(f"attn_mask must be bool or floating point, got dtype {am.dtype}")
    return mask, bias
