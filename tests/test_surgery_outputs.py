"""After ``replace_attention`` a BERT still returns its per-layer attention maps (``output_attentions=True``), equal to
eager attention's, whether or not transformers installed its capture hooks before the surgery; ``head_mask`` is
refused by name."""

import warnings

import pytest
import torch

transformers = pytest.importorskip("transformers")

from axiomformer.surgery import attention_layers, relax_model, replace_attention


def _bert():
    config = transformers.BertConfig(
        vocab_size=61,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        initializer_range=0.3,
    )
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.BertModel(config).eval()
    model.set_attn_implementation("eager")
    ids = torch.randint(3, 61, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    return model, dict(input_ids=ids, attention_mask=mask)


def _maps(model, batch):
    with torch.no_grad():
        return model(**batch, output_attentions=True).attentions


@pytest.mark.parametrize("asked_before", [True, False])
def test_output_attentions_after_surgery(asked_before):
    model, batch = _bert()
    if asked_before:  # transformers' capture hooks installed now
        expected = _maps(model, batch)
    else:
        twin, _ = _bert()  # same seed, same weights, hooks only there
        expected = _maps(twin, batch)
    replace_attention(model)
    after = _maps(model, batch)
    assert len(after) == len(expected) == 2
    real = batch["attention_mask"].bool()
    for ours, eager in zip(after, expected):
        torch.testing.assert_close(ours.transpose(1, 2)[real], eager.transpose(1, 2)[real], atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        assert model(**batch).attentions is None  # not asked, not computed


def test_relaxed_layers_return_their_own_maps():
    model, batch = _bert()
    relax_model(model, "normalizer=sigmoid", layers=[0])
    maps = _maps(model, batch)
    assert float(maps[0].sum(-1).max()) != pytest.approx(1.0)  # sigmoid weights do not sum to one
    torch.testing.assert_close(maps[1].sum(-1), torch.ones_like(maps[1].sum(-1)), atol=1e-5, rtol=1e-5)


def test_head_mask_and_unknown_arguments_are_refused():
    model, _batch = _bert()
    replace_attention(model)
    layer = attention_layers(model)[0]
    x = torch.randn(1, 3, 32)
    with pytest.raises(NotImplementedError, match="head_mask"):
        layer(x, head_mask=torch.ones(4))
    with pytest.raises(NotImplementedError, match="cu_seq_lens_q"):
        layer(x, cu_seq_lens_q=torch.tensor([0, 3]))
    assert isinstance(layer, transformers.models.bert.modeling_bert.BertSelfAttention)


def test_replaced_model_copies_and_pickles():
    import copy
    import io

    model, batch = _bert()
    replace_attention(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    for other in (copy.deepcopy(model), torch.load(buffer, weights_only=False)):
        layer = attention_layers(other)[0]
        assert isinstance(layer, transformers.models.bert.modeling_bert.BertSelfAttention)
        with torch.no_grad():
            torch.testing.assert_close(other(**batch).last_hidden_state, model(**batch).last_hidden_state)
        assert len(_maps(other, batch)) == 2
