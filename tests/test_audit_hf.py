"""Auditing transformers attention modules through their attention function (``hf:<family>``): every built-in family
with its tiny random config, offline; planted departures attributed to their assumption; bad input refused."""

import json
import math
import warnings
from functools import cache
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from axiomformer.audit import run_audit
from axiomformer.errors import UserInputError
from axiomformer.surgery import audit_adapter  # noqa: F401  (registers hf: targets)
from axiomformer.surgery.hf_audit import FALCON_ROWS, HFAttentionAdapter, calls_attention_interface
from axiomformer.surgery.hf_zoo import FAMILIES, ZOO_TARGETS, build, family_adapter, zoo_entry, zoo_markdown

ZOO = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "hf_zoo.json"
POSITIONAL = {"llama", "mistral", "gemma2", "gemma3", "gemma3-sliding", "qwen2", "qwen3", "qwen3-next", "gpt-oss"}
POSITIONAL |= {"phi3", "falcon", "deepseek-v3", "t5"}  # RoPE, or T5's relative bias


@cache
def _report(target: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_audit(target)


def _blames(report, check: str) -> list[str]:
    return report[check].candidates if report[check].passed is False else []


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_is_audited_and_positions_break_a0(family):
    report = _report(f"hf:{family}")
    assert all(c.candidates for c in report.checks if c.passed is False and c.assumption not in ("design", "numerics"))
    if family in POSITIONAL:
        assert "A0" in _blames(report, "set_symmetry")
    else:
        assert report["set_symmetry"].passed


@pytest.mark.slow
@pytest.mark.parametrize("target", ["hf:llama-nope", "hf:gpt2", "hf:bert", "hf:falcon-nope"])
def test_standard_form_families_pass_a1_to_a5_with_their_biases_noted(target):
    report = _report(target)
    assert report.passed, report.departures()
    if target in ("hf:gpt2", "hf:bert"):
        assert any("bias" in n for n in report.notes)


@pytest.mark.slow
def test_departures_are_blamed_on_their_assumption():
    assert _report("hf:gemma2-nope").failed and all(
        "A5" in c.candidates or c.assumption in ("numerics",) or c.name == "bilinear_scores"
        for c in _report("hf:gemma2-nope").checks
        if c.passed is False
    )
    assert "A5" in _blames(_report("hf:gemma2-nope"), "bilinear_scores")  # soft-capping: g(q.k)
    assert _blames(_report("hf:gpt-oss-nope"), "weights_sum_to_one")[0] == "A5"  # the sinks
    assert _blames(_report("hf:qwen3-next-nope"), "scalar_relevance")[:2] == ["A1", "A2"]  # the output gate
    assert "A0" in _blames(_report("hf:t5"), "set_symmetry")  # relative bias


def _register_dropping(argument: str) -> str:
    """An attention implementation that drops one argument before eager attention (the planted fault; gpt-oss's own
    eager reads ``module.sinks``, so the sinks are dropped by running Llama's eager, which has none)."""
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward as gemma_eager
    from transformers.models.llama.modeling_llama import eager_attention_forward as plain_eager

    real = {"s_aux": plain_eager, "softcap": gemma_eager}[argument]

    def dropping(module, query, key, value, mask, **kwargs):
        kwargs.pop(argument, None)
        return real(module, query, key, value, mask, **kwargs)

    name = f"axiomformer_test_drop_{argument}"
    transformers.AttentionInterface.register(name, dropping)
    transformers.masking_utils.AttentionMaskInterface.register(name, transformers.masking_utils.eager_mask)
    return name


@pytest.mark.slow
@pytest.mark.parametrize("family, argument", [("gpt-oss", "s_aux"), ("gemma2", "softcap")])
def test_a5_failures_come_from_the_argument_the_module_passes(family, argument):
    """The same module audited through an implementation that drops its sinks (soft-capping) passes A4 and A5 (but
    Gemma 2's query_pre_attn_scalar, a temperature fixed whatever head_dim, on scale_entropy, A5): the audit reads
    what the module hands its attention function."""
    report = _report(f"hf:{family}-nope@{_register_dropping(argument)}")
    left = {"gpt-oss": [], "gemma2": ["scale_entropy"]}[family]
    assert [c.name for c in report.checks if c.passed is False and c.assumption.startswith("A")] == left
    assert all(report[name].candidates[0] == "A5" for name in left)
    assert set(_report(f"hf:{family}-nope").failed) - set(report.failed)


def test_adapter_is_the_softmax_formula_on_llama_without_rope():
    """Independent reference: identity q/k/o projections, the trained W_v, causal softmax(q k^T / sqrt(d)) in float64."""
    adapter = family_adapter("llama-nope")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 6, 16, generator=g, dtype=torch.float64) for _ in range(3))
    w_v = adapter.value_map().weight.detach()
    heads = lambda x: x.view(2, 6, 2, 8).transpose(1, 2)
    scores = heads(q) @ heads(k).transpose(-1, -2) / math.sqrt(8)
    scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), -math.inf)
    ref = (scores.softmax(-1) @ heads(v @ w_v.T)).transpose(1, 2).reshape(2, 6, 16)
    torch.testing.assert_close(adapter(q, k, v), ref, atol=1e-6, rtol=1e-6)  # eager's softmax runs in float32


def test_a_nonzero_query_bias_is_noted_and_fails_a4():
    """Planted: GPT-2 with a nonzero query bias (as a trained model has): b_q.k_j is a per-key term (A4)."""
    model = build("gpt2")
    with torch.no_grad():
        model.h[0].attn.c_attn.bias[:16].normal_(generator=torch.Generator().manual_seed(1))
    report = run_audit(HFAttentionAdapter(model))
    assert any("b_q.k_j" in n for n in report.notes)
    assert report["bilinear_scores"].passed is False and report["bilinear_scores"].candidates == ["A4"]


def test_refusals_name_what_is_missing():
    with pytest.raises(UserInputError, match="pass the model"):
        run_audit(build("llama").layers[0].self_attn)
    with pytest.raises(UserInputError, match="hf:llama.*axiomformer_test_nowhere"):
        family_adapter("llama", implementation="axiomformer_test_nowhere")


# ------------------------------------------------------------------------------------------------ Falcon
FALCON_LAYOUTS = {
    "per_head": dict(multi_query=False, new_decoder_architecture=False),
    "multi_query": dict(multi_query=True, new_decoder_architecture=False),
    "grouped": dict(multi_query=False, new_decoder_architecture=True, num_kv_heads=2),
}
"""Falcon's three fused query_key_value layouts (4 heads of head_dim 4; grouped: 2 key/value heads)."""


def _falcon(layout: str, biases: bool = True):
    """A one-layer FalconModel of that layout, seeded (eager, RoPE), with nonzero attention biases (``biases``) or
    transformers' zero ones."""
    config = transformers.FalconConfig(
        vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=4, bias=True, **FALCON_LAYOUTS[layout]
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.FalconModel(config).eval()
    with torch.no_grad():
        for p in model.h[0].self_attention.parameters():
            if p.dim() == 1 and biases:
                p.normal_(std=0.3)
    return model


def _interface() -> bool:
    """Whether the installed transformers' FalconAttention calls the attention interface (transformers 5), as the
    library detects it; before, it computes attention inline."""
    return calls_attention_interface(_falcon("per_head").h[0].self_attention)


def _falcon_reference(model, q, k, v):
    """float64 reference read off the fused weight as transformers documents its layout (written out here, not taken
    from the library): identity query/key weights with their biases, each query head's key bias, value rows and
    value bias those of its key/value head, causal softmax(q_h k_h^T / sqrt(hd)), identity dense with its bias."""
    att = model.h[0].self_attention
    w, b = att.query_key_value.weight.detach().double(), att.query_key_value.bias.detach().double()
    heads, hd, d = 4, 4, 16
    if att.new_decoder_architecture:
        kv = att.num_kv_heads
        rows = lambda t: t.view(kv, heads // kv + 2, hd, *t.shape[1:])
        bq, bk, wv, bv = rows(b)[:, :-2].reshape(d), rows(b)[:, -2], rows(w)[:, -1], rows(b)[:, -1]
    elif att.multi_query:
        kv = 1
        rows = lambda t: t.view(heads + 2, hd, *t.shape[1:])
        bq, bk, wv, bv = rows(b)[:heads].reshape(d), rows(b)[heads:-1], rows(w)[-1:], rows(b)[-1:]
    else:
        kv = heads
        rows = lambda t: t.view(heads, 3, hd, *t.shape[1:])
        bq, bk, wv, bv = rows(b)[:, 0].reshape(d), rows(b)[:, 1], rows(w)[:, 2], rows(b)[:, 2]
    g = heads // kv  # (kv, hd, ...) -> per query head
    bk, wv, bv = (t.repeat_interleave(g, dim=0).reshape(d, *t.shape[2:]) for t in (bk, wv, bv))
    split = lambda x: x.view(*x.shape[:2], heads, hd).transpose(1, 2)
    n = q.shape[1]
    scores = split(q + bq) @ split(k + bk).transpose(-1, -2) / math.sqrt(hd)
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
    out = (scores.softmax(-1) @ split(v @ wv.T + bv)).transpose(1, 2).reshape(*q.shape)
    return out + att.dense.bias.detach().double()


def _qkv():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 6, 16, generator=g, dtype=torch.float64) for _ in range(3)]


@pytest.mark.parametrize("layout", list(FALCON_LAYOUTS))
def test_falcon_layouts_are_read_as_transformers_lays_them_out(layout):
    """Every layout of the fused query_key_value (per head; multi-query; grouped) equals the reference where the
    installed FalconAttention calls the attention interface; inline (before transformers 5) the per-head layout is
    read through StackedQKV and the others are refused, naming the interface and the layout."""
    model = _falcon(layout)
    if not _interface() and layout != "per_head":
        with pytest.raises(UserInputError, match=f"ALL_ATTENTION_FUNCTIONS.*FalconAttention.*{layout}"):
            HFAttentionAdapter(model)
        return
    adapter = HFAttentionAdapter(model, rope=False)
    q, k, v = _qkv()
    torch.testing.assert_close(adapter(q, k, v), _falcon_reference(model, q, k, v), atol=1e-6, rtol=1e-6)
    assert (layout != "per_head") == any("GQA" in n for n in adapter.notes)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["multi_query", "grouped"])
def test_falcon_with_shared_key_value_heads_passes_a1_to_a5_where_it_calls_the_interface(layout):
    """Multi-query and grouped Falcon (zero biases, as initialized: a nonzero query bias is an A4 departure) audit as
    standard attention through the interface, their shared key/value heads untied as GQA's."""
    if not _interface():
        pytest.skip("inline Falcon (before transformers 5): refused, see the layouts test")
    report = run_audit(HFAttentionAdapter(_falcon(layout, biases=False), rope=False))
    assert report.passed, report.departures()
    assert any("GQA" in n and layout in n for n in report.notes)


@pytest.mark.slow
def test_falcon_read_in_a_wrong_layout_fails_the_audit(monkeypatch):
    """Planted: Falcon's per-head interleaved rows (heads, 3, head_dim) read as [q | k | v] blocks (Phi-3's layout).
    The reference comparison fails, and so does the audit: head 0's key is then head 1's key coordinates (through the
    interface: head_independence and the bilinear fit, A4, with set symmetry intact); inline, the stacked [q | k | v]
    lands query coordinates in key slots, which set_symmetry (A0) sees first."""

    def blocks(heads, kv_heads, head_dim):
        rows = torch.arange(3 * heads * head_dim)
        return rows.chunk(3)

    monkeypatch.setitem(FALCON_ROWS, "per_head", blocks)
    model = _falcon("per_head")
    q, k, v = _qkv()
    wrong = HFAttentionAdapter(model, rope=False)(q, k, v)
    assert not torch.allclose(wrong, _falcon_reference(model, q, k, v), atol=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = run_audit(family_adapter("falcon-nope"))
    assert report["head_independence"].passed is False and "A4" in report["head_independence"].candidates
    if _interface():
        assert report["set_symmetry"].passed and report["bilinear_fit"].candidates == ["A4"]
    else:
        assert report["set_symmetry"].passed is False


@pytest.mark.parametrize(
    "target, expected",
    [
        ("hf:meta-llama/Llama-2-7b", "would need a download"),
        ("hf:llama#9", "hf:llama.*layers 0..0"),
        ("hf:llama#x", "expected an integer"),
    ],
)
def test_cli_bad_hf_targets_print_one_error_line(target, expected):
    from typer.testing import CliRunner

    from axiomformer.cli import app

    result = CliRunner().invoke(app, ["audit", target])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and __import__("re").search(expected, lines[0]), result.output


def test_committed_zoo_covers_every_target_and_matches_a_fresh_audit():
    zoo = json.loads(ZOO.read_text())
    assert [e["target"] for e in zoo["entries"]] == [f"hf:{t}" for t in ZOO_TARGETS]
    fresh = zoo_entry("hf:gpt2", _report("hf:gpt2"))
    assert next(e for e in zoo["entries"] if e["target"] == "hf:gpt2") == fresh
    table = zoo_markdown(zoo)
    assert all(f"`hf:{t}`" in table for t in ZOO_TARGETS)


def test_practice_catches_a_user_attention_function_registered_without_its_mask():
    """transformers PR #45811: a function registered with AttentionInterface but not AttentionMaskInterface gets no
    causal mask from the model; audited through the same interface, only future_tokens fails (the checks that
    assume a causal map say so instead of failing too). The same function with its mask registered passes."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    from axiomformer.audit.practice import run_practice

    transformers.AttentionInterface.register("axiomformer_test_user_eager", eager_attention_forward)
    assert run_practice("hf:llama@axiomformer_test_user_eager").failed == ["future_tokens"]
    transformers.AttentionInterface.register("axiomformer_test_masked_eager", eager_attention_forward)
    transformers.masking_utils.AttentionMaskInterface.register(
        "axiomformer_test_masked_eager", transformers.masking_utils.eager_mask
    )
    report = run_practice("hf:llama@axiomformer_test_masked_eager")
    assert report.passed, report.to_text()
    assert report["cache_decode"].passed  # the model's own cache, every layer


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt-oss"])  # sinks, sliding layers, MoE, its own cache (keep it fast)
def test_practice_passes_on_families(family):
    report = __import__("axiomformer.audit.practice", fromlist=["x"]).run_practice(f"hf:{family}")
    assert report.passed, report.to_text()


def _gqa_llama():
    config = transformers.LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=4,
        pad_token_id=0,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.AutoModel.from_config(config)


def test_grouped_key_value_heads_are_untied_and_keep_the_value_map():
    """Reference in float64: head h reads its own key slice and the values of its group's key/value head."""
    model = _gqa_llama()
    adapter = HFAttentionAdapter(model, rope=False)
    assert any("GQA" in n for n in adapter.notes) and run_audit(adapter).passed
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 5, 16, generator=g, dtype=torch.float64) for _ in range(3))
    w_v = model.layers[0].self_attn.v_proj.weight.detach().double()  # (2 kv heads * 4, 16)
    heads = lambda x, n: x.view(2, 5, n, 4).transpose(1, 2)
    values = heads(v @ w_v.T, 2).repeat_interleave(2, dim=1)
    scores = heads(q, 4) @ heads(k, 4).transpose(-1, -2) / 2.0
    scores = scores.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), -math.inf)
    ref = (scores.softmax(-1) @ values).transpose(1, 2).reshape(2, 5, 16)
    torch.testing.assert_close(adapter(q, k, v), ref, atol=1e-6, rtol=1e-6)


def test_a_local_model_folder_of_any_family_is_audited_offline(tmp_path):
    model = build("gpt2")
    model.save_pretrained(tmp_path)
    report = run_audit(f"hf:{tmp_path}")
    assert report.passed and "GPT2Attention" in report.notes[0]


def test_qwen3_next_says_its_deltanet_layers_are_not_audited():
    notes = family_adapter("qwen3-next").notes
    assert any("not audited" in n and "Qwen3NextGatedDeltaNet" in n for n in notes)
    assert not any("not audited" in n for n in family_adapter("llama").notes)


@pytest.mark.slow
def test_an_encoder_takes_a_causal_mask_on_request():
    """BERT audited with causal=True: the probe adds a causal mask to the module's own; the causal checks pass, and
    without the request the same map reads later tokens (the mask is what makes it causal)."""
    causal = run_audit("hf:bert", causal=True)
    assert causal.passed and causal["causality"].passed
    adapter = family_adapter("bert")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 6, 16, generator=g, dtype=torch.float64) for _ in range(3))
    later = v.clone()
    later[:, 4:] += 1.0
    assert torch.equal(adapter(q, k, v, causal=True)[:, :4], adapter(q, k, later, causal=True)[:, :4])
    assert not torch.allclose(adapter(q, k, v)[:, :4], adapter(q, k, later)[:, :4])
