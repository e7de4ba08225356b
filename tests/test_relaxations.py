"""The published relaxations of attention (issue 26), each against an independent implementation of its paper's formula.

Every reference below is written from the formula, in float64, from the layer's own ``q_proj`` / ``k_proj`` / ``v_proj``
/ ``out_proj`` outputs and parameters; none calls the library's normalizers, scores, scales or engines. Each choice is
checked forward (the weights of ``need_weights=True`` and the output) and backward (the gradients of the input and of
every parameter), with a causal mask and key padding, without a causal mask where the choice allows it, and through
the KV cache where it is causal.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from axiomformer import Attention, AttentionSpec
from axiomformer.attention import KVCache
from axiomformer.cli import app
from axiomformer.engines import attend
from axiomformer.train import TrainConfig, train

DIM, HEADS, LEN = 16, 2, 7
HD = DIM // HEADS

CHOICES = {
    "gate": "aggregator=gate",
    "diff": "normalizer=diff",
    "log_n": "scale=log_n",
    "stick_breaking": "normalizer=stick_breaking",
    "forget": "position=forget",
    "softmax_sink": "normalizer=softmax_sink",
    "softpick": "normalizer=softpick",
    "topk": "normalizer=topk,topk=3",
    "softcap": "softcap=2.5",
    "talking_heads": "score=talking_heads",
    "sinkhorn": "normalizer=sinkhorn,causal=false",
    "power": "normalizer=power",
    "laser": "aggregator=laser",
    "cope": "position=cope",
}
"""Issue 26's items 1-10 and its stretch items, as relax strings (topk below the key count, a softcap the scores
reach; sinkhorn is defined only without a causal mask, and says so)."""

NEW_PARAMETERS = {
    "gate": ["aggregator.gate.weight", "aggregator.gate.bias"],
    "diff": ["normalizer.diff_lambda"],
    "log_n": ["scale.log_n_coef"],
    "forget": ["position.forget_gate.weight", "position.forget_gate.bias"],
    "softmax_sink": ["normalizer.sink_logit"],
    "talking_heads": ["score_fn.mix"],
    "cope": ["position.cope_emb"],
}
CAUSAL_ONLY = {"stick_breaking", "forget", "cope"}
NONCAUSAL_ONLY = {"sinkhorn"}


# ---------------------------------------------------------------------------------------------- the references
def _heads(x: torch.Tensor) -> torch.Tensor:
    return x.view(x.shape[0], x.shape[1], HEADS, -1).transpose(1, 2)


def _masked_softmax(s: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    e = torch.exp(s - s.masked_fill(~visible, -1e300).amax(-1, keepdim=True)) * visible
    return e / e.sum(-1, keepdim=True)


def _stick_breaking(s: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    beta = torch.sigmoid(s) * visible
    u = torch.zeros_like(s)
    for j in range(s.shape[-1]):
        keep = torch.ones_like(s[..., 0])
        for m in range(j + 1, s.shape[-1]):  # visible keys after j (the causal mask: m <= i)
            keep = keep * (1 - beta[..., m])
        u[..., j] = beta[..., j] * keep
    return u


def _topk(s: torch.Tensor, visible: torch.Tensor, k: int) -> torch.Tensor:
    ranked = s.masked_fill(~visible, -math.inf).sort(-1, descending=True).values
    kth = ranked[..., min(k, s.shape[-1]) - 1 : min(k, s.shape[-1])]
    return _masked_softmax(s, visible & (s >= kth))


def _sinkhorn(s: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """Sander et al. 2022: K = exp(s) on the visible entries, then its rows, its columns and its rows again divided by
    their sums (an empty row or column left at 0)."""
    k = torch.exp(s - s.masked_fill(~visible, -1e300).amax((-2, -1), keepdim=True)) * visible
    for dim in (-1, -2, -1):
        total = k.sum(dim, keepdim=True)
        k = k / torch.where(total > 0, total, torch.ones_like(total))
    return k


def _power(s: torch.Tensor, visible: torch.Tensor, p: int = 2) -> torch.Tensor:
    """Buckman, Gelada & Zhang 2024: u_ij = s_ij^p / sum_l s_il^p over the visible keys."""
    w = s.pow(p) * visible
    return w / w.sum(-1, keepdim=True).clamp_min(1e-300)


def _cope_bias(q: torch.Tensor, s: torch.Tensor, visible: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Golovneva et al. 2024, eq. 3-6: g_ij = sigmoid(s_ij) on visible keys, p_ij = sum_{l=j..i} g_il, and
    q_i . ((p - floor p) e[ceil p] + (1 - p + floor p) e[floor p]), p clamped to the table's last index."""
    g = torch.sigmoid(s) * visible
    p = torch.zeros_like(s)
    for j in range(s.shape[-1]):
        p[..., j] = g[..., j:].sum(-1)  # keys after the query are not visible: their gates are 0
    p = p.clamp(max=table.shape[1] - 1)
    lo, hi = p.floor(), p.ceil()
    e = (p - lo).unsqueeze(-1) * table.T[hi.long()] + (1 - p + lo).unsqueeze(-1) * table.T[lo.long()]
    return (q.unsqueeze(-2) * e).sum(-1)


def reference_weights(att: Attention, x: torch.Tensor, visible: torch.Tensor, name: str, keep: torch.Tensor):
    """u (batch, heads, q, k) of choice ``name`` from the formula of its paper (issue 26's statement of it)."""
    spec = att.spec
    q, k = _heads(att.q_proj(x)), _heads(att.k_proj(x))
    s = q @ k.transpose(-2, -1) / math.sqrt(HD)  # s_ij = q_i . k_j / sqrt(head_dim)
    if name == "diff":
        h = HD // 2
        s1 = q[..., :h] @ k[..., :h].transpose(-2, -1) / math.sqrt(h)
        s2 = q[..., h:] @ k[..., h:].transpose(-2, -1) / math.sqrt(h)
        lam = att.normalizer.diff_lambda.view(1, -1, 1, 1)
        return (_masked_softmax(s1, visible) - lam * _masked_softmax(s2, visible)) * visible
    if name == "log_n":
        n = visible.sum(-1, keepdim=True).double()
        s = att.scale.log_n_coef.view(1, -1, 1, 1) * torch.log(n) * s
    if name == "stick_breaking":
        return _stick_breaking(s, visible)
    if name == "forget":
        log_f = torch.nn.functional.logsigmoid(att.position.forget_gate(x)).transpose(1, 2)  # (batch, heads, seq)
        log_f = log_f * keep[:, None, :]  # padding: no token
        idx = torch.arange(x.shape[1])
        between = (idx.view(1, -1, 1) < idx.view(1, 1, -1)) & (idx.view(1, 1, -1) <= idx.view(-1, 1, 1))  # j<l<=i
        s = s + torch.einsum("ijl,bhl->bhij", between.double(), log_f)
    if name == "softmax_sink":
        e = torch.exp(s) * visible
        return e / (torch.exp(att.normalizer.sink_logit).view(1, -1, 1, 1) + e.sum(-1, keepdim=True))
    if name == "softpick":
        e = (torch.exp(s) - 1) * visible
        return e.clamp(min=0) / (e.abs().sum(-1, keepdim=True) + 1e-6)
    if name == "topk":
        return _topk(s, visible, spec.topk)
    if name == "softcap":
        s = spec.softcap * torch.tanh(s / spec.softcap)
    if name == "talking_heads":
        s = torch.einsum("hg,bgij->bhij", att.score_fn.mix, s)
    if name == "cope":
        s = s + _cope_bias(q, s, visible, att.position.cope_emb.double())
    if name == "sinkhorn":
        return _sinkhorn(s, visible)
    if name == "power":
        return _power(s, visible)
    return _masked_softmax(s, visible)


def reference_output(att: Attention, x: torch.Tensor, visible: torch.Tensor, name: str, keep: torch.Tensor):
    u = reference_weights(att, x, visible, name, keep)
    if name == "laser":  # y_i = log(sum_j u_ij exp(v_j)), directly (no shift), a row without keys 0
        summed = u @ torch.exp(_heads(att.v_proj(x)))
        y = torch.where(summed > 0, torch.log(summed.clamp_min(1e-300)), 0.0).transpose(1, 2).reshape(x.shape)
        return att.out_proj(y), u
    y = (u @ _heads(att.v_proj(x))).transpose(1, 2).reshape(x.shape)
    if name == "gate":  # y <- sigmoid(W_g x + b_g) * y
        y = torch.sigmoid(x @ att.aggregator.gate.weight.T + att.aggregator.gate.bias) * y
    return att.out_proj(y), u


def _layer(name: str, causal: bool, seed: int = 0) -> Attention:
    spec = AttentionSpec.standard(DIM, HEADS, causal=causal).relax(CHOICES[name])
    torch.manual_seed(seed)
    att = Attention(spec).double().train()
    with torch.no_grad():  # move every new parameter off its initial value, so none is special
        for pname in NEW_PARAMETERS.get(name, []):
            p = att.get_parameter(pname)
            p.add_(0.3 * torch.randn_like(p))
    return att


def _inputs(causal: bool, name: str = ""):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, LEN, DIM, generator=g, dtype=torch.float64) * 1.5
    keep = torch.ones(2, LEN, dtype=torch.bool)
    keep[0, 2] = False  # a padded key inside the sequence
    keep[1, LEN - 2 :] = False  # right padding
    visible = keep[:, None, None, :].expand(2, 1, LEN, LEN)
    if causal:
        visible = visible & torch.ones(LEN, LEN, dtype=torch.bool).tril()
    if name in NONCAUSAL_ONLY:  # normalized over the queries too: a padded query takes no part (its row is empty)
        visible = visible & keep[:, None, :, None]
    return x, keep, visible


CASES = [
    (name, causal)
    for name in CHOICES
    for causal in (True, False)
    if (causal or name not in CAUSAL_ONLY) and not (causal and name in NONCAUSAL_ONLY)
]


@pytest.mark.parametrize("name, causal", CASES)
def test_weights_output_and_gradients_equal_the_papers_formula(name, causal):
    att = _layer(name, causal)
    x, keep, visible = _inputs(causal, name)
    out, w = att(x, key_padding_mask=keep, need_weights=True)
    ref_out, ref_w = reference_output(att, x, visible, name, keep)
    # float64 layers compute in float64 on every route (axiomformer.precision): float64 rounding, not float32's
    torch.testing.assert_close(w, ref_w, rtol=1e-10, atol=1e-12)
    real = keep.unsqueeze(-1) | (visible.any(-1).squeeze(1).unsqueeze(-1))  # rows with a visible key
    torch.testing.assert_close(out * real, ref_out * real, rtol=1e-10, atol=1e-12)

    # Backward: the fast route (no weights asked) against autograd through the reference formula.
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * real
    xx = x.clone().requires_grad_()
    att.zero_grad()
    (att(xx, key_padding_mask=keep) * probe).sum().backward()
    got = [xx.grad] + [p.grad.clone() for p in att.parameters()]
    xr = x.clone().requires_grad_()
    att.zero_grad()
    (reference_output(att, xr, visible, name, keep)[0] * probe).sum().backward()
    want = [xr.grad] + [p.grad.clone() for p in att.parameters()]
    # A gradient that is 0 in exact arithmetic (the key bias under a shift-invariant normalizer) is held to the
    # rounding of the largest one.
    biggest = max(float(b.norm()) for b in want)
    for (pname, _), a, b in zip([("input", None)] + list(att.named_parameters()), got, want):
        assert float((a - b).norm()) <= 1e-9 * max(float(b.norm()), 0.1 * biggest), f"{name}: grad of {pname}"
    for pname in NEW_PARAMETERS.get(name, []):
        assert float(att.get_parameter(pname).grad.abs().sum()) > 0, pname


@pytest.mark.parametrize("name", [name for name in CHOICES if name not in NONCAUSAL_ONLY])
def test_decoding_through_the_kv_cache_gives_the_rows_of_the_full_computation(name):
    att = _layer(name, causal=True).eval()
    x, keep, _ = _inputs(True)
    keep = torch.ones_like(keep)
    keep[1, :2] = False  # left padding, the usual decoding layout
    with torch.no_grad():
        full = att(x, key_padding_mask=keep)
        cache = KVCache()
        steps = [att(x[:, :3], key_padding_mask=keep[:, :3], cache=cache)]
        for t in range(3, LEN):
            steps.append(att(x[:, t : t + 1], key_padding_mask=keep[:, : t + 1], cache=cache))
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-10, atol=1e-12)  # float64 throughout


# ---------------------------------------------------------------------------------------------- special cases
def test_softmax_sink_starts_as_softmax1_and_forget_with_constant_gates_is_alibi():
    spec = AttentionSpec.standard(DIM, HEADS, causal=True)
    x = torch.randn(2, LEN, DIM, dtype=torch.float64)
    torch.manual_seed(0)
    sink = Attention(spec.relax(normalizer="softmax_sink")).double()
    torch.manual_seed(0)
    one = Attention(spec.relax(normalizer="softmax1")).double()
    torch.testing.assert_close(sink(x, need_weights=True)[1], one(x, need_weights=True)[1])

    torch.manual_seed(0)
    forget = Attention(spec.relax(position="forget")).double()
    torch.manual_seed(0)
    alibi = Attention(spec.relax(position="alibi")).double()
    m = alibi.position.slopes.double()
    with torch.no_grad():  # log f_l = -m_h for every token: f = exp(-m_h)
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            forget.get_submodule(name).load_state_dict(alibi.get_submodule(name).state_dict())
        forget.position.forget_gate.weight.zero_()
        forget.position.forget_gate.bias.copy_(torch.log(torch.exp(-m) / (1 - torch.exp(-m))))
    torch.testing.assert_close(forget(x, need_weights=True)[1], alibi(x, need_weights=True)[1])


def test_talking_heads_at_the_identity_is_standard_attention_and_diff_uses_half_width_scores():
    spec = AttentionSpec.standard(DIM, HEADS, causal=True)
    x = torch.randn(2, LEN, DIM, dtype=torch.float64)
    torch.manual_seed(0)
    th = Attention(spec.relax(score="talking_heads")).double()
    torch.manual_seed(0)
    std = Attention(spec).double()
    torch.testing.assert_close(th(x), std(x))
    # A planted wrong temperature for diff (1/sqrt(head_dim) instead of 1/sqrt(head_dim / 2)) is caught.
    att = _layer("diff", True)
    x, keep, visible = _inputs(True)
    w = att(x, key_padding_mask=keep, need_weights=True)[1].double()
    wrong = _layer("diff", True)
    wrong.scale.fixed = 1 / math.sqrt(HD)
    assert not torch.allclose(wrong(x, key_padding_mask=keep, need_weights=True)[1].double(), w)
    torch.testing.assert_close(w, reference_weights(att, x, visible, "diff", keep), rtol=1e-5, atol=1e-6)


def test_a_planted_wrong_formula_fails_the_reference_comparison():
    # The comparison can fail: softpick without the -1 (a plain exp normalised by |exp|) is told apart.
    att = _layer("softpick", True)
    x, keep, visible = _inputs(True)
    w = att(x, key_padding_mask=keep, need_weights=True)[1].double()
    s = _heads(att.q_proj(x)) @ _heads(att.k_proj(x)).transpose(-2, -1) / math.sqrt(HD)
    planted = torch.exp(s) * visible / (torch.exp(s) * visible).sum(-1, keepdim=True)
    assert not torch.allclose(w, planted, atol=1e-3)
    # and stick-breaking read left to right (the product over keys before j) is told apart.
    att = _layer("stick_breaking", True)
    w = att(x, key_padding_mask=keep, need_weights=True)[1].double()
    flipped = _stick_breaking(s.flip(-1), visible.flip(-1)).flip(-1)
    assert not torch.allclose(w, flipped, atol=1e-3)


def test_softpick_is_finite_for_large_scores_and_rows_can_sum_below_one():
    from axiomformer.axes.normalizer import normalize

    s = torch.tensor([[[[200.0, 199.0, -3.0, 0.5]]]])
    u = normalize(s, None, "softpick")
    e = torch.expm1(s.double())
    torch.testing.assert_close(u.double(), e.clamp(min=0) / (e.abs().sum(-1, keepdim=True) + 1e-6))
    assert torch.isfinite(u).all() and float(normalize(-s.abs(), None, "softpick").sum()) == 0.0


def test_topk_keeps_k_keys_per_row_and_at_least_one():
    from axiomformer.axes.normalizer import normalize

    s = torch.randn(2, 2, 5, 9)
    for k in (1, 3, 9, 20):
        u = normalize(s, None, "topk", params={"k": k})
        assert ((u > 0).sum(-1) == min(k, 9)).all()
        torch.testing.assert_close(u.sum(-1), torch.ones(2, 2, 5))


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "changes, message",
    [
        ("normalizer=topk,topk=0", r"topk must be an int >= 1"),
        ("softcap=-1", r"softcap must be a finite float >= 0 \(0 = off\)"),
        (
            "normalizer=stick_breaking",
            r"normalizer='stick_breaking' is defined only under a causal mask: it needs "
            r"causal=True",
        ),
        ("position=forget", r"position='forget' is defined only under a causal mask: it needs causal=True"),
        ("position=cope", r"position='cope' is defined only under a causal mask: it needs causal=True"),
        ("normalizer=diff,dim=12,num_heads=4", r"needs an even head_dim \(>= 2\), got head_dim=3"),
        ("normalizer=diff,score=bilinear", r"needs a score without head_dim-sized parameters \(one of: dot, cosine"),
        ("normalizer=linear,softcap=5", r"softcap caps scores"),
        (
            "normalizer=sinkhorn,causal=true",
            r"normalizer='sinkhorn' is defined only without a causal mask \(it normalizes over the queries too.*needs "
            r"causal=False",
        ),
        (
            "aggregator=laser,normalizer=diff",
            r"needs weights >= 0 \(any normalizer but: diff, none, linear with feature",
        ),
        ("aggregator=laser,contribution=joint", r"needs contribution='proportional', got contribution='joint'"),
    ],
)
def test_bad_relaxations_are_one_line_value_errors_naming_the_valid_range(changes, message):
    with pytest.raises(ValueError, match=message) as info:
        AttentionSpec.standard(DIM, HEADS).relax(changes)
    assert "\n" not in str(info.value)


def test_attend_refuses_a_scale_it_cannot_compute_and_a_causal_only_normalizer_without_causal():
    q = k = v = torch.randn(1, 2, 4, 8)
    for scale in ("learned", "log_n"):
        with pytest.raises(ValueError, match=f"scale='{scale}' is not a constant.*inv_sqrt_d, none"):
            attend(q, k, v, spec=AttentionSpec.standard(16, 2).relax(scale=scale))
    spec = AttentionSpec.standard(16, 2, causal=True).relax(normalizer="stick_breaking")
    with pytest.raises(ValueError, match="needs causal=True"):
        attend(q, k, v, spec=spec, causal=False)
    spec = AttentionSpec.standard(16, 2).relax(normalizer="sinkhorn")
    with pytest.raises(ValueError, match="only without a causal mask .*needs causal=False"):
        attend(q, k, v, spec=spec, causal=True)
    # A constant scale is the registry's value: diff's halves are scored at 1/sqrt(head_dim / 2).
    from axiomformer.axes.scale import constant_scale

    assert constant_scale(AttentionSpec.standard(16, 2).relax(normalizer="diff")) == pytest.approx(1 / 2)


@pytest.mark.parametrize("value", [2.5, True, "2.5", 0.5, 1.9])
def test_an_integer_field_refuses_a_fraction_or_a_bool_instead_of_truncating_it(value):
    with pytest.raises(ValueError, match=f"topk expects an integer, got {value!r}"):
        AttentionSpec.standard(16, 2).relax(normalizer="topk", topk=value)
    assert AttentionSpec.standard(16, 2).relax(normalizer="topk", topk=3.0).topk == 3  # integral: kept


@pytest.mark.parametrize("head_dim", [1, 5])
def test_attend_refuses_an_odd_head_dim_for_diff_whatever_the_spec_says(head_dim):
    # The spec (16 wide, 2 heads) has an even head_dim; the tensors given to attend decide.
    q = k = v = torch.randn(1, 2, 4, head_dim)
    with pytest.raises(ValueError, match=r"needs an even head_dim \(>= 2\), got q \(1, 2, 4, " + str(head_dim)):
        attend(q, k, v, spec=AttentionSpec.standard(16, 2).relax(normalizer="diff"))


def test_a_scale_registered_without_a_value_is_refused_by_attend_not_silently_one():
    from axiomformer.axes.registry import Choice
    from axiomformer.axes.scale import SCALES

    SCALES.register(Choice("planted_scale", "scale = 2 (a planted choice)", "test", lambda module, n: 2.0))
    try:
        spec = AttentionSpec.standard(16, 2).relax(scale="planted_scale")
        q = k = v = torch.randn(1, 2, 4, 8)
        with pytest.raises(ValueError, match="scale='planted_scale' is not a constant"):
            attend(q, k, v, spec=spec)
        torch.testing.assert_close(Attention(spec).scale(), 2.0)
    finally:
        SCALES.unregister("planted_scale")


# ---------------------------------------------------------------------------------------------- training
@pytest.mark.parametrize("name", list(CHOICES))
def test_training_runs_and_every_new_parameter_moves(name):
    config = TrainConfig(
        task="copy",
        seq_len=12,
        dim=16,
        layers=1,
        steps=4,
        batch_size=4,
        eval_batches=1,
        eval_every=4,
        task_options={"vocab": 4},
        spec=CHOICES[name],
        seed=0,
    )
    assert config.causal == (name not in NONCAUSAL_ONLY)  # sinkhorn's spec string says causal=false
    result = train(config, progress=False)
    assert len(result.losses) == 4 and all(math.isfinite(v) for v in result.losses)


def test_train_command_takes_a_relaxation_as_spec():
    result = CliRunner().invoke(
        app,
        [
            "train",
            "--task",
            "copy",
            "--seq-len",
            "12",
            "--dim",
            "16",
            "--layers",
            "1",
            "--steps",
            "2",
            "--spec",
            "normalizer=topk,topk=2",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output


# ---------------------------------------------------------------------------------------------- transformers adapter
def test_the_transformers_adapter_runs_sinks_and_softcap_as_registry_choices_with_gradients_to_the_sinks():
    pytest.importorskip("transformers")
    from axiomformer.surgery import hf_attention

    class Module(torch.nn.Module):
        is_causal = True

    spec = hf_attention.adapter_spec(2, 8, softcap=3.0, sinks=True)
    assert (spec.normalizer, spec.softcap) == ("softmax_sink", 3.0)
    assert [a for a, ok in spec.assumptions().items() if not ok] == ["A4", "A5"]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 8, generator=g, dtype=torch.float64) * 2 for _ in range(3))
    sinks = torch.tensor([0.7, -0.4], dtype=torch.float64, requires_grad=True)
    out, w = hf_attention.axiomformer_attention_forward(
        Module(), q, k, v, None, scaling=0.3, softcap=3.0, s_aux=sinks, output_attentions=True
    )
    out.square().sum().backward()
    grad = sinks.grad.clone()
    # Gemma 2 / GPT-OSS eager, written out: capped scaled logits, the sink joins the softmax and is dropped.
    ref_sinks = sinks.detach().clone().requires_grad_()
    s = 3.0 * torch.tanh(q @ k.transpose(-2, -1) * 0.3 / 3.0)
    s = s.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), -math.inf)
    full = torch.softmax(torch.cat([s, ref_sinks.view(1, 2, 1, 1).expand(1, 2, 5, 1)], -1), -1)[..., :-1]
    ref = (full @ v).transpose(1, 2)
    ref.square().sum().backward()
    torch.testing.assert_close(w.double(), full.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out, ref.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, ref_sinks.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["softcap", "softpick", "topk", "stick_breaking", "log_n", "power", "laser"])
def test_second_order_gradients_on_the_fast_route_equal_the_reference_engine(name):
    x = torch.randn(2, 40, DIM, dtype=torch.float64, generator=torch.Generator().manual_seed(4))

    def hessian_vector(engine):
        att = _layer(name, True)
        att.engine = engine
        xx = x.clone().requires_grad_()
        (grad,) = torch.autograd.grad(att(xx).square().sum(), xx, create_graph=True)
        (hv,) = torch.autograd.grad(grad.sin().sum(), xx)
        return att, hv

    fast, hv = hessian_vector("auto")
    assert fast.last_engine != "reference"
    # the reference engine normalizes in float32 (axes/normalizer.py), the rowwise one in the input dtype
    torch.testing.assert_close(hv, hessian_vector("reference")[1], rtol=1e-3, atol=1e-5)


def test_every_causal_relaxation_is_a_valid_study_arm_and_a_bad_one_names_the_choices():
    from pydantic import ValidationError

    from axiomformer.study.config import StudyConfig

    tasks = [{"name": "copy", "seq_lens": [16]}]
    arms = [text for name, text in CHOICES.items() if name not in NONCAUSAL_ONLY]
    config = StudyConfig(tasks=tasks, variants=["standard", *arms])
    assert len(config.variants) == len(arms) + 1
    with pytest.raises(ValidationError, match="unknown normalizer 'softpik'; choose one of: softmax"):
        StudyConfig(tasks=tasks, variants=["normalizer=softpik"])


@pytest.mark.parametrize("variant", [CHOICES["sinkhorn"], "normalizer=sinkhorn", "causal=false"])
def test_a_bidirectional_arm_is_refused_by_a_study_whose_tasks_are_scored_causally(variant):
    # A task scores position t after inputs[:t + 1]; an arm that reads the whole sequence sees what it is scored on.
    from pydantic import ValidationError

    from axiomformer.study.config import StudyConfig

    with pytest.raises(ValidationError, match="is not causal: the study's tasks score each position after reading"):
        StudyConfig(tasks=[{"name": "copy", "seq_lens": [12]}], variants=["standard", variant])


# ---------------------------------------------------------------------------------------------- stretch: special cases
def test_planted_wrong_stretch_formulas_fail_the_reference_comparison():
    # sinkhorn stopped after its first (row) normalization is the softmax: told apart from 3 normalizations.
    att = _layer("sinkhorn", False)
    x, keep, visible = _inputs(False, "sinkhorn")
    w = att(x, key_padding_mask=keep, need_weights=True)[1].double()
    s = _heads(att.q_proj(x)) @ _heads(att.k_proj(x)).transpose(-2, -1) / math.sqrt(HD)
    assert not torch.allclose(w, _masked_softmax(s, visible) * visible, atol=1e-3)
    torch.testing.assert_close(w, _sinkhorn(s, visible), rtol=1e-5, atol=1e-6)
    # power with p = 4 instead of 2, and with |s| instead of s^2 (p = 1: not even), are told apart.
    att = _layer("power", True)
    x, keep, visible = _inputs(True)
    w = att(x, key_padding_mask=keep, need_weights=True)[1].double()
    s = _heads(att.q_proj(x)) @ _heads(att.k_proj(x)).transpose(-2, -1) / math.sqrt(HD)
    for wrong in (_power(s, visible, 4), _power(s.abs(), visible, 1)):
        assert not torch.allclose(w, wrong, atol=1e-3)
    # LASER without its exp and log (plain attention) is told apart.
    att = _layer("laser", True)
    out = att(x, key_padding_mask=keep)
    plain, _ = reference_output(att, x, visible, "standard", keep)
    assert not torch.allclose(out.double(), plain, atol=1e-3)


def test_sinkhorn_rows_sum_to_one_its_columns_near_q_over_k_and_padding_changes_no_real_token():
    from axiomformer.axes.normalizer import normalize

    s = torch.randn(2, 2, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 2
    u = normalize(s, None, "sinkhorn")
    torch.testing.assert_close(u.sum(-1), torch.ones(2, 2, 6, dtype=torch.float64))
    soft = torch.softmax(s, -1)
    assert float((u.sum(-2) - 1).abs().max()) < float((soft.sum(-2) - 1).abs().max())  # closer to doubly stochastic
    # Padded tokens (keys and queries) take no part: real tokens' outputs do not depend on the padding's content.
    att = _layer("sinkhorn", False)
    x, keep, _ = _inputs(False, "sinkhorn")
    other = x.clone()
    other[~keep] = 7.0 * torch.randn_like(other[~keep])
    a, b = att(x, key_padding_mask=keep), att(other, key_padding_mask=keep)
    torch.testing.assert_close(a[keep], b[keep])
    assert bool((a[~keep] == 0).all())  # a padded query's row is empty


def test_power_gives_uniform_weights_to_a_row_of_zero_scores_and_zeros_to_a_row_without_keys():
    from axiomformer.axes.normalizer import normalize

    s = torch.zeros(1, 1, 3, 4, requires_grad=True)
    s2 = s + torch.tensor([0.0, 0.0, 1.0]).view(1, 1, 3, 1) * torch.tensor([1.0, -2.0, 0.0, 3.0])
    mask = torch.ones(1, 1, 3, 4, dtype=torch.bool)
    mask[..., 0, 3] = False  # row 0: three visible keys, all scores 0
    mask[..., 1, :] = False  # row 1: no visible key
    u = normalize(s2, mask, "power")
    torch.testing.assert_close(u[0, 0, 0], torch.tensor([1 / 3, 1 / 3, 1 / 3, 0.0]))
    assert bool((u[0, 0, 1] == 0).all())
    torch.testing.assert_close(u[0, 0, 2], torch.tensor([1.0, 4.0, 0.0, 9.0]) / 14)
    u.square().sum().backward()
    assert bool(torch.isfinite(s.grad).all())


def test_laser_is_finite_where_exp_of_the_values_overflows_and_a_row_without_keys_is_zero():
    from axiomformer.axes.aggregator import LaserAggregator

    g = torch.Generator().manual_seed(0)
    v = torch.randn(1, 2, 5, 4, generator=g) * 3 + 200.0  # exp(200) overflows float32
    u = torch.softmax(torch.randn(1, 2, 3, 5, generator=g), -1)
    u[..., 2, :] = 0.0  # a query without keys
    mask = torch.ones(1, 1, 3, 5, dtype=torch.bool)
    mask[..., 2, :] = False
    encoded, shift = LaserAggregator.encode(v, mask)
    y = LaserAggregator.decode(u @ encoded, shift)
    want = torch.logsumexp(torch.log(u.double()).unsqueeze(-1) + v.double().unsqueeze(-3), dim=-2)
    torch.testing.assert_close(y[..., :2, :].double(), want[..., :2, :], rtol=1e-6, atol=1e-4)
    assert bool(torch.isfinite(y).all()) and bool((y[..., 2, :] == 0).all())
    assert not bool(torch.isfinite(torch.log(u[..., :2, :] @ torch.exp(v))).all())  # the unshifted form overflows


def test_the_chunked_engine_declines_sinkhorn_and_large_problems_fall_back_to_the_reference():
    from axiomformer.engines import ENGINES
    from axiomformer.engines.chunked import ChunkedEngine

    spec = AttentionSpec.standard(DIM, HEADS).relax(normalizer="sinkhorn")
    q = k = v = torch.randn(1, HEADS, 6, HD)
    with pytest.raises(ValueError, match="engine 'chunked' cannot run normalizer=sinkhorn"):
        attend(q, k, v, spec=spec, engine="chunked")
    real = ENGINES["chunked"]
    ENGINES["chunked"] = ChunkedEngine(query_chunk=2)  # would chunk every problem if it accepted this one
    try:
        assert attend(q, k, v, spec=spec).engine == "reference"
    finally:
        ENGINES["chunked"] = real


def test_cope_starts_as_standard_attention_and_counts_positions_back_from_the_query():
    spec = AttentionSpec.standard(DIM, HEADS, causal=True)
    x = torch.randn(2, LEN, DIM, dtype=torch.float64)
    torch.manual_seed(0)
    cope = Attention(spec.relax(position="cope")).double()
    torch.manual_seed(0)
    std = Attention(spec).double()
    torch.testing.assert_close(cope(x), std(x))  # e = 0 at the start (trait starts_standard)
    # A planted wrong count, p_ij = sum over the visible keys l <= j (from the start, not back from the query), is
    # told apart from the paper's p_ij = sum_{l = j..i}.
    att = _layer("cope", True)
    x, keep, visible = _inputs(True)
    w = att(x, key_padding_mask=keep, need_weights=True)[1].double()
    q, k = _heads(att.q_proj(x)), _heads(att.k_proj(x))
    s = q @ k.transpose(-2, -1) / math.sqrt(HD)
    table = att.position.cope_emb.double()
    forward = _cope_bias(q, s.flip(-1), visible.flip(-1), table).flip(-1)
    assert not torch.allclose(w, _masked_softmax(s + forward, visible) * visible, atol=1e-3)
    torch.testing.assert_close(w, _masked_softmax(s + _cope_bias(q, s, visible, table), visible), rtol=1e-5, atol=1e-6)


def test_laser_in_float16_takes_exp_in_float32_so_values_far_apart_stay_finite():
    # Values spread ~36 apart per coordinate: float16's exp(v - m) underflows 17 below the max (it gave an output 6
    # off and non-finite gradients when computed in float16).
    torch.manual_seed(0)
    att64 = Attention(AttentionSpec.standard(16, 2).relax("aggregator=laser")).double()
    att16 = Attention(AttentionSpec.standard(16, 2).relax("aggregator=laser")).half()
    att16.load_state_dict({k: v.half() for k, v in att64.state_dict().items()})
    x = torch.randn(1, 40, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(5)) * 6
    expected = att64(x)
    xh = x.half().requires_grad_()
    out = att16(xh)
    assert out.dtype == torch.float16
    assert float((out.double() - expected).abs().max()) < 1e-2 * float(expected.abs().max())
    out.float().sum().backward()
    assert torch.isfinite(xh.grad).all() and all(torch.isfinite(p.grad).all() for p in att16.parameters())


@pytest.mark.parametrize("relax", ["normalizer=sinkhorn,causal=false", "causal=false"])
def test_train_takes_causal_false_from_the_spec_string_and_reports_it(relax):
    result = CliRunner().invoke(
        app,
        ["train", "--task", "copy", "--seq-len", "12", "--dim", "16", "--layers", "1", "--steps", "2"]
        + ["--spec", relax, "--json"],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.strip().splitlines()[-1])["spec"] == relax.removeprefix("standard,")


@pytest.mark.parametrize("position", ["alibi", "forget", "cope"])
def test_power_refuses_an_additive_position_penalty_it_would_turn_into_weight(position):
    with pytest.raises(ValueError, match=f"position='{position}''s additive penalty would become weight; choose one"):
        AttentionSpec.standard(16, 2, causal=True).relax(normalizer="power", position=position)


def test_power_refuses_a_float_bias_but_takes_a_mask_of_zeros_and_minus_infinity():
    # (q.k + b)^2 grows as b -> -1e4: the transformers convention for a masked key would give it all the weight
    att = Attention(AttentionSpec.standard(16, 2).relax(normalizer="power"))
    x = torch.randn(1, 4, 16)
    blocked = torch.zeros(4, 4)
    blocked[0, 1] = float("-inf")
    _, w = att(x, attn_mask=blocked, need_weights=True)
    assert float(w[0, :, 0, 1].abs().max()) == 0.0
    blocked[0, 2] = -1e4
    with pytest.raises(ValueError, match="a float bias or mask .* would become weight; pass a boolean mask"):
        att(x, attn_mask=blocked)
