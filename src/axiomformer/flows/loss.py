"""Multinomial regression of the *features*: the loss, its closed-form feature gradient, the flow right-hand side.

Source 2 of ``docs/SOURCES.md`` (Actor, Gruber & Cyr, arXiv:2509.04653). The classifier ``theta`` is held fixed and the
features ``Z`` move down the gradient of the cross-entropy; the negative gradient splits into an attention term and a
label term, which is what makes a splitting step a Transformer block (see ``integrators.py``).

Models (rows of ``C`` are usually distributions, one-hot or soft; targets with other row sums s = C 1 use the
general dL/dN = diag(s) sigma(N) - C, see :func:`feature_gradient`):

    linear     N = Z theta^T, theta (K, d), C (..., n, K)
               dL/dZ = (sigma(N) - C) theta
               dZ/dt = C theta - CA(Z, theta)                                  [label term, attention term]
    quadratic  N = Z theta Z^T, theta = phi phi^T (d, d) symmetric, C (..., n, n);  G = sigma(N) - C
               dL/dZ = (G + G^T) Z theta
               dZ/dt = (C + C^T) Z theta - [SA(Z) + RA(Z)]

``transposed_term`` (quadratic only) chooses what happens to the transposed pair (G^T: C^T Z theta and RA(Z))
**(our choice: the source body was not available to us)**:

    keep        the exact gradient, (G + G^T) Z theta.
    drop        G Z theta: only the row-normalized self-attention. It is exactly the gradient with respect to the
                queries alone (keys held fixed), d/dZ_q L(Z_q theta Z_k^T) at Z_q = Z_k = Z.
    symmetrize  (2 sigma(N) - C - C^T) Z theta: the transposed weights sigma(N)^T are replaced by the row softmax of
                the transposed logits, sigma(N^T), which equals sigma(N) because N is symmetric; the flow becomes
                (C + C^T) Z theta - 2 SA(Z), a pure (row-normalized) self-attention update. When the rows of C^T also
                sum to one it is twice the query-only gradient for the symmetric targets (C + C^T) / 2.

Everything is summed over rows and over leading batch dimensions of ``Z``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from axiomformer.flows.operators import cross_attention, quadratic_weights, self_attention

MODELS = ("linear", "quadratic")
TRANSPOSED_TERMS = ("keep", "drop", "symmetrize")

VectorField = Callable[[Tensor], Tensor]


def _check(model: str, transposed_term: str, Z: Tensor, theta: Tensor, C: Tensor) -> None:
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of: {', '.join(MODELS)}")
    if transposed_term not in TRANSPOSED_TERMS:
        raise ValueError(f"unknown transposed_term {transposed_term!r}; choose one of: {', '.join(TRANSPOSED_TERMS)}")
    if model == "linear" and transposed_term != "keep":
        raise ValueError(
            "transposed_term applies to model='quadratic' only (the linear gradient has no transposed term)"
        )
    width = theta.shape[0] if model == "linear" else Z.shape[-2]
    if C.shape[-1] != width or C.shape[-2] != Z.shape[-2]:
        expected = "(..., n, K)" if model == "linear" else "(..., n, n)"
        raise ValueError(
            f"C must be {expected} = (..., {Z.shape[-2]}, {width}) for model={model!r}; got shape {tuple(C.shape)}"
        )
    if model == "quadratic" and theta.shape[0] == theta.shape[-1] and not torch.allclose(theta, theta.T):
        raise ValueError("quadratic theta must be symmetric (theta = phi phi^T); use theta_from_phi(phi)")


def theta_from_phi(phi: Tensor) -> Tensor:
    """theta = phi phi^T, the symmetric (d, d) bilinear form of the quadratic model; ``phi`` is (d, r)."""
    return phi @ phi.T


def logits(Z: Tensor, theta: Tensor, model: str = "linear") -> Tensor:
    """N(Z, theta): (..., n, K) ``Z theta^T`` for the linear model, (..., n, n) ``Z theta Z^T`` for the quadratic one."""
    if model == "linear":
        return Z @ theta.T
    if model == "quadratic":
        return Z @ theta @ Z.transpose(-1, -2)
    raise ValueError(f"unknown model {model!r}; choose one of: {', '.join(MODELS)}")


def multinomial_loss(Z: Tensor, theta: Tensor, C: Tensor, model: str = "linear") -> Tensor:
    """L(Z) = -sum_rows sum_k C_rk log sigma(N)_rk, the cross-entropy of the features (a scalar, summed not averaged).

    Args:
        Z: (..., n, d) features.
        theta: (K, d) for ``linear``; (d, d) symmetric for ``quadratic``.
        C: targets, (..., n, K) for ``linear``, (..., n, n) for ``quadratic``; rows are distributions.
        model: ``"linear"`` or ``"quadratic"``.

    Raises:
        ValueError: unknown model or shapes that do not fit (the message names them).
    """
    _check(model, "keep", Z, theta, C)
    return -(C * torch.log_softmax(logits(Z, theta, model), dim=-1)).sum()


def _row_sums(C: Tensor) -> Tensor:
    """s = C 1, the row sums of the targets, kept as a column (..., n, 1)."""
    return C.sum(-1, keepdim=True)


def _check_rows_for(transposed_term: str, C: Tensor) -> None:
    if transposed_term == "symmetrize" and not torch.allclose(_row_sums(C), torch.ones((), dtype=C.dtype)):
        raise ValueError(
            "transposed_term='symmetrize' is defined for targets whose rows sum to 1 (it replaces "
            "sigma(N)^T by sigma(N), which needs normalized rows); use 'keep' or 'drop', or normalize C"
        )


def feature_gradient(
    Z: Tensor, theta: Tensor, C: Tensor, model: str = "linear", transposed_term: str = "keep"
) -> Tensor:
    """Closed-form dL/dZ (Source 2); for ``transposed_term`` other than ``keep`` the direction defined in the module doc.

    General targets: with row sums s = C 1, dL/dN = diag(s) sigma(N) - C, so the gradient is
    (diag(s) sigma(N) - C) theta (linear) and (G + G^T) Z theta with G = diag(s) sigma(N) - C (quadratic). For one-hot
    or soft targets s = 1 and this is the source's sigma(N) - C.

    Returns:
        (..., n, d), same dtype as ``Z``.

    Raises:
        ValueError: unknown model / transposed_term, shapes that do not fit, or ``symmetrize`` with rows of C that do
            not sum to 1.
    """
    _check(model, transposed_term, Z, theta, C)
    _check_rows_for(transposed_term, C)
    P = torch.softmax(logits(Z, theta, model), dim=-1)
    G = _row_sums(C) * P - C
    if model == "linear":
        return G @ theta
    ZT = Z @ theta
    if transposed_term == "keep":
        return (G + G.transpose(-1, -2)) @ ZT
    if transposed_term == "drop":
        return G @ ZT
    return (2 * P - C - C.transpose(-1, -2)) @ ZT


def _attention_term(Z: Tensor, theta: Tensor, s: Tensor, model: str, transposed_term: str) -> Tensor:
    if model == "linear":
        return -s * cross_attention(Z, theta)
    if transposed_term == "keep":
        P = quadratic_weights(Z, theta)
        ZT = Z @ theta
        return -(s * (P @ ZT) + P.transpose(-1, -2) @ (s * ZT))
    if transposed_term == "drop":
        return -s * self_attention(Z, theta)
    return -2 * self_attention(Z, theta)


def _label_term(Z: Tensor, theta: Tensor, C: Tensor, model: str, transposed_term: str) -> Tensor:
    if model == "linear":
        return (C @ theta).expand_as(Z)
    if transposed_term == "drop":
        return C @ (Z @ theta)
    return (C + C.transpose(-1, -2)) @ (Z @ theta)


def flow_terms(
    Z: Tensor, theta: Tensor, C: Tensor, model: str = "linear", transposed_term: str = "keep"
) -> tuple[Tensor, Tensor]:
    """The flow right-hand side -dL/dZ split as (attention term, label term); their sum is ``flow_rhs``.

    linear: (-diag(s) CA(Z, theta), C theta). quadratic: keep (-(diag(s) SA + sigma(N)^T diag(s) Z theta),
    (C + C^T) Z theta); drop (-diag(s) SA, C Z theta); symmetrize (-2 SA, (C + C^T) Z theta). s = C 1 are the row
    sums of the targets (1 for one-hot or soft targets, which gives the source's CA, SA and RA).

    Raises:
        ValueError: as :func:`feature_gradient`.
    """
    _check(model, transposed_term, Z, theta, C)
    _check_rows_for(transposed_term, C)
    s = _row_sums(C)
    return _attention_term(Z, theta, s, model, transposed_term), _label_term(Z, theta, C, model, transposed_term)


def flow_rhs(Z: Tensor, theta: Tensor, C: Tensor, model: str = "linear", transposed_term: str = "keep") -> Tensor:
    """dZ/dt = attention term + label term (= -dL/dZ for ``keep``); (..., n, d)."""
    attention, label = flow_terms(Z, theta, C, model, transposed_term)
    return attention + label


def vector_fields(
    theta: Tensor, C: Tensor, model: str = "linear", transposed_term: str = "keep"
) -> tuple[VectorField, VectorField]:
    """The two halves of the flow as callables ``Z -> dZ/dt``: (attention field, label field), for the splittings.

    The label field is constant (C theta) in the linear model and linear in Z in the quadratic one; the attention
    field holds all the non-linearity. Targets with any row sums are handled as in :func:`flow_terms`.

    Raises:
        ValueError: unknown model / transposed_term, or ``symmetrize`` with rows of C that do not sum to 1.
    """
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose one of: {', '.join(MODELS)}")
    if transposed_term not in TRANSPOSED_TERMS:
        raise ValueError(f"unknown transposed_term {transposed_term!r}; choose one of: {', '.join(TRANSPOSED_TERMS)}")
    if model == "linear" and transposed_term != "keep":
        raise ValueError("transposed_term applies to model='quadratic' only")
    _check_rows_for(transposed_term, C)
    s = _row_sums(C)
    return (
        (lambda Z: _attention_term(Z, theta, s, model, transposed_term)),
        (lambda Z: _label_term(Z, theta, C, model, transposed_term)),
    )


__all__ = [
    "MODELS",
    "TRANSPOSED_TERMS",
    "feature_gradient",
    "flow_rhs",
    "flow_terms",
    "logits",
    "multinomial_loss",
    "quadratic_weights",
    "theta_from_phi",
    "vector_fields",
]
