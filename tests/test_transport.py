"""The transport axis (issue 34): the delta rule, PaTH and Mamba-2 as points of the design space.

Every reference here is written from the papers' recurrences with explicit (head_dim x head_dim) matrices, in float64,
independently of ``axes/transport.py`` and ``engines/recurrent.py``: the products T_{i<-j} = P_{j+1} ... P_i
multiplied out one token at a time, the state S_t = S_{t-1} P_t + gamma_t v_t k_t^T updated one token at a time, and
each layer's output from its own projections and gate parameters. The library's parallel (UT) form, its chunked
state form at several chunk sizes, its KV-cache decoding and its gradients are held to them.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from axiomformer import Attention, AttentionSpec, KVCache
from axiomformer.audit import run_audit
from axiomformer.axes import transport as transport_mod
from axiomformer.axes.transport import TRANSPORTS, TransportGates, transported_scores
from axiomformer.cli import app
from axiomformer.engines import attend
from axiomformer.engines.state_form import state_form
from axiomformer.spec import relax_with_requirements

DIM, HEADS, LEN = 16, 2, 7
HD = DIM // HEADS
TRANSPORT_CHOICES = TRANSPORTS.names()[1:]


def _gates(kind: str, b: int = 2, h: int = 2, n: int = 6, d: int = 4, seed: int = 0) -> TransportGates:
    """Random gates of one kind: scalar or per-channel decay, a Householder factor with its own unit w or none."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.rand(*s, generator=g, dtype=torch.float64)
    channels = d if "diag" in kind else 1
    log_decay = -rand(b, h, n, channels) if "decay" in kind else torch.zeros(b, h, n, 1, dtype=torch.float64)
    beta = w = None
    if "householder" in kind:
        beta = 2 * rand(b, h, n)
        w = F.normalize(torch.randn(b, h, n, d, generator=g, dtype=torch.float64), dim=-1)
    return TransportGates(log_decay, beta, w, 0.5 + rand(b, h, n))


def _P(g: TransportGates, bi: int, hi: int, t: int, d: int) -> torch.Tensor:
    """P_t = Diag(alpha_t) (I - beta_t w_t w_t^T) as an explicit matrix."""
    alpha = g.log_decay[bi, hi, t].exp().expand(d)
    house = torch.eye(d, dtype=torch.float64)
    if g.w is not None:
        house = house - g.beta[bi, hi, t] * torch.outer(g.w[bi, hi, t], g.w[bi, hi, t])
    return torch.diag(alpha) @ house


def naive_scores(q: torch.Tensor, k: torch.Tensor, g: TransportGates) -> torch.Tensor:
    """s_ij = gamma_j k_j^T (P_{j+1} ... P_i) q_i, the product multiplied out token by token (causal, q_len = k_len)."""
    b, h, n, d = k.shape
    out = torch.zeros(b, h, n, n, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            for i in range(n):
                for j in range(i + 1):
                    T = torch.eye(d, dtype=torch.float64)
                    for t in range(j + 1, i + 1):
                        T = T @ _P(g, bi, hi, t, d)
                    out[bi, hi, i, j] = g.write[bi, hi, j] * (k[bi, hi, j] @ T @ q[bi, hi, i])
    return out


def naive_recurrence(q, k, v, g: TransportGates):
    """S_t = S_{t-1} P_t + gamma_t v_t k_t^T, o_t = S_t q_t, one token at a time; (out, final state)."""
    b, h, n, d = k.shape
    out = torch.zeros(b, h, n, v.shape[-1], dtype=torch.float64)
    states = torch.zeros(b, h, v.shape[-1], d, dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            S = torch.zeros(v.shape[-1], d, dtype=torch.float64)
            for t in range(n):
                S = S @ _P(g, bi, hi, t, d) + g.write[bi, hi, t] * torch.outer(v[bi, hi, t], k[bi, hi, t])
                out[bi, hi, t] = S @ q[bi, hi, t]
            states[bi, hi] = S
    return out, states


def _qkv(b=2, h=2, n=6, d=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=torch.float64) for _ in range(3)]


KINDS = ["decay", "diag_decay", "householder", "decay_householder", "diag_decay_householder"]


# ---------------------------------------------------------------------------------------------- the forms
@pytest.mark.parametrize("kind", KINDS)
def test_the_parallel_form_is_the_product_of_the_transports_multiplied_out(kind):
    q, k, _ = _qkv()
    g = _gates(kind)
    got = transported_scores(q, k, g, 0)
    torch.testing.assert_close(got, naive_scores(q, k, g), rtol=0, atol=1e-10)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("chunk", [1, 2, 4, 6])
def test_the_chunked_state_form_is_the_recurrence_and_the_parallel_form(kind, chunk):
    q, k, v = _qkv()
    g = _gates(kind)
    want, want_state = naive_recurrence(q, k, v, g)
    out, state = state_form(q, k, v, g, chunk=chunk)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-10)
    torch.testing.assert_close(state, want_state, rtol=0, atol=1e-10)
    parallel = transported_scores(q, k, g, 0) @ v  # the causal entries are 0 already
    torch.testing.assert_close(out, parallel, rtol=0, atol=1e-10)


@pytest.mark.parametrize("kind", KINDS)
def test_the_state_form_gradients_are_autograd_of_the_parallel_form(kind):
    q, k, v = (t.requires_grad_() for t in _qkv())
    g0 = _gates(kind)
    leaves = [t.clone().requires_grad_() if t is not None else None for t in g0]
    g = TransportGates(*leaves)
    weight = torch.randn(2, 2, 6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    wanted = [t for t in (q, k, v, *leaves) if t is not None]
    parallel = torch.autograd.grad(((transported_scores(q, k, g, 0) @ v) * weight).sum(), wanted)
    chunked = torch.autograd.grad((state_form(q, k, v, g, chunk=4)[0] * weight).sum(), wanted)
    for a, b in zip(chunked, parallel):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_the_reference_check_catches_a_householder_factor_with_the_wrong_sign(monkeypatch):
    q, k, _ = _qkv()
    g = _gates("decay_householder")
    wrong = TransportGates(g.log_decay, -g.beta, g.w, g.write)
    assert float((transported_scores(q, k, wrong, 0) - naive_scores(q, k, g)).abs().max()) > 1e-3


# ---------------------------------------------------------------------------------------------- the layer
def _spec(name: str) -> AttentionSpec:
    return relax_with_requirements(AttentionSpec.standard(DIM, HEADS), f"transport={name}")


def _layer(name: str, **kw) -> Attention:
    torch.manual_seed(0)
    return Attention(_spec(name), **kw).double()


def _x(seed: int = 3, n: int = LEN) -> torch.Tensor:
    return torch.randn(2, n, DIM, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _padding() -> torch.Tensor:
    keep = torch.ones(2, LEN, dtype=torch.bool)
    keep[1, :2] = False  # left padding in the second row
    return keep


def paper_layer(att: Attention, x: torch.Tensor) -> torch.Tensor:
    """The choice's layer from its own projections and gate parameters, written from the paper's recurrence."""
    tr, name = att.transport, att.spec.transport
    heads = lambda t: t.view(t.shape[0], t.shape[1], HEADS, -1).transpose(1, 2)
    q, k, v = heads(att.q_proj(x)), heads(att.k_proj(x)), heads(att.v_proj(x))
    if name in ("decay_householder", "diag_decay_householder"):  # Gated DeltaNet, KDA: L2-normalised q and k
        q, k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    b, n = x.shape[:2]
    out = torch.zeros(b, HEADS, n, HD, dtype=torch.float64)
    if name == "householder":  # PaTH: softmax over s_ij = k_j^T H_{j+1} .. H_i q_i / sqrt(d)
        beta = 2 * torch.sigmoid(tr.beta_proj(x)).transpose(1, 2)
        w = heads(tr.w_proj(x))
        w = w / w.norm(dim=-1, keepdim=True)
        for bi in range(b):
            for hi in range(HEADS):
                for i in range(n):
                    s, T = torch.zeros(i + 1, dtype=torch.float64), torch.eye(HD, dtype=torch.float64)
                    for j in range(i, -1, -1):  # T = H_{j+1} ... H_i, grown on the left
                        s[j] = k[bi, hi, j] @ T @ q[bi, hi, i] / math.sqrt(HD)
                        T = (
                            torch.eye(HD, dtype=torch.float64)
                            - beta[bi, hi, j] * torch.outer(w[bi, hi, j], w[bi, hi, j])
                        ) @ T
                    out[bi, hi, i] = torch.softmax(s, 0) @ v[bi, hi, : i + 1]
        return att.out_proj(out.transpose(1, 2).reshape(b, n, DIM))
    a = tr.a_log.exp()
    if name == "diag_decay_householder":  # per channel, low-rank gate
        raw = tr.dt_proj(tr.dt_down(x)).view(b, n, HEADS, HD).transpose(1, 2)
    else:
        raw = tr.dt_proj(x).view(b, n, HEADS, 1).transpose(1, 2)
    dt = F.softplus(raw + tr.dt_bias[:, None, :])
    alpha = torch.exp(-a[:, None, None] * dt)  # (batch, heads, n, 1 or HD)
    beta = torch.sigmoid(tr.beta_proj(x)).transpose(1, 2) if name != "decay" else None
    for bi in range(b):
        for hi in range(HEADS):
            S = torch.zeros(HD, HD, dtype=torch.float64)
            for t in range(n):
                kt, vt = k[bi, hi, t], v[bi, hi, t]
                D = torch.diag(alpha[bi, hi, t].expand(HD))
                if beta is None:  # Mamba-2: h_t = exp(dt A) h_{t-1} + dt B_t x_t
                    S = S @ D + dt[bi, hi, t, 0] * torch.outer(vt, kt)
                else:  # the gated delta rule
                    bt = beta[bi, hi, t]
                    S = S @ D @ (torch.eye(HD, dtype=torch.float64) - bt * torch.outer(kt, kt)) + bt * torch.outer(
                        vt, kt
                    )
                out[bi, hi, t] = S @ q[bi, hi, t] / math.sqrt(HD)
    return att.out_proj(out.transpose(1, 2).reshape(b, n, DIM))


@pytest.mark.parametrize("name", TRANSPORT_CHOICES)
def test_each_layer_is_its_papers_recurrence_from_its_own_projections(name):
    att = _layer(name)
    x = _x()
    torch.testing.assert_close(att(x), paper_layer(att, x), rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", TRANSPORT_CHOICES)
def test_the_routed_engine_matches_the_reference_forward_and_backward_with_key_padding(name, monkeypatch):
    from axiomformer.engines import ENGINES
    from axiomformer.engines.recurrent import RecurrentEngine
    from axiomformer.engines.transport_chunked import ChunkedTransportEngine

    monkeypatch.setitem(ENGINES, "recurrent", RecurrentEngine(chunk=3))  # chunks cross the sequence
    monkeypatch.setitem(ENGINES, "chunked_transport", ChunkedTransportEngine(block=3))
    results = []
    for engine in ("reference", "auto"):
        att = _layer(name, engine=engine)
        x = _x().requires_grad_()
        out = att(x, key_padding_mask=_padding())
        (out * torch.linspace(-1, 1, out.numel(), dtype=torch.float64).view_as(out)).sum().backward()
        results.append((att.last_engine, [out.detach(), x.grad] + [p.grad for p in att.parameters()]))
    (_, want), (engine, got) = results
    assert engine == ("recurrent" if TRANSPORTS.has(name, "state") else "chunked_transport")
    assert len(got) == len(want) and all(g is not None for g in got[2:])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    assert float(want[0][1, :2].abs().max()) == 0.0  # queries that see no real key: zero rows


@pytest.mark.parametrize("name", TRANSPORT_CHOICES)
@pytest.mark.parametrize("engine", ["auto", "reference"])
def test_kv_cache_decoding_is_the_full_forward(name, engine):
    att = _layer(name, engine=engine)
    x, keep = _x(), _padding()
    full = att(x, key_padding_mask=keep)
    cache, outs = KVCache(), []
    for t in range(LEN):  # token by token
        outs.append(att(x[:, t : t + 1], cache=cache, key_padding_mask=keep[:, : t + 1]))
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=0, atol=1e-8)
    cache = KVCache()  # a prefill of 4, then 3 at once
    first = att(x[:, :4], cache=cache, key_padding_mask=keep[:, :4])
    rest = att(x[:, 4:], cache=cache, key_padding_mask=keep)
    torch.testing.assert_close(torch.cat([first, rest], 1), full, rtol=0, atol=1e-8)
    state = TRANSPORTS.has(name, "state") and engine == "auto"
    assert (cache.state is not None, cache.k is None) == (state, state)  # a state, or the transported keys


def test_decoding_catches_a_key_transport_that_forgets_the_decay(monkeypatch):
    def forgetful(k, gates, first):
        return transport_keys(k, gates._replace(log_decay=torch.zeros_like(gates.log_decay)), first)

    transport_keys = transport_mod.transport_keys
    import axiomformer.attention as attention_mod

    monkeypatch.setattr(attention_mod, "transport_keys", forgetful)
    att = _layer("decay_householder", engine="reference")
    x = _x()
    cache = KVCache()
    with torch.no_grad():
        outs = [att(x[:, t : t + 1], cache=cache) for t in range(LEN)]
        assert float((torch.cat(outs, 1) - att(x)).abs().max()) > 1e-4


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "changes, words",
    [
        ("transport=decay_householder,normalizer=none", "causal=True"),
        ("transport=decay_householder,causal=true", "normalizer='none'"),
        ("transport=householder,causal=true,normalizer=sigmoid", "normalizer='softmax'"),
        ("transport=householder,causal=true,position=rope", "position"),
        ("transport=decay,causal=true,normalizer=none,window=4", "window"),
        ("transport=decay,causal=true,normalizer=none,num_kv_heads=1", "num_kv_heads"),
    ],
)
def test_the_spec_refuses_what_the_papers_do_not_define_with_the_reason(changes, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        AttentionSpec.standard(DIM, HEADS).relax(changes)


def test_a_transport_refuses_an_attn_mask_core_and_attend_without_gates():
    att = _layer("decay_householder")
    x = _x()
    with pytest.raises(ValueError, match="only the causal mask and key_padding_mask"):
        att(x, attn_mask=torch.ones(LEN, LEN, dtype=torch.bool))
    qkv = [torch.randn(2, HEADS, LEN, HD, dtype=torch.float64) for _ in range(3)]
    with pytest.raises(ValueError, match="core\\(\\) takes no mask"):
        att.core(*qkv, mask=torch.ones(LEN, dtype=torch.bool))
    assert att.core(*qkv).out.shape == (2, HEADS, LEN, HD)  # the bench's core: gates from the merged keys
    with pytest.raises(ValueError, match="needs its gates"):
        attend(*(torch.randn(2, HEADS, LEN, HD) for _ in range(3)), parts=att.plan)


def test_a_cache_filled_by_another_layout_is_a_clear_error():
    x = _x()
    cache = KVCache()
    _layer("decay_householder")(x[:, :3], cache=cache)
    for other in (_layer("householder"), _layer("decay_householder", engine="reference")):
        with pytest.raises(ValueError, match="cannot decode from it"):
            other(x[:, 3:4], cache=cache)
    with pytest.raises(ValueError, match="cannot decode from it"):
        Attention(AttentionSpec.standard(DIM, HEADS, causal=True)).double()(x[:, 3:4], cache=cache)
    with pytest.raises(ValueError, match="has no weights"):
        _layer("decay")(x[:, :1], cache=KVCache(), need_weights=True)


@pytest.mark.parametrize(
    "first, then",
    [
        ("position=short_conv", "standard"),
        ("standard", "position=short_conv"),
        ("position=rope", "standard"),
        ("select=block_mean", "standard"),
        ("kv_latent=6", "standard"),
        ("kv_latent=6", "kv_latent=4"),
        ("transport=decay,normalizer=none", "transport=decay_householder,normalizer=none"),
    ],
)
def test_a_decode_step_with_a_cache_filled_by_another_spec_is_a_clear_error(first, then):
    x = _x()
    layer = lambda changes: Attention(AttentionSpec.standard(DIM, HEADS, causal=True).relax(changes)).double()
    cache = KVCache()
    layer(first)(x[:, :3], cache=cache)
    with pytest.raises(ValueError, match="cannot decode from it"):
        layer(then)(x[:, 3:4], cache=cache)
    same = layer(first)  # another layer of the same spec continues it (fresh weights: only the layout is checked)
    assert same(x[:, 3:4], cache=cache).shape == (2, 1, DIM)


# ---------------------------------------------------------------------------------------------- spec, CLI, audit
@pytest.mark.parametrize("name", TRANSPORT_CHOICES)
def test_the_cli_describes_each_transport_with_its_source_and_relaxed_assumptions(name):
    result = CliRunner().invoke(app, ["spec", f"transport={name}"])
    assert result.exit_code == 0, result.output
    choice = TRANSPORTS[name]
    assert choice.source in result.output and choice.relaxes in result.output
    spec = _spec(name)
    relaxed = {"A0", "A4"} | ({"A5"} if spec.normalizer != "softmax" else set())
    assert {a for a, held in spec.assumptions().items() if not held} == relaxed
    for a in relaxed:
        assert f"{a}: relaxed" in result.output


def test_transport_none_passes_the_audit_and_the_householder_transport_is_blamed_on_a0_and_a4():
    assert run_audit("spec:transport=none").passed
    report = run_audit("spec:transport=householder")
    failed = {c.name: c for c in report.checks if c.passed is False}
    assert failed["set_symmetry"].assumption == "A0"
    assert "A4" in failed["bilinear_scores"].candidates


NEW_CHOICES = [f"transport={name}" for name in TRANSPORT_CHOICES] + [
    "select=block_mean",
    "select=indexer",
    "select=nsa",
    "position=short_conv",
    "kv_latent=8",
    "kv_latent=8,kv_rope_dim=4",
]
"""Every choice issue 34 added, as relax strings (MLA with and without its decoupled RoPE key)."""


@pytest.mark.parametrize("changes", NEW_CHOICES)
def test_the_cli_describes_each_new_choice_with_its_source_and_the_assumptions_it_relaxes(changes):
    from axiomformer.spec import ECONOMY_NOTES, REGISTRIES

    result = CliRunner().invoke(app, ["spec", changes])
    assert result.exit_code == 0, result.output
    spec = relax_with_requirements(AttentionSpec.standard(64, 4), changes)
    for axis, name in spec.relaxed_axes().items():
        choice = REGISTRIES[axis][name]
        assert choice.source in result.output and choice.relaxes in result.output, (axis, name)
    for field in ECONOMY_NOTES:
        if getattr(spec, field):
            assert all(part in result.output for part in ECONOMY_NOTES[field]), field
    for a, held in spec.assumptions().items():
        assert f"{a}: {'holds' if held else 'relaxed'}" in result.output


@pytest.mark.parametrize("changes", NEW_CHOICES)
def test_the_audit_fails_a_check_of_each_assumption_a_new_choice_relaxes_and_blames_no_other(changes):
    spec = relax_with_requirements(AttentionSpec.standard(64, 4), changes)
    relaxed = {a for a, held in spec.assumptions().items() if not held}
    failed = [c for c in run_audit(f"spec:{changes}").checks if c.passed is False]
    for a in relaxed:  # each relaxed assumption is caught ...
        assert any(a in c.candidates for c in failed), (a, [(c.name, c.candidates) for c in failed])
    for c in failed:  # ... and every failure is explained by one of them
        assert relaxed & set(c.candidates), (c.name, c.candidates, relaxed)
    if changes.startswith("select="):  # the second score is blamed on A4
        assert failed and next(c for c in failed if c.name == "single_score").candidates[0] == "A4"


# ---------------------------------------------------------------------------------------------- short convolutions
def _conv_reference(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """h_t + sum_{r=0..3} w[:, 3 - r] o h_{t-r}, an explicit loop (h (batch, seq, channels), zeros before t = 0)."""
    out = h.clone()
    for t in range(h.shape[1]):
        for r in range(4):
            if t - r >= 0:
                out[:, t] = out[:, t] + w[:, 3 - r] * h[:, t - r]
    return out


@pytest.mark.parametrize(
    "changes", ["position=short_conv,causal=true", "position=short_conv,transport=decay_householder"]
)
def test_a_short_convolution_is_the_residual_causal_depthwise_conv_of_the_projections_and_decodes(changes):
    spec = relax_with_requirements(AttentionSpec.standard(DIM, HEADS), changes)
    torch.manual_seed(0)
    att = Attention(spec).double()
    x, keep = _x(), _padding()
    with torch.no_grad():
        full = att(x, key_padding_mask=keep)
        cache = KVCache()
        steps = torch.cat([att(x[:, t : t + 1], cache=cache, key_padding_mask=keep[:, : t + 1]) for t in range(LEN)], 1)
        torch.testing.assert_close(steps, full, rtol=0, atol=1e-8)
        torch.testing.assert_close(full[1:, 2:], att(x[1:, 2:]), rtol=0, atol=1e-10)  # left padding changes nothing
        if spec.transport == "none":  # the layer from its own projections and the convolution written out
            p = att.position
            q = _conv_reference(att.q_proj(x), p.conv_q)
            k = _conv_reference(att.k_proj(x), p.conv_k)
            v = _conv_reference(att.v_proj(x), p.conv_v)
            heads = lambda t: t.view(2, LEN, HEADS, HD).transpose(1, 2)
            s = heads(q) @ heads(k).transpose(-2, -1) / math.sqrt(HD)
            s = s.masked_fill(~torch.ones(LEN, LEN, dtype=torch.bool).tril(), float("-inf"))
            out = (torch.softmax(s, -1) @ heads(v)).transpose(1, 2).reshape(2, LEN, DIM)
            torch.testing.assert_close(att(x), att.out_proj(out), rtol=0, atol=1e-10)


def _conv1d_reference(x, weight, history):
    """x + the causal depthwise convolution by ``F.conv1d`` on the channels-first padded input (x (b, n, c))."""
    padded = torch.cat([history, x], 1).transpose(1, 2)
    return x + F.conv1d(padded, weight.unsqueeze(1), groups=x.shape[-1]).transpose(1, 2)


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_the_short_convolution_matches_conv1d_forward_and_backward_at_any_length(n):
    from axiomformer.axes.position import causal_conv

    g = torch.Generator().manual_seed(n)
    x, hist = (
        torch.randn(2, n, 6, generator=g, dtype=torch.float64),
        torch.randn(2, 3, 6, generator=g, dtype=torch.float64),
    )
    w = torch.randn(6, 4, generator=g, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (x, w, hist)]
    out, history = causal_conv(*leaves)
    torch.testing.assert_close(out, _conv1d_reference(*leaves), rtol=0, atol=1e-12)
    torch.testing.assert_close(history, torch.cat([hist, x], 1)[:, -3:], rtol=0, atol=0)
    assert torch.autograd.gradcheck(lambda *t: causal_conv(*t)[0], leaves)
    assert torch.autograd.gradgradcheck(lambda *t: causal_conv(*t)[0], leaves)
    # a head-split view (b, n, heads, head_dim) of (b, heads, n, head_dim) is the same convolution of its channels
    split = x.view(2, n, 2, 3).transpose(1, 2).contiguous().transpose(1, 2)
    out4, _ = causal_conv(split, w, hist.view(2, 3, 2, 3))
    torch.testing.assert_close(out4.reshape(2, n, 6), out.detach(), rtol=0, atol=1e-12)
    assert out4.transpose(1, 2).is_contiguous()  # the head-split layout kept: no copy before the attention


def test_a_planted_wrong_tap_order_of_the_short_convolution_is_caught():
    from axiomformer.axes.position import causal_conv

    g = torch.Generator().manual_seed(0)
    x, hist = torch.randn(1, 5, 4, generator=g, dtype=torch.float64), torch.zeros(1, 3, 4, dtype=torch.float64)
    w = torch.randn(4, 4, generator=g, dtype=torch.float64)
    out, _ = causal_conv(x, w.flip(-1), hist)  # the taps reversed: y_t reads x_{t-3} with x_t's weight
    assert (out - _conv1d_reference(x, w, hist)).abs().max() > 1e-3


def test_the_bench_core_path_convolves_as_the_layer_does():
    spec = relax_with_requirements(AttentionSpec.standard(DIM, HEADS), "position=short_conv,causal=true")
    torch.manual_seed(0)
    att = Attention(spec).double()
    x = _x()
    heads = lambda t: t.view(2, LEN, HEADS, HD).transpose(1, 2)
    q, k, v = (heads(proj(x)) for proj in (att.q_proj, att.k_proj, att.v_proj))
    merged = att.core(q, k, v).out.transpose(1, 2).reshape(2, LEN, DIM)
    torch.testing.assert_close(att.out_proj(merged), att(x), rtol=0, atol=1e-10)


@pytest.mark.parametrize("steep", [1.0, 40.0])
def test_the_factored_and_the_exact_per_channel_decay_agree(steep, monkeypatch):
    q, k, _ = _qkv()
    g0 = _gates("diag_decay_householder")
    g = g0._replace(log_decay=steep * g0.log_decay)  # steep: a span beyond FACTOR_SPAN, the exact form
    factored = transported_scores(q, k, g, 0)
    monkeypatch.setattr(transport_mod, "FACTOR_SPAN", -1.0)  # force the exact (n, m, d) form
    exact = transported_scores(q, k, g, 0)
    torch.testing.assert_close(factored, exact, rtol=0, atol=1e-10)
    torch.testing.assert_close(exact, naive_scores(q, k, g), rtol=0, atol=1e-10)


@pytest.mark.parametrize("block", [1, 2, 4, 6])
def test_the_blockwise_householder_softmax_is_the_parallel_form_forward_and_backward(block):
    from axiomformer.engines.transport_chunked import chunked_softmax_transport

    q, k, v = (t.requires_grad_() for t in _qkv())
    g0 = _gates("householder")
    leaves = [t.clone().requires_grad_() if t is not None else None for t in g0]
    g = TransportGates(*leaves)._replace(write=None)  # PaTH writes every key with weight 1
    keep = torch.ones(2, 6, dtype=torch.bool)
    keep[1, :2] = False
    mask = torch.ones(6, 6, dtype=torch.bool).tril() & keep[:, None, None, :]
    g = g.masked(keep)
    u = torch.softmax(transported_scores(q, k, g, 0).masked_fill(~mask, float("-inf")), -1)
    want = torch.where(mask.any(-1, keepdim=True), u, 0.0) @ v  # a query that sees no real key: a zero row
    got = chunked_softmax_transport(q, k, v, g, keep, block)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    weight = torch.randn(2, 2, 6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    wanted = [t for t in (q, k, v, leaves[1], leaves[2]) if t is not None]
    mine = torch.autograd.grad((got * weight).sum(), wanted, retain_graph=True)  # the masked gates are shared
    for a, b in zip(mine, torch.autograd.grad((want * weight).sum(), wanted)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_normalizer_none_is_the_scaled_scores_and_decodes_as_its_full_forward():
    spec = AttentionSpec.standard(DIM, HEADS, causal=True).relax(normalizer="none")
    torch.manual_seed(0)
    att = Attention(spec).double()
    x = _x()
    heads = lambda t: t.view(2, LEN, HEADS, HD).transpose(1, 2)
    q, k, v = heads(att.q_proj(x)), heads(att.k_proj(x)), heads(att.v_proj(x))
    u = (q @ k.transpose(-2, -1) / math.sqrt(HD)).tril()  # u = s: no normalization, the causal entries only
    with torch.no_grad():
        want = att.out_proj((u @ v).transpose(1, 2).reshape(2, LEN, DIM))
        torch.testing.assert_close(att(x), want, rtol=0, atol=1e-10)
        cache = KVCache()
        steps = torch.cat([att(x[:, t : t + 1], cache=cache) for t in range(LEN)], 1)
    torch.testing.assert_close(steps, want, rtol=0, atol=1e-8)
