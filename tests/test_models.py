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


# ---------------------------------------------------------------------------------------------- hybrid stacks
def _hybrid(dim: int = 32, heads: int = 2):
    from axiomformer.spec import relax_with_requirements

    softmax = AttentionSpec.standard(dim, heads, causal=True)
    delta = relax_with_requirements(softmax, "transport=decay_householder")
    return softmax, [delta, delta, delta, softmax]  # Qwen3-Next's 3:1 gated DeltaNet : softmax


def test_a_hybrid_stack_of_gated_deltanet_and_softmax_layers_trains_on_mqar_and_gradients_reach_every_layer():
    from axiomformer.models import build_from_config
    from axiomformer.tasks.mqar import MQARTask

    softmax, layers = _hybrid()
    task = MQARTask(32)
    torch.manual_seed(0)
    model = TransformerLM(softmax, task.vocab_size, 4, 32, layer_specs=layers)
    assert [s.transport for s in model.layer_specs] == ["decay_householder"] * 3 + ["none"]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    held_out = [torch.as_tensor(t) for t in task.batch(64, seed=10**6, split="train")]

    def loss_on(ids, targets):
        logits = model(ids)
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)

    with torch.no_grad():
        before = float(loss_on(*held_out))
    for step in range(30):
        ids, targets = (torch.as_tensor(t) for t in task.batch(8, seed=step, split="train"))
        loss = loss_on(ids, targets)
        opt.zero_grad()
        loss.backward()
        assert bool(torch.isfinite(loss))
        for i, block in enumerate(model.blocks if step < 3 else []):  # every layer, the transport's gates included
            grads = [p.grad for p in block.attn.parameters()]
            assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads), i
            assert sum(float(g.abs().sum()) for g in grads) > 0, i
        opt.step()
    with torch.no_grad():
        after = float(loss_on(*held_out))
    assert after < 0.7 * before, (before, after)  # it trains: 4.55 -> 2.17 at this seed
    assert model.engines[:3] == ["recurrent"] * 3 and model.engines[3] != "recurrent"
    rebuilt = build_from_config(model.config)
    assert rebuilt.layer_specs == model.layer_specs


def test_a_hybrid_stack_decodes_through_its_caches_as_its_full_forward():
    softmax, layers = _hybrid()
    torch.manual_seed(1)
    model = TransformerLM(softmax, 20, 4, 16, layer_specs=layers).double().eval()
    ids = torch.randint(0, 20, (2, 9))
    full = model(ids)
    caches = model.new_caches()
    steps = [model(ids[:, :5], caches=caches)] + [model(ids[:, t : t + 1], caches=caches) for t in range(5, 9)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-8)
    assert caches[0].state is not None and caches[3].k is not None  # a state for the delta rule, keys for softmax


def test_layer_specs_of_the_wrong_length_or_width_are_refused():
    softmax, layers = _hybrid()
    with pytest.raises(ValueError, match="one per layer"):
        TransformerLM(softmax, 20, 3, 16, layer_specs=layers)
    with pytest.raises(ValueError, match="dim=32"):
        TransformerLM(softmax, 20, 1, 16, layer_specs=[AttentionSpec.standard(16, 2, causal=True)])


def test_a_hybrid_stack_is_a_spec_string_that_train_and_the_study_take_as_an_arm():
    from axiomformer.spec import stack_specs
    from axiomformer.study.config import StudyConfig
    from axiomformer.study.sweep import count_params, models
    from axiomformer.train import TrainConfig, train

    pattern = "transport=decay_householder/standard"
    base = AttentionSpec.standard(16, 2, causal=True)
    layers = stack_specs(base, pattern, 4)
    assert [s.transport for s in layers] == ["decay_householder", "none"] * 2  # repeated over the layers
    assert layers[0].normalizer == "none"  # the paper's normalizer filled in
    config = TrainConfig(task="mqar", seq_len=16, spec=pattern, layers=2, dim=16, heads=2, steps=2, eval_every=1)
    result = train(config)
    assert result.spec == pattern and result.loss == result.loss  # it ran (the loss is a number, not NaN)
    study = StudyConfig(
        variants=["standard", pattern],
        baselines=[],
        tasks=[{"name": "mqar", "seq_lens": [16]}],
        model={"dim": 16, "heads": 2, "layers": 2},
    )
    arms = {m.label: m for m in models(study)}
    assert arms[pattern].spec == pattern
    assert count_params(arms[pattern], 16, 16, "mqar", {}, layers=2, heads=2) > count_params(
        arms["standard"], 16, 16, "mqar", {}, layers=2, heads=2
    )  # the transport's gates add parameters
