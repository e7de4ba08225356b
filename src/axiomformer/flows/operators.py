"""The attention operators that appear in the feature gradient flow of multinomial regression.

Source 2 of ``docs/SOURCES.md`` (Actor, Gruber & Cyr, "Deriving Transformer Architectures as Implicit Multinomial
Regression", arXiv:2509.04653). Notation: rows are items; ``Z`` (..., n, d) features, ``theta`` the classifier,
``sigma`` the row-wise softmax. Leading batch dimensions of ``Z`` are carried through.

    CA(Z, theta) = sigma(Z theta^T) theta              cross-attention: queries Z, keys = values = class embeddings
    SA(Z)        = sigma(Z theta Z^T) Z theta          self-attention, tied queries/keys Z phi, values Z theta
    RA(Z)        = sigma(Z theta Z^T)^T Z theta        the transposed ("reverse", column-normalized) term

No 1/sqrt(d) scale: a temperature can be absorbed into ``theta``.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check_features(Z: Tensor, theta: Tensor, *, square: bool) -> None:
    if Z.dim() < 2:
        raise ValueError(f"Z must be (..., n, d); got shape {tuple(Z.shape)}")
    d = Z.shape[-1]
    if square:
        if theta.shape != (d, d):
            raise ValueError(f"quadratic theta must be (d, d) = ({d}, {d}); got shape {tuple(theta.shape)}")
    elif theta.dim() != 2 or theta.shape[-1] != d:
        raise ValueError(f"linear theta must be (K, d={d}); got shape {tuple(theta.shape)}")


def cross_attention(Z: Tensor, theta: Tensor) -> Tensor:
    """CA(Z, theta) = softmax(Z theta^T) theta (Source 2, linear case).

    Args:
        Z: (..., n, d) features (the queries).
        theta: (K, d) class embeddings (the keys and the values).

    Returns:
        (..., n, d): each feature's probability-weighted mean of the class embeddings.

    Raises:
        ValueError: ``theta`` is not (K, d) with the width of ``Z``.
    """
    _check_features(Z, theta, square=False)
    return torch.softmax(Z @ theta.T, dim=-1) @ theta


def quadratic_weights(Z: Tensor, theta: Tensor) -> Tensor:
    """sigma(Z theta Z^T): (..., n, n) row-stochastic token-to-token attention weights (theta (d, d) symmetric)."""
    _check_features(Z, theta, square=True)
    return torch.softmax(Z @ theta @ Z.transpose(-1, -2), dim=-1)


def self_attention(Z: Tensor, theta: Tensor) -> Tensor:
    """SA(Z) = sigma(Z theta Z^T) Z theta (Source 2, quadratic case, theta = phi phi^T).

    With theta = phi phi^T the logits are (Z phi)(Z phi)^T: queries and keys are tied (Z phi), values are Z theta.

    Args:
        Z: (..., n, d) token features.
        theta: (d, d) symmetric.

    Returns:
        (..., n, d).
    """
    return quadratic_weights(Z, theta) @ (Z @ theta)


def reverse_attention(Z: Tensor, theta: Tensor) -> Tensor:
    """RA(Z) = sigma(Z theta Z^T)^T Z theta: the transposed term of the quadratic gradient (Source 2).

    Row j collects sum_i sigma_ij (Z theta)_i from every query i that attended to token j; its weights are normalized
    over columns, not rows, so it is not an attention in the usual sense.

    Returns:
        (..., n, d).
    """
    return quadratic_weights(Z, theta).transpose(-1, -2) @ (Z @ theta)
