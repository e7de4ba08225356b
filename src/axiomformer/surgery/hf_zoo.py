"""Tiny random transformers models, one per attention family, built offline from a config (nothing is downloaded).

``hf:<family>`` audit targets and ``axiomformer audit --hf-zoo`` build them here: hidden size 16, 2 heads of
head_dim 8 (as many key/value heads as query heads), one or a few layers, vocabulary 32, seeded weights, the family's
eager attention. Each family keeps what makes its attention its own (sliding window, soft-capping, the query
pre-attention scalar, q/k norms, the output gate, sinks, relative bias, MLA's latent keys and values).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from axiomformer.errors import UserInputError
from axiomformer.runtime import seeded

HEADS, HEAD_DIM, VOCAB = 2, 8, 32


@dataclass(frozen=True)
class Family:
    """One family: its config, the model class that runs it, which attention layer the audit reads, what it shows."""

    config: Callable[[int], Any]
    """head_dim -> a transformers config (hidden size HEADS * head_dim)."""
    model: str = "AutoModel"
    """transformers class that builds the model from the config (``AutoModel`` uses ``from_config``)."""
    layer: int = 0
    """Index among the modules that call the attention interface."""
    rope: bool = True
    shows: str = ""
    """What the family's attention has beyond the standard form (the zoo table prints it)."""


def _decoder(hd: int, kinds: list[str] | None = None) -> dict[str, Any]:
    """The shared decoder config; ``kinds``: one ``layer_types`` entry per layer (default one plain layer)."""
    extra: dict[str, Any] = {} if kinds is None else {"layer_types": list(kinds)}
    return dict(
        **extra,
        vocab_size=VOCAB,
        hidden_size=HEADS * hd,
        intermediate_size=32,
        num_hidden_layers=1 if kinds is None else len(kinds),
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        head_dim=hd,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )


def _no_head_dim(hd: int) -> dict[str, Any]:
    out = _decoder(hd)
    del out["head_dim"]
    return out


def _t(name: str) -> Any:
    import transformers

    return getattr(transformers, name)


_TINY_MOE = {"num_experts_per_tok": 1, "moe_intermediate_size": 16}
"""The mixture-of-experts sizes of the MoE families (qwen3-next, deepseek-v3): one expert per token, width 16."""

_SLIDING_FULL = ["sliding_attention", "full_attention"]
"""``layer_types`` of a sliding-window layer then a full-attention layer (the audit reads layer 1)."""


def _gemma3(hd: int) -> Any:
    """Gemma 3's text config (both ``gemma3`` entries: one audits the full layer, one the sliding layer)."""
    return _t("Gemma3TextConfig")(**_decoder(hd, _SLIDING_FULL), sliding_window=4, query_pre_attn_scalar=6)


def _encoder(hd: int) -> dict[str, Any]:
    """The sizes the older (falcon, bert) configs name alike: one layer of HEADS heads, hidden HEADS * hd."""
    return dict(vocab_size=VOCAB, hidden_size=HEADS * hd, num_hidden_layers=1, num_attention_heads=HEADS)


FAMILIES: dict[str, Family] = {
    "llama": Family(lambda hd: _t("LlamaConfig")(**_decoder(hd)), shows="RoPE"),
    "mistral": Family(lambda hd: _t("MistralConfig")(**_decoder(hd), sliding_window=4), shows="RoPE, sliding window 4"),
    "gemma2": Family(
        lambda hd: _t("Gemma2Config")(
            **_decoder(hd, _SLIDING_FULL), sliding_window=4, attn_logit_softcapping=2.0, query_pre_attn_scalar=6
        ),
        layer=1,
        shows="RoPE, logit soft-capping 2.0, query_pre_attn_scalar 6 (a full-attention layer)",
    ),
    "gemma3": Family(
        _gemma3,
        model="Gemma3TextModel",
        layer=1,
        shows="RoPE, q/k RMS norms, query_pre_attn_scalar 6 (a full-attention layer)",
    ),
    "gemma3-sliding": Family(
        _gemma3, model="Gemma3TextModel", shows="RoPE, q/k RMS norms, sliding window 4 (a sliding layer)"
    ),
    "qwen2": Family(lambda hd: _t("Qwen2Config")(**_no_head_dim(hd)), shows="RoPE, q/k/v biases"),
    "qwen3": Family(lambda hd: _t("Qwen3Config")(**_decoder(hd)), shows="RoPE, q/k RMS norms"),
    "qwen3-next": Family(
        lambda hd: _t("Qwen3NextConfig")(
            **_decoder(hd, ["linear_attention", "full_attention"]),
            **_TINY_MOE,
            num_experts=2,
            shared_expert_intermediate_size=16,
            linear_num_value_heads=2,
            linear_num_key_heads=2,
            linear_key_head_dim=8,
            linear_value_head_dim=8,
        ),
        shows="partial RoPE, q/k norms, sigmoid output gate from the query; its gated DeltaNet layers are not "
        "audited (they call no attention function: linear attention, the transport axis)",
    ),
    "gpt-oss": Family(
        lambda hd: _t("GptOssConfig")(
            **_decoder(hd, _SLIDING_FULL), num_local_experts=2, num_experts_per_tok=1, sliding_window=4
        ),
        layer=1,
        shows="RoPE, q/k/v/o biases, one learned sink logit per head (a full-attention layer)",
    ),
    "phi3": Family(lambda hd: _t("Phi3Config")(**_no_head_dim(hd)), shows="RoPE, fused qkv_proj"),
    "falcon": Family(
        lambda hd: _t("FalconConfig")(**_encoder(hd), multi_query=False, new_decoder_architecture=False),
        shows="RoPE, fused query_key_value",
    ),
    "gpt2": Family(
        lambda hd: _t("GPT2Config")(vocab_size=VOCAB, n_embd=HEADS * hd, n_layer=1, n_head=HEADS, n_positions=64),
        shows="learned absolute positions (outside the attention), fused c_attn with biases",
    ),
    "bert": Family(
        lambda hd: _t("BertConfig")(**_encoder(hd), intermediate_size=32, attention_probs_dropout_prob=0.0),
        shows="bidirectional, q/k/v biases, absolute positions outside the attention",
    ),
    "t5": Family(
        lambda hd: _t("T5Config")(
            vocab_size=VOCAB, d_model=HEADS * hd, d_kv=hd, d_ff=32, num_layers=1, num_heads=HEADS, dropout_rate=0.0
        ),
        model="T5EncoderModel",
        shows="bidirectional encoder, bucketed relative position bias, no 1/sqrt(d) scale",
    ),
    "deepseek-v3": Family(
        lambda hd: _t("DeepseekV3Config")(
            **_no_head_dim(hd),
            **_TINY_MOE,
            q_lora_rank=None,
            kv_lora_rank=8,
            qk_rope_head_dim=hd // 2,
            qk_nope_head_dim=hd // 2,
            v_head_dim=hd,
            n_routed_experts=2,
            n_group=1,
            topk_group=1,
            first_k_dense_replace=1,
        ),
        shows="MLA: keys and values from one low-rank latent (kept as trained), decoupled RoPE on half the dims",
    ),
}
"""Built-in families of ``hf:<family>`` (underscores are accepted for hyphens)."""


NOPE = "-nope"
"""Suffix of a family name that audits it with RoPE off (``hf:gemma2-nope``): cos = 1, sin = 0."""


def family_name(text: str) -> str | None:
    """The family ``text`` names (``qwen3_next`` = ``qwen3-next``; a ``-nope`` suffix kept), or None."""
    key = text.strip().lower().replace("_", "-")
    return key if key.removesuffix(NOPE) in FAMILIES else None


def build(family: str, head_dim: int = HEAD_DIM, seed: int = 0, implementation: str = "eager") -> nn.Module:
    """The family's tiny model, seeded, in eval mode, float32.

    Raises:
        UserInputError: unknown family (naming them), or a config that does not build (naming the family).
    """
    key = family_name(family)
    if key is None:
        raise UserInputError(
            f"unknown hf family {family!r}; the built-in families are: {', '.join(FAMILIES)} (a {NOPE} suffix audits "
            "a RoPE family with RoPE off)"
        )
    key = key.removesuffix(NOPE)
    fam = FAMILIES[key]
    try:
        config = fam.config(head_dim)
        config._attn_implementation = implementation
        with warnings.catch_warnings(), seeded(seed):
            warnings.simplefilter("ignore")
            cls = _t(fam.model)
            model = cls.from_config(config) if fam.model == "AutoModel" else cls(config)
    except (ImportError, AttributeError, TypeError, ValueError, AssertionError) as err:
        raise UserInputError(
            f"hf:{key}: its tiny config (hidden {HEADS * head_dim}, {HEADS} heads of {head_dim}) does not build in "
            f"this transformers: {type(err).__name__}: {err}"
        ) from None
    with torch.no_grad():
        for module in model.modules():  # sinks (gpt-oss) start at zero: give them a value, as a trained model has
            sinks = getattr(module, "sinks", None)
            if isinstance(sinks, nn.Parameter):
                sinks.copy_(torch.linspace(-1.0, 1.0, sinks.numel()).view_as(sinks))
    return model.eval()


def family_adapter(family: str, *, seed: int = 0, layer: int | None = None, implementation: str = "eager") -> Any:
    """An :class:`~axiomformer.surgery.hf_audit.HFAttentionAdapter` of the family's tiny model (see :func:`build`)."""
    from axiomformer.surgery.hf_audit import HFAttentionAdapter

    model = build(family, seed=seed, implementation=implementation)
    key = str(family_name(family))
    fam = FAMILIES[key.removesuffix(NOPE)]
    return HFAttentionAdapter(
        model,
        fam.layer if layer is None else layer,
        f"hf:{key}",
        seed=seed,
        rope=fam.rope and not key.endswith(NOPE),
        rebuild=lambda hd: build(key, hd, seed, implementation),
        implementation=implementation,
    )


# ------------------------------------------------------------------------------------------------ the zoo table
ZOO_TARGETS = (*FAMILIES, *(f"{f}{NOPE}" for f in ("llama", "gemma2", "qwen3-next", "gpt-oss")))
"""What ``axiomformer audit --hf-zoo`` audits: every family as built, and four RoPE families with RoPE off (their
other departures without the positions' A0 in every candidate list)."""
ASSUMPTION_NAMES = ("A0", "A1", "A2", "A3", "A4", "A5", "causal")


def zoo_entry(target: str, report: Any) -> dict[str, Any]:
    """One row of the zoo: the family, what its attention shows, which assumptions no failed check names
    (``satisfies``), and each failed assumption check with its candidates."""
    family = target.removeprefix("hf:")
    key = family.removesuffix(NOPE)
    failures = [
        {"check": c.name, "assumption": c.assumption, "candidates": list(c.candidates)}
        for c in report.checks
        if c.passed is False and c.candidates
    ]
    named = {a for f in failures for a in (f["assumption"], *f["candidates"])}
    shows = FAMILIES[key].shows + (" - audited with RoPE off" if family.endswith(NOPE) else "")
    return {
        "target": target,
        "shows": shows,
        "satisfies": [a for a in ASSUMPTION_NAMES[:-1] if a not in named]
        + (["causal"] if any(c.name == "causality" and c.passed for c in report.checks) else []),
        "failures": failures,
        "not_applicable": [c.name for c in report.checks if c.passed is None],
        "notes": list(report.notes),
    }


def hf_zoo(targets: tuple[str, ...] = ZOO_TARGETS, seed: int = 0) -> dict[str, Any]:
    """Audit each ``hf:`` target (:data:`ZOO_TARGETS`) with its tiny config; ``{"transformers", "entries"}``."""
    import transformers

    from axiomformer.audit import run_audit

    entries = [zoo_entry(f"hf:{t}", run_audit(family_adapter(t, seed=seed), seed=seed)) for t in targets]
    return {"transformers": transformers.__version__, "seed": seed, "entries": entries}


def zoo_markdown(zoo: dict[str, Any]) -> str:
    """The zoo as a Markdown table: per target, what it shows, the assumptions it satisfies, its failed checks
    with their candidates (``A4 or A5``: cannot be told apart from outside)."""
    lines = [
        f"Audited with transformers {zoo['transformers']}, seed {zoo['seed']}.",
        "",
        "| target | its attention | satisfies | failed checks (candidates) |",
        "|---|---|---|---|",
    ]
    for e in zoo["entries"]:
        failed = "; ".join(f"`{f['check']}` ({' or '.join(f['candidates'])})" for f in e["failures"]) or "none"
        lines.append(f"| `{e['target']}` | {e['shows']} | {', '.join(e['satisfies']) or 'none'} | {failed} |")
    return "\n".join(lines) + "\n"
