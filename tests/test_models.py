"""Models: shapes, causality, incremental decoding equals the full forward, parameter counts, checkpoints."""

import json

import pytest
import torch
from torch import nn

from axiomformer.checkpoint import load_checkpoint, save_checkpoint
from axiomformer.models import MODEL_KINDS, RecurrentLM, TransformerLM, build_model, count_parameters
from axiomformer.spec import AttentionSpec

VOCAB = 11


def tiny(kind, spec=None, **options):
    return build_model(kind, vocab_size=VOCAB, dim=16, num_layers=2, max_len=24, spec=spec, **options).eval()


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_every_model_maps_ids_to_causal_logits(kind):
    model = tiny(kind)
    ids = torch.randint(0, VOCAB, (3, 20))
    logits = model(ids)
    assert logits.shape == (3, 20, VOCAB) and logits.dtype == torch.float32
    changed = ids.clone()
    changed[:, 12:] = (changed[:, 12:] + 1) % VOCAB
    with torch.no_grad():
        assert torch.allclose(model(changed)[:, :12], logits[:, :12], atol=1e-6)  # the future cannot leak back
        assert not torch.allclose(model(changed)[:, 12:], logits[:, 12:], atol=1e-3)


@pytest.mark.parametrize(
    "relax", ["standard", "position=rope", "position=alibi", "position=learned", "normalizer=sigmoid"]
)
def test_incremental_decoding_equals_the_full_forward(relax):
    spec = AttentionSpec.standard(16, 4, causal=True).relax(relax)
    model = tiny("transformer", spec=spec)
    ids = torch.randint(0, VOCAB, (2, 21))
    with torch.no_grad():
        full = model(ids)
        caches = model.new_caches()
        pieces = [model(ids[:, :7], caches=caches)]  # multi-token prefill
        pieces += [model(ids[:, t : t + 1], caches=caches) for t in range(7, 21)]  # then one token at a time
    assert caches[0].length == 21
    assert (torch.cat(pieces, dim=1) - full).abs().max().item() <= 1e-5


@pytest.mark.parametrize("kind", ["rnn", "lstm", "gru"])
def test_recurrent_state_carries_decoding_exactly(kind):
    model = tiny(kind)
    ids = torch.randint(0, VOCAB, (2, 15))
    with torch.no_grad():
        full = model(ids)
        first, state = model(ids[:, :6], return_state=True)
        rest = model(ids[:, 6:], state)
    assert (torch.cat([first, rest], dim=1) - full).abs().max().item() <= 1e-5


def test_transformer_rejects_sequences_beyond_max_len_and_a_cache_without_causal_mask():
    model = tiny("transformer")
    with pytest.raises(ValueError, match="max_len=24"):
        model(torch.zeros(1, 25, dtype=torch.long))
    encoder = TransformerLM(AttentionSpec.standard(16, 4), VOCAB, 1, 24)
    with pytest.raises(ValueError, match="causal"):
        encoder(torch.zeros(1, 3, dtype=torch.long), caches=encoder.new_caches())


def test_build_model_overrides_spec_width_and_causality():
    model = build_model(
        "transformer",
        vocab_size=VOCAB,
        dim=32,
        num_layers=1,
        max_len=50,
        spec=AttentionSpec.standard(64, 2).relax("A4=cosine"),
    )
    spec = model.blocks[0].attn.spec
    assert (spec.dim, spec.num_heads, spec.causal, spec.score, spec.max_len) == (32, 2, True, "cosine", 50)


def test_unknown_model_kind_names_the_choices():
    with pytest.raises(ValueError, match="transformer, rnn, lstm, gru"):
        build_model("mamba", vocab_size=VOCAB, dim=16, num_layers=1, max_len=8)


def test_parameter_counts_match_closed_forms():
    d, v, layers = 16, VOCAB, 2
    # Elman RNN: per layer W_ih, W_hh (d x d) and two bias vectors; plus the tied embedding and the final LayerNorm.
    rnn_count = v * d + layers * (2 * d * d + 2 * d) + 2 * d
    assert count_parameters(tiny("rnn")) == rnn_count
    assert count_parameters(tiny("lstm")) == v * d + layers * 4 * (2 * d * d + 2 * d) + 2 * d
    # Transformer block: 4 (d x d + d) projections, MLP d->4d->d, two LayerNorms; embedding tied, final norm.
    block = 4 * (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d) + 2 * 2 * d
    assert count_parameters(tiny("transformer")) == v * d + layers * block + 2 * d
    assert count_parameters(tiny("transformer", input_position="learned")) == v * d + 24 * d + layers * block + 2 * d


@pytest.mark.parametrize("kind, relax", [("transformer", "A4=cosine,position=rope"), ("lstm", None)])
def test_checkpoint_round_trip_restores_the_model(tmp_path, kind, relax):
    spec = AttentionSpec.standard(16, 4, causal=True).relax(relax) if relax else None
    model = tiny(kind, spec=spec)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # not the initialization: the weights must come from the file
    save_checkpoint(tmp_path, model, note="round trip")
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["note"] == "round trip" and config["model"]["kind"] == kind
    torch.manual_seed(123)
    loaded, meta = load_checkpoint(tmp_path)
    ids = torch.randint(0, VOCAB, (2, 12))
    with torch.no_grad():
        assert torch.equal(loaded.eval()(ids), model(ids))
    assert meta["model"] == model.config
    assert isinstance(loaded, RecurrentLM if kind == "lstm" else TransformerLM)


def test_loading_a_directory_without_weights_fails_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_checkpoint(tmp_path)
    with pytest.raises(ValueError, match="config"):
        save_checkpoint(tmp_path, nn.Linear(2, 2))
