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

from collections.abc import Iterable, Sequence
from typing import Any, NoReturn, SupportsIndex, cast

import torch
from torch import Tensor, nn

from axiomformer.attention import Attention
from axiomformer.spec import AttentionSpec
from axiomformer.surgery.hf_attention import (  # noqa: F401 - re-exported
    IMPLEMENTATION,
    INFORMATIONAL,
    axiomformer_attention_forward,
    hf_attention_mask,
    register_with_transformers,
)
from axiomformer.surgery.load import SurgeryError


# ---------------------------------------------------------------------------------------------- the replacement
class AxiomSelfAttention(nn.Module):
    """BERT's ``attention.self`` slot, filled by an axiomformer :class:`Attention` (all four projections inside).

    ``forward(hidden_states (batch, seq, dim), attention_mask=None, **kwargs) -> (out (batch, seq, dim), weights)``,
    the calling convention of transformers' ``BertSelfAttention``; ``weights`` (batch, heads, seq, seq) when
    ``output_attentions`` is asked (argument or ``config.output_attentions``), else None. ``head_mask``, a KV cache
    and cross-attention raise ``NotImplementedError``. Set ``record_weights = True`` to keep the attention weights of
    the last call in ``last_weights``.

    :func:`replace_attention` turns transformers' module into this class *in place* (:meth:`adopt`), so the model
    keeps the module object: hooks transformers installed on it (its ``output_attentions`` capture) stay, and it is
    still an instance of the original class.

    Attributes:
        attention: the axiomformer module; :func:`relax_model` swaps it for a relaxed one.
        layer_idx: index of the layer in the encoder.
        fresh_parameters: names of ``attention`` parameters that are *not* pretrained (new with a relaxation and
            left at axiomformer's initialisation).
    """

    def __init__(self, attention: Attention, layer_idx: int | None = None):
        nn.Module.__init__(self)
        self._setup(attention, layer_idx)

    def _setup(self, attention: Attention, layer_idx: int | None) -> None:
        self.attention = attention
        self.layer_idx = layer_idx
        self.fresh_parameters: list[str] = []
        self.record_weights = False
        self.last_weights: Tensor | None = None

    @classmethod
    def adopt(cls, module: nn.Module, attention: Attention, layer_idx: int | None = None) -> AxiomSelfAttention:
        """Turn ``module`` (a transformers self-attention) into an AxiomSelfAttention running ``attention``, in
        place: its submodules (the old projections) are removed, its class becomes a subclass of both."""
        for name, _ in list(module.named_children()):
            delattr(module, name)
        module.__class__ = _adopting_class(type(module))
        assert isinstance(module, AxiomSelfAttention)  # its class is now a subclass of both
        module._setup(attention, layer_idx)
        return module

    @property
    def spec(self) -> AttentionSpec:
        return self.attention.spec

    def forward(
        self,
        hidden_states: Tensor,
        attention_mask: Tensor | None = None,
        cache: object | None = None,
        encoder_hidden_states: Tensor | None = None,
        head_mask: Tensor | None = None,
        output_attentions: bool | None = None,
        **kwargs: Any,
    ) -> tuple[Tensor, Tensor | None]:
        if cache is not None or encoder_hidden_states is not None:
            raise NotImplementedError("surgery replaces encoder self-attention only (no KV cache, no cross-attention)")
        if head_mask is not None:
            raise NotImplementedError(
                "head_mask is not supported after surgery: relax or remove heads instead "
                "(transformers 5 no longer passes it to BERT's attention either)"
            )
        unknown = sorted(k for k, v in kwargs.items() if k not in INFORMATIONAL and v is not None and v is not False)
        if unknown:
            raise NotImplementedError(f"surgery's BERT self-attention does not support {', '.join(unknown)}")
        if output_attentions is None:
            output_attentions = getattr(getattr(self, "config", None), "output_attentions", False)
        mask = hf_attention_mask(attention_mask)
        if self.record_weights or output_attentions:
            out, weights = self.attention(hidden_states, attn_mask=mask, need_weights=True)
            weights = weights.to(hidden_states.dtype)
            if self.record_weights:
                self.last_weights = weights.detach()
            return out, (weights if output_attentions else None)
        return self.attention(hidden_states, attn_mask=mask), None

    def extra_repr(self) -> str:
        return f"layer_idx={self.layer_idx}"

    def __reduce_ex__(self, protocol: SupportsIndex) -> str | tuple[Any, ...]:
        base = getattr(type(self), "_adopted_base", None)
        if base is None:
            return super().__reduce_ex__(protocol)
        # The adopting class is made at run time; copies and pickles name its transformers base instead.
        return _new_adopted, (base,), self.__dict__


_ADOPTING: dict[type, type[AxiomSelfAttention]] = {}


def _new_adopted(base: type) -> AxiomSelfAttention:
    cls = _adopting_class(base)
    return cls.__new__(cls)


def _adopting_class(base: type) -> type[AxiomSelfAttention]:
    """The class ``Axiom<Base>(AxiomSelfAttention, base)``: our behaviour, and still an instance of ``base``."""
    if issubclass(base, AxiomSelfAttention):
        return base
    if base not in _ADOPTING:
        made = type(
            f"Axiom{base.__name__}", (AxiomSelfAttention, base), {"__module__": __name__, "_adopted_base": base}
        )
        _ADOPTING[base] = cast(type[AxiomSelfAttention], made)  # type() of these bases makes such a subclass
    return _ADOPTING[base]


def _attribute(module: nn.Module, name: str) -> Any:
    """A plain attribute of a transformers module (a config, a submodule, a head count), which nn.Module's typing
    would call ``Tensor | Module``."""
    return getattr(module, name)


def _linear(module: nn.Module, name: str) -> nn.Linear:
    """The projection ``module.<name>``; SurgeryError when it is not an ``nn.Linear``."""
    layer = getattr(module, name, None)
    if not isinstance(layer, nn.Linear):
        raise SurgeryError(f"{type(module).__name__}.{name} is not an nn.Linear (got {type(layer).__name__})")
    return layer


def _is_bert_attention_block(module: nn.Module) -> bool:
    inner, output = getattr(module, "self", None), getattr(module, "output", None)
    if isinstance(inner, AxiomSelfAttention):
        return True
    if getattr(module, "is_cross_attention", False) or inner is None or output is None:
        return False
    return (
        all(isinstance(getattr(inner, name, None), nn.Linear) for name in ("query", "key", "value"))
        and isinstance(getattr(output, "dense", None), nn.Linear)
        and hasattr(output, "LayerNorm")
    )


def attention_blocks(model: nn.Module) -> list[nn.Module]:
    """BERT's ``<layer>.attention`` modules (self-attention + output sublayer), in layer order.

    Raises:
        SurgeryError: the model has none (not a BERT-family encoder), naming the model class.
    """
    blocks = [m for m in model.modules() if _is_bert_attention_block(m)]
    if not blocks:
        raise SurgeryError(
            f"{type(model).__name__} has no BERT-style self-attention (attention.self.query/key/value "
            "and attention.output.dense); surgery supports BERT-family encoders"
        )
    return blocks


def attention_from_bert(self_attention: nn.Module, output_dense: nn.Linear) -> Attention:
    """A standard-spec :class:`Attention` carrying the weights of a BERT self-attention and its output dense.

    Raises:
        SurgeryError: the attention width differs from the model width (``all_head_size != hidden_size``).
    """
    q, k, v = (_linear(self_attention, name) for name in ("query", "key", "value"))
    dim, heads = q.in_features, int(_attribute(self_attention, "num_attention_heads"))
    if q.out_features != dim or output_dense.out_features != dim:
        raise SurgeryError(
            f"attention width {q.out_features} differs from model width {dim}; AttentionSpec needs "
            "all_head_size == hidden_size"
        )
    dropout = float(getattr(getattr(self_attention, "dropout", None), "p", 0.0))
    spec = AttentionSpec.standard(
        dim, heads, causal=bool(getattr(self_attention, "is_causal", False)), dropout=dropout, bias=q.bias is not None
    )
    module = Attention(spec).to(device=q.weight.device, dtype=q.weight.dtype)
    with torch.no_grad():
        for ours, theirs in (
            (module.q_proj, q),
            (module.k_proj, k),
            (module.v_proj, v),
            (module.out_proj, output_dense),
        ):
            assert isinstance(ours, nn.Linear)  # the standard spec's projections are linear
            ours.weight.copy_(theirs.weight)
            if ours.bias is not None:
                ours.bias.copy_(theirs.bias)
    return module


def _refuse_save_pretrained(*args: object, **kwargs: object) -> NoReturn:
    raise SurgeryError(
        "save_pretrained after replace_attention would write attention weights under names transformers does not "
        "know (attention.self.attention.*, no attention.output.dense): from_pretrained would silently initialise "
        "them at random. Save the model before surgery (surgery is reproducible: replace_attention and relax_model "
        "with the same seed), or keep the replaced model's state_dict() with safetensors/torch"
    )


def _block_save_pretrained(model: nn.Module) -> None:
    """Make ``model.save_pretrained`` (and ``push_to_hub``, which calls it) raise instead of writing a checkpoint
    that reloads with random attention weights (huggingface/optimum PR#676 blocks saving converted models too)."""
    if hasattr(model, "save_pretrained"):
        # nn.Module's attribute typing knows tensors and modules only; this is a plain function attribute.
        model.save_pretrained = _refuse_save_pretrained  # type: ignore[assignment]


def replace_attention(model: nn.Module) -> nn.Module:
    """Replace every BERT self-attention of ``model`` by an axiomformer :class:`Attention` with the same weights.

    In place; returns ``model``. Also registers ``"axiomformer"`` with transformers and selects it as the model's
    attention implementation, so BERT builds boolean masks (True = may attend). Idempotent. Afterwards the model's
    ``save_pretrained`` raises :class:`SurgeryError` (its checkpoint would reload with random attention weights).

    Raises:
        SurgeryError: no BERT-style self-attention in ``model``.
    """
    blocks = attention_blocks(model)
    name = register_with_transformers()
    if hasattr(model, "set_attn_implementation"):
        _attribute(model, "set_attn_implementation")(name)
    else:  # pragma: no cover - older transformers
        _attribute(model, "config")._attn_implementation = name
    for idx, block in enumerate(blocks):
        inner = _attribute(block, "self")
        if isinstance(inner, AxiomSelfAttention):
            continue
        output = _attribute(block, "output")
        attention = attention_from_bert(inner, _linear(output, "dense"))
        attention.train(inner.training)
        AxiomSelfAttention.adopt(inner, attention, layer_idx=idx)
        output.dense = nn.Identity()
    _block_save_pretrained(model)
    return model


def attention_layers(model: nn.Module) -> list[AxiomSelfAttention]:
    """The :class:`AxiomSelfAttention` modules of a replaced model, in layer order (empty before surgery)."""
    return [m for m in model.modules() if isinstance(m, AxiomSelfAttention)]


def _check_layer_indices(indices: Iterable[int], count: int) -> None:
    """ValueError unless every index is an int in 0 .. count - 1 (the model's layers)."""
    for i in indices:
        if not isinstance(i, int) or not 0 <= i < count:
            raise ValueError(f"layer index {i!r} out of range; the model has layers 0..{count - 1}")


def _transfer(old: Attention, new: Attention) -> list[str]:
    """Copy every parameter/buffer of ``old`` whose name and shape exist in ``new``; return the fresh names."""
    target = new.state_dict()
    carried = {k: v for k, v in old.state_dict().items() if k in target and target[k].shape == v.shape}
    new.load_state_dict(carried, strict=False)
    return [name for name, _ in new.named_parameters() if name not in carried]


def relax_model(
    model: nn.Module, changes: str | dict, layers: Iterable[int] | None = None, *, seed: int | None = 0
) -> nn.Module:
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
    _check_layer_indices(indices, len(wrappers))
    for i in indices:
        wrapper = wrappers[i]
        old = wrapper.attention
        spec = old.spec.relax(changes)
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed + i)
            new = Attention(spec, engine=old.engine, layer_index=i)  # the depth: diff_authors
        p = next(old.parameters())
        new = new.to(device=p.device, dtype=p.dtype).train(old.training)
        fresh = _transfer(old, new)
        wrapper.attention = new
        # A parameter carried over from a layer where it was already fresh is still not pretrained.
        names = {name for name, _ in new.named_parameters()}
        wrapper.fresh_parameters = sorted(set(fresh) | (set(wrapper.fresh_parameters) & names))
    return model
