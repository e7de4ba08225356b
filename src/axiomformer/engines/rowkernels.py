"""Row kernels of the rowwise engine: one normalizer's weights and closed-form VJP on a block of logits, in place.

A kernel turns a block of logits t (batch*heads, rows, keys) into the weights u, and (t, u, g = dL/du,
delta = sum_j u_j g_j) into dL/dt, overwriting the blocks it is given instead of allocating new ones: at L = 4096 a
block is 8 MiB and a call makes a hundred of them, so the allocations (page faults) and the passes over memory,
not the arithmetic, are what separates a chunked PyTorch loop from SDPA's fused kernel **(our choice)**.

Each kernel computes the formula of its registry entry (``axes/normalizer.py``, where the source is cited); the
generated engine matrix (``tests/test_engine_matrix.py``) checks every kernel against the reference engine, which
runs the registry's own ``impl`` under autograd, forward and backward. A ``closed_vjp`` choice without a kernel here
(a third-party one) runs through :class:`Generic`, its registry ``impl`` and ``extra['vjp']``.

Blocked keys carry t = -inf; ``diagonal`` is the causal chunk's (first, hidden) pair (``engines/problem.py``), None
when no key of the block is hidden.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from axiomformer.axes.registry import Choice
from axiomformer.engines.rowtiles import SoftmaxTiles, SoftpickTiles, TileForm

Diagonal = tuple[int, Tensor] | None
"""A causal chunk's (first, hidden) pair, None when no key of the block is hidden."""
Spare = Callable[[int], Tensor]
"""``spare(i)``: the i-th free workspace block of the chunk's shape."""


PART = 16
"""Queries per piece where a kernel needs flipped copies of its rows (stick-breaking) **(our choice)**."""

WHOLE_BLOCK = 2**20
"""Elements of a block small enough to flip whole rather than :data:`PART` queries at a time (stick-breaking's bands
are a few hundred keys wide: 16 pieces of 4 operations each took a fifth of the time at L = 1024) **(our choice)**."""


class RowKernel:
    """Weights and their VJP for one normalizer. ``weights`` may leave a state of its own in t for ``vjp``.

    ``spare(i)`` is the i-th free block of t's shape (i = 0, 1), the same block on every call of one chunk: a
    kernel may fill it in ``weights`` (u may be ``spare(0)``) and in ``vjp`` (``spare(1)``).
    ``shift_invariant``: u(t + c) = u(t) for a per-row constant c (the engine may then drop one from the cap).
    ``selects``: u jumps where logits cross (top-k), so the cap must round exactly as the reference's tanh does.
    ``keeps_logits``: t is as the engine gave it once ``vjp`` has returned (the engine may then reuse it).
    ``reads_options``: computes a ``configured`` choice at any options, not only at its defaults (the engine
    declines the others: :func:`reads_options`).
    ``tiled``: the :class:`~axiomformer.engines.rowtiles.TileForm` that computes the kernel in tiles of keys with a
    running maximum, keeping a few numbers per row, or None; with one, the engine runs it and ``weights`` and ``vjp``
    are not called.
    """

    shift_invariant = False
    selects = False
    keeps_logits = False
    tiled: TileForm | None = None
    reads_options = True

    def __init__(self, choice: Choice, options: dict) -> None:
        self.choice, self.options = choice, options

    def weights(self, t: Tensor, diagonal: Diagonal, spare: Spare) -> tuple[Tensor, Any]:
        """(u, state) from the logits t."""
        raise NotImplementedError

    def vjp(self, t: Tensor, u: Tensor, g: Tensor, delta: Tensor, state: Any, spare: Spare) -> Tensor:
        """dL/dt from what ``weights`` left; may overwrite t, u and g. The result is g or a new tensor, never t or a
        spare (the engine reuses t's block once dL/dt is final)."""
        raise NotImplementedError


class Generic(RowKernel):
    """The registry's ``impl`` and ``extra['vjp']`` (allocating): any ``closed_vjp`` choice."""

    keeps_logits = True  # a registry VJP may overwrite g only

    def weights(self, t: Tensor, diagonal: Diagonal, spare: Spare) -> tuple[Tensor, Any]:
        assert self.choice.impl is not None  # a normalizer always has one
        return self.choice.impl(t, False, **self.options), None

    def vjp(self, t: Tensor, u: Tensor, g: Tensor, delta: Tensor, state: Any, spare: Spare) -> Tensor:
        return self.choice.extra["vjp"](t, u, g, delta, **self.options)


class Softmax(RowKernel):
    """u = softmax(t), computed in tiles with the online softmax (``engines/rowtiles.py``);
    dL/dt = u (g - delta), the VJP :class:`TopK` shares."""

    shift_invariant = True
    keeps_logits = True
    tiled: TileForm | None = SoftmaxTiles()

    def vjp(self, t: Tensor, u: Tensor, g: Tensor, delta: Tensor, state: Any, spare: Spare) -> Tensor:
        return g.sub_(delta).mul_(u)


class TopK(Softmax):
    """u = softmax over the keys whose logit is >= the row's k-th largest (ties kept, as the registry's formula), 0
    elsewhere; the VJP is softmax's (u = 0 off the kept keys)."""

    selects = True
    tiled = None  # the k-th largest logit needs the whole row

    def weights(self, t: Tensor, diagonal: Diagonal, spare: Spare) -> tuple[Tensor, Any]:
        top = t.topk(min(int(self.options.get("k", 1)), t.shape[-1]), dim=-1).values
        # the smallest finite of the top k: the k-th largest, or the smallest visible logit of a row that has fewer
        # than k (the engine never gets a row without one)
        kth = top.masked_fill_(torch.isneginf(top), float("inf")).amin(dim=-1, keepdim=True)
        # t - kth >= 0 for a kept key; for a dropped one it is < 0, and below -tiny (the smallest normal number) unless
        # both logits are within 1e-38 of 0 (float32): one thresholding pass instead of a comparison and a masked fill
        # (1.6 ms against 0.05 on an 8 MiB block). The threshold is normal, so that it holds with denormals flushed.
        tiny = torch.finfo(t.dtype).tiny
        gap = torch.nn.functional.threshold(torch.sub(t, kth, out=spare(0)), -tiny, float("-inf"), inplace=True)
        return torch.softmax(gap, dim=-1), None


class Softpick(RowKernel):
    """u_j = relu(a_j) / D, a_j = e^(t_j - m) - e^-m, D = sum_l |a_l| + eps e^-m, m = max(0, max_j t_j), with a as the
    registry computes it (``softpick_terms``: e^-m expm1(t) in a row whose largest logit is below 1);
    dL/dt_k = e^(t_k - m) ([a_k > 0] g_k - sign(a_k) delta) / D. Computed in tiles (``engines/rowtiles.py``).
    """

    def __init__(self, choice: Choice, options: dict) -> None:
        super().__init__(choice, options)
        self.tiled = SoftpickTiles(bool(options.get("shifted_eps", False)))


class StickBreaking(RowKernel):
    """u_j = beta_j prod_{visible l > j} (1 - beta_l), beta = sigmoid(t): a reverse cumulative product of
    1 - beta = sigmoid(-t) (0.4 ms on an 8 MiB block, where the log-space form's softplus, cumsum and exp took 1.5 ms;
    a product that underflows is 0, as it is in log space). A blocked key (t = -inf) has beta = 0 and 1 - beta = 1.

    dL/dt_k = dA_k - beta_k sum_{j <= k} dA_j with dA = g u. t is left intact. The paper's convention only: the
    authors' (``stick_attend_current=False``, ``stick_remainder=True``) run on the reference and chunked engines.
    """

    reads_options = False

    def __init__(self, choice: Choice, options: dict) -> None:
        super().__init__(choice, options)
        self.firsts: list[Tensor] = []

    def weights(self, t: Tensor, diagonal: Diagonal, spare: Spare) -> tuple[Tensor, Any]:
        u = torch.special.expit(t, out=spare(0))
        # prod over l > j: a cumulative product of the reversed row, reversed back, PART queries at a time (two
        # flipped copies of a full block would be the largest allocations of the backward)
        self.firsts = []
        step = t.shape[-2] if t.numel() <= WHOLE_BLOCK else PART
        for rows in range(0, t.shape[-2], step):
            part = t[:, rows : rows + step]
            keep = torch.special.expit(part.neg_()).flip(-1)
            part.neg_()  # negation is exact: t is restored
            after = keep.cumprod_(-1).flip(-1)  # prod over l >= j
            self.firsts.append(after[..., 0])
            u[:, rows : rows + step, :-1].mul_(after[..., 1:])
        return u, None

    def stick_used_up(self) -> bool:
        """Whether, in the last ``weights`` call, the product prod_{l >= first key} (1 - beta_l) of every row was 0:
        then every key before the block has weight exactly 0 (the engine's band, ``engines/rowwise.py``)."""
        return all(not bool(first.any()) for first in self.firsts)

    def vjp(self, t: Tensor, u: Tensor, g: Tensor, delta: Tensor, state: Any, spare: Spare) -> Tensor:
        d = g.mul_(u)
        before = torch.cumsum(d, dim=-1, out=u)
        return d.addcmul_(t.sigmoid_(), before, value=-1.0)


KERNELS: dict[str, type[RowKernel]] = {
    "softmax": Softmax,
    "topk": TopK,
    "softpick": Softpick,
    "stick_breaking": StickBreaking,
}
"""Kernels by normalizer name; any other ``closed_vjp`` choice runs through :class:`Generic`."""


def reads_options(choice: Choice) -> bool:
    """Whether the kernel for ``choice`` computes it at options other than its defaults."""
    return KERNELS.get(choice.name, Generic).reads_options


def row_kernel(choice: Choice, options: dict) -> RowKernel:
    """The kernel for a registry choice (its own when one is written here, else :class:`Generic`)."""
    return KERNELS.get(choice.name, Generic)(choice, options)
