"""The rowwise engine's own numerics (``engines/rowwise.py``, ``engines/rowkernels.py``) beyond the generated engine
matrix: caps of any size keep float32 accuracy, top-k never depends on how an engine breaks ties, and the float64
results equal the reference engine's. Each property has a planted wrong version that the same check catches."""

from __future__ import annotations

import math

import pytest
import torch

from axiomformer import Attention, AttentionSpec
from axiomformer.engines import attend, rowkernels, rowwise

HEADS, HEAD_DIM, LEN = 2, 16, 64


def _float32_error(normalizer: str, cap: float, causal: bool) -> float:
    """Relative error (norm) of the rowwise engine's float32 output against the reference engine in float64."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, HEADS, LEN, HEAD_DIM, dtype=torch.float64, generator=g) for _ in range(3))
    spec = AttentionSpec.standard(HEADS * HEAD_DIM, HEADS, causal=causal).relax(normalizer=normalizer, softcap=cap)
    truth = attend(q, k, v, spec=spec, engine="reference").out
    got = attend(q.float(), k.float(), v.float(), spec=spec, engine="rowwise").out
    return float((got.double() - truth).norm() / truth.norm())


CASES = [("softmax", False), ("softpick", False), ("stick_breaking", True), ("topk", True)]


@pytest.mark.parametrize("cap", [2.5, 50.0, 1e3, 1e6])
@pytest.mark.parametrize("normalizer, causal", CASES)
def test_a_cap_of_any_size_keeps_float32_accuracy(normalizer, causal, cap):
    # 2c sigmoid(2z/c) - c errs by about c * 2^-24 in every logit; it is used up to SIGMOID_CAP_MAX = 64 (4e-6 at
    # most), tanh above, whose error is relative to the logit.
    assert _float32_error(normalizer, cap, causal) < 1e-5


def test_a_large_cap_through_sigmoid_is_caught(monkeypatch):
    monkeypatch.setattr(rowwise, "SIGMOID_CAP_MAX", math.inf)
    assert _float32_error("softmax", 1e6, False) > 1e-3


def _tied_layer(seed: int, engine: str = "auto") -> tuple[Attention, torch.Tensor]:
    # Logits capped at 0.5 saturate: c tanh(z/c) rounds to c exactly, so several keys tie at the k-th score.
    spec = AttentionSpec.standard(16, 2, causal=True).relax(normalizer="topk", topk=4, softcap=0.5, scale="log_n")
    torch.manual_seed(seed)
    att = Attention(spec, engine=engine).double()
    with torch.no_grad():
        for p in att.parameters():
            p.add_(0.5 * torch.randn_like(p))
    return att, torch.randn(2, 11, 16, dtype=torch.float64)


def _tie_gap(seed: int) -> float:
    att, x = _tied_layer(seed, "rowwise")
    ref = Attention(att.spec, engine="reference").double()
    ref.load_state_dict(att.state_dict())
    with torch.no_grad():
        return float((att(x) - ref(x)).abs().max())


@pytest.mark.parametrize("seed", range(3))
def test_topk_with_tied_scores_is_the_same_on_every_engine(seed):
    assert _tie_gap(seed) < 1e-12


def test_topk_keeps_every_key_tied_with_the_kth_score():
    s = torch.tensor([[1.0, 3.0, 2.0, 3.0, 3.0, 0.0]])
    u = rowkernels.TopK(None, {"k": 2}).weights(s.clone(), None, lambda i: torch.empty_like(s))[0]
    expected = torch.tensor([[0.0, 1.0, 0.0, 1.0, 1.0, 0.0]]) / 3
    torch.testing.assert_close(u, expected)


def test_a_topk_that_breaks_ties_by_position_is_caught(monkeypatch):
    class FirstK(rowkernels.Softmax):  # exactly k keys: ties broken the way torch.topk happens to
        selects = True

        def weights(self, t, diagonal, spare):
            top, index = t.topk(min(int(self.options["k"]), t.shape[-1]), dim=-1)
            return spare(0).zero_().scatter_(-1, index, torch.softmax(top, dim=-1)), None

    monkeypatch.setitem(rowkernels.KERNELS, "topk", FirstK)
    assert max(_tie_gap(seed) for seed in range(3)) > 1e-3


def _saturated_choice(engine: str) -> float:
    """The value of the key topk = 1 keeps (values 0 and 1).

    z = 8.8 and 9.5 under a cap of 1: tanh keeps them apart in float32 (1 - 6e-8 and 1), 2 sigmoid(2z) - 1 does
    not (both 1); topk = 1 must pick the second key, whose value is 1.
    """
    spec = AttentionSpec.standard(4, 1).relax(normalizer="topk", topk=1, softcap=1.0)
    q = torch.zeros(1, 1, 1, 4)
    q[..., 0] = 2.0  # sqrt(head_dim): z_j = k_j[0]
    k = torch.zeros(1, 1, 2, 4)
    k[0, 0, :, 0] = torch.tensor([8.8, 9.5])
    v = torch.tensor([0.0, 1.0]).view(1, 1, 2, 1).expand(1, 1, 2, 4).contiguous()
    return float(attend(q, k, v, spec=spec, engine=engine).out[0, 0, 0, 0])


@pytest.mark.parametrize("engine", ["reference", "rowwise"])
def test_topk_ranks_logits_a_float32_cap_keeps_apart(engine):
    assert _saturated_choice(engine) == 1.0


def test_topk_capped_through_sigmoid_is_caught(monkeypatch):
    monkeypatch.setattr(rowkernels.TopK, "selects", False)
    assert _saturated_choice("rowwise") == 0.5  # both keys round to the cap and tie


def _softpick_small_logit_error(engine: str) -> float:
    """Largest relative error (norm) of softpick's float32 output and query gradient at logits ~1e-4, against the
    formula in float64 under autograd."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, HEADS, 16, HEAD_DIM, dtype=torch.float64, generator=g) * 1e-4
    k, v = (torch.randn(1, HEADS, 16, HEAD_DIM, dtype=torch.float64, generator=g) for _ in range(2))
    q64 = q.clone().requires_grad_()
    e = torch.expm1(q64 @ k.transpose(-2, -1) / math.sqrt(HEAD_DIM))
    truth = (e.clamp(min=0) / (e.abs().sum(-1, keepdim=True) + 1e-6)) @ v
    (truth_grad,) = torch.autograd.grad(truth.sum(), q64)
    spec = AttentionSpec.standard(HEADS * HEAD_DIM, HEADS).relax(normalizer="softpick")
    q32 = q.float().requires_grad_()
    got = attend(q32, k.float(), v.float(), spec=spec, engine=engine).out
    (grad,) = torch.autograd.grad(got.sum(), q32)
    return max(
        float((got.double() - truth).norm() / truth.norm()),
        float((grad.double() - truth_grad).norm() / truth_grad.norm()),
    )


@pytest.mark.parametrize("engine", ["reference", "rowwise"])
def test_softpick_keeps_float32_accuracy_at_small_logits(engine):
    # e^s - 1 by subtraction loses about 1e-4 of the result at s ~ 1e-4 in float32; expm1 does not
    assert _softpick_small_logit_error(engine) < 1e-5


def test_softpick_by_subtraction_is_caught(monkeypatch):
    from axiomformer.axes import normalizer

    def by_subtraction(s):
        m = s.amax(dim=-1, keepdim=True).clamp_min(0.0)
        a = torch.exp(s - m) - torch.exp(-m)
        return torch.where(torch.isneginf(s), torch.zeros_like(a), a), torch.exp(-m)

    monkeypatch.setattr(normalizer, "softpick_terms", by_subtraction)
    assert _softpick_small_logit_error("reference") > 1e-5


# ---------------------------------------------------------------------------------------------- top-k's selected path
def _topk_grads(engine: str, causal: bool, duplicate: bool = False) -> list[torch.Tensor]:
    """Output and the q, k, v gradients of uncapped top-k (k = 4) in float64 on ``engine``."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, HEADS, LEN, HEAD_DIM, dtype=torch.float64, generator=g) for _ in range(3))
    if duplicate:  # every key twice: the 4th and 5th largest logits of a row tie
        k = k[:, :, : LEN // 2].repeat_interleave(2, dim=2)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    spec = AttentionSpec.standard(HEADS * HEAD_DIM, HEADS, causal=causal).relax(normalizer="topk", topk=4)
    out = attend(q, k, v, spec=spec, engine=engine).out
    out.backward(torch.randn(out.shape, dtype=out.dtype, generator=g))
    return [out.detach(), q.grad, k.grad, v.grad]


@pytest.fixture
def selected(monkeypatch):
    """Counts the chunks top-k computed on its selected keys and those that fell back to the dense path."""
    taken = {"selected": 0, "dense": 0}
    real = rowwise._Selected.find

    def find(*args):
        found = real(*args)
        taken["dense" if found is None else "selected"] += 1
        return found

    monkeypatch.setattr(rowwise._Selected, "find", staticmethod(find))
    return taken


@pytest.mark.parametrize("causal", [False, True])
def test_topk_on_its_selected_keys_equals_the_reference_forward_and_backward(causal, selected):
    for got, want in zip(_topk_grads("rowwise", causal), _topk_grads("reference", causal)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert selected["selected"] > 0 and selected["dense"] == 0


def test_topk_with_a_tie_at_the_kth_key_takes_the_dense_path_and_keeps_the_tied_keys(selected):
    for got, want in zip(_topk_grads("rowwise", True, True), _topk_grads("reference", True, True)):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    assert selected["dense"] > 0


def test_a_wrong_backward_on_the_selected_keys_is_caught(monkeypatch, selected):
    real = rowwise._Selected.backward

    def wrong(self, q_c, k, v, d_out, grads):
        return real(self, q_c, k, v, d_out * 1.01, grads)

    monkeypatch.setattr(rowwise._Selected, "backward", wrong)
    got, want = _topk_grads("rowwise", True), _topk_grads("reference", True)
    torch.testing.assert_close(got[0], want[0], rtol=1e-10, atol=1e-12)
    assert not torch.allclose(got[1], want[1], rtol=1e-4)


# ---------------------------------------------------------------------------------------------- stick-breaking's band
def _stick(engine: str, poison: bool = False) -> list[torch.Tensor]:
    """Output and q, k, v gradients of causal stick-breaking at L = 384 in float32 (logits of std about 3, so the
    stick is used up within a few dozen keys); ``poison``: a NaN value at key 0, long before any band."""
    g = torch.Generator().manual_seed(7)
    n = 384
    q, k, v = (torch.randn(1, HEADS, n, HEAD_DIM, generator=g) for _ in range(3))
    q = q * 3.0
    if poison:
        v[0, 0, 0, 0] = float("nan")
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    spec = AttentionSpec.standard(HEADS * HEAD_DIM, HEADS, causal=True).relax(normalizer="stick_breaking")
    out = attend(q, k, v, spec=spec, engine=engine).out
    out.backward(torch.randn(out.shape, generator=g))
    return [out.detach(), q.grad, k.grad, v.grad]


@pytest.fixture
def bands(monkeypatch):
    """Chunks of 32 queries, bands from 16 keys; records the first key each chunk read."""
    from axiomformer.engines import ENGINES

    monkeypatch.setitem(ENGINES, "rowwise", rowwise.RowwiseEngine(memory_budget=HEADS * 384 * 32))
    monkeypatch.setattr(rowwise, "BAND_START", 16)
    firsts = []
    real = rowwise._band

    def band(*args):
        found = real(*args)
        firsts.append(found[0])
        return found

    monkeypatch.setattr(rowwise, "_band", band)
    return firsts


def test_stick_breaking_on_its_band_equals_the_whole_row(bands, monkeypatch):
    banded = _stick("rowwise")
    assert max(bands) > 0  # later chunks skipped the keys whose stick was used up
    bands.clear()
    monkeypatch.setattr(rowwise, "_finite_logits", lambda *tensors: False)  # the whole rows
    whole = _stick("rowwise")
    assert not bands
    for got, want in zip(banded, whole):
        torch.testing.assert_close(got, want, rtol=0, atol=0)  # bit for bit
    for got, want in zip(banded, _stick("reference")):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_stick_breaking_flipped_in_pieces_of_queries_equals_whole_blocks(monkeypatch):
    whole = _stick("rowwise")  # blocks this small are flipped whole
    monkeypatch.setattr(rowkernels, "WHOLE_BLOCK", 0)  # every block PART queries at a time
    for got, want in zip(_stick("rowwise"), whole):
        torch.testing.assert_close(got, want, rtol=0, atol=0)  # bit for bit


def test_a_nan_before_the_band_reaches_the_output_as_on_the_reference(bands):
    got, want = _stick("rowwise", poison=True), _stick("reference", poison=True)
    # (the router may take the NaN out of v first: what matters is the same output)
    torch.testing.assert_close(got[0], want[0], equal_nan=True)
    assert bool(torch.isnan(got[0][0, 0, -1]).all())


# ---------------------------------------------------------------------------------------------- softmax in tiles
def _tiled(
    engine: str, causal: bool, cap: float, offset_keys: int = 0, normalizer: str = "softmax"
) -> list[torch.Tensor]:
    """Output and input gradients (float64) of ``normalizer`` with ``cap`` on ``engine``; ``offset_keys`` more keys
    than queries (a KV-cache decode: the queries are the last ones)."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, HEADS, 24, HEAD_DIM, dtype=torch.float64, generator=g).requires_grad_()
    k, v = (
        torch.randn(2, HEADS, 24 + offset_keys, HEAD_DIM, dtype=torch.float64, generator=g).requires_grad_()
        for _ in range(2)
    )
    spec = AttentionSpec.standard(HEADS * HEAD_DIM, HEADS, causal=causal).relax(softcap=cap, normalizer=normalizer)
    out = attend(q, k, v, spec=spec, engine=engine).out
    out.backward(torch.randn(out.shape, dtype=torch.float64, generator=g))
    return [out.detach(), q.grad, k.grad, v.grad]


@pytest.fixture
def small_tiles(monkeypatch):
    """Tiles of one query x 5 keys (2 x 2 heads): every row's softmax runs over several tiles."""
    from axiomformer.engines import ENGINES

    monkeypatch.setitem(ENGINES, "rowwise", rowwise.RowwiseEngine(memory_budget=2 * HEADS * 5))


@pytest.mark.parametrize("normalizer", ["softmax", "softpick"])
@pytest.mark.parametrize("causal, offset_keys", [(False, 0), (True, 0), (True, 7)])
@pytest.mark.parametrize("cap", [0.0, 2.5, 100.0])
def test_rows_in_tiles_of_keys_equal_the_reference_forward_and_backward(
    small_tiles, causal, offset_keys, cap, normalizer
):
    from axiomformer.engines.blocks import tile_shape

    assert tile_shape(2 * HEADS, 24, 2 * HEADS * 5) == (1, 5)
    args = (causal, cap, offset_keys, normalizer)
    got, want = _tiled("rowwise", *args), _tiled("reference", *args)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("normalizer", ["softmax", "softpick"])
def test_a_planted_wrong_rescaling_of_the_online_rows_is_caught(small_tiles, monkeypatch, normalizer):
    from axiomformer.engines import rowtiles

    monkeypatch.setattr(rowtiles, "rescale", lambda m, m_new: torch.ones_like(m))  # the old maximum kept
    got, want = _tiled("rowwise", True, 0.0, 0, normalizer), _tiled("reference", True, 0.0, 0, normalizer)
    assert (got[0] - want[0]).abs().max() > 1e-3  # the output, and through the saved lse every gradient
    assert all((a - b).abs().max() > 1e-6 for a, b in zip(got[1:], want[1:]))


@pytest.mark.parametrize("cap, fixed", [(2.5, True), (30.0, True), (41.0, False), (100.0, False)])
def test_a_cap_of_narrow_range_shifts_by_its_bound_and_keeps_float32_accuracy(small_tiles, cap, fixed):
    from axiomformer.engines import rowtiles

    spec = AttentionSpec.standard(HEADS * HEAD_DIM, HEADS, causal=True).relax(softcap=cap)
    row = rowwise._Row(Attention(spec).plan)
    assert (rowtiles.lowest_shift(row, torch.float32) is not None) == fixed  # 2c > 80: the running maximum
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, HEADS, 24, HEAD_DIM, dtype=torch.float64, generator=g) for _ in range(3))
    q = q * 8  # logits near both ends of the cap: some rows' weights span e^-2c
    truth = attend(q, k, v, spec=spec, engine="reference").out
    got = attend(q.float(), k.float(), v.float(), spec=spec, engine="rowwise").out
    assert float((got.double() - truth).norm() / truth.norm()) < 1e-5


def test_a_planted_fixed_shift_beyond_float32_range_is_caught(small_tiles, monkeypatch):
    from axiomformer.engines import rowtiles

    monkeypatch.setitem(rowtiles.FIXED_SHIFT_SPAN, torch.float32, 1e9)  # e^-200 underflows to 0 in float32
    spec = AttentionSpec.standard(HEADS * HEAD_DIM, HEADS, causal=True).relax(softcap=100.0)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, HEADS, 24, HEAD_DIM, generator=g) for _ in range(3))
    k = k - 40 * q.mean(-2, keepdim=True)  # rows whose every logit sits far below the cap's top
    got = attend(q * 8, k, v, spec=spec, engine="rowwise").out
    assert not bool(torch.isfinite(got).all())


def test_a_first_tile_of_overflowed_logits_gives_the_reference_softmax(small_tiles):
    # finite inputs whose products overflow to -inf in float32 for keys 0 and 1: the first tiles of every row hold
    # only -inf logits, and the running maximum must not turn them into NaN
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, HEADS, 4, HEAD_DIM, generator=g).abs() + 0.5
    k, v = (torch.randn(1, HEADS, 12, HEAD_DIM, generator=g) for _ in range(2))
    q[..., 0] = 1e20
    k[:, :, :2, :] = -1e20
    k[:, :, 2:, 0] = 0.0
    spec = AttentionSpec.standard(HEADS * HEAD_DIM, HEADS, causal=False)
    got = attend(q, k, v, spec=spec, engine="rowwise").out
    want = attend(q, k, v, spec=spec, engine="reference").out
    assert bool(torch.isfinite(want).all())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("value_size", [1.0, 1e-4, 1e-6])
def test_rows_at_the_bottom_of_a_caps_range_keep_float32_accuracy_with_small_values(value_size):
    # softcap 40: every logit of a row near -40; a fixed shift by the cap's top (80 above) would leave the weights at
    # e^-80 and their products with small values subnormal (or 0 with denormals flushed)
    g = torch.Generator().manual_seed(0)
    k = torch.randn(1, HEADS, 16, HEAD_DIM, generator=g)
    sign = k.mean(2, keepdim=True).sign()
    q = (-sign * 300 * torch.ones(1, HEADS, 4, HEAD_DIM)).contiguous()
    k = sign * (1 + 0.1 * torch.rand(1, HEADS, 16, HEAD_DIM, generator=g))
    v = torch.randn(1, HEADS, 16, HEAD_DIM, generator=g) * value_size
    spec = AttentionSpec.standard(HEADS * HEAD_DIM, HEADS, causal=False).relax(softcap=40.0)
    want = attend(q.double(), k.double(), v.double(), spec=spec, engine="reference").out
    if not torch.set_flush_denormal(True):  # as the command line sets it
        pytest.skip("this CPU cannot flush denormals")
    try:
        got = attend(q, k, v, spec=spec, engine="rowwise").out
    finally:
        torch.set_flush_denormal(False)
    assert float((got.double() - want).abs().max() / want.abs().max()) < 1e-5


@pytest.mark.parametrize("normalizer", ["sigmoid", "sparsemax"])
def test_a_batch_of_one_query_broadcast_against_more_keys_runs_on_its_engine(normalizer):
    spec = AttentionSpec.standard(2 * 8, 2, causal=True).relax(normalizer=normalizer)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 6, 8, dtype=torch.float64, generator=g).requires_grad_()
    k, v = (torch.randn(2, 2, 6, 8, dtype=torch.float64, generator=g).requires_grad_() for _ in range(2))
    want = attend(q, k, v, spec=spec, engine="reference").out
    got = attend(q, k, v, spec=spec)
    assert got.engine in ("elementwise", "sparse")
    torch.testing.assert_close(got.out, want, rtol=0, atol=1e-12)
    grads = torch.autograd.grad(got.out.sum(), (q, k, v))
    for a, b in zip(grads, torch.autograd.grad(want.sum(), (q, k, v))):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
