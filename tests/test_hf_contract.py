"""The transformers attention contract: ``attn_implementation="axiomformer"`` equals eager attention (logits and
returned attentions within 1e-4) on small randomly initialized models of every family that uses it, honours each
argument transformers passes, and refuses the others by name."""

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from axiomformer.surgery.hf_attention import axiomformer_attention_forward, register_with_transformers

SMALL = dict(
    vocab_size=61,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    initializer_range=0.3,
)


def _configs() -> dict:
    t = transformers
    return {
        "llama": lambda: t.LlamaConfig(**SMALL, num_key_value_heads=2),
        "mistral": lambda: t.MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=3),
        "qwen2": lambda: t.Qwen2Config(
            **SMALL, num_key_value_heads=1, use_sliding_window=True, sliding_window=3, max_window_layers=1
        ),
        "gemma2": lambda: t.Gemma2Config(
            **SMALL,
            num_key_value_heads=2,
            head_dim=8,
            sliding_window=3,
            attn_logit_softcapping=2.0,
            query_pre_attn_scalar=3,
        ),
        "gpt2": lambda: t.GPT2Config(vocab_size=61, n_embd=32, n_layer=2, n_head=4, initializer_range=0.3),
        "gpt_oss": lambda: t.GptOssConfig(
            **SMALL, num_key_value_heads=2, head_dim=8, num_local_experts=2, num_experts_per_tok=1, sliding_window=3
        ),
        "bert": lambda: t.BertConfig(
            vocab_size=61,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            initializer_range=0.3,
        ),
    }


def _model(family: str):
    config = _configs()[family]()
    config.output_attentions = True  # GPT-2's model strips the call argument; the config reaches it
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = (
            transformers.BertForMaskedLM(config)
            if family == "bert"
            else transformers.AutoModelForCausalLM.from_config(config)
        ).eval()
    with torch.no_grad():
        for module in model.modules():  # attention sinks (GPT-OSS) start at zero: give them a value
            if isinstance(getattr(module, "sinks", None), torch.nn.Parameter):
                module.sinks.normal_()
    return model


def _batch(family: str) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    ids = torch.randint(3, 61, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.long)
    if family == "bert":
        mask[0, 6:] = 0  # right padding for the encoder
    else:
        mask[0, :2] = 0  # left padding for the decoders
    return ids, mask


def _run(model, implementation: str, ids, mask):
    model.set_attn_implementation(implementation)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_attentions=True)
    return out.logits, out.attentions


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "gemma2", "gpt2", "bert", "gpt_oss"])
def test_equals_eager(family):
    name = register_with_transformers()
    model = _model(family)
    ids, mask = _batch(family)
    logits, maps = _run(model, "eager", ids, mask)
    got_logits, got_maps = _run(model, name, ids, mask)
    real = mask.bool()  # padded query rows are zero rows here, uniform rows in eager
    assert len(got_maps) == len(maps) == 2
    torch.testing.assert_close(got_logits[real], logits[real], atol=1e-4, rtol=1e-4)
    for ours, eager in zip(got_maps, maps):
        assert ours.shape == eager.shape
        torch.testing.assert_close(ours.transpose(1, 2)[real], eager.transpose(1, 2)[real], atol=1e-4, rtol=1e-4)


def _dropping(argument: str):
    def broken(*args, **kwargs):
        kwargs.pop(argument, None)
        return axiomformer_attention_forward(*args, **kwargs)

    return broken


@pytest.mark.parametrize("family, argument", [("gemma2", "softcap"), ("gemma2", "scaling"), ("gpt_oss", "s_aux")])
def test_the_comparison_catches_a_dropped_argument(family, argument):
    """The planted fault: an attention function that drops one argument fails the eager comparison."""
    transformers.AttentionInterface.register("dropping", _dropping(argument))
    transformers.masking_utils.AttentionMaskInterface.register("dropping", transformers.masking_utils.sdpa_mask)
    model = _model(family)
    ids, mask = _batch(family)
    logits, _ = _run(model, "eager", ids, mask)
    broken, _ = _run(model, "dropping", ids, mask)
    assert (broken - logits)[mask.bool()].abs().max() > 1e-3


class _Module(torch.nn.Module):
    def __init__(self, is_causal=True):
        super().__init__()
        self.is_causal = is_causal


def _eager(q, k, v, visible, scaling, sinks=None):
    scores = (q @ k.transpose(-1, -2)) * scaling
    scores = scores.masked_fill(~visible, float("-inf"))
    if sinks is not None:  # GPT-OSS: the sink logit joins the softmax, then is dropped
        scores = torch.cat([scores, sinks.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)], -1)
    weights = scores.softmax(-1)[..., : k.shape[-2]]
    return (weights @ v).transpose(1, 2), weights


def _qkv(heads=4, kv_heads=4, length=6):
    torch.manual_seed(2)
    return torch.randn(2, heads, length, 8), torch.randn(2, kv_heads, length, 8), torch.randn(2, kv_heads, length, 8)


def test_sliding_window_without_mask():
    q, k, v = _qkv()
    out, weights = axiomformer_attention_forward(_Module(), q, k, v, None, sliding_window=2, output_attentions=True)
    i = torch.arange(6)
    visible = (i.view(-1, 1) >= i) & (i.view(-1, 1) - i < 2)
    ref_out, ref_w = _eager(q, k, v, visible, 8**-0.5)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, ref_w, atol=1e-5, rtol=1e-5)


def test_bidirectional_sliding_window_without_mask():
    q, k, v = _qkv()
    out, weights = axiomformer_attention_forward(
        _Module(is_causal=False), q, k, v, None, sliding_window=1, output_attentions=True
    )
    i = torch.arange(6)
    ref_out, ref_w = _eager(q, k, v, (i.view(-1, 1) - i).abs() <= 1, 8**-0.5)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, ref_w, atol=1e-5, rtol=1e-5)


def test_attention_sinks():
    q, k, v = _qkv()
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0])
    out, weights = axiomformer_attention_forward(_Module(), q, k, v, None, s_aux=sinks, output_attentions=True)
    i = torch.arange(6)
    ref_out, ref_w = _eager(q, k, v, i.view(-1, 1) >= i, 8**-0.5, sinks)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, ref_w, atol=1e-5, rtol=1e-5)
    assert float(weights.sum(-1).max()) < 1 - 1e-3  # the sink takes a share: rows no longer sum to one


def test_grouped_query_heads_and_is_causal_argument():
    q, k, v = _qkv(heads=4, kv_heads=2)
    out, weights = axiomformer_attention_forward(
        _Module(is_causal=True), q, k, v, None, is_causal=False, scaling=0.3, output_attentions=True
    )
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    ref_out, ref_w = _eager(q, kk, vv, torch.ones(6, 6, dtype=torch.bool), 0.3)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, ref_w, atol=1e-5, rtol=1e-5)


def test_dropout_acts_only_in_training():
    q, k, v = _qkv()
    module = _Module()
    plain, _ = axiomformer_attention_forward(module, q, k, v, None)
    module.train()
    torch.manual_seed(0)
    dropped, _ = axiomformer_attention_forward(module, q, k, v, None, dropout=0.5)
    assert (dropped - plain).abs().max() > 1e-2
    module.eval()
    torch.testing.assert_close(axiomformer_attention_forward(module, q, k, v, None, dropout=0.5)[0], plain)


def test_weights_only_when_asked():
    q, k, v = _qkv()
    assert axiomformer_attention_forward(_Module(), q, k, v, None)[1] is None


@pytest.mark.parametrize("argument", ["cu_seq_lens_q", "max_length_k", "some_future_argument"])
def test_unsupported_argument_is_refused_by_name(argument):
    q, k, v = _qkv()
    with pytest.raises(NotImplementedError, match=argument):
        axiomformer_attention_forward(_Module(), q, k, v, None, **{argument: torch.tensor([0, 6])})


def test_informational_arguments_are_accepted():
    q, k, v = _qkv()
    axiomformer_attention_forward(
        _Module(), q, k, v, None, position_ids=torch.arange(6)[None], use_cache=True, cache_position=torch.arange(6)
    )
