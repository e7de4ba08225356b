"""The transports against code no one here wrote: the pure-PyTorch naive references of ``fla-core`` (the
flash-linear-attention package, optional extra ``fla``), loaded file by file so that no Triton kernel is imported.

Each layer's output is compared with the output projection of fla's reference on the layer's own q, k, v and gates
(for a selection: on the layer's own index scores, or the blocks it selected). fla's references compute in float32
(they cast their inputs), so the comparison holds to float32 precision. Skipped when fla-core is not installed
(``pip install "axiomformer[fla]"``). Covered: gated_delta_rule (``transport=decay_householder``), kda
(``diag_decay_householder``), simple_gla (``decay``, Mamba-2's SSD), path_attn (``householder``), dsa
(``select=indexer``), nsa's selected-block attention (``select=nsa`` given its blocks); and two older mixers fla
covers, stickbreaking_attn (``normalizer=stick_breaking`` with its authors' conventions, in float64) and
forgetting_attn (``position=forget``). MoBA has no naive reference in fla-core 0.6 (only a Triton kernel):
``tests/test_select.py`` checks it against a loop written from the paper.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch

from axiomformer import Attention, AttentionSpec
from axiomformer.spec import relax_with_requirements

DIM, HEADS, LEN = 16, 2, 11
HD = DIM // HEADS


def _fla_naive(op: str, stubs: dict[str, dict] | None = None):
    """fla/ops/<op>/naive.py as a module, without importing the fla package (whose __init__ needs Triton).

    ``stubs`` stand in for the modules the file imports that the compared function does not use ({module name:
    {attribute: value}}), while the file loads; the real modules are put back after."""
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations or importlib.util.find_spec("einops") is None:
        pytest.skip("fla-core (and einops) not installed: pip install 'axiomformer[fla]'")
    path = Path(next(iter(spec.submodule_search_locations))) / "ops" / op / "naive.py"
    loader = importlib.util.spec_from_file_location(f"fla_naive_{op}", path)
    module = importlib.util.module_from_spec(loader)
    saved = {name: sys.modules.get(name) for name in stubs or {}}
    try:
        for name, attributes in (stubs or {}).items():
            sys.modules[name] = types.SimpleNamespace(**attributes)  # type: ignore[assignment]
        loader.loader.exec_module(module)
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    return module


def _pieces(name: str):
    """The layer, its input, and its q, k, v (batch, seq, heads, head_dim) and gates, as fla lays them out."""
    spec = relax_with_requirements(AttentionSpec.standard(DIM, HEADS), f"transport={name}")
    torch.manual_seed(0)
    att = Attention(spec).double()
    x = torch.randn(2, LEN, DIM, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    heads = lambda t: t.view(2, LEN, HEADS, HD).transpose(1, 2)
    q, k = att.transport.prepare(heads(att.q_proj(x)), heads(att.k_proj(x)))
    v = heads(att.v_proj(x))
    gates = att.transport.gates(x, k)
    bthd = lambda t: t.transpose(1, 2).float()
    return att, x, bthd(q), bthd(k), bthd(v), gates, bthd


def _compare(att, x, o_bthd):
    want = att.out_proj(o_bthd.double().reshape(2, LEN, DIM))
    with torch.no_grad():
        torch.testing.assert_close(att(x), want, rtol=2e-5, atol=2e-5)


def test_gated_deltanet_is_flas_naive_recurrent_gated_delta_rule():
    fla = _fla_naive("gated_delta_rule")
    att, x, q, k, v, g, _bthd = _pieces("decay_householder")
    o, _ = fla.naive_recurrent_gated_delta_rule(
        q, k, v, g.beta.transpose(1, 2).float(), g.log_decay[..., 0].transpose(1, 2).float(), scale=HD**-0.5
    )
    _compare(att, x, o.detach())


def test_kda_is_flas_naive_recurrent_kda():
    fla = _fla_naive("kda")
    att, x, q, k, v, g, bthd = _pieces("diag_decay_householder")
    o, _ = fla.naive_recurrent_kda(q, k, v, bthd(g.log_decay), g.beta.transpose(1, 2).float(), scale=HD**-0.5)
    _compare(att, x, o.detach())


def test_mamba2_decay_is_flas_naive_recurrent_simple_gla_with_dt_folded_into_the_values():
    fla = _fla_naive("simple_gla")
    att, x, q, k, v, g, _bthd = _pieces("decay")
    dt = g.write.transpose(1, 2).float()[..., None]  # SSD: h_t = exp(dt A) h_{t-1} + dt B_t x_t
    o, _ = fla.naive_recurrent_simple_gla(q, k, v * dt, g.log_decay[..., 0].transpose(1, 2).float(), scale=HD**-0.5)
    _compare(att, x, o.detach())


def test_path_is_flas_naive_path_attn():
    fla = _fla_naive("path_attn")
    att, x, q, k, v, g, bthd = _pieces("householder")
    zeros = torch.zeros(2, LEN, HEADS)  # no forget gate (PaTH without FoX)
    o = fla.naive_path_attn(q, k, v, bthd(g.w), g.beta.transpose(1, 2).float(), zeros, HD**-0.5, chunk_size=4)
    _compare(att, x, o.detach())


def test_the_comparison_catches_a_wrong_convention():
    # fla's delta rule with beta halved: the gate convention a port could get wrong is caught at this tolerance.
    fla = _fla_naive("gated_delta_rule")
    att, x, q, k, v, g, _bthd = _pieces("decay_householder")
    o, _ = fla.naive_recurrent_gated_delta_rule(
        q, k, v, 0.5 * g.beta.transpose(1, 2).float(), g.log_decay[..., 0].transpose(1, 2).float(), scale=HD**-0.5
    )
    with pytest.raises(AssertionError):
        _compare(att, x, o.detach())


# ---------------------------------------------------------------------------------------------- selections
def _select_pieces(name: str, block: int, topk: int):
    """A causal selection layer, its input and its per-head q, k, v (batch, heads, seq, head_dim)."""
    spec = AttentionSpec.standard(DIM, HEADS, causal=True).relax(select=name, select_block=block, select_topk=topk)
    torch.manual_seed(0)
    att = Attention(spec).double()
    x = torch.randn(2, LEN, DIM, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    heads = lambda t: t.view(2, LEN, HEADS, HD).transpose(1, 2)
    return att, x, heads(att.q_proj(x)), heads(att.k_proj(x)), heads(att.v_proj(x))


def test_the_indexer_is_flas_naive_dsa_on_each_heads_index_scores():
    # DSA's lightning indexer I_ts = sum_j w_tj relu(q_idx_tj . k_idx_s), the top-k causal keys, then the softmax
    # over them; axiomformer indexes per attention head from the head's own q and k (axes/select.py), so fla's
    # reference runs once per head, with that head's index queries, key and weights (its 1/sqrt(DI) does not change
    # the ranking).
    fla = _fla_naive("dsa")
    block, topk = 2, 2
    att, x, q, k, v = _select_pieces("indexer", block, topk)
    sel = att.select
    with torch.no_grad():
        outs = []
        for h in range(HEADS):
            qh, kh = q[:, h], k[:, h]  # (batch, seq, head_dim)
            q_idx = sel.index_q(qh).view(2, LEN, -1, sel.index_k.out_features)
            o = fla.naive_dsa(
                qh[:, :, None].float(),
                kh[:, :, None].float(),
                v[:, h, :, None].float(),
                q_idx.float(),
                sel.index_k(kh).float(),
                sel.index_w(qh).float(),
                topk=topk * block,
            )
            outs.append(o[:, :, 0])
        _compare(att, x, torch.stack(outs, 2))


def _chosen_blocks(att, q, k, block: int, topk: int) -> torch.Tensor:
    """The blocks the layer's selection keeps for each query, (batch, seq, heads, topk) padded with -1."""
    mask = att.select.mask(q, k, 0, True, None)  # (batch, heads, seq, seq)
    first = mask[..., ::block]  # a block is kept whole: its first key stands for it
    out = torch.full((2, LEN, HEADS, topk), -1, dtype=torch.long)
    for b in range(2):
        for h in range(HEADS):
            for i in range(LEN):
                kept = first[b, h, i].nonzero().flatten()
                assert len(kept) <= topk
                out[b, i, h, : len(kept)] = kept
    return out


def test_nsa_weighs_its_selected_blocks_as_flas_naive_nsa_selection():
    # fla's naive_nsa_selection: the softmax over the keys of the given blocks (block b: keys bB .. bB + B - 1),
    # the causal future of the own block left out. The file's other imports (fla.ops.utils, whose package needs
    # Triton) serve functions not compared here.
    stubs = {"fla": {}, "fla.ops": {}, "fla.ops.utils": {"prepare_chunk_offsets": None}}
    stubs["fla.ops.utils.pooling"] = {"mean_pooling": None}
    fla = _fla_naive("nsa", stubs)
    block, topk = 2, 3
    att, x, q, k, v = _select_pieces("nsa", block, topk)
    with torch.no_grad():
        indices = _chosen_blocks(att, q, k, block, topk)
        bthd = lambda t: t.transpose(1, 2).float()
        o = fla.naive_nsa_selection(bthd(q), bthd(k), bthd(v), indices, block_size=block, scale=HD**-0.5)
    _compare(att, x, o)
    with torch.no_grad():  # the comparison sees the selection: other blocks give another output
        shifted = torch.where(indices > 0, indices - 1, indices)
        o = fla.naive_nsa_selection(bthd(q), bthd(k), bthd(v), shifted, block_size=block, scale=HD**-0.5)
    with pytest.raises(AssertionError):
        _compare(att, x, o)


# ---------------------------------------------------------------------------- the authors' conventions fla computes
def _layer_qkv(changes: str):
    spec = AttentionSpec.standard(DIM, HEADS, causal=True).relax(changes)
    torch.manual_seed(0)
    att = Attention(spec).double()
    x = torch.randn(2, LEN, DIM, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    bthd = lambda t: t.view(2, LEN, HEADS, HD)
    return att, x, bthd(att.q_proj(x)), bthd(att.k_proj(x)), bthd(att.v_proj(x))


@pytest.mark.parametrize("attend_current, remainder", [(False, True), (False, False), (True, False), (True, True)])
def test_stick_breaking_and_its_authors_conventions_are_flas_naive_stickbreaking_attn(attend_current, remainder):
    # fla's naive_stickbreaking_attn computes in float64 for float64 inputs and returns the stick left over, which
    # the authors' layer adds times the query's own value (stick_remainder).
    fla = _fla_naive("stickbreaking_attn")
    changes = f"normalizer=stick_breaking,stick_attend_current={attend_current},stick_remainder={remainder}"
    att, x, q, k, v = _layer_qkv(changes)
    with torch.no_grad():
        o, rem = fla.naive_stickbreaking_attn(q, k, v, scale=HD**-0.5, attend_current=attend_current)
        if remainder:
            o = o + rem[..., None] * v
        want = att.out_proj(o.reshape(2, LEN, DIM))
        torch.testing.assert_close(att(x), want, rtol=1e-10, atol=1e-12)


def test_the_forgetting_transformer_is_flas_naive_forgetting_attn():
    fla = _fla_naive("forgetting_attn")
    att, x, q, k, v = _layer_qkv("position=forget")
    with torch.no_grad():
        log_f = torch.nn.functional.logsigmoid(att.position.forget_gate(x))  # (batch, seq, heads)
        o = fla.naive_forgetting_attn(q.float(), k.float(), v.float(), log_f.float(), scale=HD**-0.5)
    _compare(att, x, o)
