"""The equivalence matrix, generated from the registries: every choice of every axis x every engine that accepts it x
every kind of problem (no mask, key padding, float mask, causal, ALiBi, sliding window, KV-cache decode), forward and
backward (inputs and every parameter), against the reference engine.

Which engines accept a case is asked of the router itself (an engine forced on a problem it does not accept raises),
so a new choice, or a new fast path for an old one, is checked here without a test written for it. The last test
plants a wrong fast path and shows that the matrix catches it, in the right cases and only there.
"""

from __future__ import annotations

import pytest
import torch

from axiomformer import Attention, AttentionSpec, KVCache
from axiomformer.axes.normalizer import NORMALIZERS
from axiomformer.engines import ENGINE_ORDER, ENGINES, register_engine, unregister_engine
from axiomformer.engines.chunked import ChunkedEngine
from axiomformer.engines.elementwise import ElementwiseEngine
from axiomformer.engines.linear import LinearEngine
from axiomformer.engines.recurrent import RecurrentEngine
from axiomformer.engines.rowwise import RowwiseEngine
from axiomformer.engines.sdpa import SDPAEngine
from axiomformer.engines.selected import SelectedEngine
from axiomformer.engines.sparse import SparseEngine
from axiomformer.engines.transport_chunked import ChunkedTransportEngine
from axiomformer.spec import AXES, allows_causal, required_fields

DIM, HEADS, BATCH, Q_LEN, K_LEN, WINDOW = 16, 2, 2, 6, 9, 3
SCENARIOS = ("none", "key_padding", "float_mask", "causal", "alibi", "window", "kv_decode")
FIELD_CHOICES = {
    "topk": ("normalizer", "topk"),
    "softpick_shifted_eps": ("normalizer", "softpick"),
    "stick_attend_current": ("normalizer", "stick_breaking"),
    "stick_remainder": ("normalizer", "stick_breaking"),
    "talking_heads_residual": ("score", "talking_heads"),
    "sinkhorn_authors": ("normalizer", "sinkhorn"),
    "diff_authors": ("normalizer", "diff"),
}
"""The choice whose option each field case sets (the authors' conventions: ``tests/test_authors_conventions.py``)."""
CHOICES = [(axis, name) for axis, names in AXES.items() for name in names] + [
    ("softcap", "2.5"),
    ("topk", "3"),
    ("softpick_shifted_eps", "true"),
    ("stick_attend_current", "false"),
    ("stick_remainder", "true"),
    ("talking_heads_residual", "true"),
    ("sinkhorn_authors", "true"),
    ("diff_authors", "true"),
]
"""Every choice of every axis, and the relaxations that are spec fields (soft-capping; topk below the key count; the
authors' conventions of softpick, stick-breaking, talking heads, Sinkhorn and differential attention)."""
RTOL = 1e-4
"""Largest relative error (norm of the difference over the norm of the reference, per tensor) in float32."""


@pytest.fixture(autouse=True)
def _small_blocks(monkeypatch):
    # Blocks of a few queries and keys, so that every chunked path crosses chunk boundaries at these sizes.
    monkeypatch.setitem(ENGINES, "chunked", ChunkedEngine(query_chunk=4, key_chunk=4))
    monkeypatch.setitem(ENGINES, "linear", LinearEngine(chunk=4))
    monkeypatch.setitem(ENGINES, "elementwise", ElementwiseEngine(memory_budget=100))
    monkeypatch.setitem(ENGINES, "sparse", SparseEngine(memory_budget=100))
    monkeypatch.setitem(ENGINES, "rowwise", RowwiseEngine(memory_budget=100))
    monkeypatch.setitem(ENGINES, "recurrent", RecurrentEngine(chunk=4))
    monkeypatch.setitem(ENGINES, "chunked_transport", ChunkedTransportEngine(block=4))
    monkeypatch.setitem(ENGINES, "selected", SelectedEngine(memory_budget=40))
    monkeypatch.delenv("AXIOMFORMER_ENGINE", raising=False)


def case_spec(axis: str, name: str, scenario: str) -> AttentionSpec | None:
    """The spec of one cell, or None where the scenario would replace the choice (ALiBi on another position)."""
    if scenario == "alibi" and axis == "position" and name != "alibi":
        return None
    if axis == "transport" and name != AXES["transport"][0] and scenario in ("alibi", "window"):
        return None  # refused by the spec: the transport is the position mechanism, a window would cut its products
    if axis == "select" and name != AXES["select"][0] and scenario == "window":
        return None  # refused by the spec: a selection chooses among every visible key
    causal = scenario in ("causal", "alibi", "window", "kv_decode")
    option_of = FIELD_CHOICES.get(axis)
    if not allows_causal(axis, name, causal) or (option_of and not allows_causal(*option_of, causal)):
        return None  # defined only under a causal mask, or only without one
    if scenario in ("float_mask", "alibi") and axis == "normalizer" and NORMALIZERS.has(name, "sign_blind"):
        return None  # refused: a float bias would become weight (power)
    spec = AttentionSpec.standard(DIM, HEADS, causal=causal)
    spec = spec.relax({**required_fields(axis, name), axis: name})  # a transport's paired normalizer
    if option_of:
        spec = spec.relax({option_of[0]: option_of[1]})
    if axis == "feature_map":
        spec = spec.relax(normalizer="linear")
    if scenario == "alibi":
        spec = spec.relax(position="alibi")
    if scenario == "window":
        spec = spec.relax(window=WINDOW)
    return spec


def _inputs(scenario: str, device: str = "cpu"):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(BATCH, Q_LEN, DIM, generator=g)
    kv = torch.randn(BATCH, K_LEN, DIM, generator=g)
    kwargs = {}
    if scenario == "key_padding":
        keep = torch.ones(BATCH, K_LEN, dtype=torch.bool)
        keep[1, 6:] = False
        kwargs["key_padding_mask"] = keep
    if scenario == "float_mask":
        bias = torch.randn(Q_LEN, K_LEN, generator=g)
        bias[0, 2:5] = float("-inf")
        kwargs["attn_mask"] = bias
    return x.to(device), kv.to(device), {key: value.to(device) for key, value in kwargs.items()}


def run_case(spec: AttentionSpec, scenario: str, engine: str, device: str = "cpu"):
    """Output and gradients (inputs, then every parameter) of one cell on one engine; None if it declines."""
    x, kv, kwargs = _inputs(scenario, device)
    torch.manual_seed(3)
    att = Attention(spec, engine=engine).to(device).eval()
    x, kv = x.requires_grad_(), kv.requires_grad_()
    try:
        if scenario == "kv_decode":
            cache = KVCache()
            att(kv[:, :-1], cache=cache)  # prefill 8 tokens
            out = att(kv[:, -1:], cache=cache)  # decode the 9th
        else:
            out = att(x, kv, **kwargs)
    except ValueError as err:
        if "cannot run" in str(err):
            return None
        raise
    assert att.last_engine == engine
    (out * torch.linspace(-1, 1, out.numel(), device=device).view_as(out)).sum().backward()
    grads = [x.grad if x.grad is not None else torch.zeros(()), kv.grad]
    tensors = [out.detach()] + grads + [p.grad if p.grad is not None else torch.zeros(()) for p in att.parameters()]
    return [t.cpu() for t in tensors]


def mismatches(got: list, expected: list) -> list[str]:
    """Which tensors differ beyond ``RTOL`` (``out``, ``grad x``, ``grad kv``, ``grad <parameter i>``)."""
    names = ["out", "grad x", "grad kv"] + [f"grad parameter {i}" for i in range(len(expected) - 3)]
    floor = 1e-3 * max(float(t.norm()) for t in expected)
    bad = []
    for name, a, b in zip(names, got, expected):
        if not bool(torch.isfinite(a).all()) or float((a - b).norm()) > RTOL * max(float(b.norm()), floor):
            bad.append(f"{name}: |diff| {float((a - b).norm()):.2e} vs |ref| {float(b.norm()):.2e}")
    return bad


def cell_failures(axis: str, name: str, scenario: str, engines=None, device: str = "cpu") -> dict[str, list[str]]:
    """{engine: mismatches} for every engine that accepts the cell and differs from the reference engine."""
    spec = case_spec(axis, name, scenario)
    if spec is None:
        return {}
    expected = run_case(spec, scenario, "reference", device)
    failures = {}
    for engine in engines or ENGINE_ORDER:
        if engine == "reference":
            continue
        got = run_case(spec, scenario, engine, device)
        if got is not None and (bad := mismatches(got, expected)):
            failures[engine] = bad
    return failures


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("axis, name", CHOICES, ids=[f"{a}={n}" for a, n in CHOICES])
def test_every_engine_that_accepts_a_choice_computes_what_the_reference_does(axis, name, scenario):
    assert cell_failures(axis, name, scenario) == {}


@pytest.mark.cuda
def test_the_matrix_on_cuda():
    # The router's kind holds the device: CUDA problems get their own decisions (flex among them), checked alike.
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    failures = {
        (axis, name, scenario): got
        for axis, name in CHOICES
        for scenario in SCENARIOS
        if (got := cell_failures(axis, name, scenario, device="cuda"))
    }
    assert failures == {}


def test_the_matrix_runs_every_fast_engine_somewhere():
    # Guards against a matrix that checks nothing: each CPU engine is accepted by some cell.
    ran = set()
    for axis, name, scenario in (
        ("score", "dot", "causal"),
        ("normalizer", "linear", "causal"),
        ("normalizer", "sigmoid", "causal"),
        ("normalizer", "sparsemax", "none"),
        ("score", "additive", "causal"),
    ):
        for engine in ENGINE_ORDER:
            if run_case(case_spec(axis, name, scenario), scenario, engine) is not None:
                ran.add(engine)
    assert {"sdpa", "linear", "elementwise", "sparse", "chunked", "reference"} <= ran


# ---------------------------------------------------------------------------------------------- the matrix can fail
class _ForgetsTheBias(SDPAEngine):
    """A wrong fast path: SDPA that drops the float bias and the ALiBi slopes (the fault of issue 25)."""

    name = "forgets_bias"

    def __call__(self, plan, problem, need_weights=False):
        import dataclasses

        return super().__call__(plan, dataclasses.replace(problem, bias=None, alibi_slopes=None), need_weights)


def test_a_planted_wrong_fast_path_is_caught_in_exactly_the_cells_it_gets_wrong():
    register_engine(_ForgetsTheBias(), before="sdpa")
    try:
        caught = {
            scenario: cell_failures("score", "cosine", scenario, engines=["forgets_bias"]) for scenario in SCENARIOS
        }
    finally:
        unregister_engine("forgets_bias")
    wrong = {scenario for scenario, failures in caught.items() if failures}
    assert wrong == {"float_mask", "alibi"}, caught
    assert all(set(failures) == {"forgets_bias"} for failures in caught.values() if failures)


def _rowwise_failures(name: str, accepted=("none", "causal", "kv_decode"), axis: str = "normalizer") -> dict:
    caught = {scenario: cell_failures(axis, name, scenario, engines=["rowwise"]) for scenario in SCENARIOS}
    wrong = {scenario for scenario, failures in caught.items() if failures}
    assert wrong == set(accepted), caught  # the cells rowwise accepts (at most a causal mask)
    assert all(all(f.startswith("grad") for f in failures["rowwise"]) for failures in caught.values() if failures)
    return caught


@pytest.mark.parametrize(
    "name, accepted",
    [
        ("softpick", ("none", "causal", "kv_decode")),
        ("stick_breaking", ("causal", "kv_decode")),  # causal only: no cell without the mask
        ("topk", ("none", "causal", "kv_decode")),
    ],
)
def test_a_planted_wrong_row_kernel_backward_is_caught_on_the_rowwise_engine(monkeypatch, name, accepted):
    from axiomformer.engines import rowkernels

    right = rowkernels.KERNELS[name]

    class Wrong(right):  # a VJP 1% too large
        def vjp(self, t, u, g, delta, state, spare):
            return super().vjp(t, u, g, delta, state, spare).mul_(1.01)

    monkeypatch.setitem(rowkernels.KERNELS, name, Wrong)
    if name == "softpick":  # its tiles compute its VJP themselves
        from axiomformer.engines import rowtiles

        vjp = rowtiles.softpick_vjp
        monkeypatch.setattr(rowtiles, "softpick_vjp", lambda *args: vjp(*args).mul_(1.01))
    _rowwise_failures(name, accepted)


def test_a_planted_wrong_registry_vjp_is_caught_where_no_row_kernel_is_written(monkeypatch):
    from axiomformer.axes.normalizer import NORMALIZERS
    from axiomformer.engines import rowkernels

    monkeypatch.delitem(rowkernels.KERNELS, "softpick")  # a closed_vjp choice without a kernel: Generic
    choice = NORMALIZERS["softpick"]
    right = choice.extra["vjp"]
    monkeypatch.setitem(choice.extra, "vjp", lambda z, u, g, delta, **o: right(z, u, g, 0 * delta, **o))
    _rowwise_failures("softpick")


def test_a_planted_wrong_power_vjp_is_caught_on_the_rowwise_engine(monkeypatch):
    from axiomformer.axes.normalizer import NORMALIZERS

    choice = NORMALIZERS["power"]  # no row kernel of its own: Generic runs its registry vjp
    right = choice.extra["vjp"]
    monkeypatch.setitem(choice.extra, "vjp", lambda z, u, g, delta, **o: right(z, u, g, delta, **o).mul_(1.01))
    _rowwise_failures("power")


def test_a_planted_wrong_softcap_slope_is_caught_on_the_rowwise_engine(monkeypatch):
    from axiomformer.engines import rowwise

    right = rowwise._Row.logits

    def forgets_the_slope(self, q_c, k_c, diagonal, out, slope=None):
        t = right(self, q_c, k_c, diagonal, out, slope)
        if slope is not None:
            slope.fill_(1.0)  # d(c tanh(z / c))/dz taken as 1
        return t

    monkeypatch.setattr(rowwise._Row, "logits", forgets_the_slope)
    monkeypatch.setattr(rowwise._Row, "slope_", lambda self, t, diagonal: t.fill_(1.0))  # the late slope too
    _rowwise_failures("2.5", axis="softcap")  # softmax: the slope recomputed from t after the VJP
    for normalizer in ("softpick", "stick_breaking"):  # kernels that overwrite t: the slope kept in its own block
        spec = case_spec("normalizer", normalizer, "causal").relax("softcap=2.5")
        bad = mismatches(run_case(spec, "causal", "rowwise"), run_case(spec, "causal", "reference"))
        assert bad and all(b.startswith("grad") for b in bad), (normalizer, bad)


def _rowwise_normalizers() -> list[str]:
    from axiomformer.axes.normalizer import NORMALIZERS

    return [c.name for c in NORMALIZERS if "closed_vjp" in c.traits and "parametric" not in c.traits]


@pytest.mark.parametrize("scenario", ["none", "causal", "kv_decode"])
@pytest.mark.parametrize("extra", ["softcap=2.5", "scale=log_n", "softcap=2.5,scale=log_n"])
@pytest.mark.parametrize("normalizer", _rowwise_normalizers())
def test_every_row_kernel_with_a_cap_and_a_per_row_scale_computes_what_the_reference_does(normalizer, extra, scenario):
    # The matrix crosses each choice with the standard spec only; the rowwise engine composes the cap (and a per-row
    # scale folded into q) with every kernel, including the kernels that are not shift invariant.
    spec = case_spec("normalizer", normalizer, scenario)
    if spec is None:
        pytest.skip("defined only under a causal mask")
    spec = spec.relax(extra)
    got = run_case(spec, scenario, "rowwise")
    assert got is not None, "the rowwise engine declined"
    expected = run_case(spec, scenario, "reference")
    # A gradient that is 0 in exact arithmetic (the per-row scale's under power, whose weights are homogeneous of
    # degree 0 in the scores and so ignore any temperature) is float32 rounding on both engines: it is held to the
    # rounding of the largest gradient instead of to its own size.
    biggest = max(float(t.norm()) for t in expected)
    for i, want in enumerate(expected):
        if float(want.norm()) <= 1e-5 * biggest:
            assert float(got[i].norm()) <= 1e-5 * biggest, i
            got[i] = want
    assert mismatches(got, expected) == []
