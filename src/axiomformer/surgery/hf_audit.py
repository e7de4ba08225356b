"""Audit adapter for any transformers attention module that calls transformers' attention interface.

transformers' attention modules project q, k, v from one ``hidden_states`` tensor, apply their own norms and position
encodings, then call ``ALL_ATTENTION_FUNCTIONS[config._attn_implementation](module, query, key, value, mask, ...)``
and finish with their output projection (and, for gated attention, a gate). :class:`HFAttentionAdapter` finds q, k, v
*around that function*: on a private float64 copy of the model whose ``_attn_implementation`` is a probing function
registered with transformers' ``AttentionInterface``, one audited call ``(q, k, v) -> out`` runs the module three
times, on ``hidden_states = k`` (the probe keeps the key states it is handed and stops), on ``hidden_states = v`` (the
value states), and on ``hidden_states = q``, where the probe hands the kept key and value states, with the query states
and every argument the module passes (mask, scaling, ``sliding_window``, ``softcap``, ``s_aux``, ``position_bias``),
to the model's own attention function (its ``eager_attention_forward`` or the registered function it names). The
module then applies what follows the attention function (output projection, gate) as it always does. So RoPE, biases,
q/k norms, masks, sinks, soft-capping and relative biases stay as the model has them.

The arguments the *model* passes to the attention module (position embeddings, the mask it builds for that layer,
T5's position bias) are recorded by a forward pre-hook during one run of the model at each sequence length, so the
module is called exactly as its model calls it, whatever its signature.

Convention **(the audit's, see** :mod:`axiomformer.audit.adapters` **)**: where the module's query/key/output
projections have a known layout (``q_proj``/``k_proj``/``o_proj``, BERT's ``query``/``key``, T5's ``q``/``k``/``o``,
GPT-2's fused ``c_attn``/``c_proj``, Phi-3's fused ``qkv_proj``, the query half of Qwen3-Next's gated ``q_proj``),
their weights are set to the identity and their biases kept; the value map is kept. Projections of another shape
(MLA's latent key/value path, a key projection narrower than the queries under GQA) are kept as trained, and the
report's notes say so.
"""

from __future__ import annotations

import copy
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from axiomformer.audit.adapters import Adapter, bias_notes, measured_precision
from axiomformer.errors import UserInputError

PROBE = "axiomformer_audit_probe"
"""Name of the probing attention function in transformers' ``AttentionInterface``."""


class _Stop(Exception):
    """Raised by the probe once it holds what it came for (the rest of the forward pass is not needed)."""


@dataclass
class _ProbeState:
    """What the probe does on the next call: keep the key ('key') or value ('value') states, or run ('run')."""

    real: Callable[..., Any]
    mode: str = "run"
    kept: dict[str, Tensor] = field(default_factory=dict)
    arguments: dict[str, Any] = field(default_factory=dict)
    causal: bool = False
    """Add a causal mask to the one the module passes (an encoder audited with a causal mask on request)."""

    def __call__(self, module: nn.Module, query: Tensor, key: Tensor, value: Tensor, mask: Any, **kwargs: Any) -> Any:
        if self.mode in ("key", "value"):
            self.kept[self.mode] = key if self.mode == "key" else value
            self.arguments = dict(kwargs, attention_mask=mask, query_shape=tuple(query.shape))
            raise _Stop
        key, value = self.kept.pop("key"), self.kept.pop("value")
        if self.causal:
            mask = with_causal(mask, query.shape[-2], key.shape[-2], query.dtype)
        return self.real(module, query, key, value, mask, **kwargs)


def with_causal(mask: Any, q_len: int, k_len: int, dtype: torch.dtype) -> Tensor:
    """``mask`` (None, bool True = may attend, or additive float) combined with a bottom-right causal mask, in the
    same convention (None becomes an additive (1, 1, q_len, k_len) mask of 0 and ``finfo.min``)."""
    allowed = torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)
    if isinstance(mask, Tensor) and mask.dtype == torch.bool:
        return mask & allowed
    blocked = torch.zeros(1, 1, q_len, k_len, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return blocked if mask is None else (mask + blocked).clamp_min(torch.finfo(dtype).min)


def probe_attention(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, mask: Any, **kwargs: Any) -> Any:
    """The probing attention function: dispatches to the :class:`_ProbeState` of the module's private copy.

    Raises:
        RuntimeError: called on a module no :class:`HFAttentionAdapter` prepared.
    """
    state = module.__dict__.get("_axiomformer_probe")
    if state is None:
        raise RuntimeError(f"{PROBE} is axiomformer's audit probe; set no model's attn_implementation to it")
    return state(module, query, key, value, mask, **kwargs)


def register_probe() -> str:
    """Register :func:`probe_attention` with transformers' ``AttentionInterface`` (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(PROBE, probe_attention)
    return PROBE


def calls_attention_interface(module: nn.Module) -> bool:
    """True when the module's forward dispatches through transformers' ``ALL_ATTENTION_FUNCTIONS``."""
    try:
        return "ALL_ATTENTION_FUNCTIONS" in inspect.getsource(type(module).forward)
    except (OSError, TypeError):
        return False


def attention_function(module: nn.Module, implementation: str) -> Callable[..., Any]:
    """The function the module would call for ``implementation``: its model file's ``eager_attention_forward`` for
    "eager", else the registered function of that name.

    Raises:
        UserInputError: no function is registered under that name (naming the registered ones).
    """
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if implementation == "eager" or implementation is None:
        eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
        if eager is None:
            raise UserInputError(f"{type(module).__name__}: its model file has no eager_attention_forward")
        return eager
    if implementation not in ALL_ATTENTION_FUNCTIONS:
        raise UserInputError(
            f"attention implementation {implementation!r} is not registered with transformers' AttentionInterface; "
            f"registered: eager, {', '.join(sorted(ALL_ATTENTION_FUNCTIONS.keys()))}"
        )
    return ALL_ATTENTION_FUNCTIONS[implementation]


# ------------------------------------------------------------------------------------------------ projections
def _linear(module: nn.Module, *names: str) -> tuple[str, nn.Linear] | None:
    for n in names:
        m = getattr(module, n, None)
        if isinstance(m, nn.Linear):
            return n, m
    return None


@torch.no_grad()
def _eye_rows(weight: Tensor, rows: slice | Tensor) -> None:
    """Set weight[rows] to the matching rows of the identity (weight (out, in))."""
    eye = torch.eye(weight.shape[1], dtype=weight.dtype)
    weight[rows] = eye


def identity_projections(module: nn.Module, heads: int, head_dim: int) -> tuple[tuple[str, ...], Any]:
    """Set the query/key/output projection weights of a known layout to the identity (biases kept), in place.

    Returns (notes, value map or None): what was done and kept, and the module's value map x -> W_v x + b_v.
    """
    conv = getattr(module, "c_attn", None)
    if conv is not None and type(conv).__name__ == "Conv1D":
        return _identity_gpt2(module)
    fused = _linear(module, "qkv_proj")
    if fused is not None:
        return _identity_fused(module, fused[1])
    q, k, v = _linear(module, "q_proj", "query", "q"), _linear(module, "k_proj", "key", "k"), None
    v = _linear(module, "v_proj", "value", "v")
    o = _linear(module, "o_proj", "o", "dense", "out_proj")
    notes: list[str] = []
    dim = 0 if q is None else q[1].in_features
    if k is not None and v is not None and k[1].out_features < k[1].in_features == heads * head_dim:
        k, v = _untie_key_value_heads(module, k, v, heads, head_dim)
        notes.append(GQA_NOTE)
    if q is not None and q[1].out_features == dim:
        _eye_rows(q[1].weight, slice(None))
    elif q is not None and q[1].out_features == 2 * dim and heads * head_dim == dim:
        rows = torch.arange(2 * dim).view(heads, 2, head_dim)[:, 0].reshape(-1)  # query rows; the gate rows follow
        with torch.no_grad():
            q[1].weight[rows] = torch.eye(dim, dtype=q[1].weight.dtype)
        notes.append("the gate half of the query projection is kept as trained: the gate reads the query")
    elif q is not None:
        notes.append(f"query projection {q[0]} ({dim} -> {q[1].out_features}) kept as trained")
    if k is not None and k[1].out_features == k[1].in_features:
        _eye_rows(k[1].weight, slice(None))
    elif k is not None:
        notes.append(f"key projection {k[0]} ({k[1].in_features} -> {k[1].out_features}) kept as trained")
    if o is not None and o[1].in_features == o[1].out_features:
        _eye_rows(o[1].weight, slice(None))
    elif o is not None:
        notes.append(f"output projection {o[0]} kept as trained")
    biases = [None if x is None else x[1].bias for x in (q, k, v, o)]
    if q is not None and q[1].bias is not None and q[1].out_features != dim:
        biases[0] = None
    return tuple(notes) + all_bias_notes(*biases), None if v is None else v[1]


GQA_NOTE = (
    "grouped key/value heads (GQA) untied for the audit: each query head gets its own key (identity projection, "
    "the group's key bias) and the value projection repeats each key/value head's rows (the same value map); GQA's "
    "sharing is a tie of the key projection, which the audit's convention replaces by the identity anyway"
)


def _repeat_rows(t: Tensor, groups: int, head_dim: int) -> Tensor:
    """Rows (kv_heads * head_dim, ...) -> (kv_heads * groups * head_dim, ...), each head's block repeated."""
    blocks = t.detach().reshape(-1, head_dim, *t.shape[1:])
    return blocks.repeat_interleave(groups, dim=0).reshape(-1, *t.shape[1:])


def _widened(lin: nn.Linear, weight: Tensor, groups: int, head_dim: int) -> nn.Linear:
    """A projection with ``weight`` and ``lin``'s bias, each key/value head's bias block repeated ``groups`` times."""
    wide = nn.Linear(weight.shape[1], weight.shape[0], bias=lin.bias is not None, dtype=lin.weight.dtype)
    with torch.no_grad():
        wide.weight.copy_(weight)
        if lin.bias is not None:
            wide.bias.copy_(_repeat_rows(lin.bias, groups, head_dim))
    return wide


def _untie_key_value_heads(
    module: Any, k: tuple[str, nn.Linear], v: tuple[str, nn.Linear], heads: int, head_dim: int
) -> tuple[tuple[str, nn.Linear], tuple[str, nn.Linear]]:
    """Replace the module's key/value projections of ``kv_heads`` heads by ones of ``heads`` heads (see GQA_NOTE)."""
    groups = heads // (k[1].out_features // head_dim)
    eye = torch.eye(heads * head_dim, k[1].in_features, dtype=k[1].weight.dtype)
    wide_k = _widened(k[1], eye, groups, head_dim)
    wide_v = _widened(v[1], _repeat_rows(v[1].weight, groups, head_dim), groups, head_dim)
    setattr(module, k[0], wide_k)
    setattr(module, v[0], wide_v)
    for attr, value in (("num_key_value_groups", 1), ("num_key_value_heads", heads)):
        if hasattr(module, attr):
            setattr(module, attr, value)
    return (k[0], wide_k), (v[0], wide_v)


def all_bias_notes(*biases: Tensor | None) -> tuple[str, ...]:
    """:func:`~axiomformer.audit.adapters.bias_notes` for the nonzero (query, key, value, output) biases, and one
    note naming the biases the module has that are zero (transformers initializes them so): a trained model's
    nonzero query bias adds b_q.k_j to the scores, which the A4 checks see."""
    zero = [n for n, b in zip(("query", "key", "value", "output"), biases) if b is not None and not bool(b.any())]
    notes = bias_notes(*biases)
    if zero:
        notes += (
            f"{', '.join(zero)} projection bias{'es' if len(zero) > 1 else ''} present and zero in this model "
            "(transformers' initialization); a nonzero query bias would add b_q.k_j to the scores (the A4 checks "
            "see it), a key bias a row constant, value and output biases constant offsets",
        )
    return notes


def _identity_gpt2(module: Any) -> tuple[tuple[str, ...], Any]:
    """GPT-2's ``c_attn`` (Conv1D, weight (in, 3 e): x W + b = [q | k | v]) and ``c_proj``."""
    w, b, e = module.c_attn.weight, module.c_attn.bias, module.c_attn.weight.shape[0]
    eye = torch.eye(e, dtype=w.dtype)
    with torch.no_grad():
        w[:, :e], w[:, e : 2 * e] = eye, eye
        module.c_proj.weight.copy_(eye)
    wv, bv = w[:, 2 * e :].detach().clone(), b[2 * e :].detach().clone()
    notes = all_bias_notes(b[:e], b[e : 2 * e], bv, module.c_proj.bias)
    return notes, lambda x: x @ wv + bv


def _identity_fused(module: Any, fused: nn.Linear) -> tuple[tuple[str, ...], Any]:
    """Phi-3's ``qkv_proj`` (rows [q | k | v]) and ``o_proj``."""
    d = fused.in_features
    notes: list[str] = []
    with torch.no_grad():
        fused.weight[:d] = torch.eye(d, dtype=fused.weight.dtype)
        if fused.out_features == 3 * d:
            fused.weight[d : 2 * d] = torch.eye(d, dtype=fused.weight.dtype)
        else:
            notes.append("the key rows of the fused qkv_proj are kept as trained (fewer key heads than query heads)")
        o = getattr(module, "o_proj", None)
        if isinstance(o, nn.Linear) and o.in_features == o.out_features:
            o.weight.copy_(torch.eye(d, dtype=o.weight.dtype))
    wv = fused.weight[fused.out_features - d :].detach().clone()
    b = fused.bias
    bv = None if b is None else b[fused.out_features - d :].detach().clone()
    o = getattr(module, "o_proj", None)
    biases = (None, None, None) if b is None else (b[:d], b[d : fused.out_features - d], bv)
    notes.extend(all_bias_notes(*biases, getattr(o, "bias", None)))
    return tuple(notes), lambda x: nn.functional.linear(x, wv, bv)


def _identity_stacked(module: Any, heads: int) -> tuple[tuple[str, ...], Any]:
    """Falcon: ``query_key_value`` becomes :class:`StackedQKV`, ``dense`` the identity (biases kept)."""
    fused = module.query_key_value
    stacked = StackedQKV(fused, heads)
    module.query_key_value = stacked
    dense = module.dense
    if isinstance(dense, nn.Linear) and dense.in_features == dense.out_features:
        _eye_rows(dense.weight, slice(None))
    qk = None if stacked.bias is None else stacked.bias
    biases = (None, None) if qk is None else (qk[:, 0].reshape(-1), qk[:, 1].reshape(-1))
    return all_bias_notes(*biases, stacked.value.bias, dense.bias), stacked.value


def is_falcon_layout(module: nn.Module) -> bool:
    """Falcon's attention with one key and value head per query head (``query_key_value`` rows (heads, 3, hd))."""
    return (
        isinstance(getattr(module, "query_key_value", None), nn.Linear)
        and hasattr(module, "_split_heads")
        and not getattr(module, "multi_query", True)
        and not getattr(module, "new_decoder_architecture", True)
    )


class StackedQKV(nn.Module):
    """Falcon's fused ``query_key_value`` fed [q | k | v] (width 3 d): per head, q and k pass (identity weight,
    bias kept) and v goes through the trained value rows, laid out (heads, 3, head_dim) as Falcon splits it."""

    def __init__(self, fused: nn.Linear, heads: int):
        super().__init__()
        d = fused.in_features
        self.heads, self.d = heads, d
        rows = fused.weight.detach().view(heads, 3, d // heads, d)
        bias = None if fused.bias is None else fused.bias.detach().view(heads, 3, d // heads)
        self.value = nn.Linear(d, d, bias=bias is not None, dtype=fused.weight.dtype)
        with torch.no_grad():
            self.value.weight.copy_(rows[:, 2].reshape(d, d))
            if bias is not None:
                self.value.bias.copy_(bias[:, 2].reshape(d))
        self.bias = None if bias is None else bias[:, :2].clone()  # (heads, 2, head_dim): query, key biases

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = x.split(self.d, dim=-1)
        parts = [t.view(*t.shape[:-1], self.heads, 1, self.d // self.heads) for t in (q, k, self.value(v))]
        if self.bias is not None:
            parts[0], parts[1] = parts[0] + self.bias[:, :1], parts[1] + self.bias[:, 1:]
        return torch.cat(parts, dim=-2).flatten(-3)


# ------------------------------------------------------------------------------------------------ the adapter
def _hidden_size(config: Any) -> int:
    for name in ("hidden_size", "d_model", "n_embd"):
        if isinstance(getattr(config, name, None), int):
            return int(getattr(config, name))
    raise UserInputError(f"{type(config).__name__} names no hidden_size, d_model or n_embd")


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` whose forward calls transformers' attention interface, in model order."""
    return [m for m in model.modules() if calls_attention_interface(m)]


MIXERS = ("Attention", "DeltaNet", "Mamba", "Mixer")
"""Class-name endings of token mixers; those that call no attention function are named as not audited."""


def _skipped(model: nn.Module, audited: type) -> tuple[str, ...]:
    """A note naming the token-mixing layers of another kind than ``audited`` that the adapter does not audit (e.g.
    Qwen3-Next's gated DeltaNet)."""
    counts: dict[str, int] = {}
    for m in model.modules():
        name = type(m).__name__
        holds = any(calls_attention_interface(c) or isinstance(c, audited) for c in m.modules())
        if name.endswith(MIXERS) and not holds:
            counts[name] = counts.get(name, 0) + 1
    if not counts:
        return ()
    listed = ", ".join(f"{n} (x{c})" for n, c in counts.items())
    return (
        f"not audited: {listed}, which call no attention function (e.g. linear attention / DeltaNet, the "
        "transport axis); the audit reads one attention layer",
    )


def _refusal(model: nn.Module) -> str:
    inline = sorted({type(m).__name__ for m in model.modules() if type(m).__name__.endswith("Attention")})
    found = f" (its attention modules {', '.join(inline)} compute attention inline)" if inline else ""
    return (
        f"cannot audit {type(model).__name__}: no module calls transformers' attention interface "
        f"(ALL_ATTENTION_FUNCTIONS){found}, so the adapter cannot find q, k, v around an attention function; "
        "wrap the attention as a callable (q, k, v) -> out instead"
    )


def _float64(x: Any) -> Any:
    """``x`` with every floating tensor in it (tuples, lists, dict values) cast to float64."""
    if isinstance(x, Tensor):
        return x.to(torch.float64) if x.is_floating_point() else x
    if isinstance(x, (tuple, list)):
        return type(x)(_float64(t) for t in x)
    if isinstance(x, dict):
        return {k: _float64(v) for k, v in x.items()}
    return x


class HFAttentionAdapter(Adapter):
    """One attention module of a transformers model seen as (q, k, v) -> out, each (batch, seq, hidden_size), in
    float64 (see the module docstring).

    Args:
        model: a transformers model (``PreTrainedModel``) whose forward accepts ``input_ids``.
        layer: which of its attention modules (those that call the attention interface), in model order.
        name: report name. seed: seed of the rebuilt targets. rope: False replaces the position embeddings the model
            passes by cos = 1, sin = 0 (RoPE off: the standard form). rebuild: ``head_dim -> model`` for
            ``scale_entropy`` (a family built from a config), or None.
        implementation: attention implementation to audit (default: the model's ``config._attn_implementation``);
            a function a user registered with transformers' ``AttentionInterface`` is audited by its name.

    q, k and v must share their length (self-attention). The target is causal when the module is
    (``module.is_causal``); the mask is the one the model builds for that layer, and a causal mask on request (an
    encoder such as BERT or T5) is added to it by the probe (:func:`with_causal`).

    Raises:
        UserInputError: no module calls the attention interface (naming the inline ones), ``layer`` out of range,
            an implementation that is not registered, or a model whose forward cannot be run on ``input_ids``.
    """

    def __init__(
        self,
        model: nn.Module,
        layer: int = 0,
        name: str | None = None,
        *,
        seed: int = 0,
        rope: bool = True,
        rebuild: Callable[[int], nn.Module] | None = None,
        implementation: str | None = None,
    ):
        self.seed, self.rope, self.rebuild, self.layer = seed, rope, rebuild, layer
        # the model runs in its own dtype (to build the layer's arguments: MoE kernels refuse float64); the audited
        # module is a float64 copy
        self.model: Any = copy.deepcopy(model).eval()
        self.source = model
        if implementation is not None:
            config: Any = self.model.config
            config._attn_implementation = implementation
        found = attention_modules(self.model)
        # Falcon computes attention inline: its fused projection is fed [q | k | v] instead (StackedQKV)
        self.stacked = not found
        found = found or [m for m in self.model.modules() if is_falcon_layout(m)]
        if not found:
            raise UserInputError(_refusal(model))
        if not 0 <= layer < len(found):
            raise UserInputError(
                f"{type(model).__name__}: bad layer {layer}; it has attention layers 0..{len(found) - 1}"
            )
        self.module: Any = found[layer].to(torch.float64)
        own: Any = self.module.config
        self.implementation = str(own._attn_implementation or "eager")
        real = (lambda *a, **k: None) if self.stacked else attention_function(self.module, self.implementation)
        self.state = _ProbeState(real)
        self.dim = _hidden_size(self.model.config)
        self._calls: dict[int, tuple[tuple[Any, ...], dict[str, Any]]] = {}
        self._setup(model, name)

    def _setup(self, model: nn.Module, name: str | None) -> None:
        module = self.module
        if self.stacked:
            heads, head_dim = int(module.num_heads), int(module.head_dim)
            notes, self._value = _identity_stacked(module, heads)
        else:
            # the module's own config object may be shared with the model: give the copy one of its own
            module.config = copy.copy(module.config)
            module.config._attn_implementation = register_probe()
            module.__dict__["_axiomformer_probe"] = self.state
            heads, head_dim = self._shape()
            notes, self._value = identity_projections(module, heads, head_dim)
        self.num_heads = heads if heads * head_dim == self.dim else 1
        self.causal = bool(getattr(module, "is_causal", False))
        self.supports_causal = not self.stacked  # the probe adds a causal mask to the module's own
        _, kwargs = self._call(8)
        positions = kwargs.get("position_embeddings")
        self.has_positions = bool(
            (positions is not None and self.rope) or getattr(module, "has_relative_attention_bias", False)
        )
        self.precision = self.derivative_precision = measured_precision(lambda q, k, v: self(q, k, v), self.dim)
        layer = f"{type(module).__name__} (layer {self.layer} of {type(model).__name__}, {self.implementation})"
        self.name = name or layer
        used = sorted(k for k, v in self.state.arguments.items() if v is not None and k in _SHOWN)
        found = (
            "it computes attention inline (no attention interface): q, k, v fed to its fused query_key_value as "
            "[q | k | v]"
            if self.stacked
            else "q, k, v found around its attention function; arguments it passes: "
            + (", ".join(used) or "none beyond the mask and scaling")
        )
        self.notes = (f"audited {layer}: {found}", *notes, *_skipped(self.model, type(module)))
        if positions is not None and not self.rope:
            self.notes += ("RoPE off: the position embeddings the model passes are replaced by cos = 1, sin = 0",)

    def _shape(self) -> tuple[int, int]:
        """(heads, head_dim) of the query states the module hands its attention function."""
        x = torch.zeros(1, 4, self.dim, dtype=torch.float64)
        self._run("key", x)
        _, heads, _, head_dim = self.state.arguments["query_shape"]
        return int(heads), int(head_dim)

    def _call(self, n: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The positional and keyword arguments the model passes the module at sequence length ``n``."""
        if n not in self._calls:
            seen: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

            def hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
                seen.append((args, dict(kwargs)))
                raise _Stop

            handle = self.module.register_forward_pre_hook(hook, with_kwargs=True)
            try:
                with torch.no_grad():
                    self.model(input_ids=torch.zeros(1, n, dtype=torch.long), use_cache=False)
            except _Stop:
                pass
            except (TypeError, ValueError, RuntimeError) as err:
                raise UserInputError(
                    f"cannot run {type(self.model).__name__} on input_ids of length {n}: {type(err).__name__}: {err}"
                ) from None
            finally:
                handle.remove()
            if not seen:
                raise UserInputError(f"{type(self.model).__name__}'s forward never called its attention layer")
            args, kwargs = _float64(seen[0][0]), _float64(seen[0][1])
            if not self.rope and kwargs.get("position_embeddings") is not None:
                cos, sin = kwargs["position_embeddings"]
                kwargs["position_embeddings"] = (torch.ones_like(cos), torch.zeros_like(sin))
            self._calls[n] = (args, kwargs)
        return self._calls[n]

    def _run(self, mode: str, hidden: Tensor) -> Any:
        args, kwargs = self._call(hidden.shape[1])
        if args:
            args = (hidden, *args[1:])
        else:
            kwargs = dict(kwargs, hidden_states=hidden)
        self.state.mode = mode
        try:
            out = self.module(*args, **kwargs)
        except _Stop:
            return None
        finally:
            self.state.mode = "run"
        return out[0] if isinstance(out, tuple) else out

    def __call__(self, q, k, v, *, causal=False):
        if not q.shape[1] == k.shape[1] == v.shape[1]:
            raise ValueError(
                f"a self-attention needs equal q, k, v lengths; got {q.shape[1]}, {k.shape[1]}, {v.shape[1]}"
            )
        if self.stacked:
            return self._run("run", torch.cat([q, k, v], dim=-1))
        self.state.causal = bool(causal and not self.causal)
        self._run("key", k)
        self._run("value", v)
        return self._run("run", q)

    def value_map(self):
        return self._value

    def model_cache_gap(self, n: int, generator: torch.Generator) -> tuple[float, float, str] | None:
        """None for a bidirectional model (an encoder audited with a causal mask on request: its own forward is not
        causal, so decoding through a cache is not its map). Else (relative gap, tolerance of the model's dtype,
        evidence): the model's last hidden states decoded one token at a time through its own
        cache (``use_cache=True``, the ``past_key_values`` it returns) against its full forward, on a copy of the
        model as given (every layer, its own dtype) with seeded token ids."""
        from axiomformer.audit.probe import rel, tolerance

        if not self.causal:
            return None
        model: Any = copy.deepcopy(self.source).eval()
        if self.implementation != model.config._attn_implementation:
            model.set_attn_implementation(self.implementation)
        vocab = int(getattr(model.config, "vocab_size", 32))
        ids = torch.randint(3, vocab, (2, n), generator=generator)
        with torch.no_grad():
            full = model(input_ids=ids, use_cache=False).last_hidden_state
            cache, steps = None, []
            # transformers 5 names the cache ``cache`` (``past_key_values`` before)
            name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
            for t in range(n):
                out = model(input_ids=ids[:, t : t + 1], use_cache=True, **{name: cache})
                cache = getattr(out, name)
                steps.append(out.last_hidden_state)
        gap = rel(torch.cat(steps, 1).double(), full.double())
        return (
            gap,
            tolerance(full.dtype),
            (
                f"{type(model).__name__} decoding {n} tokens one at a time through its cache equals its full forward "
                "(last hidden states, every layer)"
            ),
        )

    def with_head_dim(self, head_dim):
        if self.rebuild is None:
            return None
        return HFAttentionAdapter(
            self.rebuild(head_dim),
            self.layer,
            self.name,
            seed=self.seed,
            rope=self.rope,
            implementation=self.implementation,
        )


_SHOWN = ("sliding_window", "softcap", "s_aux", "position_bias", "dropout", "scaling", "is_causal")
"""Arguments of the attention call that the notes name when the module passes them."""
