"""Higher-order gradients for the fast engines' kernels.

The fast kernels (PyTorch's fused SDPA on CPU, the closed-form backwards of ``elementwise.py`` and ``sparse.py``)
have first-order backwards only. When a backward runs with ``create_graph=True`` (gradient penalties, Hessian-vector
products, MAML), ``torch.is_grad_enabled()`` is True inside it; the kernels then differentiate an exact formula of
the same function (plain tensor ops, differentiable to every order) on the saved inputs instead. The first-order
path stays the fast one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

LOW_PRECISION = (torch.float16, torch.bfloat16)
"""Dtypes in which :func:`sdpa` runs the kernel on float32 copies when a gradient is needed. The fused kernels'
backward (FlashAttention-2's, Dao 2023, Algorithm 2, and the CPU one) forms D_i = sum_d dO_id O_id from the output
*rounded to the input dtype*, then dS_ij = P_ij (dP_ij - D_i). On a row that puts nearly all its weight on one key,
dP_ij - D_i is a difference of nearly equal terms and the rounding of O (2^-8 relative in bfloat16) swamps it: dW_q
and dW_k of an ALiBi layer in bfloat16 were off by 54 % and 37 % of their largest value, while the reference engine,
which backpropagates through float32 weights, was within 0.4 % (issue 36). Computing in max(dtype, float32) is the
project's precision rule (``axiomformer/precision.py``); without gradients the low-precision kernel is kept (its
forward is within the dtype's rounding)."""

DOUBLE_BACKWARD_HINT = "use Attention(..., double_backward=True) (or attend(..., double_backward=True))"


def differentiable_backward(
    exact: Callable[..., Tensor], inputs: Sequence[Any], grad_out: Tensor, needs: Sequence[bool]
) -> list[Tensor | None]:
    """Vector-Jacobian products of ``exact(*inputs)`` with ``grad_out`` for the inputs in ``needs``, as a graph.

    ``inputs`` are the tensors a ``torch.autograd.Function`` saved (with their history when the outer backward
    runs with ``create_graph=True``); entries that are not tensors pass through to ``exact`` unchanged.
    """
    with torch.enable_grad():
        out = exact(*inputs)
    wanted = [x for x, need in zip(inputs, needs) if need]
    got = iter(torch.autograd.grad(out, wanted, grad_out, create_graph=True, allow_unused=True))
    return [next(got) if need else None for need in needs]


def graph_grads(
    ctx: Any, exact: Callable[..., Tensor], inputs: Sequence[Any], grad_out: Tensor, trailing: int
) -> tuple[Tensor | None, ...]:
    """A ``torch.autograd.Function.backward`` result built as a graph (the outer backward has ``create_graph=True``).

    :func:`differentiable_backward` for the Function's first ``len(inputs)`` arguments (as ``ctx.needs_input_grad``
    asks), then ``trailing`` Nones for the options after them.
    """
    grads = differentiable_backward(exact, inputs, grad_out, ctx.needs_input_grad[: len(inputs)])
    return (*grads, *(None,) * trailing)


FirstOrder = Callable[[Any, Tensor], tuple[Tensor | None, ...]]
"""A hand-written first-order backward ``(ctx, grad_out) -> grads``."""


class RecomputingFunction(torch.autograd.Function):
    """A chunked Function over (q, k, v, and 4 options) that recomputes its weights in the backward.

    Its forward ends with :func:`keep_for_backward`. The backward runs the hand-written ``first_order(ctx,
    grad_out)`` (``grad_out`` made contiguous), or, where the outer backward builds a graph (``create_graph=True``:
    grad mode is on inside ``backward``), :func:`graph_grads` of ``exact`` (the same output in plain tensor ops) at
    the first three saved tensors.
    """

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        if torch.is_grad_enabled():
            return graph_grads(ctx, ctx.exact, ctx.saved_tensors[:3], grad_out, trailing=4)
        first_order: FirstOrder = ctx.first_order
        return first_order(ctx, grad_out.contiguous())


def keep_for_backward(
    ctx: Any, saved: tuple[Tensor, ...], exact: Callable[..., Tensor], first_order: FirstOrder
) -> None:
    """What :class:`RecomputingFunction`'s backward reads: the ``saved`` tensors (q, k, v first), ``exact`` and
    ``first_order``."""
    ctx.save_for_backward(*saved)
    ctx.exact, ctx.first_order = exact, first_order


def _math_sdpa(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, is_causal: bool, scale: float | None
) -> Tensor:
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale)


class _SDPA(torch.autograd.Function):
    """``F.scaled_dot_product_attention`` (fused kernels, first order) with a math-backend second order."""

    @staticmethod
    def forward(
        ctx: Any,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attn_mask: Tensor | None,
        dropout_p: float,
        is_causal: bool,
        scale: float | None,
    ) -> Tensor:
        ctx.save_for_backward(query, key, value, attn_mask)
        ctx.options = (dropout_p, is_causal, scale)
        needs = ctx.needs_input_grad[:4]
        with torch.enable_grad():
            lq, lk, lv = (t.detach().requires_grad_(need) for t, need in zip((query, key, value), needs))
            lm = None if attn_mask is None else attn_mask.detach().requires_grad_(needs[3])
            out = F.scaled_dot_product_attention(
                lq, lk, lv, attn_mask=lm, dropout_p=dropout_p, is_causal=is_causal, scale=scale
            )
        ctx.graph = ([lq, lk, lv, lm], out)
        return out.detach()

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        needs = ctx.needs_input_grad[:4]
        dropout_p, is_causal, scale = ctx.options
        if torch.is_grad_enabled():
            if dropout_p > 0:
                raise RuntimeError(
                    "second-order gradients through SDPA with dropout would redraw the dropout mask; "
                    + DOUBLE_BACKWARD_HINT
                )
            grads = differentiable_backward(
                lambda q, k, v, m: _math_sdpa(q, k, v, m, is_causal, scale), ctx.saved_tensors, grad_out, needs
            )
        else:
            leaves, out = ctx.graph
            wanted = [t for t, need in zip(leaves, needs) if need]
            got = iter(torch.autograd.grad(out, wanted, grad_out, retain_graph=True, allow_unused=True))
            grads = [next(got) if need else None for need in needs]
        return (*grads, None, None, None)


def _wide(t: Tensor) -> Tensor:
    return t.float() if t.is_floating_point() else t


def sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    """``F.scaled_dot_product_attention`` whose backward is differentiable again (see the module docstring).

    Under ``torch.compile``, or when nothing needs a gradient, it is the plain call.
    """
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, attn_mask))
    if needs_grad and q.dtype in LOW_PRECISION:  # the backward in float32 (see LOW_PRECISION); the forward is the same
        wide_mask = None if attn_mask is None else _wide(attn_mask)
        return sdpa(
            _wide(q), _wide(k), _wide(v), attn_mask=wide_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        ).to(q.dtype)
    if torch.compiler.is_compiling() or not needs_grad:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        )
    return _SDPA.apply(q, k, v, attn_mask, dropout_p, is_causal, scale)
