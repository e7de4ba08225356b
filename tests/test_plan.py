"""Resolve once, decide once, stay bounded: a layer's spec is resolved into a plan once (no choice looked up by name
per forward), the router's cache is keyed on the plan and the kind of problem (no lengths, no values) and bounded,
and ``last_engine`` names the engine that ran."""

from __future__ import annotations

import collections

import pytest
import torch

from axiomformer import Attention, AttentionSpec, KVCache
from axiomformer.axes import registry
from axiomformer.engines import ENGINE_ORDER, ENGINES, route_cache_clear, route_cache_size, router
from axiomformer.spec import AXES, required_fields

CHOICES = [(axis, name) for axis, names in AXES.items() for name in names]


@pytest.fixture
def lookups(monkeypatch):
    """Counts every registry lookup by name (``Registry.__getitem__`` and ``Registry.has``)."""
    seen = collections.Counter()
    real_get, real_has = registry.Registry.__getitem__, registry.Registry.has
    monkeypatch.setattr(
        registry.Registry, "__getitem__", lambda self, name: seen.update([self.axis]) or real_get(self, name)
    )
    monkeypatch.setattr(
        registry.Registry, "has", lambda self, name, trait: seen.update([self.axis]) or real_has(self, name, trait)
    )
    return seen


def _layer(axis: str, name: str, **fields) -> Attention:
    causal = required_fields(axis, name).get("causal", True)
    spec = AttentionSpec.standard(16, 2, causal=causal, **fields).relax({**required_fields(axis, name), axis: name})
    if axis == "feature_map":
        spec = spec.relax(normalizer="linear")
    return Attention(spec)


@pytest.mark.parametrize("axis, name", CHOICES, ids=[f"{a}={n}" for a, n in CHOICES])
def test_a_forward_looks_up_no_choice_by_name(axis, name, lookups):
    att = _layer(axis, name)
    x = torch.randn(2, 9, 16)
    keep = torch.ones(2, 9, dtype=torch.bool)
    keep[1, 7:] = False
    att(x)  # the plan is resolved here, once
    lookups.clear()
    att(x, key_padding_mask=keep).sum().backward()
    att(x)
    assert not lookups, dict(lookups)


def test_the_lookup_check_sees_a_lookup_per_forward(lookups, monkeypatch):
    from axiomformer.axes.normalizer import NORMALIZERS

    att = _layer("normalizer", "sigmoid")
    real = Attention._attend_heads
    monkeypatch.setattr(
        Attention, "_attend_heads", lambda self, *a: NORMALIZERS[self.spec.normalizer] and real(self, *a)
    )
    att(torch.randn(1, 5, 16))
    lookups.clear()
    att(torch.randn(1, 5, 16))
    assert lookups["normalizer"] == 1


def test_replacing_the_spec_resolves_a_new_plan():
    att = _layer("normalizer", "gumbel_softmax", gumbel_tau=0.7)
    first = att.plan
    assert att.plan is first  # resolved once
    att.spec = att.spec.relax(gumbel_tau=0.5)
    assert att.plan is not first and att.plan.options["tau"] == 0.5
    assert att.plan.key == first.key  # the route key holds no option values (only: at defaults?)


# ---------------------------------------------------------------------------------------------- the router's cache
def test_decoding_and_new_lengths_reuse_one_routing_decision():
    att = _layer("position", "alibi").eval()
    cache = KVCache()
    route_cache_clear()
    with torch.no_grad():
        att(torch.randn(1, 4, 16), cache=cache)
        for _ in range(3):
            att(torch.randn(1, 1, 16), cache=cache)
        after_warmup = route_cache_size()
        for _ in range(30):
            att(torch.randn(1, 1, 16), cache=cache)
        for n in range(5, 25):
            att(torch.randn(1, n, 16))
    assert route_cache_size() == after_warmup <= 2


def test_an_annealed_temperature_reuses_one_routing_decision():
    att = _layer("normalizer", "gumbel_softmax").train()
    route_cache_clear()
    for tau in torch.linspace(2.0, 0.1, 25).tolist():
        att.spec = att.spec.relax(gumbel_tau=tau)
        att(torch.randn(2, 6, 16))
    assert route_cache_size() == 1


def test_the_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(router, "ROUTE_CACHE_MAX", 3)
    route_cache_clear()
    x = torch.randn(1, 6, 16)
    for relax in ("standard", "normalizer=sigmoid", "normalizer=relu", "normalizer=sparsemax", "score=cosine"):
        _layer("score", "dot").__class__(AttentionSpec.standard(16, 2).relax(relax))(x)
        assert route_cache_size() <= 3
    assert route_cache_size() == 3


def test_the_bound_check_sees_an_unbounded_cache(monkeypatch):
    # Plant the old key: the lengths in it. Every new length then adds an entry.
    real = router.problem_kind
    monkeypatch.setattr(
        router,
        "problem_kind",
        lambda plan, problem: real(plan, problem)._replace(dtype=(problem.q.dtype, problem.k_len)),
    )
    monkeypatch.setattr(router, "ROUTE_CACHE_MAX", 10**6)
    route_cache_clear()
    att = _layer("score", "dot")
    for n in range(5, 25):
        att(torch.randn(1, n, 16))
    assert route_cache_size() == 20


# ---------------------------------------------------------------------------------------------- last_engine
@pytest.mark.parametrize(
    "relax, causal",
    [
        ("standard", True),
        ("normalizer=sigmoid", True),
        ("normalizer=sparsemax", False),
        ("normalizer=linear", True),
        ("score=additive", True),
        ("position=alibi", True),
    ],
)
def test_last_engine_names_the_engine_whose_kernel_ran(relax, causal, monkeypatch):
    ran = []
    for name in ENGINE_ORDER:
        engine = ENGINES[name]
        real = type(engine).__call__
        monkeypatch.setattr(
            type(engine), "__call__", lambda self, *a, _real=real, **k: ran.append(self.name) or _real(self, *a, **k)
        )
    att = Attention(AttentionSpec.standard(16, 2, causal=causal).relax(relax))
    for n in (6, 300):  # small (reference) and large enough for a fast path
        ran.clear()
        att(torch.randn(1, n, 16))
        assert ran == [att.last_engine]
