"""The authors' released conventions as options (issue 34, item 6), each against an independent float64 formula
written here from the authors' code, and each shown to differ from the default (the paper's formula) on a case where
they differ, so that an option that changes nothing is caught. Every engine that accepts an option is checked
against the reference engine by the equivalence matrix (``tests/test_engine_matrix.py``, the field cases)."""

from __future__ import annotations

import math

import pytest
import torch

from axiomformer import AttentionSpec
from axiomformer.engines.router import attend

DIM, HEADS, LEN = 16, 2, 7


def _qkv(seed: int, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (2, HEADS, LEN, DIM // HEADS)
    q, k, v = (torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(3))
    return q * scale, k, v


def _f64(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def _scores(q: torch.Tensor, k: torch.Tensor) -> list[list[list[list[float]]]]:
    d = q.shape[-1]
    return (q @ k.transpose(-2, -1) / math.sqrt(d)).tolist()


# ------------------------------------------------------------------------------------------------------ softpick
def _softpick_authors(row: list[float]) -> list[float]:
    # zaydzuhri/softpick-attention's softpick: x_m = max(x) (no clamp), relu(e^(x - x_m) - e^-x_m) over
    # sum |e^(x - x_m) - e^-x_m| + 1e-8
    x_m = max(row)
    terms = [math.exp(x - x_m) - math.exp(-x_m) for x in row]
    denom = sum(abs(t) for t in terms) + 1e-8
    return [max(t, 0.0) / denom for t in terms]


@pytest.mark.parametrize("scale", [1.0, 1e-4])
def test_softpick_shifted_eps_is_the_authors_formula_and_not_the_default(scale):
    # At scale 1e-4 the logits are ~1e-5 and sum |e^s - 1| ~ 1e-4: the epsilon's place is visible.
    q, k, v = _qkv(0, scale)
    spec = AttentionSpec.standard(DIM, HEADS).relax("normalizer=softpick,softpick_shifted_eps=true")
    expected = _f64([[[_softpick_authors(r) for r in head] for head in b] for b in _scores(q, k)])
    out = attend(q, k, v, spec=spec, engine="reference", need_weights=True)
    # the formula's e^(x - x_m) - e^-x_m cancels to ~1e-16 / |x| relative (axiomformer takes expm1 there)
    tol = 1e-12 / scale
    assert torch.allclose(out.weights, expected, rtol=tol, atol=1e-15)
    assert torch.allclose(out.out, expected @ v, rtol=tol, atol=1e-15)
    default = attend(q, k, v, spec=spec.relax(softpick_shifted_eps=False), engine="reference").out
    assert float((default - out.out).abs().max()) > 1e-9  # the paper's 1e-6 e^-m: another output


def test_softpick_shifted_eps_on_the_rowwise_engine_matches_the_formula():
    q, k, v = _qkv(1, 1e-4)
    spec = AttentionSpec.standard(DIM, HEADS).relax("normalizer=softpick,softpick_shifted_eps=true")
    expected = _f64([[[_softpick_authors(r) for r in head] for head in b] for b in _scores(q, k)]) @ v
    out = attend(q, k, v, spec=spec, engine="rowwise")
    assert out.engine == "rowwise" and torch.allclose(out.out, expected, rtol=1e-8, atol=1e-14)


# ------------------------------------------------------------------------------------------------ stick-breaking
def _stick_authors(z: list[float], i: int, attend_current: bool, remainder: bool) -> list[float]:
    # shawntan/stickbreaking-attention: log beta_ij = logsigmoid(z_ij), A_ij = beta_ij prod_{j < k < i'} (1 - beta_ik)
    # over the keys j <= i' of query i (i' = i - 1 when the diagonal is left out); rem_i = 1 - sum_j A_ij goes to
    # the query's own value (o_i += rem_i v_i), returned here as its weight on key i.
    last = i if attend_current else i - 1
    beta = [1.0 / (1.0 + math.exp(-x)) for x in z]
    weights = [0.0] * len(z)
    for j in range(last + 1):
        weights[j] = beta[j] * math.prod(1.0 - beta[m] for m in range(j + 1, last + 1))
    if remainder:
        weights[i] += 1.0 - sum(weights)
    return weights


@pytest.mark.parametrize(
    "attend_current, remainder", [(False, True), (False, False), (True, True), (True, False)], ids=str
)
def test_stick_breaking_conventions_are_the_authors_formula(attend_current, remainder):
    q, k, v = _qkv(2)
    spec = AttentionSpec.standard(DIM, HEADS, causal=True).relax(
        normalizer="stick_breaking", stick_attend_current=attend_current, stick_remainder=remainder
    )
    rows = _scores(q, k)
    expected = _f64(
        [[[_stick_authors(r, i, attend_current, remainder) for i, r in enumerate(h)] for h in b] for b in rows]
    )
    out = attend(q, k, v, spec=spec, engine="reference", need_weights=True)
    assert torch.allclose(out.weights, expected, rtol=1e-12, atol=1e-15)
    assert torch.allclose(out.out, expected @ v, rtol=1e-12, atol=1e-14)
    if remainder:  # the remainder completes every row to 1 (the first query's whole weight is its own value)
        assert torch.allclose(out.weights.sum(-1), torch.ones(()).double(), atol=1e-14)
    default = attend(q, k, v, spec=spec.relax(stick_attend_current=True, stick_remainder=False)).out
    assert (attend_current, remainder) == (True, False) or float((default - out.out).abs().max()) > 1e-3


def test_stick_breaking_authors_conventions_decode_through_the_cache_as_the_full_forward():
    from axiomformer import Attention, KVCache

    spec = AttentionSpec.standard(DIM, HEADS, causal=True).relax(
        "normalizer=stick_breaking,stick_attend_current=false,stick_remainder=true"
    )
    torch.manual_seed(0)
    att = Attention(spec).double().eval()
    x = torch.randn(2, LEN, DIM, dtype=torch.float64)
    full = att(x)
    cache = KVCache()
    steps = [att(x[:, t : t + 1], cache=cache) for t in range(LEN)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-12)


def test_the_rowwise_engine_declines_stick_breaking_at_the_authors_conventions():
    q, k, v = _qkv(3)
    spec = AttentionSpec.standard(DIM, HEADS, causal=True).relax("normalizer=stick_breaking,stick_remainder=true")
    with pytest.raises(ValueError, match="cannot run"):
        attend(q.float(), k.float(), v.float(), spec=spec, engine="rowwise")
    assert attend(q.float(), k.float(), v.float(), spec=spec.relax(stick_remainder=False), engine="rowwise").out.numel()


@pytest.mark.parametrize(
    "text, field", [("softpick_shifted_eps=maybe", "softpick_shifted_eps"), ("stick_remainder=2", "stick_remainder")]
)
def test_convention_flags_are_booleans(text, field):
    with pytest.raises(ValueError, match=field):
        AttentionSpec.standard(DIM, HEADS).relax(text)
    with pytest.raises(ValueError, match=field):
        AttentionSpec(**{field: 1})


def test_the_variant_names_the_conventions_that_differ_from_the_defaults():
    spec = AttentionSpec.standard(DIM, HEADS, causal=True).relax("normalizer=stick_breaking,stick_attend_current=0")
    assert spec.variant == "normalizer=stick_breaking,stick_attend_current=false"
    assert AttentionSpec.from_string(spec.variant, dim=DIM, num_heads=HEADS, causal=True) == spec


# ------------------------------------------------------------------------------------------------- talking heads
def test_talking_heads_residual_is_x_transformers_mixing_and_not_the_default():
    # x-transformers' Attend: sim = sim + pre_softmax_talking_heads(sim), a 1x1 convolution over the heads
    # initialised by nn.init.dirac_ (the identity), so the mixing matrix is I + W and starts at 2 I.
    from axiomformer.axes.score import build_score

    q, k, _ = _qkv(4)
    spec = AttentionSpec.standard(DIM, HEADS).relax("score=talking_heads,talking_heads_residual=true")
    score = build_score(spec).double()
    logits = _f64(
        [
            [[[sum(a * b for a, b in zip(qi, kj)) for kj in kh] for qi in qh] for qh, kh in zip(qb, kb)]
            for qb, kb in zip(q.tolist(), k.tolist())
        ]
    )
    assert torch.allclose(score(q, k), 2.0 * logits, rtol=1e-13)  # dirac start: (I + I) s
    mix = _f64([[0.3, -1.2], [0.7, 0.4]])
    with torch.no_grad():
        score.mix.copy_(mix)
    expected = _f64(
        [
            [
                [
                    [
                        logits[b, h, i, j].item()
                        + sum(mix[h, g].item() * logits[b, g, i, j].item() for g in range(HEADS))
                        for j in range(LEN)
                    ]
                    for i in range(LEN)
                ]
                for h in range(HEADS)
            ]
            for b in range(2)
        ]
    )
    assert torch.allclose(score(q, k), expected, rtol=1e-12, atol=1e-13)
    default = build_score(spec.relax(talking_heads_residual=False)).double()
    with torch.no_grad():
        default.mix.copy_(mix)
    assert float((default(q, k) - expected).abs().max()) > 1e-2  # the paper's P s: another score
    assert spec.variant == "score=talking_heads,talking_heads_residual=true"


# ------------------------------------------------------------------------------------------------------ sinkhorn
def _sinkhorn_authors(dots: torch.Tensor) -> torch.Tensor:
    # michaelsdr/sinkformers, vit_pytorch/sinkhorn.py (SinkhornDistance, eps = 1, max_iter = 3) and vit.py
    # (attn = sink(dots)[0]; attn = attn * attn.shape[-1]), ported line by line in float64
    x_points, y_points = dots.shape[-2], dots.shape[-1]
    mu = torch.full(dots.shape[:-1], 1.0 / x_points, dtype=dots.dtype)
    nu = torch.full(dots.shape[:-2] + (y_points,), 1.0 / y_points, dtype=dots.dtype)
    u, v = torch.zeros_like(mu), torch.zeros_like(nu)

    def m(u, v):
        return dots + u.unsqueeze(-1) + v.unsqueeze(-2)

    for i in range(3):
        if i % 2 == 0:
            u = (torch.log(mu) - torch.logsumexp(m(u, v), dim=-1)) + u
        else:
            v = (torch.log(nu) - torch.logsumexp(m(u, v).transpose(-2, -1), dim=-1)) + v
            v = v.detach().requires_grad_(False)
    pi = torch.exp(m(u, v))
    return pi * pi.shape[-1]


@pytest.mark.parametrize("q_len", [5, LEN])
def test_sinkhorn_authors_is_the_released_layer_and_not_the_default(q_len):
    q, k, v = _qkv(5)
    q = q[:, :, :q_len].clone().requires_grad_()
    spec = AttentionSpec.standard(DIM, HEADS).relax("normalizer=sinkhorn,sinkhorn_authors=true")
    out = attend(q, k, v, spec=spec, engine="reference", need_weights=True)
    dots = q @ k.transpose(-2, -1) / math.sqrt(DIM // HEADS)
    expected = _sinkhorn_authors(dots)
    assert torch.allclose(out.weights, expected, rtol=1e-12, atol=1e-15)
    assert torch.allclose(out.weights.sum(-1), torch.full((), LEN / q_len, dtype=torch.float64), rtol=1e-12)
    probe = torch.linspace(-1, 1, out.out.numel()).double().view_as(out.out)
    (grad,) = torch.autograd.grad((out.out * probe).sum(), q)
    (want,) = torch.autograd.grad(((expected @ v) * probe).sum(), q)
    assert torch.allclose(grad, want, rtol=1e-10, atol=1e-13)  # the detached column potential
    default = attend(q, k, v, spec=spec.relax(sinkhorn_authors=False), engine="reference")
    (grad_default,) = torch.autograd.grad((default.out * probe).sum(), q)
    # non-square: other weights; square: the same weights (k_len / q_len = 1) but another gradient
    differs = (default.out - out.out) if q_len != LEN else (grad_default - grad)
    assert float(differs.abs().max()) > 1e-3


# ------------------------------------------------------------------------------------------ differential attention
def _rope_interleaved(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    # flash-attn's apply_rotary_emb(x, cos, sin, interleaved=True) on (batch, seq, heads, d): pairs (2i, 2i + 1)
    # rotated by p * base^(-2i / d), the position p the token's index
    out = x.clone()
    d = x.shape[-1]
    for p in range(x.shape[1]):
        for i in range(d // 2):
            angle = p * base ** (-2.0 * i / d)
            c, s = math.cos(angle), math.sin(angle)
            x0, x1 = x[:, p, :, 2 * i], x[:, p, :, 2 * i + 1]
            out[:, p, :, 2 * i], out[:, p, :, 2 * i + 1] = x0 * c - x1 * s, x1 * c + x0 * s
    return out


def _diff_authors_layer(x: torch.Tensor, w: dict[str, torch.Tensor], depth: int, heads: int, rope: bool):
    # microsoft/unilm Diff-Transformer, multihead_diffattn.py (MultiheadDiffAttn.forward, MHA, causal), in float64:
    # half-width heads of d = dim / heads / 2, lambda_full = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init(depth),
    # the difference of the two softmaxes, subln = RMSNorm(2 d, eps=1e-5) with its weight, times (1 - lambda_init)
    bsz, n, dim = x.shape
    d = dim // heads // 2
    q = (x @ w["q"].T).view(bsz, n, 2 * heads, d)
    k = (x @ w["k"].T).view(bsz, n, 2 * heads, d)
    v = (x @ w["v"].T).view(bsz, n, heads, 2 * d)
    if rope:
        q, k = _rope_interleaved(q), _rope_interleaved(k)
    q, k, v = q.transpose(1, 2) * d**-0.5, k.transpose(1, 2), v.transpose(1, 2)
    attn = q @ k.transpose(-1, -2) + torch.triu(torch.full((n, n), float("-inf"), dtype=x.dtype), 1)
    attn = torch.softmax(attn, dim=-1)
    lambda_init = 0.8 - 0.6 * math.exp(-0.3 * depth)
    lam = torch.exp((w["lq1"] * w["lk1"]).sum()) - torch.exp((w["lq2"] * w["lk2"]).sum()) + lambda_init
    attn = attn.view(bsz, heads, 2, n, n)
    attn = attn[:, :, 0] - lam * attn[:, :, 1]
    out = attn @ v
    out = out * torch.rsqrt(out.pow(2).mean(-1, keepdim=True) + 1e-5) * w["g"]
    out = out * (1 - lambda_init)
    return out.transpose(1, 2).reshape(bsz, n, heads * 2 * d) @ w["o"].T


def _diff_layer(position: str, depth: int, authors: bool = True):
    from axiomformer import Attention

    spec = AttentionSpec.standard(32, HEADS, causal=True, bias=False).relax(
        normalizer="diff", diff_authors=authors, position=position
    )
    torch.manual_seed(6)
    att = Attention(spec, engine="reference", layer_index=depth).double().eval()
    if authors:
        with torch.no_grad():  # a scale away from its ones, so that a forgotten weight shows
            att.aggregator.weight.copy_(torch.linspace(0.5, 1.5, spec.head_dim, dtype=torch.float64))
    return att


def _diff_weights(att) -> dict[str, torch.Tensor]:
    n = att.normalizer
    return {
        "q": att.q_proj.weight,
        "k": att.k_proj.weight,
        "v": att.v_proj.weight,
        "o": att.out_proj.weight,
        "lq1": n.lambda_q1,
        "lk1": n.lambda_k1,
        "lq2": n.lambda_q2,
        "lk2": n.lambda_k2,
        "g": att.aggregator.weight,
    }


@pytest.mark.parametrize("position", ["none", "rope"])
@pytest.mark.parametrize("depth", [0, 3])
def test_diff_authors_is_the_released_layer_forward_and_backward(position, depth):
    att = _diff_layer(position, depth)
    x = torch.randn(2, LEN, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(7), requires_grad=True)
    weights = _diff_weights(att)
    out = att(x)
    expected = _diff_authors_layer(x, weights, depth, HEADS, position == "rope")
    assert torch.allclose(out, expected, rtol=1e-12, atol=1e-13)
    probe = torch.linspace(-1, 1, out.numel()).double().view_as(out)
    inputs = [x, *weights.values()]
    got = torch.autograd.grad((out * probe).sum(), inputs)
    want = torch.autograd.grad((expected * probe).sum(), inputs)
    for a, b in zip(got, want):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)
    for e in ("chunked", "auto"):  # and on the engines that take diff
        att.engine = e
        assert torch.allclose(att(x), expected, rtol=1e-10, atol=1e-12)


def test_diff_authors_is_not_the_default_layer_even_with_the_same_lambda():
    # The default (eq. 1 alone) with lambda_h set to the authors' lambda: the same weights, without the per-head
    # RMSNorm and (1 - lambda_init) scale, and with the full-head RoPE.
    att = _diff_layer("rope", 0)
    default = _diff_layer("rope", 0, authors=False)
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            getattr(default, name).weight.copy_(getattr(att, name).weight)
        default.normalizer.diff_lambda.fill_(float(att.normalizer.params()["lam"]))
    x = torch.randn(2, LEN, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    assert float((att(x) - default(x)).detach().abs().max()) > 1e-3
    expected = _diff_authors_layer(x, _diff_weights(att), 0, HEADS, rope=True)
    assert float((default(x) - expected).detach().abs().max()) > 1e-3


def test_diff_authors_lambda_init_follows_the_depth_the_model_passes():
    from axiomformer.models import TransformerLM

    spec = AttentionSpec.standard(32, HEADS, causal=True).relax("normalizer=diff,diff_authors=true,position=rope")
    model = TransformerLM(spec, 11, 4, 16)
    for i, block in enumerate(model.blocks):
        init = 0.8 - 0.6 * math.exp(-0.3 * i)  # the paper's l - 1 = i
        assert block.attn.layer_index == i
        assert block.attn.aggregator.scale == pytest.approx(1 - init, rel=1e-15)
        lam = float(block.attn.normalizer.params()["lam"])
        n = block.attn.normalizer
        want = math.exp(float(n.lambda_q1 @ n.lambda_k1)) - math.exp(float(n.lambda_q2 @ n.lambda_k2)) + init
        assert lam == pytest.approx(want, rel=1e-6)
    assert spec.assumptions()["A1"] is False and spec.relax(diff_authors=False).assumptions()["A1"] is True
    assert spec.variant == "normalizer=diff,position=rope,diff_authors=true"
    assert AttentionSpec.from_string(spec.variant, dim=32, num_heads=HEADS, causal=True) == spec


def test_diff_authors_decodes_through_the_cache_as_the_full_forward():
    from axiomformer import KVCache

    att = _diff_layer("rope", 2)
    x = torch.randn(2, LEN, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    full = att(x)
    cache = KVCache()
    steps = [att(x[:, t : t + 1], cache=cache) for t in range(LEN)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-12)


def test_diff_refuses_a_half_head_rope_of_odd_width_and_a_negative_depth():
    from axiomformer import Attention

    for authors in ("true", "false"):  # both rotate each half of a head apart: the halves need an even width
        with pytest.raises(ValueError, match="divisible by 4"):
            AttentionSpec.standard(24, 4).relax(f"normalizer=diff,diff_authors={authors},position=rope")  # hd 6
    AttentionSpec.standard(24, 4).relax("normalizer=diff")  # no RoPE: an even head_dim is enough
    with pytest.raises(ValueError, match="layer_index"):
        Attention(AttentionSpec.standard(32, HEADS), layer_index=-1)


def test_the_audit_blames_the_per_head_rmsnorm_of_diff_authors_on_a1_and_passes_a1_for_the_default():
    from axiomformer.audit import run_audit

    failed = {c.name: c for c in run_audit("spec:normalizer=diff,diff_authors=true").checks if c.passed is False}
    assert failed["token_additivity"].assumption == "A1" and "A1" in failed["token_additivity"].candidates
    default = {c.name: c for c in run_audit("spec:normalizer=diff").checks}
    assert default["token_additivity"].passed is True and default["linearity"].passed is True


def test_the_rope_of_diff_rotates_each_half_apart_and_depends_on_relative_positions_only(monkeypatch):
    # Each half rotated apart keeps RoPE's promise (q1 . k1 and q2 . k2 depend on p_i - p_j), for the authors' layer
    # (interleaved pairs) and for the default (rotate-half within each half). A planted rotation over the whole head
    # pairs a coordinate of q1 with one of q2: the same shift then moves the output (the check can fail).
    from axiomformer.axes import position

    x = torch.randn(2, LEN, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(10))
    shift = torch.arange(LEN) + 37
    with torch.no_grad():
        for authors in (True, False):
            att = _diff_layer("rope", 1, authors=authors)
            assert torch.allclose(att(x, position_ids=shift), att(x), atol=1e-12), authors
        monkeypatch.setattr(position, "apply_rope_each_half", position.apply_rope)
        planted = _diff_layer("rope", 1, authors=False)
        assert float((planted(x, position_ids=shift) - planted(x)).abs().max()) > 1e-3


def test_rope_each_half_is_rope_applied_to_each_half_as_its_own_head():
    from axiomformer.axes.position import apply_rope, apply_rope_each_half

    x = torch.randn(2, 3, 7, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(11))
    positions = torch.arange(7) + 5
    expected = torch.cat([apply_rope(x[..., :4], positions), apply_rope(x[..., 4:], positions)], -1)
    assert torch.allclose(apply_rope_each_half(x, positions), expected, atol=1e-14)


def test_the_cli_describes_diff_authors_and_the_a1_it_relaxes_only_with_normalizer_diff():
    from typer.testing import CliRunner

    from axiomformer.cli import app
    from axiomformer.spec import FIELD_RELAXATIONS

    _formula, how, source = FIELD_RELAXATIONS["diff_authors"]
    result = CliRunner().invoke(app, ["spec", "normalizer=diff,diff_authors=true,position=rope", "--causal"])
    assert result.exit_code == 0, result.output
    assert "A1: relaxed" in result.output and source in result.output and how in result.output
    ignored = CliRunner().invoke(app, ["spec", "diff_authors=true"])  # ignored without normalizer=diff
    assert "A0-A5 hold" in ignored.output and source not in ignored.output
