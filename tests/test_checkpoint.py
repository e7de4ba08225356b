"""Checkpoints of wrapped models (``torch.compile``, ``DataParallel``) load into the plain model, and a save is
never left half-written under the final names."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from axiomformer import AttentionSpec
from axiomformer.checkpoint import CONFIG, WEIGHTS, load_checkpoint, save_checkpoint, unwrap_model
from axiomformer.models.transformer import TransformerLM


def _model() -> TransformerLM:
    return TransformerLM(AttentionSpec.standard(16, 2, causal=True), vocab_size=11, num_layers=1, max_len=16).eval()


@pytest.mark.parametrize("wrap", ["compile", "data_parallel", "compile_of_data_parallel"])
def test_a_wrapped_model_saves_the_keys_of_the_model_it_wraps(tmp_path, wrap):
    model = _model()
    ids = torch.randint(0, 11, (2, 6))
    with torch.no_grad():
        expected = model(ids)
    wrapped = {
        "compile": lambda m: torch.compile(m, backend="eager"),
        "data_parallel": nn.DataParallel,
        "compile_of_data_parallel": lambda m: torch.compile(nn.DataParallel(m), backend="eager"),
    }[wrap](model)
    assert unwrap_model(wrapped) is model
    save_checkpoint(tmp_path, wrapped)
    loaded, _ = load_checkpoint(tmp_path)
    with torch.no_grad():
        assert torch.equal(loaded(ids), expected)


def test_an_interrupted_save_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, _model())
    before = (tmp_path / WEIGHTS).read_bytes(), (tmp_path / CONFIG).read_text()

    def crash(model, filename, *args, **kwargs):
        with open(filename, "wb") as f:
            f.write(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr("axiomformer.checkpoint.save_model", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, _model())
    assert ((tmp_path / WEIGHTS).read_bytes(), (tmp_path / CONFIG).read_text()) == before
    load_checkpoint(tmp_path)
