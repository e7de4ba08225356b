"""Engines read traits, and other packages plug in: a normalizer registered through the entry-point group
``axiomformer.choices`` gets the fast engine its traits earn, and an engine registered through
``axiomformer.engines`` is asked by the router and checked by the generated equivalence matrix."""

from __future__ import annotations

import warnings
from importlib import metadata
from pathlib import Path

import pytest
import torch

from axiomformer import Attention, AttentionSpec
from axiomformer.axes.normalizer import NORMALIZERS
from axiomformer.axes.plugins import PluginWarning, load_choices
from axiomformer.axes.registry import Choice
from axiomformer.engines import ENGINE_ORDER, attend, register_engine, router, unregister_engine
from axiomformer.engines import plugins as engine_plugins
from axiomformer.engines.base import Computes, EngineBase
from axiomformer.spec import REGISTRIES

HERE = Path(__file__).parent


def _entries(root: Path) -> list[metadata.EntryPoint]:
    return [e for d in metadata.distributions(path=[str(root)]) for e in d.entry_points]


def _outputs_and_grads(spec: AttentionSpec, engine: str, x: torch.Tensor) -> tuple[list[torch.Tensor], str]:
    torch.manual_seed(0)
    att = Attention(spec, engine=engine)
    x = x.clone().requires_grad_()
    out = att(x)
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    return [out.detach(), x.grad] + [p.grad for p in att.parameters()], att.last_engine


def _assert_same_as_reference(spec: AttentionSpec, expected_engine: str) -> None:
    x = torch.randn(2, 11, 16, generator=torch.Generator().manual_seed(1))
    got, ran = _outputs_and_grads(spec, "auto", x)
    expected, _ = _outputs_and_grads(spec, "reference", x)
    assert ran == expected_engine
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.fixture
def relu2(monkeypatch):
    """The example package's ``normalizer=relu2`` (``tests/plugin_example``) registered through its entry point."""
    monkeypatch.syspath_prepend(str(HERE / "plugin_example"))
    assert load_choices(REGISTRIES, _entries(HERE / "plugin_example")) == ["normalizer.relu2"]
    yield NORMALIZERS["relu2"]
    NORMALIZERS.unregister("relu2")


@pytest.mark.parametrize("causal", [True, False])
def test_a_plugged_in_elementwise_normalizer_runs_on_the_elementwise_engine_as_on_the_reference(relu2, causal):
    assert relu2.traits == {"elementwise"}  # no closed form: the engine differentiates its impl per chunk
    spec = AttentionSpec.standard(16, 2, causal=causal).relax(normalizer="relu2")
    _assert_same_as_reference(spec, "elementwise")


def test_the_engine_s_closed_form_and_its_autograd_path_agree_and_a_wrong_closed_form_is_seen():
    # sigmoid's formula without its closed_grad trait takes the autograd path of the same engine: same numbers; with
    # a closed form 1% off, the gradients differ.
    sigmoid = NORMALIZERS["sigmoid"]
    wrong_grad = {**sigmoid.extra, "grad_": lambda u, n, g: sigmoid.extra["grad_"](u, n, g).mul_(1.01)}
    twins = [
        Choice("sigmoid_autograd", "u", "test", sigmoid.impl, frozenset({"elementwise"})),
        Choice("sigmoid_wrong", "u", "test", sigmoid.impl, sigmoid.traits, wrong_grad),
    ]
    x = torch.randn(2, 11, 16, generator=torch.Generator().manual_seed(2))
    try:
        for twin in twins:
            NORMALIZERS.register(twin, origin="test")
        runs = {}
        for name in ("sigmoid", "sigmoid_autograd", "sigmoid_wrong"):
            spec = AttentionSpec.standard(16, 2, causal=True).relax(normalizer=name)
            runs[name] = _outputs_and_grads(spec, "elementwise", x)[0]
    finally:
        for twin in twins:
            NORMALIZERS.unregister(twin.name)
    for a, b in zip(runs["sigmoid"], runs["sigmoid_autograd"], strict=True):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(runs["sigmoid"][0], runs["sigmoid_wrong"][0])  # the forward is right
    assert not torch.allclose(runs["sigmoid"][1], runs["sigmoid_wrong"][1], rtol=1e-3)  # the backward is not


def test_traits_alone_decide_which_fast_engine_takes_a_choice():
    # The same formulas as built-in choices under new names: the traits route them, the names do not.
    sparsemax, relu = NORMALIZERS["sparsemax"], NORMALIZERS["relu"]
    twins = {
        "my_sparsemax": (
            Choice("my_sparsemax", "u", "test", sparsemax.impl, sparsemax.traits, sparsemax.extra),
            "sparse",
        ),
        "my_relu": (Choice("my_relu", "u", "test", relu.impl, frozenset({"elementwise"})), "elementwise"),
        # entmax of an alpha the sparse engine has no threshold for, and no elementwise trait: the general engines
        "my_entmax3": (
            Choice("my_entmax3", "u", "test", sparsemax.impl, sparsemax.traits, {"alpha": 3.0}),
            "reference",
        ),
        "my_rowwise_relu": (
            Choice("my_rowwise_relu", "u", "test", lambda s, training: torch.relu(s) / s.shape[-1], frozenset({"row"})),
            "reference",
        ),
    }
    try:
        for choice, _ in twins.values():
            NORMALIZERS.register(choice, origin="test")
        for name, (_, engine) in twins.items():
            q, k, v = (torch.randn(1, 2, 7, 8, generator=torch.Generator().manual_seed(i)) for i in range(3))
            spec = AttentionSpec.standard(16, 2, causal=True).relax(normalizer=name)
            assert attend(q, k, v, spec=spec).engine == engine, name
    finally:
        for name in twins:
            NORMALIZERS.unregister(name)


def test_an_engine_is_never_asked_for_a_plan_its_declaration_excludes():
    asked = []

    class Eager(EngineBase):  # accepts every problem, but computes only elementwise normalizers
        name = "eager"
        computes = Computes(all_of={"normalizer": {"elementwise"}})

        def accepts(self, plan, kind):
            asked.append(plan.spec.normalizer)
            return True

        def __call__(self, plan, problem, need_weights=False):
            return router.ENGINES["reference"](plan, problem, need_weights)

    register_engine(Eager(), before=ENGINE_ORDER[0])
    try:
        q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
        ran = {
            n: attend(q, k, v, spec=AttentionSpec.standard(16, 2).relax(normalizer=n)).engine
            for n in ("softmax", "sigmoid")
        }
    finally:
        unregister_engine("eager")
    assert ran == {"softmax": "sdpa", "sigmoid": "eager"}
    assert asked == ["sigmoid"]


def test_computes_admits_by_all_any_and_none_of_and_names_unknown_axes():
    plan = router.default_parts(AttentionSpec.standard(16, 2).relax(normalizer="sigmoid"))
    assert Computes(all_of={"normalizer": {"elementwise", "closed_grad"}}).admits(plan)
    assert not Computes(all_of={"normalizer": {"elementwise", "row"}}).admits(plan)
    assert Computes(any_of={"normalizer": {"row", "elementwise"}}).admits(plan)
    assert not Computes(any_of={"normalizer": {"row", "kernel"}}).admits(plan)
    assert not Computes(none_of={"score": {"plain_dot"}}).admits(plan)
    assert Computes().describe() == "every choice"
    with pytest.raises(ValueError, match="unknown axes \\['normaliser'\\].*normalizer, score"):
        Computes(all_of={"normaliser": {"elementwise"}})


# ---------------------------------------------------------------------------------------------- engines from packages
ENGINE_MODULE = """
import torch
from axiomformer.engines.base import Computes, EngineBase
from axiomformer.axes.normalizer import normalize


class Plugged(EngineBase):
    '''A third-party engine: elementwise normalizers with plain dot scores, the whole score matrix at once.'''

    name = "plugged"
    before = "elementwise"
    computes = Computes(all_of={"normalizer": {"elementwise"}, "score": {"plain_dot"}, "contribution": {"proportional"}})
    factor = 1.0

    def accepts(self, plan, kind):
        return kind.mask == "none" and not kind.bias and kind.alibi == "none" and not kind.window and not kind.dropout

    def __call__(self, plan, problem, need_weights=False):
        s = torch.matmul(problem.q, problem.k.transpose(-2, -1)) * problem.scale
        mask = None
        if problem.causal:
            q_len, k_len = s.shape[-2:]
            rows = torch.arange(q_len).view(-1, 1) + problem.q_offset
            mask = torch.arange(k_len).view(1, -1) <= rows
        u = normalize(s, mask, plan.normalizer_choice) * self.factor
        return torch.matmul(u.to(problem.v.dtype), problem.v), None


class Wrong(Plugged):
    name = "plugged_wrong"
    factor = 1.01
"""


def _engine_dist(
    root: Path, dist: str, entries: dict[str, str], body: str = ENGINE_MODULE
) -> list[metadata.EntryPoint]:
    module = dist.replace("-", "_")
    (root / module).mkdir(parents=True)
    (root / module / "__init__.py").write_text(body)
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = "".join(f"{name} = {module}:{target}\n" for name, target in entries.items())
    (info / "entry_points.txt").write_text(f"[{engine_plugins.GROUP}]\n{lines}")
    return _entries(root)


@pytest.fixture
def load_engines(monkeypatch):
    """``load_engines`` into the router's registry, every plug-in engine removed afterwards."""
    added: list[str] = []

    def load(root: Path, entries: list[metadata.EntryPoint]) -> list[str]:
        monkeypatch.syspath_prepend(str(root))
        names = engine_plugins.load_engines(register_engine, router.ENGINE_ORIGINS, entries)
        added.extend(names)
        return names

    yield load
    for name in added:
        unregister_engine(name)


def test_an_engine_registered_through_an_entry_point_is_picked_by_the_router(tmp_path, load_engines):
    entries = _engine_dist(tmp_path, "my-engines", {"plugged": "Plugged"})
    assert load_engines(tmp_path, entries) == ["plugged"]
    assert ENGINE_ORDER.index("plugged") == ENGINE_ORDER.index("elementwise") - 1  # its ``before``
    assert router.ENGINE_ORIGINS["plugged"] == "my-engines"
    _assert_same_as_reference(AttentionSpec.standard(16, 2, causal=True).relax(normalizer="sigmoid"), "plugged")
    # Its declaration keeps it off what it does not compute: softmax stays on SDPA.
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    assert attend(q, k, v, spec=AttentionSpec.standard(16, 2)).engine == "sdpa"


def test_the_equivalence_matrix_checks_a_plugged_in_engine_and_catches_a_wrong_one(tmp_path, load_engines):
    from test_engine_matrix import SCENARIOS, cell_failures

    entries = _engine_dist(tmp_path, "my-engines", {"plugged": "Plugged", "plugged_wrong": "Wrong"})
    assert load_engines(tmp_path, entries) == ["plugged", "plugged_wrong"]
    caught = {s: cell_failures("normalizer", "relu", s) for s in SCENARIOS}  # every engine of ENGINE_ORDER
    wrong = {s for s, failures in caught.items() if failures}
    assert wrong == {"none", "causal", "kv_decode"}, caught  # the cells it accepts: no mask but the causal one
    assert all(set(failures) == {"plugged_wrong"} for failures in caught.values() if failures), caught


BROKEN_ENGINES = {  # module body, entry name, target, what the warning says
    "import_error": ("import this_module_does_not_exist_xyz\n", "broken", "Plugged", "ModuleNotFoundError"),
    "missing_attribute": (ENGINE_MODULE, "plugged", "NOT_THERE", "AttributeError"),
    "not_an_engine": ("ENGINE = 3\n", "plugged", "ENGINE", "int, which lacks name"),
    "misnamed": (ENGINE_MODULE, "other", "Plugged", "the engine is named 'plugged'"),
    "factory_raises": ("def make():\n    raise RuntimeError('boom')\n", "plugged", "make", "boom"),
    "property_raises": (
        ENGINE_MODULE + "\nclass Raising(Plugged):\n    @property\n    def returns_weights(self):\n"
        "        raise RuntimeError('no weights today')\n",
        "plugged",
        "Raising",
        "no weights today",
    ),
    "computes_wrong_type": (
        ENGINE_MODULE + "\nclass Loose(Plugged):\n    computes = {'normalizer': {'elementwise'}}\n",
        "plugged",
        "Loose",
        "computes is a dict",
    ),
    "accepts_not_callable": (
        ENGINE_MODULE + "\nclass Flag(Plugged):\n    accepts = True\n",
        "plugged",
        "Flag",
        "accepts cannot be called",
    ),
    "before_not_a_name": (
        ENGINE_MODULE + "\nclass Early(Plugged):\n    before = 3\n",
        "plugged",
        "Early",
        "before is a int",
    ),
}


@pytest.mark.parametrize("kind", sorted(BROKEN_ENGINES))
def test_a_broken_plug_in_engine_is_skipped_with_one_warning_naming_it_and_its_distribution(
    kind, tmp_path, load_engines
):
    body, name, target, why = BROKEN_ENGINES[kind]
    before = list(ENGINE_ORDER)
    entries = _engine_dist(tmp_path, f"pkg-{kind.replace('_', '-')}", {name: target}, body)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert load_engines(tmp_path, entries) == []
    assert len(caught) == 1 and caught[0].category is PluginWarning
    message = str(caught[0].message)
    assert f"{name!r}" in message and f"pkg-{kind.replace('_', '-')}" in message and why in message, message
    assert ENGINE_ORDER == before


def test_a_plug_in_engine_named_like_a_built_in_is_skipped_and_the_built_in_kept(tmp_path, load_engines):
    built_in = router.ENGINES["sparse"]
    entries = _engine_dist(tmp_path, "my-engines", {"sparse": "Plugged"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert load_engines(tmp_path, entries) == []
    assert len(caught) == 1 and "'sparse' is a built-in engine of axiomformer, which is kept" in str(caught[0].message)
    assert router.ENGINES["sparse"] is built_in and router.ENGINE_ORIGINS["sparse"] == "axiomformer"


def test_two_distributions_registering_one_engine_name_keep_neither(tmp_path, load_engines, monkeypatch):
    first = _engine_dist(tmp_path / "a", "pkg-a", {"plugged": "Plugged"})
    second = _engine_dist(tmp_path / "b", "pkg-b", {"plugged": "Plugged"})
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    monkeypatch.syspath_prepend(str(tmp_path / "b"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        names = engine_plugins.load_engines(
            register_engine, router.ENGINE_ORIGINS, first + second, unregister=unregister_engine
        )
    assert names == [] and "plugged" not in ENGINE_ORDER and "plugged" not in router.ENGINE_ORIGINS
    assert len(caught) == 1 and "by pkg-a and by pkg-b; neither is kept" in str(caught[0].message)


def test_an_unknown_before_is_named_and_the_engine_still_registers(tmp_path, load_engines):
    body = ENGINE_MODULE + "\nclass Lost(Plugged):\n    before = 'no_such_engine'\n"
    entries = _engine_dist(tmp_path, "pkg-lost", {"plugged": "Lost"}, body)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert load_engines(tmp_path, entries) == ["plugged"]
    assert len(caught) == 1 and "'no_such_engine', which is not registered" in str(caught[0].message)
    assert ENGINE_ORDER.index("plugged") == ENGINE_ORDER.index("reference") - 1


def test_an_engine_that_raises_while_routed_is_passed_over_with_one_warning(tmp_path, load_engines, monkeypatch):
    """A plug-in engine whose ``accepts`` raises at routing time: automatic routing warns once, names it and its
    distribution, and routes to the built-in engines; the library keeps working."""
    body = ENGINE_MODULE + "\nclass Crashy(Plugged):\n    def accepts(self, plan, kind):\n        raise KeyError('x')\n"
    entries = _engine_dist(tmp_path, "pkg-crashy", {"plugged": "Crashy"}, body)
    assert load_engines(tmp_path, entries) == ["plugged"]
    monkeypatch.setattr(router, "_WARNED", set())
    spec = AttentionSpec.standard(16, 2, causal=True).relax(normalizer="sigmoid")
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = attend(q, k, v, spec=spec, causal=True)
        attend(q, k, v * 2, spec=spec, causal=True, q_offset=0)
    messages = [str(w.message) for w in caught if w.category is PluginWarning]
    assert len(messages) == 1 and "'plugged'" in messages[0] and "pkg-crashy" in messages[0], messages
    assert first.engine == "elementwise"
    reference = attend(q, k, v, spec=spec, causal=True, engine="reference").out
    torch.testing.assert_close(first.out, reference)
