"""The chunkwise state form (``engines/state_chunked.py``) and its decayed Gram matrices (``engines/chunk_grams.py``).

Held to the references of ``test_transport.py`` (the state recurrence one token at a time with explicit matrices, the
transports multiplied out) and to autograd of the quadratic parallel form, in float64 at 1e-10: outputs, final states
and every input's gradient, at lengths that are not a multiple of the chunk, with an initial state, with the delta
rule's w = k, with per-channel decays steep enough that one reference token per chunk would overflow, and through the
routed engine with key padding. The written-out backward is also checked by ``gradcheck`` and the second order by
``gradgradcheck``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from axiomformer import Attention, AttentionSpec
from axiomformer.axes.transport import FACTOR_SPAN, TRANSPORTS, TransportGates, _LogDecay, transported_scores
from axiomformer.engines import ENGINES
from axiomformer.engines.chunk_grams import channel_gram, gram, gram_backward, leaf_size
from axiomformer.engines.recurrent import RecurrentEngine
from axiomformer.engines.state_chunked import chunkwise_state_form
from axiomformer.engines.state_form import state_form
from test_transport import DIM, HEADS, KINDS, _gates, _layer, _qkv, naive_recurrence

FORMS = [(kind, False) for kind in KINDS] + [(kind, True) for kind in KINDS if "householder" in kind]
"""(kind, shared): every kind of gates, and those with a Householder factor also with w = k (the delta rule)."""
SHAPES = [(6, 4, 4), (13, 4, 8), (13, 3, 6), (13, 16, 16), (9, 2, 4), (1, 4, 4)]
"""(tokens, chunk, group): partial last chunks and groups, a chunk longer than the sequence, one token."""


def _case(
    kind: str, n: int, shared: bool, *, b: int = 2, h: int = 2, d: int = 4
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, TransportGates]:
    """q, k, v and gates of one kind; with ``shared`` the Householder vectors are the (unit) keys, as the delta rule."""
    q, k, v = _qkv(b, h, n, d)
    g = _gates(kind, b, h, n, d)
    if shared:
        k = F.normalize(k, dim=-1)
        g = g._replace(w=k)
    return q, k, v, g


def _leaves(q, k, v, g: TransportGates, shared: bool):
    """Fresh leaves of every input (w tied to k when shared) and the list autograd is asked about."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    parts = [t.clone().requires_grad_() if t is not None else None for t in g]
    if shared:
        parts[2] = k
    gates = TransportGates(*parts)
    wanted = [q, k, v] + [t for i, t in enumerate(parts) if t is not None and not (shared and i == 2)]
    return q, k, v, gates, wanted


# ---------------------------------------------------------------------------------------------- forward
@pytest.mark.parametrize(("kind", "shared"), FORMS)
@pytest.mark.parametrize(("n", "chunk", "group"), SHAPES)
def test_the_chunkwise_form_is_the_recurrence_and_the_parallel_form(kind, shared, n, chunk, group):
    q, k, v, g = _case(kind, n, shared)
    want, want_state = naive_recurrence(q, k, v, g)
    out, state = chunkwise_state_form(q, k, v, g, chunk=chunk, group=group, shared=shared)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-10)
    torch.testing.assert_close(state, want_state, rtol=0, atol=1e-10)
    torch.testing.assert_close(out, transported_scores(q, k, g, 0) @ v, rtol=0, atol=1e-10)


@pytest.mark.parametrize("kind", KINDS)
def test_an_initial_state_and_a_scale_are_those_of_the_autograd_chunk_form(kind):
    q, k, v, g = _case(kind, 11, False)
    state = torch.randn(2, 2, 4, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    want, want_state = state_form(q * 0.3, k, v, g, state, chunk=11)
    out, last = chunkwise_state_form(q, k, v, g, state, scale=0.3, chunk=4, group=4)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-10)
    torch.testing.assert_close(last, want_state, rtol=0, atol=1e-10)


@pytest.mark.parametrize("shared", [False, True])
def test_steep_per_channel_decays_stay_exact_and_finite(shared):
    """Decays of -40 per token span far beyond FACTOR_SPAN within a chunk: the Gram matrices halve the chunk down to
    single tokens, every exponent <= 0, in float64 exactly and in float32 without an overflow."""
    q, k, v, g = _case("diag_decay_householder", 13, shared)
    g = g._replace(log_decay=40.0 * g.log_decay)
    assert float(-g.log_decay.sum(-2).min()) > FACTOR_SPAN
    want, want_state = naive_recurrence(q, k, v, g)
    out, state = chunkwise_state_form(q, k, v, g, chunk=8, group=8, shared=shared)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-10)
    torch.testing.assert_close(state, want_state, rtol=0, atol=1e-10)
    g32 = TransportGates(*(t.float() if t is not None else None for t in g))
    out32, _ = chunkwise_state_form(q.float(), k.float(), v.float(), g32, chunk=8, shared=shared)
    assert torch.isfinite(out32).all()
    torch.testing.assert_close(out32.double(), want, rtol=0, atol=1e-4)


# ---------------------------------------------------------------------------------------------- gradients
@pytest.mark.parametrize(("kind", "shared"), FORMS)
@pytest.mark.parametrize(("n", "chunk", "group"), [(13, 4, 8), (9, 3, 3), (6, 16, 16)])
def test_the_gradients_are_autograd_of_the_parallel_form(kind, shared, n, chunk, group):
    q, k, v, g = _case(kind, n, shared)
    weight = torch.randn(2, 2, n, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    q, k, v, gates, wanted = _leaves(q, k, v, g, shared)
    parallel = torch.autograd.grad(((transported_scores(q * 0.7, k, gates, 0) @ v) * weight).sum(), wanted)
    out, _ = chunkwise_state_form(q, k, v, gates, scale=0.7, chunk=chunk, group=group, shared=shared)
    mine = torch.autograd.grad((out * weight).sum(), wanted)
    for a, b in zip(mine, parallel):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


@pytest.mark.parametrize("kind", ["decay", "diag_decay", "decay_householder", "diag_decay_householder"])
def test_the_gradients_of_the_final_and_the_initial_state(kind):
    shared = "householder" in kind
    q, k, v, g = _case(kind, 10, shared)
    q, k, v, gates, wanted = _leaves(q, k, v, g, shared)
    state = torch.randn(2, 2, 4, 4, dtype=torch.float64, requires_grad=True)
    gen = torch.Generator().manual_seed(6)
    w_out, w_state = (torch.randn(*s, dtype=torch.float64, generator=gen) for s in ((2, 2, 10, 4), (2, 2, 4, 4)))
    loss = lambda out, last: (out * w_out).sum() + (last * w_state).sum()
    want = torch.autograd.grad(loss(*state_form(q, k, v, gates, state, chunk=10)), [*wanted, state])
    got = torch.autograd.grad(
        loss(*chunkwise_state_form(q, k, v, gates, state, chunk=4, shared=shared)), [*wanted, state]
    )
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


@pytest.mark.parametrize(
    ("kind", "shared"), [("decay", False), ("diag_decay_householder", True), ("householder", False)]
)
def test_gradcheck_and_second_order(kind, shared):
    """Written out (decay; w = k) and through autograd (Householder vectors of their own), first and second order
    (a backward with ``create_graph=True`` differentiates the autograd chunk form)."""
    q, k, v, g = _case(kind, 5, shared, b=1, h=1, d=3)
    parts = [t.requires_grad_() if t is not None else None for t in (q, k, v, g.log_decay, g.beta, g.w, g.write)]

    def run(*inputs: torch.Tensor | None) -> torch.Tensor:
        q, k, v, log_decay, beta, w, write = inputs
        gates = TransportGates(log_decay, beta, k if shared else w, write)
        return chunkwise_state_form(q, k, v, gates, scale=0.5, chunk=2, group=2, shared=shared)[0]

    inputs = tuple(None if shared and i == 5 else t for i, t in enumerate(parts))
    assert torch.autograd.gradcheck(run, inputs)
    assert torch.autograd.gradgradcheck(run, inputs)


def test_bad_options_are_refused_with_the_reason():
    q, k, v, g = _case("diag_decay", 4, False)
    with pytest.raises(ValueError, match="Householder"):
        chunkwise_state_form(q, k, v, g, shared=True)
    with pytest.raises(ValueError, match="at least one token"):
        chunkwise_state_form(q, k, v, g, chunk=0)


# ---------------------------------------------------------------------------------------------- Gram matrices
def _exact_gram(x, y, c):
    """sum_i x_ai y_bi e^(c_ai - c_bi) for a >= b from the (n, n, channels) exponent, masked before exp."""
    n = x.shape[-2]
    exponent = (c.unsqueeze(-2) - c.unsqueeze(-3)).masked_fill(
        ~torch.ones(n, n, dtype=torch.bool).tril()[..., None], -torch.inf
    )
    decay = exponent.exp().expand(*exponent.shape[:-1], x.shape[-1])
    return torch.einsum("...ai,...bi,...abi->...ab", x, y, decay)


@pytest.mark.parametrize("channels", [1, 4])
@pytest.mark.parametrize("n", [1, 5, 8, 16])
@pytest.mark.parametrize("steep", [0.3, 3.0, 60.0])
def test_the_gram_matrices_and_their_gradients_are_the_exact_form(channels, n, steep):
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(2, 3, 2, n, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    y = torch.randn(2, 3, 1, n, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    c = (-steep * torch.rand(2, 3, 1, n, channels, dtype=torch.float64, generator=gen)).cumsum(-2).requires_grad_()
    value, want = gram(x, y, c), _exact_gram(x, y, c)
    torch.testing.assert_close(value, want, rtol=0, atol=1e-12)
    grad = torch.randn(want.shape, dtype=torch.float64, generator=gen).tril()
    got = gram_backward(x.detach(), y.detach(), c.detach(), [value.detach()], [grad])
    for a, b in zip(got, torch.autograd.grad((want * grad).sum(), (x, y, c))):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_every_leaf_size_gives_the_same_per_channel_gram():
    gen = torch.Generator().manual_seed(2)
    x, y = (torch.randn(3, 16, 4, dtype=torch.float64, generator=gen) for _ in range(2))
    c = (-torch.rand(3, 16, 4, dtype=torch.float64, generator=gen)).cumsum(-2)
    assert leaf_size(c) == 16 and leaf_size(100.0 * c) < 16
    for leaf in (1, 2, 4, 8, 16):
        torch.testing.assert_close(channel_gram(x, y, c, leaf), _exact_gram(x, y, c), rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------------------------- the layer
def test_the_gate_keeps_only_its_output_and_is_autograds_to_rounding():
    gen = torch.Generator().manual_seed(4)
    raw = (10.0 * torch.randn(2, 3, 5, 4, dtype=torch.float64, generator=gen)).requires_grad_()  # some z > 20
    bias = torch.randn(3, 1, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    a_log = torch.randn(3, 1, 1, dtype=torch.float64, generator=gen, requires_grad=True)
    assert torch.autograd.gradcheck(_LogDecay.apply, (raw, bias, a_log))
    assert torch.autograd.gradgradcheck(_LogDecay.apply, (raw, bias, a_log))
    want = -a_log.exp() * F.softplus(raw + bias)
    got = _LogDecay.apply(raw, bias, a_log)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    weight = torch.randn(want.shape, dtype=torch.float64, generator=gen)
    for a, b in zip(
        torch.autograd.grad((got * weight).sum(), (raw, bias, a_log)),
        torch.autograd.grad((want * weight).sum(), (raw, bias, a_log)),
    ):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-12)


@pytest.mark.parametrize("name", TRANSPORTS.names()[1:])
def test_the_gates_of_keys_split_into_heads_are_those_of_the_merged_keys(name):
    att = _layer(name)
    k = att.transport.prepare(*(2 * [torch.randn(2, HEADS, 9, DIM // HEADS, dtype=torch.float64)]))[1]
    merged = att.transport.gates(att._merge_heads(k), k)
    for a, b in zip(att.transport.gates(k, k), merged):
        if b is not None:
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", [n for n in TRANSPORTS.names() if TRANSPORTS.has(n, "state")])
def test_the_routed_engine_is_the_reference_over_several_chunks_with_padding(name, monkeypatch):
    """70 tokens, chunks of 8 in groups of 16 (partial last chunk and group), left padding: forward and every
    parameter's gradient equal the reference engine's."""
    monkeypatch.setitem(ENGINES, "recurrent", RecurrentEngine(chunk=8, group=16))
    spec = AttentionSpec.standard(DIM, HEADS, causal=True).relax(f"transport={name},normalizer=none")
    x = torch.randn(2, 70, DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    keep = torch.ones(2, 70, dtype=torch.bool)
    keep[1, :5] = False
    results = []
    for engine in ("reference", "auto"):
        torch.manual_seed(0)
        att = Attention(spec, engine=engine).double()
        leaf = x.clone().requires_grad_()
        out = att(leaf, key_padding_mask=keep)
        (out * torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view_as(out)).sum().backward()
        results.append((att.last_engine, [out.detach(), leaf.grad] + [p.grad for p in att.parameters()]))
    (_, want), (engine, got) = results
    assert engine == "recurrent"
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_a_linear_map_of_keys_split_into_heads_is_that_of_the_merged_keys_to_second_order():
    from axiomformer.axes.transport import _HeadSplitLinear

    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 5, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(6, 12, dtype=torch.float64, generator=gen, requires_grad=True)
    merged = x.transpose(1, 2).reshape(2, 5, 12) @ weight.T
    torch.testing.assert_close(_HeadSplitLinear.apply(x, weight), merged, rtol=0, atol=1e-12)
    assert torch.autograd.gradcheck(_HeadSplitLinear.apply, (x, weight))
    assert torch.autograd.gradgradcheck(_HeadSplitLinear.apply, (x, weight))


def test_the_l2_normalisation_is_f_normalize_to_second_order():
    from axiomformer.axes.transport import _Unit

    x = torch.randn(2, 3, 5, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    x[0, 0, 0] = 0.0  # a zero row: the clamped norm
    x.requires_grad_()
    torch.testing.assert_close(_Unit.apply(x), F.normalize(x, dim=-1), rtol=0, atol=0)
    weight = torch.randn(x.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    want = torch.autograd.grad((F.normalize(x, dim=-1) * weight).sum(), x)[0]
    torch.testing.assert_close(torch.autograd.grad((_Unit.apply(x) * weight).sum(), x)[0], want, rtol=0, atol=1e-12)
    smooth = x.detach()[1:].clone().requires_grad_()  # away from the kink at 0
    assert torch.autograd.gradcheck(_Unit.apply, (smooth,))
    assert torch.autograd.gradgradcheck(_Unit.apply, (smooth,))


# ---------------------------------------------------------------------------------------------- PaTH's blockwise form
def _path_case(n: int, padded: bool):
    from axiomformer.engines.transport_chunked import chunked_softmax_transport

    q, k, v = (t.requires_grad_() for t in _qkv(n=n))
    g0 = _gates("householder", n=n)
    write = (
        0.5 + torch.rand(2, 2, n, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    ).requires_grad_()
    leaves = [g0.log_decay, g0.beta.clone().requires_grad_(), g0.w.clone().requires_grad_(), write]
    keep = torch.ones(2, n, dtype=torch.bool)
    if padded:
        keep[1, :2] = False
    g = TransportGates(*leaves).masked(keep if padded else None)
    return chunked_softmax_transport, (q, k, v, leaves[1], leaves[2], write), g, keep


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize(("n", "block"), [(13, 4), (13, 16), (9, 3), (8, 8)])
def test_the_blockwise_softmax_transport_is_the_parallel_form_with_write_strengths(padded, n, block):
    """Gates with a write strength gamma_j (what key padding leaves PaTH's gates, and what the audit's surgery may
    set), blocks that do not divide the sequence, left padding: forward and every gradient, gamma's included."""
    run, (q, k, v, beta, w, write), g, keep = _path_case(n, padded)
    mask = torch.ones(n, n, dtype=torch.bool).tril() & keep[:, None, None, :]
    u = torch.softmax(transported_scores(q, k, g, 0).masked_fill(~mask, float("-inf")), -1)
    want = torch.where(mask.any(-1, keepdim=True), u, 0.0) @ v
    got = run(q, k, v, g, keep, block)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    weight = torch.randn(want.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    wanted = [q, k, v, beta, w, write]
    mine = torch.autograd.grad((got * weight).sum(), wanted, retain_graph=True)
    for a, b in zip(mine, torch.autograd.grad((want * weight).sum(), wanted)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_the_blockwise_softmax_transport_passes_gradcheck_and_second_order():
    from axiomformer.engines.transport_chunked import chunked_softmax_transport

    q, k, v = (t[:1, :1, :, :3].contiguous().requires_grad_() for t in _qkv(n=5))
    g = _gates("householder", b=1, h=1, n=5, d=3)
    beta, w = g.beta.requires_grad_(), g.w.requires_grad_()

    def run(*inputs: torch.Tensor) -> torch.Tensor:
        q, k, v, beta, w = inputs
        return chunked_softmax_transport(q, k, v, TransportGates(g.log_decay, beta, w, None), None, 2)

    assert torch.autograd.gradcheck(run, (q, k, v, beta, w))
    assert torch.autograd.gradgradcheck(run, (q, k, v, beta, w))
    with pytest.raises(ValueError, match="without a decay"):
        chunked_softmax_transport(q, k, v, g._replace(log_decay=g.log_decay - 1.0), None, 2)
