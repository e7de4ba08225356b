"""The one precision rule of the attention core: compute in max(input dtype, float32).

Half-precision inputs (float16, bfloat16) are upcast before any arithmetic on scores, so that q . k, its scale, a bias
or a normalizer cannot overflow or lose the small differences a softmax reads (a float16 q . k overflows at 65504
before the 1/sqrt(d) scale could bring it back); float32 stays float32, and float64 is never lowered, so float64
inputs get float64 results and pass ``torch.autograd.gradcheck`` (as SDPA's math path and the entmax package do).
"""

from __future__ import annotations

import torch
from torch import Tensor


def compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """The widest of ``dtypes`` and float32."""
    out = torch.float32
    for dtype in dtypes:
        out = torch.promote_types(out, dtype)
    return out


def upcast(t: Tensor) -> Tensor:
    """``t`` in :func:`compute_dtype` of its own dtype (a no-op for float32 and float64; integers become float32)."""
    return t.to(compute_dtype(t.dtype)) if t.is_floating_point() else t.float()
