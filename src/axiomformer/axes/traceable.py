"""Sparsemax and 1.5-entmax in plain tensor ops, for ``torch.compile``.

The ``entmax`` package implements them as ``torch.autograd.Function`` classes with classmethod ``forward``s that
Dynamo cannot inline (a graph break per call). While ``torch.compile`` traces, ``axes/normalizer.py`` uses these
instead: the same functions, differentiated by autograd. Rows are (..., n) along the last dimension; blocked entries
are ``-inf`` and every row has a finite entry (``normalize`` guarantees both).

- sparsemax (Martins & Astudillo 2016, eq. 2 and Algorithm 1): sort z descending; the support size k is the largest
  k with 1 + k z_(k) > sum_{j<=k} z_(j); tau = (sum_{j<=k} z_(j) - 1) / k; p = relu(z - tau). On a fixed support
  tau is a linear function of the scores, so autograd through the sort and the gathered cumulative sum gives the
  sparsemax Jacobian.
- 1.5-entmax (Peters et al. 2019, Algorithm 2, as the ``entmax`` package): x = z / 2 sorted, with the running means
  m_k and mean squares s_k, tau_k = m_k - sqrt((1 - k (s_k - m_k^2)) / k); the support is {k : tau_k <= x_(k)};
  p = relu(x - tau)^2. The square root is taken after the gather, so rows' unused entries carry no gradient.
(alpha-entmax, ``normalizer.entmax_alpha``, is written in plain tensor ops already.)
"""

from __future__ import annotations

import torch
from torch import Tensor


def _sorted_clean(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Descending sort, with -inf (blocked, sorted last) replaced by 0 so that cumulative sums stay finite; the
    finite flags; and the ranks 1..n."""
    srt = torch.sort(x, dim=-1, descending=True).values
    finite = torch.isfinite(srt)
    rho = torch.arange(1, x.shape[-1] + 1, device=x.device, dtype=x.dtype)
    return torch.where(finite, srt, 0.0), finite, rho


def sparsemax(s: Tensor) -> Tensor:
    """Sparsemax along the last dimension (see the module docstring)."""
    z = s - s.amax(-1, keepdim=True).detach()
    srt, finite, rho = _sorted_clean(z)
    csum = srt.cumsum(-1) - 1.0
    k = ((rho * srt > csum) & finite).sum(-1, keepdim=True).clamp_min(1)
    tau = csum.gather(-1, k - 1) / k.to(z.dtype)
    return torch.relu(z - tau)


def entmax15(s: Tensor) -> Tensor:
    """1.5-entmax along the last dimension, relu(z / 2 - tau)^2 (see the module docstring)."""
    x = (s - s.amax(-1, keepdim=True).detach()) / 2
    srt, finite, rho = _sorted_clean(x)
    mean = srt.cumsum(-1) / rho
    mean_sq = (srt * srt).cumsum(-1) / rho
    with torch.no_grad():
        delta = (1 - rho * (mean_sq - mean * mean)) / rho
        tau_all = mean - delta.clamp_min(0).sqrt()
        k = ((tau_all <= srt) & finite).sum(-1, keepdim=True).clamp_min(1)
    m, m2, kf = mean.gather(-1, k - 1), mean_sq.gather(-1, k - 1), k.to(x.dtype)
    tau = m - ((1 - kf * (m2 - m * m)) / kf).clamp_min(0).sqrt()
    return torch.relu(x - tau).square()
