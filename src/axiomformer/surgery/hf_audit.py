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
GPT-2's fused ``c_attn``/``c_proj``, Phi-3's fused ``qkv_proj``, Falcon's fused ``query_key_value`` in any of its
layouts (:data:`FALCON_ROWS`), the query half of Qwen3-Next's gated ``q_proj``),
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
    falcon = falcon_layout(module)
    if falcon is not None:
        return _identity_falcon(module, *falcon)
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


def _per_head_rows(heads: int, kv_heads: int, head_dim: int) -> tuple[Tensor, Tensor, Tensor]:
    rows = torch.arange(3 * heads * head_dim).view(heads, 3, head_dim)
    return rows[:, 0].flatten(), rows[:, 1].flatten(), rows[:, 2].flatten()


def _multi_query_rows(heads: int, kv_heads: int, head_dim: int) -> tuple[Tensor, Tensor, Tensor]:
    rows = torch.arange((heads + 2) * head_dim).view(heads + 2, head_dim)
    return rows[:heads].flatten(), rows[heads], rows[heads + 1]


def _grouped_rows(heads: int, kv_heads: int, head_dim: int) -> tuple[Tensor, Tensor, Tensor]:
    rows = torch.arange((heads + 2 * kv_heads) * head_dim).view(kv_heads, heads // kv_heads + 2, head_dim)
    return rows[:, :-2].flatten(), rows[:, -2].flatten(), rows[:, -1].flatten()


FALCON_ROWS: dict[str, Callable[[int, int, int], tuple[Tensor, Tensor, Tensor]]] = {
    "per_head": _per_head_rows,
    "multi_query": _multi_query_rows,
    "grouped": _grouped_rows,
}
"""Falcon's fused ``query_key_value`` layouts: ``(heads, kv_heads, head_dim) -> (query rows, key rows, value rows)``,
row indices of its weight in the order Falcon reads the heads (head h's query rows are block h of the query rows, key
/ value head g's rows block g of the key / value rows). "per_head": (heads, 3, head_dim), query, key and value
interleaved per head (neither multi_query nor new_decoder_architecture); "multi_query": every query head, then one key
and one value head; "grouped" (new_decoder_architecture): (kv_heads, heads / kv_heads + 2, head_dim), each group's
query heads, then its key and its value head."""


def _falcon_flag(module: nn.Module, name: str) -> bool:
    """The module's own flag ``name`` (Falcon reads its attributes), else its config's."""
    value = getattr(module, name, None)
    return bool(getattr(getattr(module, "config", None), name, False) if value is None else value)


def falcon_layout(module: nn.Module) -> tuple[str, int] | None:
    """(layout, key/value heads) of a Falcon-style attention module, read from what it has: a fused
    ``query_key_value`` linear, ``num_heads`` and ``head_dim``, the ``new_decoder_architecture`` / ``multi_query``
    flags (its own, else its config's) and, grouped, ``num_kv_heads``; None when any is missing or the fused width
    is not the one the layout implies (see :data:`FALCON_ROWS`). Whether the module calls the attention interface
    (transformers 5) or computes attention inline (before) does not matter here."""
    fused, heads, head_dim = (getattr(module, n, None) for n in ("query_key_value", "num_heads", "head_dim"))
    if not (isinstance(fused, nn.Linear) and isinstance(heads, int) and isinstance(head_dim, int)):
        return None
    if heads * head_dim != fused.in_features:
        return None
    if _falcon_flag(module, "new_decoder_architecture"):
        kv = getattr(module, "num_kv_heads", None) or getattr(getattr(module, "config", None), "num_kv_heads", None)
        layout, kv_heads = "grouped", kv if isinstance(kv, int) and kv > 0 and heads % kv == 0 else 0
    elif _falcon_flag(module, "multi_query"):
        layout, kv_heads = "multi_query", 1
    else:
        layout, kv_heads = "per_head", heads
    if not kv_heads or fused.out_features != (heads + 2 * kv_heads) * head_dim:
        return None
    return layout, kv_heads


def is_falcon_layout(module: nn.Module) -> bool:
    """A Falcon-style attention with a fused ``query_key_value`` of a known layout (:func:`falcon_layout`)."""
    return falcon_layout(module) is not None


def _identity_falcon(module: Any, layout: str, kv_heads: int) -> tuple[tuple[str, ...], Any]:
    """Falcon's fused ``query_key_value`` (any layout of :data:`FALCON_ROWS`) and ``dense``, on a module that calls
    the attention interface: the fused projection is rebuilt in the per-head layout with ``heads`` key/value heads
    (query and key rows the identity, each head's key bias and value rows those of its key/value head), the module's
    flags set to read it so, and ``dense`` set to the identity (biases kept)."""
    fused: nn.Linear = module.query_key_value
    heads, head_dim, d = int(module.num_heads), int(module.head_dim), fused.in_features
    groups = heads // kv_heads
    q_rows, k_rows, v_rows = FALCON_ROWS[layout](heads, kv_heads, head_dim)
    w, b = fused.weight.detach(), None if fused.bias is None else fused.bias.detach()
    value = nn.Linear(d, d, bias=b is not None, dtype=w.dtype)
    untied = nn.Linear(d, 3 * d, bias=b is not None, dtype=w.dtype)
    q_new, k_new, v_new = FALCON_ROWS["per_head"](heads, heads, head_dim)
    eye = torch.eye(d, dtype=w.dtype)
    with torch.no_grad():
        value.weight.copy_(_repeat_rows(w[v_rows], groups, head_dim))
        untied.weight[q_new], untied.weight[k_new], untied.weight[v_new] = eye, eye, value.weight
        if b is not None:
            value.bias.copy_(_repeat_rows(b[v_rows], groups, head_dim))
            untied.bias[q_new] = b[q_rows]
            untied.bias[k_new] = _repeat_rows(b[k_rows], groups, head_dim)
            untied.bias[v_new] = value.bias
    module.query_key_value = untied
    for owner in (module, module.config):  # the module reads its own flags; its config is its private copy
        owner.multi_query, owner.new_decoder_architecture, owner.num_kv_heads = False, False, heads
    module.num_key_value_groups = 1
    dense = module.dense
    if isinstance(dense, nn.Linear) and dense.in_features == dense.out_features:
        _eye_rows(dense.weight, slice(None))
    notes = [
        f"Falcon's fused query_key_value read in its {layout} layout: query and key rows set to the identity "
        "(biases kept), value rows kept as trained"
    ]
    if kv_heads < heads:
        notes.append(GQA_NOTE + f" (Falcon's {layout} layout: {kv_heads} key/value head(s) for {heads} query heads)")
    biases = (None,) * 3 if b is None else (b[q_rows], b[k_rows], b[v_rows])
    notes.extend(all_bias_notes(*biases, dense.bias))
    return tuple(notes), value


def _identity_stacked(module: Any, heads: int) -> tuple[tuple[str, ...], Any]:
    """Falcon computing attention inline (per-head layout): ``query_key_value`` becomes :class:`StackedQKV`,
    ``dense`` the identity (biases kept)."""
    fused = module.query_key_value
    stacked = StackedQKV(fused, FALCON_ROWS["per_head"](heads, heads, fused.in_features // heads))
    module.query_key_value = stacked
    dense = module.dense
    if isinstance(dense, nn.Linear) and dense.in_features == dense.out_features:
        _eye_rows(dense.weight, slice(None))
    biases = (None, None) if stacked.bias is None else stacked.bias
    return all_bias_notes(*biases, stacked.value.bias, dense.bias), stacked.value


class StackedQKV(nn.Module):
    """Falcon's fused ``query_key_value`` fed [q | k | v] (width 3 d): q and k pass (identity weight, bias kept) and
    v goes through the trained value rows, each put at the rows ``(query rows, key rows, value rows)`` of the fused
    output (a permutation of its 3 d rows: Falcon's per-head layout, :data:`FALCON_ROWS`)."""

    order: Tensor
    """Fused output row r is row ``order[r]`` of [q + b_q | k + b_k | value(v)]."""

    def __init__(self, fused: nn.Linear, rows: tuple[Tensor, Tensor, Tensor]):
        super().__init__()
        d = fused.in_features
        self.d = d
        q_rows, k_rows, v_rows = rows
        self.register_buffer("order", torch.argsort(torch.cat(rows)), persistent=False)
        bias = None if fused.bias is None else fused.bias.detach()
        self.value = nn.Linear(d, d, bias=bias is not None, dtype=fused.weight.dtype)
        with torch.no_grad():
            self.value.weight.copy_(fused.weight.detach()[v_rows])
            if bias is not None:
                self.value.bias.copy_(bias[v_rows])
        self.bias = None if bias is None else (bias[q_rows].clone(), bias[k_rows].clone())  # query, key biases

    def forward(self, x: Tensor) -> Tensor:
        q, k, v = x.split(self.d, dim=-1)
        if self.bias is not None:
            q, k = q + self.bias[0], k + self.bias[1]
        return torch.cat([q, k, self.value(v)], dim=-1)[..., self.order]


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
    other = sorted({layout[0] for m in model.modules() if (layout := falcon_layout(m)) and layout[0] != "per_head"})
    if other:
        found += f"; inline Falcon attention is audited in its per_head layout only, this one is {', '.join(other)}"
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
        # Falcon before transformers 5 computes attention inline: its fused projection (per-head layout) is fed
        # [q | k | v] instead (StackedQKV)
        self.stacked = not found
        found = found or [m for m in self.model.modules() if (falcon_layout(m) or ("",))[0] == "per_head"]
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
