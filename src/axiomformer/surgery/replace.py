"""Swap a pretrained BERT's self-attention for axiomformer's :class:`~axiomformer.attention.Attention`, then relax it.

BERT's attention sublayer (``<layer>.attention``) is

    h = LayerNorm( x + Dropout( W_o · MHA(W_q x, W_k x, W_v x) + b_o ) )

with the query/key/value linears in ``attention.self`` and ``W_o, b_o`` in ``attention.output.dense``. Surgery puts
*all four projections* into one ``Attention`` (``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``), installs it as
``attention.self`` (wrapped by :class:`AxiomSelfAttention`, which speaks BERT's calling convention) and replaces
``attention.output.dense`` by the identity; BERT keeps its own dropout, residual and LayerNorm. With the standard spec
the replaced model is the original model, numerically.

transformers' own extension points are used where they fit: the name ``"axiomformer"`` is registered in its
``AttentionMaskInterface`` (so BERT builds a boolean mask, True = may attend: axiomformer's convention) and in its
``AttentionInterface`` (a core ``(q, k, v, mask) -> out`` running axiomformer's engines, for attention modules that were
not replaced, e.g. ``AutoModel.from_pretrained(dir, attn_implementation="axiomformer")`` without surgery). A full module
swap is still needed for surgery: the registry function receives q, k, v already projected, so relaxations of the value
map (A3), the aggregator (A1) or input position encodings could not act through it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn

from axiomformer.attention import Attention
from axiomformer.engines import AttentionProblem, select_engine
from axiomformer.masks import prepare_masks
from axiomformer.spec import AttentionSpec
from axiomformer.surgery.load import SurgeryError

IMPLEMENTATION = "axiomformer"
"""The name under which axiomformer registers itself with transformers (``config._attn_implementation``)."""


# ---------------------------------------------------------------------------------------------- masks and registry
def hf_attention_mask(mask: Tensor | None) -> Tensor | None:
    """Convert a transformers attention mask to axiomformer's convention.

    Args:
        mask: ``None``; bool (batch, 1, q_len, k_len) with True = may attend (transformers' ``sdpa_mask``, and ours);
            or float of the same shape added to the scores, where ``torch.finfo(dtype).min`` (or ``-inf``) blocks a
            key (transformers' ``eager_mask`` and the "extended attention mask" of older versions).

    Returns:
        ``None``, a bool mask (True = may attend), or a float mask whose ``-inf`` entries block and whose finite
        entries are a score bias (only when the input carried a non-zero bias besides the blocking values).
    """
    if mask is None or mask.dtype == torch.bool:
        return mask
    if not mask.is_floating_point():
        raise ValueError(f"attention mask must be bool or float, got dtype {mask.dtype}")
    blocked = mask <= torch.finfo(mask.dtype).min / 2            # -inf included
    bias = mask.masked_fill(blocked, 0.0)
    if not bool(bias.any()):
        return ~blocked
    return bias.masked_fill(blocked, float("-inf"))


_STANDARD_CORES: dict[tuple[int, int], Attention] = {}


def _standard_core(num_heads: int, head_dim: int) -> Attention:
    key = (num_heads, head_dim)
    if key not in _STANDARD_CORES:
        # Only the score, scale, normalizer and contribution of this module are used (q, k, v arrive projected).
        _STANDARD_CORES[key] = Attention(AttentionSpec.standard(num_heads * head_dim, num_heads)).eval()
    return _STANDARD_CORES[key]


def axiomformer_attention_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                                  attention_mask: Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                                  **kwargs) -> tuple[Tensor, None]:
    """transformers ``AttentionInterface`` function: standard attention computed by axiomformer's engines.

    Args:
        module: the calling transformers attention module (its ``training`` and ``is_causal`` are read).
        query: (batch, heads, q_len, head_dim); key, value: (batch, heads, k_len, head_dim).
        attention_mask: see :func:`hf_attention_mask`.
        scaling: the score temperature (default ``head_dim ** -0.5``, Vaswani et al. 2017, eq. 1).
        dropout: dropout on the attention weights (used only in training).

    Returns:
        ``(out, None)`` with out (batch, q_len, heads, head_dim), the layout transformers expects.
    """
    batch, heads, q_len, head_dim = query.shape
    k_len = key.shape[-2]
    core = _standard_core(heads, head_dim)
    if scaling is not None and not math.isclose(scaling, head_dim ** -0.5, rel_tol=1e-6):
        query = query * (scaling * math.sqrt(head_dim))          # the core applies head_dim ** -0.5
    mask, bias = prepare_masks(hf_attention_mask(attention_mask), None, batch, heads, q_len, k_len)
    # As transformers' sdpa_attention_forward: a causal module with no mask relies on is_causal.
    causal = attention_mask is None and q_len > 1 and bool(getattr(module, "is_causal", False))
    problem = AttentionProblem(q=query, k=key, v=value, causal=causal, mask=mask, bias=bias, q_offset=k_len - q_len,
                               dropout_p=dropout, training=module.training)
    out, _ = select_engine(core, problem).run(core, problem, False)
    return out.transpose(1, 2).contiguous(), None


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


# ---------------------------------------------------------------------------------------------- the replacement
class AxiomSelfAttention(nn.Module):
    """BERT's ``attention.self`` slot, filled by an axiomformer :class:`Attention` (all four projections inside).

    ``forward(hidden_states (batch, seq, dim), attention_mask=None, **kwargs) -> (out (batch, seq, dim), None)``,
    the calling convention of transformers' ``BertSelfAttention``. Set ``record_weights = True`` to keep the
    attention weights (batch, heads, seq, seq) of the last call in ``last_weights``.

    Attributes:
        attention: the axiomformer module; :func:`relax_model` swaps it for a relaxed one.
        layer_idx: index of the layer in the encoder.
        fresh_parameters: names of ``attention`` parameters that are *not* pretrained (new with a relaxation and
            left at axiomformer's initialisation).
    """

    def __init__(self, attention: Attention, layer_idx: int | None = None):
        super().__init__()
        self.attention = attention
        self.layer_idx = layer_idx
        self.fresh_parameters: list[str] = []
        self.record_weights = False
        self.last_weights: Tensor | None = None

    @property
    def spec(self) -> AttentionSpec:
        return self.attention.spec

    def forward(self, hidden_states: Tensor, attention_mask: Tensor | None = None, cache=None,
                encoder_hidden_states: Tensor | None = None, **kwargs) -> tuple[Tensor, None]:
        if cache is not None or encoder_hidden_states is not None:
            raise NotImplementedError("surgery replaces encoder self-attention only (no KV cache, no cross-attention)")
        mask = hf_attention_mask(attention_mask)
        if self.record_weights:
            out, weights = self.attention(hidden_states, attn_mask=mask, need_weights=True)
            self.last_weights = weights.detach()
        else:
            out = self.attention(hidden_states, attn_mask=mask)
        return out, None

    def extra_repr(self) -> str:
        return f"layer_idx={self.layer_idx}"


def _is_bert_attention_block(module: nn.Module) -> bool:
    inner, output = getattr(module, "self", None), getattr(module, "output", None)
    if isinstance(inner, AxiomSelfAttention):
        return True
    if getattr(module, "is_cross_attention", False) or inner is None or output is None:
        return False
    return (all(isinstance(getattr(inner, name, None), nn.Linear) for name in ("query", "key", "value"))
            and isinstance(getattr(output, "dense", None), nn.Linear) and hasattr(output, "LayerNorm"))


def attention_blocks(model: nn.Module) -> list[nn.Module]:
    """BERT's ``<layer>.attention`` modules (self-attention + output sublayer), in layer order.

    Raises:
        SurgeryError: the model has none (not a BERT-family encoder), naming the model class.
    """
    blocks = [m for m in model.modules() if _is_bert_attention_block(m)]
    if not blocks:
        raise SurgeryError(f"{type(model).__name__} has no BERT-style self-attention (attention.self.query/key/value "
                           "and attention.output.dense); surgery supports BERT-family encoders")
    return blocks


def attention_from_bert(self_attention: nn.Module, output_dense: nn.Linear) -> Attention:
    """A standard-spec :class:`Attention` carrying the weights of a BERT self-attention and its output dense.

    Raises:
        SurgeryError: the attention width differs from the model width (``all_head_size != hidden_size``).
    """
    q, k, v = self_attention.query, self_attention.key, self_attention.value
    dim, heads = q.in_features, int(self_attention.num_attention_heads)
    if q.out_features != dim or output_dense.out_features != dim:
        raise SurgeryError(f"attention width {q.out_features} differs from model width {dim}; AttentionSpec needs "
                           "all_head_size == hidden_size")
    dropout = float(getattr(getattr(self_attention, "dropout", None), "p", 0.0))
    spec = AttentionSpec.standard(dim, heads, causal=bool(getattr(self_attention, "is_causal", False)),
                                  dropout=dropout, bias=q.bias is not None)
    module = Attention(spec).to(device=q.weight.device, dtype=q.weight.dtype)
    with torch.no_grad():
        for ours, theirs in ((module.q_proj, q), (module.k_proj, k), (module.v_proj, v), (module.out_proj, output_dense)):
            ours.weight.copy_(theirs.weight)
            if ours.bias is not None:
                ours.bias.copy_(theirs.bias)
    return module


def replace_attention(model: nn.Module) -> nn.Module:
    """Replace every BERT self-attention of ``model`` by an axiomformer :class:`Attention` with the same weights.

    In place; returns ``model``. Also registers ``"axiomformer"`` with transformers and selects it as the model's
    attention implementation, so BERT builds boolean masks (True = may attend). Idempotent.

    Raises:
        SurgeryError: no BERT-style self-attention in ``model``.
    """
    blocks = attention_blocks(model)
    name = register_with_transformers()
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:  # pragma: no cover - older transformers
        model.config._attn_implementation = name
    for idx, block in enumerate(blocks):
        if isinstance(block.self, AxiomSelfAttention):
            continue
        attention = attention_from_bert(block.self, block.output.dense)
        attention.train(block.self.training)
        block.self = AxiomSelfAttention(attention, layer_idx=idx)
        block.output.dense = nn.Identity()
    return model


def attention_layers(model: nn.Module) -> list[AxiomSelfAttention]:
    """The :class:`AxiomSelfAttention` modules of a replaced model, in layer order (empty before surgery)."""
    return [m for m in model.modules() if isinstance(m, AxiomSelfAttention)]


def _transfer(old: Attention, new: Attention) -> list[str]:
    """Copy every parameter/buffer of ``old`` whose name and shape exist in ``new``; return the fresh names."""
    target = new.state_dict()
    carried = {k: v for k, v in old.state_dict().items() if k in target and target[k].shape == v.shape}
    new.load_state_dict(carried, strict=False)
    return [name for name, _ in new.named_parameters() if name not in carried]


def relax_model(model: nn.Module, changes: str | dict, layers: Iterable[int] | None = None, *,
                seed: int | None = 0) -> nn.Module:
    """Relax assumptions of the attention of a pretrained model, post hoc (no training), in place.

    Each selected layer's spec becomes ``spec.relax(changes)`` (so calls accumulate); every pretrained weight whose
    name and shape still exist is carried over (q/k/v/out projections). Parameters the relaxation adds (e.g. the
    bilinear form, cosine temperature, additive/MLP score, learned scale, ``joint`` contribution, ``mlp``
    aggregator or value map, learned position table) keep axiomformer's initialisation, seeded by ``seed + layer``
    for reproducibility; they are listed in each layer's ``fresh_parameters``. A model that was not replaced yet is
    replaced first (:func:`replace_attention`).

    Args:
        model: a BERT-family transformers model.
        changes: a relax string such as ``"normalizer=sigmoid"`` or ``"A4=cosine,scale=none"``, or a dict
            (see :meth:`AttentionSpec.relax`).
        layers: layer indices to relax (0-based); ``None`` relaxes every layer.
        seed: seed of the fresh parameters; ``None`` leaves the global RNG as it is.

    Returns:
        ``model``.

    Raises:
        ValueError: an unknown axis or choice (naming the valid ones) or a layer index out of range.
        SurgeryError: not a BERT-family model.
    """
    if not attention_layers(model):
        replace_attention(model)
    wrappers = attention_layers(model)
    indices: Sequence[int] = range(len(wrappers)) if layers is None else list(layers)
    for i in indices:
        if not isinstance(i, int) or not 0 <= i < len(wrappers):
            raise ValueError(f"layer index {i!r} out of range; the model has layers 0..{len(wrappers) - 1}")
    for i in indices:
        wrapper = wrappers[i]
        old = wrapper.attention
        spec = old.spec.relax(changes)
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed + i)
            new = Attention(spec, engine=old.engine)
        p = next(old.parameters())
        new = new.to(device=p.device, dtype=p.dtype).train(old.training)
        fresh = _transfer(old, new)
        wrapper.attention = new
        # A parameter carried over from a layer where it was already fresh is still not pretrained.
        names = {name for name, _ in new.named_parameters()}
        wrapper.fresh_parameters = sorted(set(fresh) | (set(wrapper.fresh_parameters) & names))
    return model
