"""axiomformer as a transformers attention implementation: ``attn_implementation="axiomformer"``.

transformers' attention modules project q, k, v (and apply RoPE) themselves, then call the registered function

    attention_interface(module, query, key, value, attention_mask, dropout=..., scaling=..., **kwargs)
        -> (out (batch, q_len, heads, head_dim), weights (batch, heads, q_len, k_len) or None)

:func:`axiomformer_attention_forward` computes it with axiomformer's engines and honours every argument that
transformers passes to eager attention (checked against eager on Llama, Mistral, Qwen2, Gemma 2, GPT-2 and BERT in
``tests/test_hf_contract.py``):

=====================  =========================================================================================
argument               how it is honoured
=====================  =========================================================================================
key/value head groups  key/value heads fewer than query heads (GQA, Ainslie et al. 2023) are shared by groups of
                       ``heads / kv_heads`` consecutive query heads, as transformers' ``repeat_kv``
``attention_mask``     bool (True = may attend) or additive float (``finfo.min`` / ``-inf`` blocks), (batch|1,
                       1|heads, q_len, k_len)
``scaling``            the score temperature (default ``head_dim ** -0.5``)
``dropout``            dropout on the weights, applied when ``module.training``
``is_causal``          (or ``module.is_causal``) used as transformers' SDPA path uses it: only without a mask and
                       with more than one query; keys beyond the queries (a static cache's empty slots) hidden
``sliding_window``     carried by the mask transformers builds for the layer; without a mask, applied here
                       (causal: i - j < window; bidirectional: |i - j| <= window, as transformers' overlays)
``softcap``            logit soft-capping ``c tanh(s / c)`` before the mask (Gemma 2): the spec field ``softcap``
``s_aux`` (sinks)      one learned logit per head in the softmax denominator (GPT-OSS): ``normalizer=softmax_sink``
                       with the model's logits as b_h
``position_bias``      added to the scores (T5-style relative bias)
``output_attentions``  (or ``module.config.output_attentions``) returns the weights, in the query's dtype, taken
                       *before* dropout (eager returns them after dropout; equal outside training)
=====================  =========================================================================================

Arguments that only inform other implementations are accepted and unused: ``position_ids`` and ``cache_position``
(positions are already in q and k; the mask carries packing), ``use_cache``, ``output_hidden_states``,
``return_dict``, ``encoder_hidden_states``. Any other argument with a value raises ``NotImplementedError`` naming it
(e.g. flash-attention's ``cu_seq_lens_q``); nothing is dropped silently.

A caveat of transformers, not ours: GPT-2's model removes ``output_attentions`` from the call before it reaches the
attention function; set ``model.config.output_attentions = True`` to get its maps.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from axiomformer.attention import Attention
from axiomformer.engines import Plan, attend
from axiomformer.masks import prepare_masks
from axiomformer.spec import AttentionSpec

IMPLEMENTATION = "axiomformer"
"""The name under which axiomformer registers itself with transformers (``config._attn_implementation``)."""

HONOURED = (
    "attention_mask",
    "scaling",
    "dropout",
    "is_causal",
    "sliding_window",
    "softcap",
    "s_aux",
    "position_bias",
    "output_attentions",
)
"""Arguments of the transformers attention contract that change the result, all honoured."""

INFORMATIONAL = (
    "position_ids",
    "cache_position",
    "use_cache",
    "output_hidden_states",
    "return_dict",
    "encoder_hidden_states",
)
"""Arguments that carry nothing the computation needs (see the module docstring)."""


def hf_attention_mask(mask: Tensor | None) -> Tensor | None:
    """Convert a transformers attention mask to axiomformer's convention.

    Args:
        mask: ``None``; bool (batch, 1, q_len, k_len) with True = may attend (transformers' ``sdpa_mask``, and ours);
            or float of the same shape added to the scores, where ``torch.finfo(dtype).min`` (or ``-inf``) blocks a
            key (transformers' ``eager_mask`` and the "extended attention mask" of older versions).

    Returns:
        ``None``, a bool mask (True = may attend), or a float mask whose ``-inf`` entries block and whose finite
        entries are a score bias (only when the input carried a non-zero bias besides the blocking values).

    Raises:
        ValueError: a mask that is neither bool nor floating point.
    """
    if mask is None or mask.dtype == torch.bool:
        return mask
    if not mask.is_floating_point():
        raise ValueError(f"attention mask must be bool or float, got dtype {mask.dtype}")
    blocked = mask <= torch.finfo(mask.dtype).min / 2  # -inf included
    bias = mask.masked_fill(blocked, 0.0)
    if not bool(bias.any()):
        return ~blocked
    return bias.masked_fill(blocked, float("-inf"))


_CORES: dict[tuple, Attention] = {}


def adapter_spec(num_heads: int, head_dim: int, softcap: float | None = None, sinks: bool = False) -> AttentionSpec:
    """The point of the design space a transformers attention call is: standard attention, with Gemma 2's logit
    soft-capping as the spec field ``softcap`` and GPT-OSS's learned sinks (``s_aux``) as ``normalizer=softmax_sink``.

    A model run through this adapter is therefore described by registry choices, and relaxing them is a spec change
    (e.g. ``normalizer=softmax`` drops the sinks, ``softcap=0`` the capping).
    """
    spec = AttentionSpec.standard(num_heads * head_dim, num_heads)
    return spec.relax(softcap=float(softcap or 0.0), normalizer="softmax_sink" if sinks else "softmax")


def _core(num_heads: int, head_dim: int, softcap: float | None, sinks: bool) -> Attention:
    """A module of :func:`adapter_spec` whose score, scale, normalizer and contribution run the problem (q, k, v
    arrive projected)."""
    key = (num_heads, head_dim, softcap, sinks)
    if key not in _CORES:
        _CORES[key] = Attention(adapter_spec(num_heads, head_dim, softcap, sinks)).eval()
    return _CORES[key]


class _Sinks(nn.Module):
    """The sink logits of one call (transformers' ``s_aux``, the model's own parameter) in the place of
    ``normalizer=softmax_sink``'s learned ``sink_logit``, so that gradients reach the model's parameter."""

    def __init__(self, logits: Tensor):
        super().__init__()
        self.sink_logit = logits


def _plan(core: Attention, s_aux: Tensor | None) -> Plan:
    if s_aux is None:
        return core.plan
    return Plan(core.spec, core.score_fn, core.contribution, _Sinks(s_aux.float().reshape(-1)))


def _check_arguments(kwargs: dict[str, Any]) -> None:
    unknown = sorted(
        name for name, value in kwargs.items() if name not in INFORMATIONAL and value is not None and value is not False
    )
    if unknown:
        raise NotImplementedError(
            f"attn_implementation={IMPLEMENTATION!r} does not support the argument(s) {', '.join(unknown)}; it "
            f"honours {', '.join(HONOURED)} and key/value head groups (see axiomformer.surgery.hf_attention)"
        )


def _visibility(
    q_len: int, k_len: int, causal: bool, sliding_window: int | None, device: torch.device
) -> Tensor | None:
    """Bool (q_len, k_len) of the causal and sliding-window rules when there is no mask, or None when all visible.

    As transformers: causal aligned as its SDPA path aligns it (query i sees keys j <= i) with the window
    i - j < sliding_window; bidirectional windows keep |i - j| <= sliding_window.
    """
    if not causal and sliding_window is None:
        return None
    i = torch.arange(q_len, device=device).view(-1, 1) + (0 if causal else k_len - q_len)
    j = torch.arange(k_len, device=device).view(1, -1)
    visible = j <= i if causal else torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    if sliding_window is not None:
        visible = visible & ((i - j < sliding_window) if causal else ((i - j).abs() <= sliding_window))
    return visible


def _check_window(sliding_window: int | None) -> None:
    """ValueError unless ``sliding_window`` is None or a positive number of keys."""
    if sliding_window is not None and (isinstance(sliding_window, bool) or sliding_window <= 0):
        # transformers means "no window" by None; 0 or -1 read literally would be an empty band (all-zero output).
        raise ValueError(
            f"sliding_window must be a positive number of keys, or None for no window; got {sliding_window!r}"
        )


def _expand_kv_heads(heads: int, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
    """key/value (batch, kv_heads, k_len, d) repeated to ``heads`` heads (GQA); ValueError if they do not divide."""
    kv_heads = key.shape[1]
    if heads % kv_heads or value.shape[1] != kv_heads:
        raise ValueError(
            f"query heads {heads} must be a multiple of the key/value heads (key {tuple(key.shape)}, "
            f"value {tuple(value.shape)})"
        )
    if kv_heads != heads:  # GQA: each key/value head serves heads/kv_heads queries
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    return key, value


def _masks(
    module: nn.Module,
    is_causal: bool | None,
    attention_mask: Tensor | None,
    position_bias: Tensor | None,
    sliding_window: int | None,
    query: Tensor,
    k_len: int,
) -> tuple[Tensor | None, Tensor | None, bool]:
    """(mask, bias, causal flag) for :func:`attend`: transformers' mask and position bias, and the causal and
    sliding-window rules (causal: ``is_causal``, else the calling module's), as the engines' fast causal flag where
    it is exact, else folded into the mask. ``query``: (batch, heads, q_len, head_dim), for its sizes and device."""
    batch, heads, q_len, _ = query.shape
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
    mask, bias = prepare_masks(hf_attention_mask(attention_mask), None, batch, heads, q_len, k_len)
    if position_bias is not None:
        bias = position_bias if bias is None else bias + position_bias
    causal = causal and attention_mask is None and q_len > 1
    window_bites = sliding_window is not None and k_len > sliding_window
    flag = causal and q_len == k_len and not window_bites  # the engines' fast causal path
    rule = None if flag else _visibility(q_len, k_len, causal, sliding_window, query.device)
    if rule is not None:
        mask = rule.view(1, 1, q_len, k_len) if mask is None else mask & rule
    return mask, bias, flag


def axiomformer_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    s_aux: Tensor | None = None,
    position_bias: Tensor | None = None,
    output_attentions: bool | None = None,
    **kwargs: Any,
) -> tuple[Tensor, Tensor | None]:
    """transformers ``AttentionInterface`` function: attention computed by axiomformer's engines.

    Args:
        module: the calling transformers attention module (``training``, ``is_causal`` and ``config`` are read).
        query: (batch, heads, q_len, head_dim); key: (batch, kv_heads, k_len, head_dim); value: (batch, kv_heads,
            k_len, head_dim_v), with ``heads`` a multiple of ``kv_heads``.
        attention_mask: see :func:`hf_attention_mask`.
        the rest: see the module docstring's table.

    Returns:
        ``(out, weights)``: out (batch, q_len, heads, head_dim_v), the layout transformers expects; weights
        (batch, heads, q_len, k_len) when ``output_attentions`` (argument or config), else None.

    Raises:
        NotImplementedError: an argument outside the contract above, naming it.
        ValueError: ``heads`` not a multiple of ``kv_heads``, masks that do not fit (naming the shapes), or a
            ``sliding_window`` that is not a positive number of keys.
    """
    _check_arguments(kwargs)
    _check_window(sliding_window)
    _, heads, q_len, head_dim = query.shape
    k_len = key.shape[-2]
    key, value = _expand_kv_heads(heads, key, value)
    core = _core(heads, head_dim, None if softcap is None else float(softcap), s_aux is not None)
    query = _rescaled(query, scaling)
    mask, bias, flag = _masks(module, is_causal, attention_mask, position_bias, sliding_window, query, k_len)
    out, weights, _ = attend(
        query,
        key,
        value,
        parts=_plan(core, s_aux),
        mask=mask,
        bias=bias,
        scale=core.scale(),
        causal=flag,
        q_offset=key.shape[-2] - q_len,
        dropout_p=dropout,
        training=module.training,
        need_weights=_need_weights(module, output_attentions),
        engine=core.engine,
    )
    if weights is not None:
        weights = weights[..., :k_len].to(query.dtype)
    return out.transpose(1, 2).contiguous(), weights


def _rescaled(query: Tensor, scaling: float | None) -> Tensor:
    """``query`` rescaled so that the core's head_dim ** -0.5 applies transformers' ``scaling`` (None: the same)."""
    head_dim = query.shape[-1]
    scaling = head_dim**-0.5 if scaling is None else float(scaling)
    if not math.isclose(scaling, head_dim**-0.5, rel_tol=1e-6):
        query = query * (scaling * math.sqrt(head_dim))  # the core applies head_dim ** -0.5
    return query


def _need_weights(module: nn.Module, output_attentions: bool | None) -> bool:
    """Whether to return the weights: ``output_attentions``, else the calling module's config's."""
    return bool(
        output_attentions
        if output_attentions is not None
        else getattr(getattr(module, "config", None), "output_attentions", False)
    )


def register_with_transformers() -> str:
    """Register ``"axiomformer"`` in transformers' attention and attention-mask registries; return the name.

    Idempotent. Needs transformers >= 4.48 (``AttentionInterface``); the mask registration needs the
    ``masking_utils.AttentionMaskInterface`` of later versions and is skipped when absent (masks then arrive as
    float masks, which :func:`hf_attention_mask` converts).
    """
    from transformers import AttentionInterface

    AttentionInterface.register(IMPLEMENTATION, axiomformer_attention_forward)
    try:
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:  # pragma: no cover - older transformers
        return IMPLEMENTATION
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
    return IMPLEMENTATION
