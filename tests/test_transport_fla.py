"""The transports against code no one here wrote: the pure-PyTorch naive references of ``fla-core`` (the
flash-linear-attention package, optional extra ``fla``), loaded file by file so that no Triton kernel is imported.

Each layer's output is compared with the output projection of fla's reference on the layer's own q, k, v and gates.
fla's references compute in float32 (they cast their inputs), so the comparison holds to float32 precision.
Skipped when fla-core is not installed (``pip install "axiomformer[fla]"``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from axiomformer import Attention, AttentionSpec
from axiomformer.spec import relax_with_requirements

DIM, HEADS, LEN = 16, 2, 11
HD = DIM // HEADS


def _fla_naive(op: str):
    """fla/ops/<op>/naive.py as a module, without importing the fla package (whose __init__ needs Triton)."""
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations or importlib.util.find_spec("einops") is None:
        pytest.skip("fla-core (and einops) not installed: pip install 'axiomformer[fla]'")
    path = Path(next(iter(spec.submodule_search_locations))) / "ops" / op / "naive.py"
    loader = importlib.util.spec_from_file_location(f"fla_naive_{op}", path)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
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
