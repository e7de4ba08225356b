"""Audit adapter for Hugging Face BERT-family self-attention (``BertSelfAttention`` and its copies in transformers).

``axiomformer.audit`` probes a map (q, k, v) -> out on (batch, seq, dim) tensors. A BERT self-attention computes
q, k, v from one ``hidden_states`` tensor, so the adapter feeds it ``hidden_states = [q | k | v]`` (width 3*dim) and,
on a float64 copy, replaces its ``query`` / ``key`` / ``value`` linears by slices of that input — ``query`` and ``key``
keep their pretrained biases after the slice (b_q adds b_q.k_j to the scores, a per-key content term the A4 checks see;
the report's notes say so), ``value`` keeps the pretrained W_v and b_v after its slice. The forward pass itself stays
transformers' own ``BertSelfAttention.forward`` and the model's registered attention function (``sdpa``, ``eager``,
or ``axiomformer``). This follows the audit's convention for every target **(its choice, see
axiomformer.audit.adapters)**: query/key projection weights are the identity (no assumption constrains them), the
value map is the object of A3 and is kept; BERT's output dense is outside
``attention.self`` and outside the audit.

Importing this module registers, with :func:`axiomformer.audit.register_adapter`:
    * HF self-attention modules (duck-typed: ``query``/``key``/``value`` linears, ``num_attention_heads``, ``config``);
    * :class:`~axiomformer.surgery.AxiomSelfAttention` (audited as its axiomformer ``Attention``);
    * target strings ``"hf:"`` (layer 0 of the bundled all-MiniLM-L6-v2), ``"hf:<model dir>"`` and
      ``"hf:<model dir>#<layer>"``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn

from axiomformer.audit import AttentionAdapter, register_adapter, run_audit
from axiomformer.audit.adapters import Adapter, AddBias, bias_notes
from axiomformer.errors import UserInputError
from axiomformer.runtime import seeded
from axiomformer.surgery.replace import AxiomSelfAttention, _attribute, _linear


class _Slice(nn.Module):
    """x[..., index*width:(index+1)*width]: one of q, k, v from the stacked input [q | k | v]."""

    def __init__(self, index: int, width: int):
        super().__init__()
        self.index, self.width = index, width

    def forward(self, x: Tensor) -> Tensor:
        return x[..., self.index * self.width : (self.index + 1) * self.width]


def is_hf_self_attention(obj: Any) -> bool:
    """True for a transformers BERT-style self-attention module (duck-typed, transformers is not imported)."""
    return (
        isinstance(obj, nn.Module)
        and not isinstance(obj, AxiomSelfAttention)
        and all(isinstance(getattr(obj, n, None), nn.Linear) for n in ("query", "key", "value"))
        and hasattr(obj, "num_attention_heads")
        and hasattr(obj, "config")
    )


class HFSelfAttentionAdapter(Adapter):
    """A transformers BERT self-attention seen as (q, k, v) -> out, in float64 (see the module docstring).

    q, k and v must share their length (it is self-attention). A causal mask on request is passed as transformers'
    additive 4-D mask (``finfo.min`` blocks), which every registered attention function accepts.

    Weights (batch, heads, q_len, k_len) are read from the module itself, whatever attention function it runs (SDPA
    returns none): a second copy with the identity value map is called once per key j with v_j = 1 and every other
    value 0, so output coordinate h*head_dim of query i is w_hij (the output is sum_j w_ij v_j for any weights).
    """

    exposes_weights = True

    supports_causal = True
    has_positions = False  # BERT adds positions to the embeddings, outside the attention

    def __init__(self, module: nn.Module, name: str | None = None, seed: int = 0):
        self.original, self.seed = module, seed
        m = copy.deepcopy(module).to(torch.float64).eval()
        query, key, pretrained_value = (_linear(m, name) for name in ("query", "key", "value"))
        d = query.in_features
        self.notes = bias_notes(query.bias, key.bias, pretrained_value.bias)
        if self.notes:
            self.notes += (
                "scale_entropy rebuilds the layer at other head dims with zero biases (transformers' "
                "initial values; their shape depends on head_dim)",
            )
        m.query, m.key = (nn.Sequential(_Slice(i, d), AddBias(lin.bias)) for i, lin in enumerate((query, key)))
        m.value = nn.Sequential(_Slice(2, d), pretrained_value)
        self.module, self.pretrained_value = m, pretrained_value
        self.weight_probe = copy.copy(m)  # shares everything but its value map, which is the identity
        self.weight_probe._modules = dict(m._modules, value=_Slice(2, d))
        self.name = name or f"{type(module).__name__} ({_attribute(m, 'config')._attn_implementation})"
        self.dim, self.num_heads = d, int(_attribute(m, "num_attention_heads"))
        self.causal = bool(getattr(m, "is_causal", False))
        self.dropout = float(getattr(getattr(m, "dropout", None), "p", 0.0))

    def _run(self, q: Tensor, k: Tensor, v: Tensor, causal: bool, module: nn.Module | None = None) -> Tensor:
        if not q.shape[1] == k.shape[1] == v.shape[1]:
            raise ValueError(
                f"a self-attention needs equal q, k, v lengths; got {q.shape[1]}, {k.shape[1]}, {v.shape[1]}"
            )
        mask = None
        if causal and not self.causal:
            n = q.shape[1]
            blocked = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
            mask = torch.zeros(1, 1, n, n, dtype=q.dtype, device=q.device).masked_fill(
                blocked, torch.finfo(q.dtype).min
            )
        return (module or self.module)(torch.cat([q, k, v], dim=-1), attention_mask=mask)[0]

    def __call__(self, q, k, v, *, causal=False):
        return self._run(q, k, v, causal)

    def value_map(self):
        return self.pretrained_value

    def weights(self, q, k, *, causal=False):
        b, n, d = k.shape
        probes = torch.zeros(n, b, n, d, dtype=k.dtype, device=k.device)
        probes[torch.arange(n), :, torch.arange(n)] = 1.0  # probe j: v_j = 1, other values 0
        out = self._run(
            q.repeat(n, 1, 1), k.repeat(n, 1, 1), probes.reshape(n * b, n, d), causal, self.weight_probe
        ).view(n, b, q.shape[1], d)
        first = torch.arange(self.num_heads, device=k.device) * (d // self.num_heads)
        return out[..., first].permute(1, 3, 2, 0)  # (batch, heads, q_len, k_len)

    def with_head_dim(self, head_dim):
        config = copy.deepcopy(_attribute(self.original, "config"))
        config.hidden_size = head_dim * self.num_heads
        with seeded(self.seed):
            fresh = type(self.original)(config)
        with torch.no_grad():
            for lin in (_linear(fresh, name) for name in ("query", "key", "value")):
                if lin.bias is not None:
                    lin.bias.zero_()
        return HFSelfAttentionAdapter(fresh, self.name, self.seed)

    def set_training(self, flag):
        self.module.train(flag)
        return True


def _hf_module(target: nn.Module, *, seed: int = 0, **_: Any) -> Adapter:
    return HFSelfAttentionAdapter(target, seed=seed)


def _axiom_wrapper(target: AxiomSelfAttention, *, seed: int = 0, **_: Any) -> Adapter:
    name = f"surgery layer {target.layer_idx}: Attention({target.spec.variant})"
    return AttentionAdapter(target.attention, name, seed)


def _model_type(folder: Any) -> str | None:
    """``model_type`` of the ``config.json`` in ``folder`` (None when there is none or it is unreadable)."""
    import json

    try:
        return json.loads((folder / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None


def _local_model(target: str, folder: Any, layer: str, implementation: str, seed: int) -> Adapter:
    """A transformers model saved in ``folder`` (any architecture whose attention the interface adapter takes),
    loaded offline (``local_files_only``)."""
    from transformers import AutoModel

    from axiomformer.surgery.hf_audit import HFAttentionAdapter

    try:
        index = int(layer or 0)
        kwargs: dict[str, Any] = {"attn_implementation": implementation} if implementation else {}
        model = AutoModel.from_pretrained(str(folder), local_files_only=True, **kwargs)
    except (OSError, ValueError) as err:
        raise UserInputError(f"{target}: cannot load the model in {str(folder)!r} offline: {err}") from None
    try:
        return HFAttentionAdapter(model, index, target, seed=seed)
    except UserInputError as err:
        raise UserInputError(f"{target}: {err}") from None


def _hf_string(target: str, *, seed: int = 0, **_: Any) -> Adapter:
    from pathlib import Path

    from axiomformer.surgery.hf_zoo import FAMILIES, family_adapter, family_name
    from axiomformer.surgery.load import BERT_FAMILY, load_model

    rest, _at, implementation = target[len("hf:") :].partition("@")
    folder, _hash, layer = rest.partition("#")
    if family_name(folder) is not None:
        try:
            index = None if not layer else int(layer)
        except ValueError:
            raise UserInputError(f"bad layer {layer!r} in {target!r}: expected an integer") from None
        try:
            adapter = family_adapter(folder, seed=seed, layer=index, implementation=implementation or "eager")
        except UserInputError as err:
            raise UserInputError(str(err) if str(err).startswith("hf:") else f"{target}: {err}") from None
        adapter.name = target
        return adapter
    if folder and not Path(folder).expanduser().exists():
        raise UserInputError(
            f"cannot audit {target!r}: {folder!r} is not a built-in family and the local folder {folder!r} does not "
            "exist; a model id would need a download, which the audit never does; expected "
            f"hf:<family>[-nope][#layer][@impl] with a family among {', '.join(FAMILIES)}, or "
            "hf:<folder saved with save_pretrained>[#layer]"
        )
    if folder and _model_type(Path(folder).expanduser()) not in (None, *BERT_FAMILY):
        return _local_model(target, Path(folder).expanduser(), layer, implementation, seed)
    if implementation:
        raise UserInputError(f"{target!r}: @<implementation> is for hf:<family> targets and local non-BERT models")
    model, _tokenizer = load_model(folder or None)
    blocks = [m for m in model.modules() if is_hf_self_attention(m)]
    try:
        index = int(layer or 0)
        module = blocks[index]
    except (ValueError, IndexError):
        raise ValueError(f"bad layer {layer!r} in {target!r}; the model has layers 0..{len(blocks) - 1}") from None
    return HFSelfAttentionAdapter(module, name=target, seed=seed)


def is_hf_model(obj: Any) -> bool:
    """A transformers model (duck-typed: a module with a ``config`` naming its attention implementation and input
    embeddings), audited at its first attention layer by :class:`~axiomformer.surgery.hf_audit.HFAttentionAdapter`."""
    return (
        isinstance(obj, nn.Module)
        and hasattr(getattr(obj, "config", None), "_attn_implementation")
        and callable(getattr(obj, "get_input_embeddings", None))
    )


def _hf_model(target: nn.Module, *, seed: int = 0, **_: Any) -> Adapter:
    from axiomformer.surgery.hf_audit import HFAttentionAdapter

    return HFAttentionAdapter(target, seed=seed)


def _is_bare_attention(obj: Any) -> bool:
    from axiomformer.surgery.hf_audit import calls_attention_interface, is_falcon_layout

    return isinstance(obj, nn.Module) and (calls_attention_interface(obj) or is_falcon_layout(obj))


def _bare_attention(target: nn.Module, **_: Any) -> Adapter:
    raise UserInputError(
        f"cannot audit a bare {type(target).__name__}: its model builds the position embeddings and the mask it is "
        "called with; pass the model (HFAttentionAdapter(model, layer) or run_audit(model))"
    )


register_adapter(_is_bare_attention, _bare_attention)
register_adapter(is_hf_model, _hf_model)
register_adapter(is_hf_self_attention, _hf_module)
register_adapter(AxiomSelfAttention, _axiom_wrapper)
register_adapter("hf:", _hf_string)


def audit_layer0(model: nn.Module) -> dict:
    """Audit the first self-attention of a (not replaced) transformers BERT-family model.

    Returns:
        ``AuditReport.to_dict()`` (``{"target", "checks": [...]}``) plus ``"text"`` (the readable report).
    """
    blocks = [m for m in model.modules() if is_hf_self_attention(m)]
    if not blocks:
        return {"error": f"{type(model).__name__} has no Hugging Face BERT self-attention to audit"}
    report = run_audit(blocks[0])
    report.target = f"layer 0 {report.target}"
    out = report.to_dict()
    out["text"] = report.to_text()
    return out
