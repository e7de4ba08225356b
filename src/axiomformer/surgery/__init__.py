"""Assumption surgery on a pretrained Transformer: swap a BERT's self-attention for axiomformer's, then relax it.

    from axiomformer.surgery import load_model, replace_attention, relax_model
    model, tokenizer = load_model()                      # bundled all-MiniLM-L6-v2, offline
    replace_attention(model)                              # same weights, same outputs (standard spec)
    relax_model(model, "normalizer=sigmoid", layers=[0, 1])

``transformers`` is imported lazily (inside the functions that need it): installing the ``hf`` extra provides it.
"""

from axiomformer.surgery.load import (
    BERT_FAMILY,
    SurgeryError,
    builtin_sentences,
    bundled_model_dir,
    check_model_dir,
    load_model,
    read_sentences,
)
from axiomformer.surgery.metrics import (
    DEFAULT_RELAXATIONS,
    SurgeryReport,
    embed,
    mean_cosine,
    mean_pool,
    nearest_neighbours,
    retrieval_agreement,
    run_surgery,
)
from axiomformer.surgery.replace import (
    IMPLEMENTATION,
    AxiomSelfAttention,
    attention_blocks,
    attention_from_bert,
    attention_layers,
    axiomformer_attention_forward,
    hf_attention_mask,
    register_with_transformers,
    relax_model,
    replace_attention,
)

__all__ = [
    "BERT_FAMILY",
    "DEFAULT_RELAXATIONS",
    "IMPLEMENTATION",
    "AxiomSelfAttention",
    "SurgeryError",
    "SurgeryReport",
    "attention_blocks",
    "attention_from_bert",
    "attention_layers",
    "axiomformer_attention_forward",
    "builtin_sentences",
    "bundled_model_dir",
    "check_model_dir",
    "embed",
    "hf_attention_mask",
    "load_model",
    "mean_cosine",
    "mean_pool",
    "nearest_neighbours",
    "read_sentences",
    "register_with_transformers",
    "relax_model",
    "replace_attention",
    "retrieval_agreement",
    "run_surgery",
]
