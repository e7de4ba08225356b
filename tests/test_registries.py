"""Properties of the axis registries: every choice has a formula and a source, keeps the promises of its traits,
matches an independent implementation of its formula, and runs the same on every engine as on the reference."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from axiomformer import Attention, AttentionSpec
from axiomformer.axes.normalizer import NORMALIZERS, normalize
from axiomformer.axes.registry import Choice, Registry
from axiomformer.axes.score import SCORES, build_score
from axiomformer.engines import ENGINE_ORDER, ENGINES, AttentionProblem, engine_accepts, problem_kind
from axiomformer.spec import AXES, REGISTRIES, allows_causal, required_fields

DIM, HEADS = 16, 2


def _independent_normalizers():
    """The formulas of the normalizers written out here, independently of ``axes/normalizer.py``, for rows of
    scores s (..., n) with every key visible."""
    from entmax import entmax15, sparsemax

    def softmax(s):
        e = torch.exp(s - s.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)

    return {
        "softmax": softmax,
        "sigmoid": lambda s: 1 / (1 + torch.exp(-(s - math.log(s.shape[-1])))),
        "relu": lambda s: s.clamp(min=0) / s.shape[-1],
        "sparsemax": lambda s: sparsemax(s, dim=-1),  # the entmax package's sort-based reference
        "entmax15": lambda s: entmax15(s, dim=-1),
        "gumbel_softmax": softmax,  # outside training
        "linear": lambda k: k / (k.sum(-1, keepdim=True) + 1e-6),
        "entmax_alpha": lambda s: entmax15(s, dim=-1),  # its alpha starts at 1.5 (params default)
        "softmax1": lambda s: torch.exp(s.double()) / (1 + torch.exp(s.double()).sum(-1, keepdim=True)),
        # diff reads its input as the two halves' scores stacked on the first dimension; lambda starts at 0.2.
        "diff": lambda s: softmax(s[0]) - 0.2 * softmax(s[1]),
        "stick_breaking": _stick_breaking_loop,
        "softmax_sink": lambda s: torch.exp(s.double()) / (1 + torch.exp(s.double()).sum(-1, keepdim=True)),
        "softpick": lambda s: (
            (torch.exp(s.double()) - 1).clamp(min=0) / ((torch.exp(s.double()) - 1).abs().sum(-1, keepdim=True) + 1e-6)
        ),
        "topk": softmax,  # 7 keys, topk = 8: every key kept
        "sinkhorn": _sinkhorn_loop,
        "power": lambda s: s.double().square() / s.double().square().sum(-1, keepdim=True),  # p = 2
        "none": lambda s: s,  # no normalization
    }


def _sinkhorn_loop(s):
    """exp(s) divided by its row sums, then its column sums, then its row sums (one matrix at a time)."""
    out = torch.zeros_like(s, dtype=torch.float64)
    for idx in torch.cartesian_prod(*(torch.arange(n) for n in s.shape[:-2])):
        k = torch.exp(s[tuple(idx)].double())
        for dim in (1, 0, 1):
            k = k / k.sum(dim, keepdim=True)
        out[tuple(idx)] = k
    return out


def _stick_breaking_loop(s):
    """u_ij = sigmoid(s_ij) prod_{l > j} (1 - sigmoid(s_il)), with explicit loops."""
    beta = 1 / (1 + torch.exp(-s.double()))
    out = torch.zeros_like(beta)
    n = s.shape[-1]
    for j in range(n):
        keep = torch.ones_like(beta[..., 0])
        for m in range(j + 1, n):
            keep = keep * (1 - beta[..., m])
        out[..., j] = beta[..., j] * keep
    return out


# ---------------------------------------------------------------------------------------------- every choice
def test_every_choice_of_every_axis_has_a_formula_and_a_source_and_the_spec_lists_it():
    for axis, registry in REGISTRIES.items():
        assert AXES[axis] == registry.names()
        for choice in registry:
            assert choice.formula.strip() and choice.source.strip(), (axis, choice.name)
            assert choice.traits <= set(registry.traits), (axis, choice.name)
            AttentionSpec.standard(DIM, HEADS).relax({axis: choice.name, **required_fields(axis, choice.name)})


def test_a_registry_rejects_undeclared_traits_and_names_its_choices():
    with pytest.raises(ValueError, match="not declared"):
        Registry("x", [Choice("a", "f", "s", traits=frozenset({"fast"}))])
    with pytest.raises(ValueError, match="choose one of: a"):
        Registry("x", [Choice("a", "f", "s")])["b"]


@pytest.mark.parametrize("name", NORMALIZERS.names())
def test_every_normalizer_matches_an_independent_implementation_of_its_formula(name):
    formulas = _independent_normalizers()
    assert name in formulas, f"normalizer {name!r} has no independent formula in this test"
    s = torch.randn(2, 3, 4, 7, generator=torch.Generator().manual_seed(0))
    scores = s.abs() if NORMALIZERS.has(name, "kernel") else s
    expected = formulas[name](scores).float()
    torch.testing.assert_close(normalize(scores, None, name), expected)


# ---------------------------------------------------------------------------------------------- traits keep promises
def trait_violations(choice: Choice) -> list[str]:
    """The normalizer traits ``choice`` claims but does not keep, on random rows."""
    s = torch.randn(2, 3, 5, 9, generator=torch.Generator().manual_seed(1))
    wrong = []
    if choice.has("softmax") and not torch.allclose(choice.impl(s, True), torch.softmax(s, -1)):
        wrong.append("softmax")
    if choice.has("softmax_in_eval") and not torch.allclose(choice.impl(s, False), torch.softmax(s, -1)):
        wrong.append("softmax_in_eval")
    if choice.has("sink"):
        with_sink = torch.softmax(torch.cat([s, torch.zeros_like(s[..., :1])], -1), -1)[..., :-1]
        if not torch.allclose(choice.impl(s, False), with_sink):
            wrong.append("sink")
    if choice.has("elementwise"):
        n = torch.full_like(s[..., :1], 20.0)
        whole = choice.impl(s, n)
        if not torch.allclose(torch.cat([choice.impl(s[..., :4], n), choice.impl(s[..., 4:], n)], -1), whole):
            wrong.append("elementwise")
    if choice.has("closed_grad"):
        n = torch.arange(1.0, 6.0).view(5, 1)
        g = torch.randn(s.shape, generator=torch.Generator().manual_seed(2))
        leaf = s.clone().requires_grad_()
        u = choice.impl(leaf, n)
        (expected,) = torch.autograd.grad(u, leaf, g)  # autograd of the formula, the independent value
        in_place = choice.extra["impl_"](s.clone(), n)
        grad = choice.extra["grad_"](u.detach().clone(), n, g.clone())
        if not (torch.allclose(in_place, u) and torch.allclose(grad, expected)):
            wrong.append("closed_grad")
    if choice.has("entmax"):
        from entmax import entmax_bisect

        expected = entmax_bisect(s, alpha=choice.extra["alpha"], dim=-1, n_iter=100)
        if not torch.allclose(choice.impl(s, False), expected, atol=1e-5):
            wrong.append("entmax")
    return wrong


@pytest.mark.parametrize("name", NORMALIZERS.names())
def test_every_normalizer_keeps_the_promises_of_its_traits(name):
    assert trait_violations(NORMALIZERS[name]) == []


def test_the_trait_check_catches_a_choice_that_claims_a_trait_it_does_not_have():
    liar = Choice("liar", "u = sigmoid(s)", "planted", lambda s, training: torch.sigmoid(s), frozenset({"softmax"}))
    assert trait_violations(liar) == ["softmax"]
    sinkless = Choice(
        "sinkless", "u = softmax(s)", "planted", lambda s, training: torch.softmax(s, -1), frozenset({"sink"})
    )
    assert trait_violations(sinkless) == ["sink"]
    relu = NORMALIZERS["relu"]
    steep = {**relu.extra, "grad_": lambda u, n, g: relu.extra["grad_"](u, n, g).mul_(2.0)}
    assert trait_violations(Choice("steep", "u", "planted", relu.impl, relu.traits, steep)) == ["closed_grad"]
    sparsemax = NORMALIZERS["sparsemax"]
    misnamed = Choice("misnamed", "u", "planted", sparsemax.impl, sparsemax.traits, {"alpha": 1.5})
    assert trait_violations(misnamed) == ["entmax"]


@pytest.mark.parametrize("name", [c.name for c in SCORES if c.has("dot_form")])
def test_every_dot_form_reproduces_its_score_up_to_a_per_query_constant(name):
    spec = AttentionSpec.standard(DIM, HEADS).relax(score=name)
    torch.manual_seed(0)
    module = build_score(spec)
    q, k = torch.randn(2, HEADS, 5, DIM // HEADS), torch.randn(2, HEADS, 7, DIM // HEADS)
    scale = 0.3
    q2, k2, scale2, extras = SCORES[name].extra["dot_form"](module, q, k, scale)
    logits = scale2 * q2 @ k2.transpose(-2, -1) + sum((qc * kc.transpose(-2, -1) for qc, kc in extras), 0.0)
    gap = logits - scale * module(q, k)
    torch.testing.assert_close(gap, gap[..., :1].expand_as(gap), rtol=1e-5, atol=1e-5)  # constant in j
    if SCORES.has(name, "dot_form_exact"):
        torch.testing.assert_close(gap, torch.zeros_like(gap), rtol=1e-5, atol=1e-5)


def test_the_taylor_feature_map_is_the_second_order_expansion_of_exp_of_the_scaled_score():
    from axiomformer.axes.normalizer import feature_map

    q, k = torch.randn(3, 8, dtype=torch.float64), torch.randn(5, 8, dtype=torch.float64)
    t = q @ k.T / math.sqrt(8)
    kernel = feature_map(q, "taylor") @ feature_map(k, "taylor").T
    torch.testing.assert_close(kernel, 1 + t + t**2 / 2)
    assert bool((kernel > 0).all())


@pytest.mark.parametrize("alpha, reference", [(1.5, "entmax15"), (2.0, "sparsemax")])
def test_entmax_alpha_at_1_5_and_2_is_the_sort_based_entmax_and_sparsemax_and_alpha_learns(alpha, reference):
    from entmax import entmax15, sparsemax

    from axiomformer.axes.normalizer import Normalizer

    module = Normalizer(AttentionSpec.standard(DIM, HEADS).relax(normalizer="entmax_alpha"))
    with torch.no_grad():
        module.alpha_raw.fill_(math.log(math.expm1(alpha - 1.0)))
    s = torch.randn(2, HEADS, 4, 9, generator=torch.Generator().manual_seed(3))
    expected = (entmax15 if reference == "entmax15" else sparsemax)(s, dim=-1)
    weights = module(s)
    torch.testing.assert_close(weights, expected, rtol=1e-4, atol=1e-5)
    (weights * torch.randn_like(weights)).sum().backward()
    assert module.alpha_raw.grad is not None and bool(module.alpha_raw.grad.abs().sum() > 0)


# ---------------------------------------------------------------------------------------------- engines
@pytest.mark.parametrize(
    "axis, name",
    [
        (axis, c.name)
        for axis in ("normalizer", "score", "position", "contribution", "feature_map")
        for c in REGISTRIES[axis]
    ],
)
@pytest.mark.parametrize("causal", [False, True])
def test_every_choice_runs_the_same_on_every_engine_that_accepts_it_as_on_the_reference(axis, name, causal):
    if not allows_causal(axis, name, causal):
        pytest.skip("defined only under a causal mask, or only without one")
    spec = AttentionSpec.standard(DIM, HEADS, causal=causal).relax({axis: name})
    if axis == "feature_map":
        spec = spec.relax(normalizer="linear")
    g = torch.Generator().manual_seed(2)
    x, kv = torch.randn(2, 6, DIM, generator=g), torch.randn(2, 9, DIM, generator=g)
    keep = torch.ones(2, 9, dtype=torch.bool)
    keep[1, 6:] = False

    def run(engine):
        torch.manual_seed(3)
        att = Attention(spec, engine=engine).eval()
        xx, kk = x.clone().requires_grad_(), kv.clone().requires_grad_()
        out = att(xx, kk, key_padding_mask=keep)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        return [out.detach(), xx.grad, kk.grad] + [p.grad for p in att.parameters() if p.grad is not None]

    expected = run("reference")
    for engine in ENGINE_ORDER:
        if engine == "reference":
            continue
        att = Attention(spec).eval()
        q = torch.zeros(2, HEADS, 6, DIM // HEADS)
        k = torch.zeros(2, HEADS, 9, DIM // HEADS)
        problem = AttentionProblem(
            q=q,
            k=k,
            v=k,
            causal=causal,
            mask=keep[:, None, None],
            q_offset=3,
            alibi_slopes=att.position.slopes if name == "alibi" else None,
        )
        if not engine_accepts(ENGINES[engine], att.plan, problem_kind(att.plan, problem)):
            continue
        got = run(engine)
        floor = 1e-3 * max(float(t.norm()) for t in expected[1:])
        for i, (a, b) in enumerate(zip(got, expected)):
            assert float((a - b).norm()) <= 1e-4 * max(float(b.norm()), floor), (engine, i)


def test_the_standard_normalizer_is_what_pytorch_sdpa_computes():
    # The standard point of the normalizer axis is what PyTorch's own kernel computes.
    q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
    w = normalize(q @ k.transpose(-2, -1) / 2, None, AXES["normalizer"][0])
    torch.testing.assert_close(w @ v, F.scaled_dot_product_attention(q, k, v))


@pytest.mark.parametrize("axis_choice", [f"{axis}={c.name}" for axis, reg in REGISTRIES.items() for c in reg])
def test_every_choice_makes_a_layer_that_pickles(axis_choice):
    # a registry impl kept on a module (a lambda) would make torch.save / copy.deepcopy of the whole model fail
    import pickle

    axis, name = axis_choice.split("=")
    spec = AttentionSpec.standard(16, 2, causal=required_fields(axis, name).get("causal", True))
    try:
        spec = spec.relax({**required_fields(axis, name), axis: name})
    except ValueError:
        pytest.skip(f"{axis_choice} needs other fields")
    layer = Attention(spec)
    assert isinstance(pickle.loads(pickle.dumps(layer)), Attention)
