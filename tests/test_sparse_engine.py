"""The sort-free sparsemax / 1.5-entmax engine (``sparse``): thresholds against the ``entmax`` package, the
engine against the reference engine forward and backward, and float64 gradcheck of the hand-written backward."""

from __future__ import annotations

import pytest
import torch
from entmax import entmax15, sparsemax

from axiomformer import AttentionSpec
from axiomformer.engines import ENGINES, AttentionProblem, engine_accepts, problem_kind, sparse
from axiomformer.engines.chunked import ChunkedEngine
from test_engines import BATCH, DIM, HEADS, K_LEN, Q_LEN, _assert_close, _run

KINDS = sparse.KINDS


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch):
    # 16 queries per chunk, so 37 queries leave a partial chunk and a causal chunk ends mid-diagonal.
    monkeypatch.setitem(ENGINES, "chunked", ChunkedEngine(query_chunk=16, key_chunk=16))
    monkeypatch.delenv("AXIOMFORMER_ENGINE", raising=False)


@pytest.fixture
def calls(monkeypatch):
    """Records every call of the sparse autograd function (proof that the fast path ran)."""
    record = []
    real = sparse.SparseAttention.apply
    monkeypatch.setattr(sparse.SparseAttention, "apply", staticmethod(lambda *a: record.append(a[4]) or real(*a)))
    return record


@pytest.fixture(params=["dense", "support"])
def path(request, monkeypatch):
    """Every chunk on the dense products (SUPPORT_BELOW = 0) or on the support path (SUPPORT_BELOW > 1); returns
    how many chunks took the support path."""
    monkeypatch.setattr(sparse, "SUPPORT_BELOW", 0.0 if request.param == "dense" else 2.0)
    taken = []
    real = sparse._Support.find.__func__

    def find(cls, *args):
        found = real(cls, *args)
        taken.extend([] if found is None else [1])
        return found

    monkeypatch.setattr(sparse._Support, "find", classmethod(find))
    return request.param, taken


# ---------------------------------------------------------------------------------------------- thresholds
def _rows(dtype: torch.dtype) -> list[torch.Tensor]:
    """Blocks of rows (r, n): random at several scales, ties, all-equal, peaked, masked (-inf), length 1, long."""
    g = torch.Generator().manual_seed(5)
    blocks = [torch.randn(64, n, generator=g) * sd for n in (2, 7, 40, 300) for sd in (0.05, 1.0, 6.0)]
    blocks.append(torch.randn(8, 3000, generator=g))  # long rows: the sketch path
    blocks.append(torch.randn(8, 3000, generator=g) * 0.02)  # long and flat: large supports
    ties = torch.randint(0, 3, (32, 50), generator=g).float()  # many exact ties
    ties[0] = 1.0  # an all-equal row
    ties[1, :] = 0.0
    ties[1, 7] = 2.0  # 2.0 = max, 0.0 = max - 2: boundary
    blocks.append(ties)
    peaked = torch.randn(16, 100, generator=g)
    peaked[:, 3] += 50.0  # one dominant entry
    blocks.append(peaked)
    masked = torch.randn(16, 60, generator=g) * 2
    masked[:, 10:] = float("-inf")  # masked keys
    masked[0, 1:] = float("-inf")  # a single visible key
    blocks.append(masked)
    blocks.append(torch.randn(16, 1, generator=g))  # length-1 rows
    return [b.to(dtype) for b in blocks]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_thresholds_equal_the_entmax_package(dtype):
    atol = 1e-6 if dtype == torch.float32 else 1e-12
    for z in _rows(dtype):
        tau = sparse.sparsemax_threshold(z)
        torch.testing.assert_close(torch.relu(z - tau), sparsemax(z, dim=-1), rtol=0, atol=atol)
        tau = sparse.entmax15_threshold(z / 2)
        torch.testing.assert_close(torch.relu(z / 2 - tau) ** 2, entmax15(z, dim=-1), rtol=0, atol=atol)


@pytest.mark.parametrize("kind", KINDS)
def test_rows_left_open_by_the_iteration_cap_get_the_sort_based_threshold(kind, monkeypatch):
    monkeypatch.setattr(sparse, "MAX_ITERATIONS", 1)
    left_open = []
    real = sparse._fallback
    monkeypatch.setattr(sparse, "_fallback", lambda x, kind: left_open.append(x.shape[0]) or real(x, kind))
    z = torch.randn(64, 500) * 0.1  # flat rows: one pass settles few of them
    x = z if kind == "sparsemax" else z / 2
    tau = sparse._threshold(x, kind)
    assert left_open and 0 < left_open[0] <= 64
    if kind == "sparsemax":
        torch.testing.assert_close(torch.relu(z - tau), sparsemax(z, dim=-1), rtol=0, atol=1e-6)
    else:
        torch.testing.assert_close(torch.relu(x - tau) ** 2, entmax15(z, dim=-1), rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------------------------- the engine
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale", ["inv_sqrt_d", "learned"])
def test_sparse_path_matches_reference_forward_and_backward(kind, causal, scale, calls, path):
    spec = AttentionSpec.standard(DIM, HEADS, causal=causal).relax(normalizer=kind, scale=scale)
    g = torch.Generator().manual_seed(11)
    for k_len in (Q_LEN, K_LEN):  # K_LEN > Q_LEN: bottom-right aligned causal cross attention
        for spread in (1.0, 4.0):  # flat rows (wide supports) and peaked ones (a few keys)
            x = torch.randn(BATCH, Q_LEN, DIM, generator=g) * spread
            kv = torch.randn(BATCH, k_len, DIM, generator=g) * spread
            calls.clear()
            fast = _run(spec, "sparse", x, kv)
            assert calls == [kind], "the sparse path did not run"
            _assert_close(fast, _run(spec, "reference", x, kv))  # every gradient, the learned scale's too
    assert bool(path[1]) == (path[0] == "support")  # every chunk asks; only the support path finds one


@pytest.mark.parametrize("kind", KINDS)
def test_masks_the_sparse_path_cannot_take_go_to_the_generic_path(kind, calls):
    spec = AttentionSpec.standard(DIM, HEADS, causal=True).relax(normalizer=kind)
    g = torch.Generator().manual_seed(2)
    x, kv = torch.randn(BATCH, Q_LEN, DIM, generator=g), torch.randn(BATCH, 20, DIM, generator=g)
    keep = torch.ones(BATCH, Q_LEN, dtype=torch.bool)
    keep[0, -3:] = False
    # Causal with fewer keys than queries (the first queries see no key) and a key padding mask.
    for args, kwargs in (((x, kv), {}), ((x, x), {"key_padding_mask": keep})):
        fast = _run(spec, "auto", *args, **kwargs)
        assert fast[2] != "sparse"
        _assert_close(fast, _run(spec, "reference", *args, **kwargs))
    assert calls == []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("causal, q_len, k_len", [(False, 5, 7), (True, 5, 5), (True, 4, 9)])
def test_gradcheck_float64(kind, causal, q_len, k_len, path):
    g = torch.Generator().manual_seed(3)
    q = (torch.randn(2, 2, q_len, 3, generator=g, dtype=torch.float64) * 2).requires_grad_()
    k = (torch.randn(2, 2, k_len, 3, generator=g, dtype=torch.float64) * 2).requires_grad_()
    v = torch.randn(2, 2, k_len, 4, generator=g, dtype=torch.float64).requires_grad_()
    scale = torch.tensor([0.7, 1.3], dtype=torch.float64).view(1, 2, 1, 1).requires_grad_()

    def fn(q, k, v, scale):
        return sparse.SparseAttention.apply(q, k, v, scale, kind, causal, k_len - q_len, 2)

    out = fn(q, k, v, scale)
    assert bool((out != 0).any())
    assert torch.autograd.gradcheck(fn, (q, k, v, scale), eps=1e-6, atol=1e-6)
    assert torch.autograd.gradcheck(lambda q, k, v: fn(q, k, v, 0.8), (q, k, v), eps=1e-6, atol=1e-6)
    assert bool(path[1]) == (path[0] == "support")


@pytest.mark.parametrize("kind", KINDS)
def test_forward_saves_no_score_block_and_matches_reference_weights(kind):
    # Tensors kept for the backward pass: q, k, v and per-row thresholds and statistics only.
    spec = AttentionSpec.standard(DIM, HEADS, causal=True).relax(normalizer=kind)
    from axiomformer import Attention

    att = Attention(spec, engine="sparse")
    x = torch.randn(BATCH, Q_LEN, DIM, requires_grad=True)
    sizes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: sizes.append(t.numel()) or t, lambda t: t):
        att(x)
    assert max(sizes) <= BATCH * Q_LEN * DIM


@pytest.mark.parametrize("kind", KINDS)
def test_nan_in_a_key_poisons_exactly_the_queries_that_see_it(kind, calls, path):
    spec = AttentionSpec.standard(DIM, HEADS, causal=True).relax(normalizer=kind)
    g = torch.Generator().manual_seed(4)
    x, kv = torch.randn(BATCH, Q_LEN, DIM, generator=g), torch.randn(BATCH, K_LEN, DIM, generator=g)
    kv[0, 50] = float("nan")  # bottom-right causal: queries 50 - 33 = 17.. see key 50
    out, grads, _ = _run(spec, "sparse", x, kv)
    assert calls == [kind]
    expected, _, _ = _run(spec, "reference", x, kv)
    assert bool(torch.isnan(out[0, 17:]).all()) and bool(torch.isfinite(out[0, :17]).all())
    assert bool(torch.isfinite(out[1]).all())
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5, equal_nan=True)
    assert bool(torch.isfinite(grads[0]).all())  # the queries' gradient


def _accepts(att, problem) -> bool:
    return engine_accepts(ENGINES["sparse"], att.plan, problem_kind(att.plan, problem))


def test_applies_only_where_the_closed_form_is_exact():
    from axiomformer import Attention

    q = torch.randn(1, 2, 4, 8)
    k = torch.randn(1, 2, 6, 8)
    att = Attention(AttentionSpec.standard(DIM, HEADS, causal=True).relax(normalizer="entmax15"))
    assert _accepts(att, AttentionProblem(q=q, k=k, v=k, causal=True, q_offset=2))
    assert _accepts(att, AttentionProblem(q=q.double(), k=k.double(), v=k.double()))
    assert not _accepts(att, AttentionProblem(q=q, k=k, v=k, causal=True, q_offset=-1))
    assert not _accepts(att, AttentionProblem(q=q, k=k, v=k, mask=torch.ones(6, dtype=torch.bool)))
    assert not _accepts(att, AttentionProblem(q=q, k=k, v=k, bias=torch.zeros(4, 6)))
    assert not _accepts(att, AttentionProblem(q=q, k=k, v=k, dropout_p=0.1, training=True))
    assert not _accepts(att, AttentionProblem(q=q.half(), k=k.half(), v=k.half()))
    for relax in ("normalizer=softmax", "normalizer=entmax15,A4=additive", "normalizer=sparsemax,A2=joint"):
        other = Attention(AttentionSpec.standard(DIM, HEADS).relax(relax))
        assert not _accepts(other, AttentionProblem(q=q, k=k, v=k))


@pytest.mark.parametrize("kind", KINDS)
def test_weights_sum_to_one_when_every_score_is_large(kind):
    # Scores 3000 + N(0, 0.01): without shifting each row by its maximum, ulp(3000) = 2.4e-4 swamps the weights.
    g = torch.Generator().manual_seed(9)
    n, d = 300, 8
    q, k = torch.randn(1, n, d, generator=g) * 0.01, torch.randn(1, n, d, generator=g) * 0.01
    q[..., 0], k[..., 0] = 60.0, 50.0
    ones = torch.ones(1, n, 1)
    for causal in (False, True):
        total = sparse.SparseAttention.apply(q, k, ones, 1.0, kind, causal, 0, 64)  # sum_j p_ij per query
        torch.testing.assert_close(total, torch.ones_like(total), atol=1e-4, rtol=0)
