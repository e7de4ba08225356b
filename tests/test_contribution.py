"""The joint contribution (A2 relaxed): the factored forward equals its definition, pair by pair."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from axiomformer.axes.contribution import JointContribution


def _by_definition(module: JointContribution, weights: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """out_i = sum_j u_ij (v_j + W_2 gelu(W_v v_j + u_ij w_u + b_1) + b_2), one (i, j) pair at a time."""
    batch, heads, q_len, k_len = weights.shape
    out = torch.zeros(batch, heads, q_len, v.shape[-1], dtype=v.dtype)
    for i in range(q_len):
        for j in range(k_len):
            u = weights[:, :, i, j, None]
            hidden = F.gelu(F.linear(v[:, :, j], module.w_v.weight, module.w_v.bias) + u * module.w_u)
            out[:, :, i] += u * (v[:, :, j] + F.linear(hidden, module.out.weight, module.out.bias))
    return out


def test_joint_forward_equals_the_pairwise_definition_with_gradients() -> None:
    torch.manual_seed(0)
    module = JointContribution(head_dim=3, hidden=5).double()
    weights = torch.rand(2, 2, 4, 6, dtype=torch.float64).softmax(-1).requires_grad_()
    v = torch.randn(2, 2, 6, 3, dtype=torch.float64, requires_grad=True)
    fast = module(weights, v)
    slow = _by_definition(module, weights, v)
    torch.testing.assert_close(fast, slow, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fast, module.pair_contribution(weights, v).sum(-2), rtol=1e-12, atol=1e-12)
    grads_fast = torch.autograd.grad(fast.sum(), (weights, v, *module.parameters()))
    grads_slow = torch.autograd.grad(slow.sum(), (weights, v, *module.parameters()))
    for a, b in zip(grads_fast, grads_slow):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_a_masked_key_contributes_nothing() -> None:
    """phi(v, 0) = 0: a key of zero weight changes no output, whatever its value."""
    torch.manual_seed(1)
    module = JointContribution(head_dim=4).double()
    weights = torch.rand(1, 1, 3, 5, dtype=torch.float64)
    weights[..., 2] = 0.0
    v = torch.randn(1, 1, 5, 4, dtype=torch.float64)
    moved = v.clone()
    moved[..., 2, :] += 100.0
    torch.testing.assert_close(module(weights, v), module(weights, moved), rtol=0, atol=1e-12)
