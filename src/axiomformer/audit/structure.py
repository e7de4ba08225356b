"""Checks read from how the outputs move with each key's value: the value Jacobian J_ij = d out_i / d v_j.

Source: Somani, assumptions A1-A4 (``docs/SOURCES.md``). In standard attention J_ij = w_ij A for one matrix A per head
(A = W_v restricted to the head; the identity for a function of already-mapped values): *one scalar relevance per
key* (A2) read by every coordinate. How J departs from that form tells departures apart: J_ij = c_ij R_i (it factors
through the query: an output gate or a nonlinearity after the sum, A1), J_ij = c_ij H_j (it factors through the key:
a per-key nonlinearity of the value, A3), or neither (a relevance that reads the values, A4, or a contribution that
reads value and relevance jointly, A2). See ``docs/audit.md``.
"""

from __future__ import annotations

import math

import torch

from axiomformer.audit.probe import AuditCheck, Probe, cannot_tell, rank1_residual, rel, result, tolerance


def jacobian_structure(p: Probe, jac: torch.Tensor) -> dict[str, float]:
    """Low-rank residuals of ``jac`` (b, L, S, dim, m): ``scalar``, rank one per head over every (input, query, key)
    (J_ij = w_hij A_h), or rank <= heads over the whole output when a map after the sum mixes the heads
    (J_ij = sum_h w_hij B_h); ``per_query``, over the keys of each query (J_ij = R_i sum_h w_hij B_h: rank one per head,
    or rank <= heads over the whole output when a map after the sum mixes the heads and there are more keys than
    heads); ``per_key``, rank one per head over the queries of each key (J_ij = w_hij H_hj)."""
    blocks = p.head_blocks(jac)  # (heads, b, L, S, hd * m)
    per_query = rank1_residual(blocks.flatten(0, 2))
    b, L, s, d, m = jac.shape
    scalar = max(rank1_residual(blk.flatten(0, 2)) for blk in blocks)
    # the rank-heads residuals (SVDs, the costly part) only matter where the rank-one residual is over tolerance
    if p.a.num_heads > 1 and s > p.a.num_heads and per_query > p.tol:
        per_query = min(per_query, rank1_residual(jac.reshape(b * L, s, d * m), rank=p.a.num_heads))
    if p.a.num_heads > 1 and scalar > p.tol:
        # an output map that mixes the heads: J_ij = sum_h w_hij B_h spans heads-many directions in all
        scalar = min(scalar, rank1_residual(jac.reshape(b * L * s, d * m), rank=p.a.num_heads))
    return {"scalar": scalar, "per_query": per_query, "per_key": rank1_residual(blocks.transpose(2, 3).flatten(0, 2))}


def fd_tolerance(p: Probe) -> float:
    """Tolerance of the finite-difference structure: sqrt of the tolerance of the target's ``derivative_precision``
    (else its dtype)."""
    return math.sqrt(tolerance(p.fd_precision))


def _directions(p: Probe) -> str:
    m = min(p.a.dim, 32)
    return (
        "every coordinate e_m of each key's value"
        if m == p.a.dim
        else f"{m} random orthonormal directions of each key's value (width {p.a.dim})"
    )


def scalar_relevance(p: Probe) -> tuple[AuditCheck, dict[str, float]]:
    """A2, one scalar relevance per key: every coordinate of a head sees the same weights."""
    name = "scalar_relevance"
    q, k, _ = p.qkv()
    base, jac, rdirs = p.value_jacobian(q, k)
    coef = torch.randn(k.shape[0], k.shape[1], rdirs.shape[1], generator=p.g, dtype=torch.float64)
    err = rel(p.f(q, k, (coef @ rdirs.T).to(k.dtype)), base + torch.einsum("blsom,bsm->blo", jac, coef))
    if err > p.tol:
        return cannot_tell(
            name,
            "A2",
            p.tol,
            f"the output is not linear in the values (probe error {err:.2g}), so "
            "there are no weights to compare across coordinates; see linearity and "
            "value_free_relevance",
        ), {}
    st = jacobian_structure(p, jac)
    return result(
        name,
        "A2",
        st["scalar"],
        p.tol,
        f"with v_j moved along {_directions(p)}, head h's output moves by w_hij A_h for one matrix A_h: "
        "every coordinate sees the same weights, whatever the value map (statistic: rank-one residual of "
        f"the stacked Jacobians, worst head; per query {st['per_query']:.2g}, per key "
        f"{st['per_key']:.2g})",
    ), st


def value_free_relevance(
    p: Probe, linearity: AuditCheck, additivity: AuditCheck
) -> tuple[AuditCheck, dict[str, float]]:
    """A4, the relevances are computed from queries and keys only: they do not read the values."""
    name = "value_free_relevance"
    fd_tol = fd_tolerance(p)
    if linearity.passed is True:
        return result(
            name, "A4", 0.0, fd_tol, "the output is affine in the values (linearity passed), so no relevance reads them"
        ), {}
    if linearity.passed is None:
        return cannot_tell(name, "A4", fd_tol, "linearity in the values could not be measured"), {}
    q, k, v = p.qkv()
    _, jac, _ = p.value_jacobian(q, k, v)
    st = jacobian_structure(p, jac)
    if additivity.passed is True:
        return result(
            name,
            "A4",
            0.0,
            fd_tol,
            "the output is not affine but additive over the tokens' values "
            "(token_additivity passed): each value enters only its own contribution, so no relevance "
            f"reads it (local Jacobian: per query {st['per_query']:.2g}, per key {st['per_key']:.2g})",
        ), st
    stat = min(st["per_query"], st["per_key"])
    return result(
        name,
        "A4",
        stat,
        fd_tol,
        "the output is neither affine nor additive in the values; the local Jacobian J_ij = d out_i / d v_j "
        "(central differences at random values) must factor through the query (J_ij = c_ij R_i: a "
        "nonlinearity after the sum) or through the key (J_ij = c_ij H_j: a nonlinearity of each value); a "
        "relevance that reads the values gives neither (statistic: the smaller rank-one residual, per "
        f"query {st['per_query']:.2g}, per key {st['per_key']:.2g}; tolerance sqrt(tol) for the finite "
        "differences)",
    ), st
