"""The selected engine (``engines/selected.py``): a selection's kept keys gathered per query, against the mask form on
the reference engine in float64 -- outputs, gradients of the inputs and of every parameter, second-order gradients
-- at lengths that are no multiple of the block, with and without the causal rule and key padding, across chunk
sizes, and where ties keep many keys (the rows the engine pads apart). Also the index form of the selection rule
(``axes/select.top_entries``) against the mask form (``_top``) on ties, -inf and NaN, and which engine runs what."""

from __future__ import annotations

import pytest
import torch

from axiomformer import Attention, AttentionSpec, KVCache
from axiomformer.axes.select import SELECTS, _top, top_entries
from axiomformer.engines import ENGINES
from axiomformer.engines.problem import AttentionProblem
from axiomformer.engines.selected import Picked, SelectedEngine, picked_groups

DIM, HEADS = 16, 2
CHOICES = SELECTS.names()[1:]


def _pair(name: str, causal: bool, **fields) -> tuple[Attention, Attention]:
    """The same layer on the selected engine and on the reference engine (the mask form), float64."""
    spec = AttentionSpec.standard(DIM, HEADS, causal=causal).relax({"select": name, **fields})
    torch.manual_seed(0)
    fast = Attention(spec, engine="selected").double()
    slow = Attention(spec, engine="reference").double()
    slow.load_state_dict(fast.state_dict())
    return fast, slow


def _run(att: Attention, x: torch.Tensor, **kwargs) -> list[torch.Tensor]:
    """Output, then the gradients of the input and of every parameter (zeros where none flows)."""
    x = x.detach().requires_grad_()
    out = att(x, **kwargs)
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    params = list(att.parameters())
    grads = torch.autograd.grad((out * weights).sum(), [x, *params], allow_unused=True)
    return [out.detach()] + [torch.zeros(()) if g is None else g for g in grads]


def _assert_same(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("budget", [1, 300, 10**6], ids=["rows-of-1", "some-rows", "one-chunk"])
@pytest.mark.parametrize("padded", [False, True], ids=["no-mask", "key-padding"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("name", CHOICES)
def test_the_gathered_keys_give_the_mask_forms_output_and_gradients(monkeypatch, name, causal, padded, budget):
    monkeypatch.setitem(ENGINES, "selected", SelectedEngine(memory_budget=budget))
    fast, slow = _pair(name, causal, select_block=3, select_topk=2)
    for length in (1, 7, 13):  # 13 = 4 blocks of 3 and one key
        x = torch.randn(2, length, DIM, generator=torch.Generator().manual_seed(length), dtype=torch.float64)
        kwargs = {}
        if padded:
            keep = torch.ones(2, length, dtype=torch.bool)
            keep[1, length // 2 :] = False  # padded keys are never selected nor averaged
            kwargs["key_padding_mask"] = keep
        got = _run(fast, x, **kwargs)
        assert fast.last_engine == "selected"
        _assert_same(got, _run(slow, x, **kwargs))


@pytest.mark.parametrize("name", CHOICES)
def test_cross_attention_with_a_query_offset_and_the_kv_cache(name):
    fast, slow = _pair(name, True)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, DIM, generator=g, dtype=torch.float64)
    kv = torch.randn(2, 11, DIM, generator=g, dtype=torch.float64)
    _assert_same(_run(fast, x, key=kv, value=kv), _run(slow, x, key=kv, value=kv))
    with torch.no_grad():
        full = fast(kv)
        cache = KVCache()
        steps = torch.cat([fast(kv[:, t : t + 1], cache=cache) for t in range(kv.shape[1])], 1)
    assert fast.last_engine == "selected"
    torch.testing.assert_close(steps, full, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", CHOICES)
def test_second_order_gradients_are_the_mask_forms(name):
    spec = AttentionSpec.standard(DIM, HEADS, causal=True).relax(select=name)
    torch.manual_seed(0)
    fast = Attention(spec, engine="selected", double_backward=True).double()
    slow = Attention(spec, engine="reference", double_backward=True).double()
    slow.load_state_dict(fast.state_dict())
    x0 = torch.randn(2, 9, DIM, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    results = []
    for att in (fast, slow):
        x = x0.clone().requires_grad_()
        (g,) = torch.autograd.grad(att(x).pow(2).sum(), x, create_graph=True)
        results.append(torch.autograd.grad(g.pow(2).sum(), x)[0])
    assert fast.last_engine == "selected"
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=1e-10)


# ---------------------------------------------------------------------------------------------- ties
def _groups(att: Attention, q, k, v, budget: int = 10**6) -> list[Picked]:
    selection = att.select.selection(q, k, k.shape[-2] - q.shape[-2], att.spec.causal, None)
    problem = AttentionProblem(q, k, v, causal=att.spec.causal, q_offset=k.shape[-2] - q.shape[-2], select=selection)
    return picked_groups(att.plan, problem, tuple(q.shape[:2]), budget)


@pytest.mark.parametrize("every", [False, True], ids=["some-rows-tie", "every-row-ties"])
def test_rows_that_tie_at_the_kth_score_keep_every_tied_key(every):
    # The indexer score I = sum_h w_h relu(q W_h . k W_k) is exactly 0 for a key whose index logits are all negative
    # (1 in 16 at random); where the select_topk * select_block-th largest is such a 0 (every weight w_h(q_i)
    # negative), every key at 0 is kept with it. A few such rows go to padded groups of their own; zero keys make
    # every row tie, and then topk widens.
    fast, slow = _pair("indexer", True)
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(2, HEADS, 64, DIM // HEADS, generator=g, dtype=torch.float64) for _ in range(3))
    if every:
        k = torch.zeros_like(k)
    groups = _groups(fast, q, k, v)
    wide = [group for group in groups if not isinstance(group.rows, slice)]
    dense = max(group.flat.shape[-1] for group in groups if isinstance(group.rows, slice))
    if every:
        assert dense == 64 and not wide  # topk widened to every key
    else:
        assert wide and max(group.flat.shape[-1] for group in wide) > 4 and dense == 4
    q.requires_grad_()
    got, want = fast.core(q, k, v).out, slow.core(q, k, v).out
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    grads = [torch.autograd.grad((out * v.flip(-2)).sum(), q)[0] for out in (got, want)]
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=1e-12)


def test_blocks_that_all_tie_are_all_kept_as_the_mask_form_keeps_them():
    fast, slow = _pair("block_mean", True, select_topk=2)
    q = torch.ones(1, HEADS, 12, DIM // HEADS, dtype=torch.float64, requires_grad=True)
    k = torch.zeros(1, HEADS, 12, DIM // HEADS, dtype=torch.float64)  # every block mean is 0: all blocks tie
    v = torch.randn(1, HEADS, 12, DIM // HEADS, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    got, want = fast.core(q, k, v).out, slow.core(q, k, v).out
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), q)[0], torch.autograd.grad(want.sum(), q)[0])


@pytest.mark.parametrize("spread", [3, 1000], ids=["many-ties", "few-ties"])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_the_index_form_keeps_exactly_the_entries_of_the_mask_form(k, spread):
    g = torch.Generator().manual_seed(k)
    scores = torch.randint(-spread, spread + 1, (3, 40, 61), generator=g).double()
    scores[0, :5] = float("-inf")  # rows with no finite entry
    scores[1, 5:10, :58] = float("-inf")  # fewer finite entries than k
    scores[2, 10:12, 0] = float("inf")
    scores[2, 12, 3] = float("nan")
    scores[2, 13, 5:40:3] = float("nan")  # more NaN than k
    # 1 and 3 columns: fewer than k + 1; groups of 2 and 4 columns: the prefilter reads a few groups (a short last
    # one at 61 columns), 64: topk reads every column
    for cols, group in ((1, 64), (3, 64), (61, 64), (61, 2), (61, 4), (60, 4)):
        s = scores[..., :cols]
        kept = top_entries(s.clone(), k, group)
        mask = torch.zeros(s.shape, dtype=torch.bool)
        lead = torch.arange(s.shape[0] * s.shape[1]).view(s.shape[:2]).unsqueeze(-1).expand(kept.picks.shape)
        mask.view(-1, cols)[lead[kept.kept], kept.picks[kept.kept]] = True
        mask.view(-1, cols)[kept.rows, kept.cols] = True
        assert torch.equal(mask, _top(s, k)), (cols, group)


# ---------------------------------------------------------------------------------------------- routing
def test_auto_routes_a_selection_to_the_selected_engine_and_folds_it_where_another_engine_must_run():
    x = torch.randn(1, 9, DIM)
    att = Attention(AttentionSpec.standard(DIM, HEADS, causal=True).relax(select="nsa"))
    att(x)
    assert att.last_engine == "selected"
    _, weights = att(x, need_weights=True)  # the weights: the reference engine, on the mask form
    assert att.last_engine == "reference" and weights is not None
    counted = Attention(AttentionSpec.standard(DIM, HEADS, causal=True).relax(select="nsa", scale="log_n"))
    counted(x)  # log_n counts each query's visible (selected) keys from the mask before the engine runs
    assert counted.last_engine != "selected"
    with pytest.raises(ValueError, match="cannot run"):
        Attention(att.spec, engine="selected")(x, attn_mask=torch.randn(9, 9))  # a float mask: the mask form only
