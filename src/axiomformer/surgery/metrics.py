"""Sentence embeddings before and after surgery, and how much a relaxation moves them.

Embedding: mask-aware mean pooling of the last hidden state, e_s = sum_t m_st h_st / sum_t m_st (m = attention mask),
the pooling all-MiniLM-L6-v2 was trained with (sentence-transformers ``Pooling(mode="mean")``; its final L2
normalisation does not change cosines and is skipped).

Per relaxation:
    cosine               mean over sentences of cos(e_s, e'_s) between original and relaxed embeddings.
    retrieval_agreement  fraction of sentences whose nearest neighbour (cosine, itself excluded) among the sentence
                         set is the same before and after the relaxation.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from axiomformer.surgery.load import builtin_sentences, load_model, model_name
from axiomformer.surgery.replace import (
    AxiomSelfAttention,
    _check_layer_indices,
    attention_layers,
    relax_model,
    replace_attention,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

M = TypeVar("M", bound=nn.Module)

DEFAULT_RELAXATIONS: tuple[str, ...] = (
    "aggregator=mlp",
    "contribution=joint",
    "value=identity",
    "value=mlp",
    "score=bilinear",
    "score=additive",
    "score=cosine",
    "score=neg_l2",
    "score=mlp",
    "normalizer=sigmoid",
    "normalizer=relu",
    "normalizer=sparsemax",
    "normalizer=entmax15",
    "normalizer=linear",
    "scale=none",
    "position=sinusoidal",
    "position=learned",
    "position=rope",
    "position=alibi",
)
"""Single-axis relaxations run when none is given, every layer relaxed at once: every non-standard choice of every
axis except ``normalizer=gumbel_softmax`` and ``scale=learned``, which equal the standard model in eval mode at their
initialisation (Gumbel noise only in training; the learned scale starts at 1/sqrt(head_dim))."""


def clone_model(model: M) -> M:
    """A deep copy of ``model`` that shares its embedding tables (surgery never modifies them; saves memory/time)."""
    shared = {id(m): m for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    return copy.deepcopy(model, memo=shared)


def tokenize(
    tokenizer: PreTrainedTokenizerBase, sentences: Sequence[str], batch_size: int = 32, max_length: int = 128
) -> list[dict[str, Tensor]]:
    """Padded, truncated batches (dicts of (batch, seq) int64 tensors: input_ids, attention_mask, ...)."""
    return [
        dict(
            tokenizer(
                list(sentences[i : i + batch_size]),
                padding=True,
                truncation=True,
                max_length=max_length,
                return_tensors="pt",
            )
        )
        for i in range(0, len(sentences), batch_size)
    ]


@torch.no_grad()
def last_hidden_states(model: nn.Module, batches: Sequence[dict[str, Tensor]]) -> list[Tensor]:
    """The model's last hidden state (batch, seq, dim) for each batch."""
    return [model(**batch).last_hidden_state for batch in batches]


def mean_pool(hidden: Tensor, attention_mask: Tensor) -> Tensor:
    """Mask-aware mean over tokens: hidden (batch, seq, dim), attention_mask (batch, seq) 0/1 -> (batch, dim)."""
    m = attention_mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1e-9)


def embed(model: nn.Module, batches: Sequence[dict[str, Tensor]]) -> Tensor:
    """Mean-pooled sentence embeddings (n_sentences, dim), float32."""
    hidden = last_hidden_states(model, batches)
    return torch.cat([mean_pool(h, b["attention_mask"]) for h, b in zip(hidden, batches)]).float()


def max_abs_err(reference: Sequence[Tensor], other: Sequence[Tensor], batches: Sequence[dict[str, Tensor]]) -> float:
    """Largest |difference| of two lists of hidden states over the real (non-padding) tokens."""
    worst = 0.0
    for a, b, batch in zip(reference, other, batches):
        real = batch["attention_mask"].bool()
        worst = max(worst, float((a - b).abs()[real].max()))
    return worst


def mean_cosine(reference: Tensor, other: Tensor) -> float:
    """Mean over rows of cos(reference_s, other_s); both (n, dim)."""
    return float(F.cosine_similarity(reference, other, dim=-1).mean())


def nearest_neighbours(embeddings: Tensor) -> Tensor:
    """Index (n,) of each row's nearest other row by cosine similarity (itself excluded). Needs n >= 2."""
    unit = F.normalize(embeddings, dim=-1)
    sim = unit @ unit.T
    sim.fill_diagonal_(float("-inf"))
    return sim.argmax(-1)


def retrieval_agreement(reference: Tensor, other: Tensor) -> float:
    """Fraction of rows whose nearest neighbour (cosine, itself excluded) is the same in both embeddings."""
    return float((nearest_neighbours(reference) == nearest_neighbours(other)).float().mean())


@dataclass
class SurgeryReport:
    """What ``axiomformer surgery`` measures.

    Attributes:
        model: model name (``"all-MiniLM-L6-v2 (bundled)"`` or the folder given).
        standard_max_abs_err: max |h - h'| of the last hidden state over real tokens between the original model and
            the standard-spec replacement (same units as the hidden state).
        relaxations: one dict per relaxation: ``spec``, ``cosine``, ``retrieval_agreement``.
        fresh_parameters: per relaxation spec, the names of the non-pretrained parameters of one relaxed layer.
        n_sentences: size of the sentence set.
        layers: relaxed layer indices, or ``None`` for all.
        audit: the audit of the original model's layer-0 self-attention (``AuditReport.to_dict()`` plus ``text``),
            or a dict with an ``"error"`` key.
    """

    model: str
    standard_max_abs_err: float
    relaxations: list[dict] = field(default_factory=list)
    fresh_parameters: dict[str, list[str]] = field(default_factory=dict)
    n_sentences: int = 0
    layers: list[int] | None = None
    audit: dict | None = None

    def to_json(self) -> dict:
        """The JSON object of ``--json`` (``audit`` included when present)."""
        out = {"model": self.model, "standard_max_abs_err": self.standard_max_abs_err, "relaxations": self.relaxations}
        if self.audit is not None:
            out["audit"] = {k: v for k, v in self.audit.items() if k != "text"}
        return out


def run_surgery(
    model_dir: str | Path | None = None,
    relaxations: Sequence[str] | None = None,
    sentences: Sequence[str] | None = None,
    *,
    layers: Sequence[int] | None = None,
    batch_size: int = 32,
    seed: int = 0,
    on_result: Callable[[dict], None] | None = None,
    model_and_tokenizer: tuple[nn.Module, PreTrainedTokenizerBase] | None = None,
    audit_fn: Callable[[nn.Module], dict[str, Any]] | None = None,
) -> SurgeryReport:
    """Measure the standard replacement and each relaxation on a sentence set.

    Args:
        model_dir: local model folder; ``None`` is the bundled all-MiniLM-L6-v2.
        relaxations: relax strings; ``None`` or empty runs :data:`DEFAULT_RELAXATIONS`.
        sentences: at least 2 sentences; ``None`` uses the built-in list.
        layers: layers to relax (``None``: all).
        batch_size: sentences per forward pass.
        seed: seed of the parameters a relaxation adds (see :func:`relax_model`).
        on_result: called with each relaxation's dict as soon as it is measured.
        model_and_tokenizer: an already loaded ``(model, tokenizer)`` (it is not modified); skips loading.
        audit_fn: called with the loaded (original) model; its JSON-ready result becomes ``report.audit``.

    Raises:
        SurgeryError: missing/non-BERT model folder. ValueError: a bad relax string or layer index, or < 2 sentences.
    """
    sentences = list(builtin_sentences() if sentences is None else sentences)
    if len(sentences) < 2:
        raise ValueError(f"need at least 2 sentences for nearest-neighbour retrieval, got {len(sentences)}")
    model, tokenizer = model_and_tokenizer if model_and_tokenizer is not None else load_model(model_dir)
    batches = tokenize(tokenizer, sentences, batch_size)
    reference_hidden = last_hidden_states(model, batches)
    reference = torch.cat([mean_pool(h, b["attention_mask"]) for h, b in zip(reference_hidden, batches)]).float()

    replaced = replace_attention(clone_model(model)).eval()
    report = SurgeryReport(
        model=model_name(model_dir),
        standard_max_abs_err=max_abs_err(reference_hidden, last_hidden_states(replaced, batches), batches),
        n_sentences=len(sentences),
        layers=None if layers is None else list(layers),
    )
    specs = list(relaxations or DEFAULT_RELAXATIONS)
    _check_relaxations(attention_layers(replaced), specs, layers)
    report.audit = audit_fn(model) if audit_fn is not None else None
    for spec in specs:
        row = _measure_relaxation(report, replaced, spec, layers, seed=seed, batches=batches, reference=reference)
        if on_result is not None:
            on_result(row)
    return report


def _check_relaxations(wrappers: list[AxiomSelfAttention], specs: list[str], layers: Sequence[int] | None) -> None:
    """Fail on a bad relax string or layer index before measuring anything (ValueError)."""
    for spec in specs:
        wrappers[0].spec.relax(spec)
    _check_layer_indices(layers or [], len(wrappers))


def _measure_relaxation(
    report: SurgeryReport,
    replaced: nn.Module,
    spec: str,
    layers: Sequence[int] | None,
    *,
    seed: int,
    batches: list[dict[str, Tensor]],
    reference: Tensor,
) -> dict[str, Any]:
    """Relax a copy of ``replaced`` by ``spec``, compare its embeddings with ``reference`` and add the row and the
    relaxed layer's fresh parameters to ``report``; the row."""
    relaxed = relax_model(clone_model(replaced), spec, layers, seed=seed)
    after = embed(relaxed, batches)
    row = {
        "spec": spec,
        "cosine": mean_cosine(reference, after),
        "retrieval_agreement": retrieval_agreement(reference, after),
    }
    report.relaxations.append(row)
    wrappers = attention_layers(relaxed)
    report.fresh_parameters[spec] = list(wrappers[layers[0] if layers else 0].fresh_parameters)
    return row
