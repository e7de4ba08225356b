"""The chunked transport engine: a Householder transport under a row normalizer (PaTH with softmax) in O(L) memory.

Source: Yang et al. 2025, PaTH attention, arXiv:2505.16381, sec. 3.2 (the blockwise algorithm; fla's
``naive_path_attn`` is the same sweep). With H_t = I - beta_t w_t w_t^T and blocks of C tokens, the score of key j in
block J = [c, d) for query i in a later block I = [a, b) factors through the blocks in between:

    s_ij = k~_j . q~_i,   k~_j = (H_{j+1} ... H_{d-1})^T k_j,   q~_i <- B_J q~_i after each block J,  B_J = H_c ... H_{d-1},

starting from q~_i = (H_a ... H_i) q_i and sweeping the key blocks backward; within a block the parallel form
(``transported_scores``). The keys transported to their block's end, the queries to their block's start and each block's
(head_dim x head_dim) product come from the same UT form: K~ = K - A^T (beta o W) with A the transported scores of the
Householder vectors against the keys, Q~ = Q - S (beta o W), B = I - (beta o W)^T W~. The softmax is accumulated
online over the key blocks (Milakov & Gimelshein 2018).

The backward (:class:`_PathAttention`) is FlashAttention-2's (Dao 2023, Algorithm 2) with the transport: it keeps the
inputs, the output and each row's log-sum-exp; per query block it recomputes the transported queries at every key
block (one (C x head_dim) state per earlier block), forms dS = P o (dO V^T - rowsum(dO o O)) block by block, and
carries the queries' gradient back through the blocks (dq~ <- dq~ B_J, dB_J += dq~^T q~), summing each key block's
dK~ and dB; autograd then takes the per-block pieces (local scores, q~ at the block's start, K~, B) back to q, k, w and
beta one block at a time **(our choice: the blocks' UT form stays autograd's, the quadratic sweep is written out)**.
Memory: the inputs, the output, K~, and one query block's states. A backward with ``create_graph=True`` differentiates
the quadratic parallel form instead.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from axiomformer.axes.transport import TransportGates, transported_scores
from axiomformer.engines.base import Computes, EngineBase
from axiomformer.engines.plan import Plan, ProblemKind
from axiomformer.engines.problem import AttentionProblem
from axiomformer.engines.recurrent import aligned_inputs, sequential_kind

DEFAULT_BLOCK = 128
"""Tokens per block **(our choice: fla's PaTH kernels use 64 on a GPU; on a CPU each pair of blocks is a few batched
products dispatched from Python, so larger blocks: at L = 4096 the sweep has 496 pairs instead of 2016; at 256 the
blocks' own UT forms, (block x block x block) solves, cost more than the pairs saved (9.1x SDPA against 6.3x))**."""


# ---------------------------------------------------------------------------------------------- per-block pieces
def _plain(w: Tensor, beta: Tensor) -> TransportGates:
    """Householder gates without a decay or a write strength (PaTH's)."""
    return TransportGates(w.new_zeros(*w.shape[:-1], 1), beta, w, None)


def block_ends(k: Tensor, w: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
    """Keys transported to the end of their block, and the block's product B (..., d, d); k, w (..., C, d) and
    beta (..., C) of whole blocks (any leading dims)."""
    wb = w * beta.unsqueeze(-1)
    plain = _plain(w, beta)
    keys = k - transported_scores(w, k, plain, -1).transpose(-2, -1) @ wb  # query m sits at position m - 1
    w_end = w - transported_scores(w, w, plain, -1).transpose(-2, -1) @ wb
    eye = torch.eye(k.shape[-1], dtype=k.dtype, device=k.device)
    return keys, eye - wb.transpose(-2, -1) @ w_end


def block_starts(q: Tensor, k: Tensor, w: Tensor, beta: Tensor) -> tuple[Tensor, Tensor]:
    """(queries transported to their block's start, the block's own transported scores (..., C, C), causal entries
    only), for whole blocks as :func:`block_ends`."""
    plain = _plain(w, beta)
    starts = q - transported_scores(q, w, plain, 0) @ (w * beta.unsqueeze(-1))
    return starts, transported_scores(q, k, plain, 0)


def _blocks(t: Tensor, size: int) -> Tensor:
    """(batch, heads, n, ...) zero-padded to whole blocks, as (batch, heads, blocks, size, ...)."""
    pad = -t.shape[2] % size
    if pad:
        t = F.pad(t, (0, 0) * (t.dim() - 3) + (0, pad))
    return t.unflatten(2, (t.shape[2] // size, size))


INPUTS = ("q", "k", "v", "w", "beta", "write")
"""The tensors :class:`_PathAttention` differentiates, in its arguments' order."""


def _split(inputs: tuple[Tensor, ...], keep: Tensor, size: int) -> dict[str, Any]:
    """The inputs (q, k, v, w, beta, write) in blocks of ``size`` (padding tokens: zero, their keys blocked), a
    block's causal mask, and ``dense``: every key kept and written with gamma = 1 (then every row sees its own key,
    no score is masked outside the diagonal blocks and none is scaled: the sweep skips those passes)."""
    dense = bool(keep.all()) and bool((inputs[-1] == 1).all()) and keep.shape[-1] % size == 0
    pad = -keep.shape[-1] % size
    keep = torch.cat([keep, keep.new_zeros(keep.shape[0], pad)], -1) if pad else keep
    split: dict[str, Any] = {name: _blocks(t, size) for name, t in zip(INPUTS, inputs)}
    split["keep"] = keep.unflatten(-1, (keep.shape[-1] // size, size))[:, None, :, None, :]  # (batch, 1, blocks, 1, C)
    split["causal"] = torch.ones(size, size, dtype=torch.bool, device=keep.device).tril()
    split["dense"] = dense
    return split


def _block(split: dict[str, Any], index: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(q, k, w, beta) of block ``index``."""
    q, k, w, beta = (split[name][:, :, index] for name in ("q", "k", "w", "beta"))
    return q, k, w, beta


# ---------------------------------------------------------------------------------------------- forward
def _online(state: tuple[Tensor, Tensor, Tensor], s: Tensor, v: Tensor, dense: bool) -> tuple[Tensor, Tensor, Tensor]:
    """One key block into the online softmax: state (row max m, row sum l, accumulated output), scores s (-inf where
    blocked), values v. A row that has seen no key yet keeps m = -inf (its exponentials are taken from 0; ``dense``:
    no such row)."""
    m, total, acc = state
    top = torch.maximum(m, s.amax(-1, keepdim=True))
    shift = top if dense else torch.where(torch.isfinite(top), top, 0.0)
    rescale, p = (m - shift).exp(), (s - shift).exp()
    return top, total * rescale + p.sum(-1, keepdim=True), acc * rescale + p @ v


def _scores(split: dict[str, Any], s: Tensor, index: int) -> Tensor:
    """Scores against key block ``index`` written (gamma_j) and blocked (-inf) at padded keys, unless dense."""
    if split["dense"]:
        return s
    return (s * split["write"][:, :, index, None, :]).masked_fill(~split["keep"][:, :, index], -torch.inf)


def _forward_block(split: dict[str, Any], ends: Tensor, products: Tensor, index: int) -> tuple[Tensor, Tensor]:
    """(output, log-sum-exp) of query block ``index`` over every key up to it (module docstring)."""
    v, dense = split["v"], split["dense"]
    starts, local = block_starts(*_block(split, index))
    local = _scores(split, local, index).masked_fill(~split["causal"], -torch.inf)
    empty = local.new_full((*local.shape[:-1], 1), -torch.inf)
    state = _online((empty, torch.zeros_like(empty), torch.zeros_like(v[:, :, index])), local, v[:, :, index], dense)
    qt = starts
    for j in range(index - 1, -1, -1):  # the earlier blocks, backward
        state = _online(state, _scores(split, qt @ ends[:, :, j].transpose(-2, -1), j), v[:, :, j], dense)
        if j:
            qt = qt @ products[:, :, j].transpose(-2, -1)
    m, total, acc = state
    out = torch.where(total > 0, acc / total.clamp_min(torch.finfo(acc.dtype).tiny), 0.0)
    return out, torch.where(torch.isfinite(m), m, 0.0) + total.log()  # -inf for a row that sees no key


# ---------------------------------------------------------------------------------------------- backward
def _probabilities(s: Tensor, lse: Tensor, keep: Tensor | None) -> Tensor:
    """exp(s - lse) where the key is visible (``keep``; None: every key), 0 elsewhere and on rows that see no key
    (lse = -inf)."""
    if keep is None:
        return (s - lse).exp()
    return (s - torch.where(torch.isfinite(lse), lse, torch.inf)).exp().masked_fill(~keep, 0.0)


def _sweep_backward(
    split: dict[str, Any], saved: dict[str, Tensor], grads: dict[str, Tensor], index: int, starts: Tensor
) -> Tensor:
    """The earlier key blocks of query block ``index`` backward: adds into grads["v"], grads["ends"] and
    grads["products"]; returns the gradient of the queries at the block's start."""
    ends, products, v, write = saved["ends"], saved["products"], split["v"], split["write"][:, :, :, None, :]
    d_out, lse, delta = (saved[name][:, :, index] for name in ("d_out", "lse", "delta"))
    states = {index - 1: starts}
    for j in range(index - 1, 0, -1):
        states[j - 1] = states[j] @ products[:, :, j].transpose(-2, -1)
    carried = None  # the gradient of the queries as they enter block j - 1
    dense = split["dense"]
    for j in range(index):
        raw = states[j] @ ends[:, :, j].transpose(-2, -1)
        p = _probabilities(raw if dense else raw * write[:, :, j], lse, None if dense else split["keep"][:, :, j])
        grads["v"][:, :, j] += p.transpose(-2, -1) @ d_out
        d_s = p * (d_out @ v[:, :, j].transpose(-2, -1) - delta)
        if split["write_grad"]:
            grads["write"][:, :, j] += (d_s * raw).sum(-2)
        if not dense:
            d_s *= write[:, :, j]  # the gradient of the unwritten score k~_j . q~_i
        grads["ends"][:, :, j] += d_s.transpose(-2, -1) @ states[j]
        here = d_s @ ends[:, :, j]
        if carried is not None:  # states[j - 1] = states[j] B_j^T
            here += carried @ products[:, :, j]
            grads["products"][:, :, j] += carried.transpose(-2, -1) @ states[j]
        carried = here
    return carried if carried is not None else torch.zeros_like(starts)


def _block_backward(split: dict[str, Any], saved: dict[str, Tensor], grads: dict[str, Tensor], index: int) -> None:
    """Query block ``index`` backward: its own scores and the sweep written out, then autograd of the block's UT
    pieces (its queries at the start and its own scores) into grads["q"], ["k"], ["w"], ["beta"]."""
    leaves = [t.detach().requires_grad_() for t in _block(split, index)]
    with torch.enable_grad():
        starts, local = block_starts(*leaves)
    d_out, lse, delta = (saved[name][:, :, index] for name in ("d_out", "lse", "delta"))
    write = split["write"][:, :, index, None, :]
    visible = split["causal"] if split["dense"] else split["causal"] & split["keep"][:, :, index]
    p = _probabilities(local.detach() * write, lse, visible)
    grads["v"][:, :, index] += p.transpose(-2, -1) @ d_out
    d_local = p * (d_out @ split["v"][:, :, index].transpose(-2, -1) - delta)
    if split["write_grad"]:
        grads["write"][:, :, index] += (d_local * local.detach()).sum(-2)
    d_local *= write
    d_starts = _sweep_backward(split, saved, grads, index, starts.detach())
    got = torch.autograd.grad([starts, local], leaves, [d_starts, d_local])
    for name, g in zip(("q", "k", "w", "beta"), got):
        grads[name][:, :, index] += g


def _ends_backward(split: dict[str, Any], grads: dict[str, Tensor], index: int) -> None:
    """Autograd of block ``index``'s transported keys and product into grads["k"], ["w"], ["beta"]."""
    leaves = [split[name][:, :, index].detach().requires_grad_() for name in ("k", "w", "beta")]
    with torch.enable_grad():
        ends, products = block_ends(*leaves)
    got = torch.autograd.grad([ends, products], leaves, [grads["ends"][:, :, index], grads["products"][:, :, index]])
    for name, g in zip(("k", "w", "beta"), got):
        grads[name][:, :, index] += g


# ---------------------------------------------------------------------------------------------- the function
def _parallel(inputs: tuple[Tensor, ...], keep: Tensor) -> Tensor:
    """The quadratic parallel form of (q, k, v, w, beta, write): softmax over the causal, kept keys of the
    transported scores, times v (rows that see no key: 0). For a backward with ``create_graph=True``."""
    q, k, v, w, beta, write = inputs
    n = k.shape[-2]
    mask = torch.ones(n, n, dtype=torch.bool, device=k.device).tril() & keep[:, None, None, :]
    scores = transported_scores(q, k, _plain(w, beta)._replace(write=write), 0)
    u = torch.softmax(scores.masked_fill(~mask, -torch.inf), -1)
    return torch.where(mask.any(-1, keepdim=True), u, 0.0) @ v


class _PathAttention(torch.autograd.Function):
    """softmax(transported scores) v of :func:`chunked_softmax_transport`; the backward of the module docstring."""

    @staticmethod
    def forward(ctx: Any, *args: Any) -> Tensor:
        *inputs, keep, size = args
        q, k = inputs[0], inputs[1]
        split = _split(tuple(inputs), keep, size)
        blocks = split["q"].shape[2]
        ends, products = torch.empty_like(split["k"]), k.new_empty(*k.shape[:2], blocks, k.shape[-1], k.shape[-1])
        for j in range(blocks):
            ends[:, :, j], products[:, :, j] = block_ends(*_block(split, j)[1:])
        outs, lse = zip(*(_forward_block(split, ends, products, i) for i in range(blocks)))
        out = torch.stack(outs, 2)
        ctx.save_for_backward(*inputs, keep, ends, products, out, torch.stack(lse, 2))
        ctx.size = size
        return out.flatten(2, 3)[:, :, : q.shape[-2]]

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        *inputs, keep, ends, products, out, lse = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: a graph of the parallel form
            needs = ctx.needs_input_grad[: len(INPUTS)]
            wanted = [t for t, need in zip(inputs, needs) if need]
            got = iter(torch.autograd.grad(_parallel(tuple(inputs), keep), wanted, grad_out, create_graph=True))
            return (*(next(got) if need else None for need in needs), None, None)
        split = _split(tuple(inputs), keep, ctx.size)
        split["write_grad"] = ctx.needs_input_grad[INPUTS.index("write")]
        d_out = _blocks(grad_out, ctx.size)
        saved = {
            "ends": ends,
            "products": products,
            "d_out": d_out,
            "lse": lse,
            "delta": (d_out * out).sum(-1, keepdim=True),
        }  # rowsum(dO o O): FlashAttention-2's D
        grads = {name: torch.zeros_like(split[name]) for name in INPUTS}
        grads |= {"ends": torch.zeros_like(ends), "products": torch.zeros_like(products)}
        for i in range(split["q"].shape[2]):
            _block_backward(split, saved, grads, i)
        for j in range(split["q"].shape[2]):
            _ends_backward(split, grads, j)
        n = inputs[0].shape[-2]
        return (*(grads[name].flatten(2, 3)[:, :, :n] for name in INPUTS), None, None)


def chunked_softmax_transport(
    q: Tensor, k: Tensor, v: Tensor, gates: TransportGates, keep: Tensor | None, block: int = DEFAULT_BLOCK
) -> Tensor:
    """softmax_j(s_ij) v_j over the causal keys with s the Householder transport, block by block.

    Args:
        q, k: (batch, heads, n, head_dim), q already scaled; v: (batch, heads, n, head_dim_v); gates: Householder
            gates without a decay (PaTH's; a write strength gamma_j multiplies key j's scores), zero at padded keys
            (``TransportGates.masked``);
        keep: (batch, n) False at padded keys (None: none); block: tokens per block.

    Returns:
        (batch, heads, n, head_dim_v); rows without a visible key are 0.

    Raises:
        ValueError: gates without a Householder factor, or with a decay.
    """
    if gates.w is None or gates.beta is None or bool(gates.log_decay.any()):
        raise ValueError("chunked_softmax_transport takes Householder gates without a decay (w and beta)")
    keep = torch.ones(k.shape[0], k.shape[-2], dtype=torch.bool, device=k.device) if keep is None else keep
    write = torch.ones_like(gates.beta) if gates.write is None else gates.write
    size = max(1, min(block, k.shape[-2]))  # a sequence shorter than a block is one block, not padded to one
    return _PathAttention.apply(q, k, v, gates.w, gates.beta, write, keep, size)


class ChunkedTransportEngine(EngineBase):
    """A Householder transport without a decay (PaTH) under the softmax, blockwise in O(L) memory.

    Declines: weights requests, masks other than key padding, float biases, ALiBi, dropout, windows, a query offset
    other than the bottom-right one, and ``torch.compile`` tracing (a Python loop over the blocks)."""

    name = "chunked_transport"
    returns_weights = False
    double_backward = True
    transports = True
    computes = Computes(
        all_of={"transport": {"householder"}, "normalizer": {"softmax"}, "contribution": {"proportional"}},
        none_of={"transport": {"decay", "diag_decay", "state"}},
    )

    def __init__(self, block: int = DEFAULT_BLOCK):
        self.block = block

    def accepts(self, plan: Plan, kind: ProblemKind) -> bool:
        return not kind.mask_heads and sequential_kind(kind)

    def __call__(
        self, plan: Plan, problem: AttentionProblem, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        qs, k, v, gates, keep, lead = aligned_inputs(problem)  # the lead query rows are padding
        out = chunked_softmax_transport(qs, k, v, gates, keep, self.block)
        return out[:, :, lead:].to(problem.v.dtype), None
