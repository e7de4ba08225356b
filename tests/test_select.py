"""The select axis (issue 34): MoBA, DeepSeek-V3.2's indexer and NSA's selection, each against loops written from the
paper's rule (independently of ``axes/select.py``), through the KV cache, and the audit's ``single_score`` check."""

from __future__ import annotations

import math

import pytest
import torch

from axiomformer import Attention, AttentionSpec, KVCache
from axiomformer.audit import FunctionAdapter, run_audit
from axiomformer.axes.select import INDEX_DIM, INDEX_HEADS, SELECTS

DIM, HEADS, LEN, BLOCK, TOPK = 16, 2, 9, 2, 2
HD = DIM // HEADS
CHOICES = SELECTS.names()[1:]


def _layer(name: str, causal: bool) -> Attention:
    spec = AttentionSpec.standard(DIM, HEADS, causal=causal).relax(select=name, select_block=BLOCK, select_topk=TOPK)
    torch.manual_seed(0)
    return Attention(spec).double()


def _heads(x):
    return x.view(x.shape[0], x.shape[1], HEADS, HD).transpose(1, 2)


def _block_scores(att, name, q, k, i, n_blocks):
    """Selection score of each block for query vector q (head_dim,), keys k (k_len, head_dim) of one head."""
    out = []
    for b in range(n_blocks):
        keys = k[b * BLOCK : (b + 1) * BLOCK]
        if name == "block_mean":
            out.append(float(q @ keys.mean(0)))
        else:  # nsa: a linear map of the block's keys concatenated (zeros past the end)
            flat = torch.cat([keys.flatten(), torch.zeros(BLOCK * HD - keys.numel(), dtype=keys.dtype)])
            out.append(float(q @ att.select.compress(flat)))
    return out


def reference_keys(att: Attention, name: str, q, k, i: int, causal: bool) -> set[int]:
    """The keys query i keeps, from the paper's rule, one head."""
    n = k.shape[0]
    if name == "indexer":
        qi = att.select.index_q(q).view(INDEX_HEADS, INDEX_DIM)
        w = att.select.index_w(q)
        scores = [
            float(sum(w[h] * torch.relu(qi[h] @ att.select.index_k(k[j])) for h in range(INDEX_HEADS)))
            for j in range(n)
        ]
        candidates = [j for j in range(n) if not causal or j <= i]
        ranked = sorted((scores[j] for j in candidates), reverse=True)
        kth = ranked[min(TOPK * BLOCK, len(ranked)) - 1]
        return {j for j in candidates if scores[j] >= kth}
    n_blocks = math.ceil(n / BLOCK)
    own = i // BLOCK
    always = {own} | ({0, own - 1} & set(range(n_blocks)) if name == "nsa" else set())
    complete = [b for b in range(n_blocks) if (not causal or (b + 1) * BLOCK - 1 <= i) and b not in always]
    scores = _block_scores(att, name, q, k, i, n_blocks)
    rest = max(0, TOPK - len(always))
    ranked = sorted((scores[b] for b in complete), reverse=True)
    chosen = set(always)
    if rest and ranked:
        kth = ranked[min(rest, len(ranked)) - 1]
        chosen |= {b for b in complete if scores[b] >= kth}
    return {j for j in range(n) if j // BLOCK in chosen and (not causal or j <= i)}


def reference_layer(att: Attention, name: str, x, causal: bool):
    q, k, v = _heads(att.q_proj(x)), _heads(att.k_proj(x)), _heads(att.v_proj(x))
    out = torch.zeros_like(q)
    for b in range(x.shape[0]):
        for h in range(HEADS):
            for i in range(x.shape[1]):
                keys = sorted(reference_keys(att, name, q[b, h, i], k[b, h], i, causal))
                u = torch.softmax(k[b, h, keys] @ q[b, h, i] / math.sqrt(HD), 0)
                out[b, h, i] = u @ v[b, h, keys]
    return att.out_proj(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], DIM))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", CHOICES)
def test_each_selection_is_its_papers_rule_then_the_softmax_over_the_kept_keys(name, causal):
    att = _layer(name, causal)
    x = torch.randn(2, LEN, DIM, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(att(x), reference_layer(att, name, x, causal), rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", CHOICES)
def test_a_selection_decodes_through_the_cache_as_its_full_forward(name):
    att = _layer(name, True)
    x = torch.randn(2, LEN, DIM, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    with torch.no_grad():
        full = att(x)
        cache = KVCache()
        steps = torch.cat([att(x[:, t : t + 1], cache=cache) for t in range(LEN)], 1)
    torch.testing.assert_close(steps, full, rtol=0, atol=1e-8)


def test_blocks_tied_with_the_kth_score_are_all_kept_as_topk_keeps_them():
    att = _layer("block_mean", True)
    q = torch.ones(1, 1, 1, HD, dtype=torch.float64)
    k = torch.zeros(1, 1, 7, HD, dtype=torch.float64)  # every block mean is 0: blocks 0, 1, 2 tie, block 3 is own
    mask = att.select.mask(q, k, 6, True, None)
    assert mask[0, 0, 0].tolist() == [True] * 7  # top-1 of the three tied past blocks keeps all three


@pytest.mark.parametrize(
    "changes, words",
    [
        ("select=block_mean,select_block=1", "normalizer='topk'"),
        ("select=indexer,select_topk=0", "select_topk must be an int >= 1"),
        ("select=nsa,window=4", "window"),
        ("select=block_mean,select_block=16,max_len=8", "more keys than the longest sequence"),
        ("select=nsa,transport=decay,normalizer=none", "transport"),
    ],
)
def test_the_spec_refuses_selections_the_papers_do_not_define(changes, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        AttentionSpec.standard(DIM, HEADS, causal=True).relax(changes)


# ---------------------------------------------------------------------------------------------- the audit
def _sparse(select_by):
    """A one-head map: softmax of q.k over the 3 keys ranked highest by ``select_by(q, k)``, 0 elsewhere."""

    def run(q, k, v):
        s = q @ k.transpose(-2, -1)
        sel = select_by(q, k)
        kth = sel.topk(min(3, sel.shape[-1]), dim=-1).values[..., -1:]
        return torch.softmax(s.masked_fill(sel < kth, float("-inf")), -1) @ v

    return run


def test_single_score_passes_a_selection_by_the_weighting_score_and_blames_a_second_score_on_a4():
    one = run_audit(FunctionAdapter(_sparse(lambda q, k: q @ k.transpose(-2, -1)), "top-3 by q.k", dim=8))
    assert one["single_score"].passed is True
    other = run_audit(FunctionAdapter(_sparse(lambda q, k: q @ k.flip(-1).transpose(-2, -1)), "second score", dim=8))
    check = other["single_score"]
    assert check.passed is False and check.candidates[0] == "A4"
    assert run_audit("spec:standard")["single_score"].passed is None  # nothing selected: cannot tell
