"""Multi-head latent attention (DeepSeek-V2) as a key/value parameterisation (issue 34): the layer is its paper's
formula, decodes from a cache of latents alone, and the audit agrees that it relaxes none of A1-A5."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from axiomformer import Attention, AttentionSpec, KVCache
from axiomformer.audit import AttentionAdapter, run_audit

DIM, HEADS, LATENT, LEN = 16, 2, 6, 9
HD = DIM // HEADS


def _layer(**fields) -> Attention:
    torch.manual_seed(0)
    return Attention(AttentionSpec.standard(DIM, HEADS, causal=True, kv_latent=LATENT, **fields)).double()


def _x(seed: int = 2) -> torch.Tensor:
    return torch.randn(2, LEN, DIM, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_mla_is_softmax_attention_on_keys_and_values_up_projected_from_one_latent():
    att = _layer()
    x = _x()
    w_dkv = att.kv_down.weight  # DeepSeek-V2 eq. 9: c = W_DKV h
    w_uk, b_k = att.k_proj[-1].weight, att.k_proj[-1].bias  # eq. 10: k = W_UK c
    w_uv, b_v = att.v_proj[-1].weight, att.v_proj[-1].bias  # eq. 11: v = W_UV c
    c = x @ w_dkv.T
    heads = lambda t: t.view(2, LEN, HEADS, HD).transpose(1, 2)
    q, k, v = heads(att.q_proj(x)), heads(c @ w_uk.T + b_k), heads(c @ w_uv.T + b_v)
    s = (q @ k.transpose(-2, -1) / math.sqrt(HD)).masked_fill(~torch.ones(LEN, LEN, dtype=torch.bool).tril(), -math.inf)
    want = att.out_proj((torch.softmax(s, -1) @ v).transpose(1, 2).reshape(2, LEN, DIM))
    with torch.no_grad():
        torch.testing.assert_close(att(x), want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("fields", [{}, {"position": "rope"}, {"num_kv_heads": 1, "position": "alibi"}])
def test_mla_decodes_from_a_cache_of_latents_alone_as_its_full_forward(fields):
    att = _layer(**fields)
    x = _x()
    with torch.no_grad():
        full = att(x)
        cache = KVCache()
        steps = torch.cat([att(x[:, :4], cache=cache)] + [att(x[:, t : t + 1], cache=cache) for t in range(4, LEN)], 1)
    torch.testing.assert_close(steps, full, rtol=0, atol=1e-8)
    assert cache.k.shape == (2, 1, LEN, LATENT) and cache.v.numel() == 0  # LATENT numbers per token
    assert LATENT < 2 * att.spec.kv_dim  # against 2 * kv_dim for the keys and values of a plain cache


def test_mla_relaxes_no_assumption_and_the_audit_agrees():
    spec = AttentionSpec.standard(DIM, HEADS, kv_latent=LATENT)
    assert all(spec.assumptions().values())
    for target in (f"spec:kv_latent={LATENT}", f"spec:kv_latent={LATENT},causal=true"):
        report = run_audit(target)
        assert not [c.name for c in report.checks if c.passed is False], target


@pytest.mark.parametrize(
    "fields, relaxed", [(f"kv_latent={LATENT}", set()), (f"kv_latent={LATENT},kv_rope_dim=4", {"A0"})]
)
def test_the_cli_describes_mla_with_its_source_and_what_it_relaxes(fields, relaxed):
    from typer.testing import CliRunner

    from axiomformer.cli import app
    from axiomformer.spec import ECONOMY_NOTES

    result = CliRunner().invoke(app, ["spec", fields])
    assert result.exit_code == 0, result.output
    for name in [f.split("=")[0] for f in fields.split(",")]:
        formula, how, source = ECONOMY_NOTES[name]
        assert source in result.output and how in result.output and formula in result.output
    assert {a for a in ("A0", "A1", "A2", "A3", "A4", "A5") if f"{a}: relaxed" in result.output} == relaxed


def test_the_audit_catches_the_released_layers_norm_on_the_latent_as_a_nonlinear_value_map():
    # DeepSeek-V2's released layer normalizes c (kv_a_layernorm); then v = W_uv RMSNorm(W_dkv x) is not linear in x.
    att = _layer()
    norm = nn.Sequential(att.kv_down, nn.RMSNorm(LATENT, dtype=torch.float64))
    att.k_proj[0], att.v_proj[0] = norm, norm
    report = run_audit(AttentionAdapter(att))
    assert report["linearity"].passed is False and "A3" in report["linearity"].candidates


def test_mla_refuses_what_its_latent_does_not_define():
    with pytest.raises(ValueError, match="kv_latent=6 needs another value"):
        AttentionSpec.standard(DIM, HEADS, kv_latent=LATENT, value="mlp")
    with pytest.raises(ValueError, match="kv_latent must be an int >= 0"):
        AttentionSpec.standard(DIM, HEADS, kv_latent=-1)
    att, x = _layer(), _x()
    with pytest.raises(ValueError, match="must be the same input"):
        att(x, x, x.clone(), cache=KVCache())


def test_the_decoupled_rope_key_is_deepseek_v2s_and_decodes_from_latents_and_rotated_keys():
    from axiomformer.axes.position import apply_rope

    att = _layer(kv_rope_dim=4)
    x = _x()
    heads = lambda t, h=HEADS: t.view(2, LEN, h, -1).transpose(1, 2)
    pos = torch.arange(LEN)
    c = x @ att.kv_down.weight.T
    q = torch.cat([heads(att.q_proj(x)), apply_rope(heads(att.q_rope(x)), pos)], -1)  # eq. 14-16: [q^C; q^R]
    kr = apply_rope(heads(att.k_rope(x), 1), pos).expand(-1, HEADS, -1, -1)  # eq. 17: one k^R for every head
    k = torch.cat([heads(att.k_proj[-1](c)), kr], -1)
    v = heads(att.v_proj[-1](c))
    s = (q @ k.transpose(-2, -1) / math.sqrt(HD + 4)).masked_fill(
        ~torch.ones(LEN, LEN, dtype=torch.bool).tril(), -math.inf
    )
    want = att.out_proj((torch.softmax(s, -1) @ v).transpose(1, 2).reshape(2, LEN, DIM))
    with torch.no_grad():
        torch.testing.assert_close(att(x), want, rtol=0, atol=1e-10)
        cache = KVCache()
        steps = torch.cat([att(x[:, t : t + 1], cache=cache) for t in range(LEN)], 1)
    torch.testing.assert_close(steps, want, rtol=0, atol=1e-8)
    assert cache.k.shape == (2, 1, LEN, LATENT + 4)  # the latent and the rotated k^R, nothing per head
    spec = att.spec
    assert {a for a, held in spec.assumptions().items() if not held} == {"A0"}  # a position mechanism, as RoPE
    report = run_audit(f"spec:kv_latent={LATENT},kv_rope_dim=4,causal=true")
    assert report["set_symmetry"].passed is False
    with pytest.raises(ValueError, match="decoupled RoPE key"):
        AttentionSpec.standard(DIM, HEADS, kv_latent=LATENT, kv_rope_dim=4, position="rope")
