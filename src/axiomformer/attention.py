"""``Attention``: one layer of the design space, y = W_o rho( sum_j phi(v(x_j), u_ij) ).

Read with ``spec.py`` (the axes) and ``axes/`` (each choice's formula). Shapes: (batch, seq, dim) at the module boundary,
(batch, heads, seq, head_dim) inside. Boolean masks mean True = may attend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import torch
from torch import Tensor, nn

from axiomformer.axes import Normalizer, Position, Scale, build_aggregator, build_contribution, build_score, build_value
from axiomformer.axes.aggregator import LogValuesAggregator
from axiomformer.axes.position import TokenPositions, alibi_slope_list, apply_rope, token_positions
from axiomformer.axes.select import Select, Selection
from axiomformer.axes.transport import Transport, TransportGates, build_transport, transport_keys
from axiomformer.engines import Attended, Plan, attend
from axiomformer.engines.problem import KeyVisibility, causal_mask, window_mask
from axiomformer.engines.reference import call_in
from axiomformer.engines.state_form import DEFAULT_CHUNK, chunk_for, state_form
from axiomformer.masks import prepare_masks
from axiomformer.spec import AttentionSpec


def _common_dtype(module: nn.Module, *inputs: Tensor) -> torch.dtype | None:
    """The promoted dtype of the floating inputs, parameters and buffers when they are not all one dtype, else None."""
    dtypes = {t.dtype for t in inputs if t.is_floating_point()}
    dtypes |= {p.dtype for p in module.parameters() if p.is_floating_point()}
    dtypes |= {b.dtype for b in module.buffers() if b.is_floating_point()}
    if len(dtypes) <= 1:
        return None
    common = dtypes.pop()
    for other in dtypes:
        common = torch.promote_types(common, other)
    return common


def _in_dtype(module: nn.Module, dtype: torch.dtype, inputs: tuple[Tensor, ...], kwargs: dict) -> Any:
    """``module(*inputs, **kwargs)`` with every floating input, parameter and buffer cast to ``dtype`` (torch's type
    promotion, as for ``a + b``); gradients flow back to each parameter and input in its own dtype."""

    def promoted(t: Tensor) -> Tensor:
        return t.to(dtype) if t.is_floating_point() else t

    state = {n: promoted(p) for n, p in module.named_parameters()}
    state |= {n: promoted(b) for n, b in module.named_buffers()}
    return torch.func.functional_call(module, state, tuple(promoted(t) for t in inputs), kwargs, strict=False)


def _with_weights(out: Tensor, weights: Tensor | None, need_weights: bool) -> Tensor | tuple[Tensor, Tensor]:
    """``forward``'s result: ``out``, or ``(out, weights)`` when ``need_weights``."""
    if not need_weights:
        return out
    if weights is None:  # attend returns the weights whenever they are asked for
        raise RuntimeError("the engine returned no attention weights although need_weights=True")
    return out, weights


def _load_linear(proj: nn.Module, weight: Tensor, bias: Tensor | None) -> None:
    """Copy a weight (and bias) of ``nn.MultiheadAttention`` into the projection ``proj``.

    Raises:
        ValueError: ``proj`` is not an ``nn.Linear`` (a spec whose value map or keys are not one linear map).
    """
    if not isinstance(proj, nn.Linear):
        raise ValueError(f"cannot load nn.MultiheadAttention weights into a {type(proj).__name__} projection")
    proj.weight.copy_(weight)
    if bias is not None:
        proj.bias.copy_(bias)


@dataclass
class KVCache:
    """Keys and values of the tokens decoded so far, for incremental (token-by-token) decoding.

    A layer with a sliding window keeps only the last ``window - 1`` tokens (older ones are invisible to every later
    query), so memory and the cost of a decode step stay flat in the length (a ring of the window's size, as
    apple/axlearn PR#995 and Mistral's rolling buffer cache).

    Attributes:
        k: (batch, kv_heads, stored, head_dim) keys after projection and RoPE, or None when empty.
        v: (batch, kv_heads, stored, head_dim) values, or None when empty.
        positions: (batch, stored) int64 token positions of the stored keys, or None while they are the indices
            start..start+stored-1 (see ``axiomformer.axes.position``); new tokens continue from the last one.
        start: tokens dropped from the front: the first stored key is the ``start``-th token seen.
        decay: (batch, heads, stored) float32 running sums of the forget gates' log f of the stored keys
            (``position="forget"``), or None.
        state: (batch, heads, head_dim_v, head_dim) the state of a transport with trait ``state``
            (``axes/transport.py``): such a cache keeps no keys, and ``start`` counts the tokens folded into it.
        write: (batch, heads, stored) the write strengths gamma_j of the stored keys of a transport without a state
            (its keys are stored transported to the last token), or None.
        real: (batch,) float count of the real (unpadded) keys folded into a state, or None.
        conv: the last three projected q, k, v inputs of ``position="short_conv"``'s convolution, or None.
        transport: what the layer that filled the cache keeps in it (``Attention._cache_layout``: ``"keys"``, or a
            transport and whether its state or its keys) and for which spec (``AttentionSpec.variant``: keys rotated
            by RoPE or through a short convolution mean something else), None while empty; a layer that keeps
            something else, or keeps it for another spec, refuses the cache.
    """

    k: Tensor | None = None
    v: Tensor | None = None
    positions: Tensor | None = None
    start: int = 0
    decay: Tensor | None = None
    state: Tensor | None = None
    write: Tensor | None = None
    real: Tensor | None = None
    transport: str | None = None
    conv: tuple[Tensor, Tensor, Tensor] | None = None

    @property
    def length(self) -> int:
        """Number of stored positions."""
        return 0 if self.k is None else self.k.shape[-2]

    @property
    def seen(self) -> int:
        """Number of tokens appended so far (stored or dropped): the index of the next token."""
        return self.start + self.length

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store new keys/values (batch, heads, new_len, head_dim) and return all stored ones.

        Raises:
            ValueError: new keys or values whose batch, heads or head_dim differ from the cached ones (naming both
                shapes; e.g. a cache filled with another batch size).
        """
        for name, old, new in (("keys", self.k, k), ("values", self.v, v)):
            if old is not None and (old.shape[:2] != new.shape[:2] or old.shape[-1] != new.shape[-1]):
                raise ValueError(
                    f"new {name} of shape {tuple(new.shape)} do not fit the cached {name} of shape "
                    f"{tuple(old.shape)} (batch, heads and head_dim must match; reset() the cache)"
                )
        self.k = k if self.k is None else torch.cat([self.k, k], dim=-2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=-2)
        return self.k, self.v

    def keep_last(self, n: int) -> None:
        """Drop all but the last ``n`` stored positions (their indices stay absolute through ``start``)."""
        drop = self.length - n
        if drop <= 0 or self.k is None or self.v is None:  # nothing stored: nothing to drop
            return
        self.k, self.v = self.k[..., drop:, :], self.v[..., drop:, :]
        if self.positions is not None:
            self.positions = self.positions[..., drop:]
        if self.decay is not None:
            self.decay = self.decay[..., drop:]
        self.start += drop

    def key_positions(self, new: TokenPositions) -> Tensor:
        """Record the positions of the keys this call adds; return the positions of every stored key, (stored,)
        while they are the indices, else (batch, stored)."""
        past = self.seen
        if new.default and self.positions is None:
            return torch.arange(self.start, past + new.k.shape[-1], device=new.k.device)
        k = new.k if new.k.dim() == 2 else new.k.unsqueeze(0)
        old = (
            self.positions
            if self.positions is not None
            else torch.arange(self.start, past, device=k.device).unsqueeze(0)
        )
        rows = max(k.shape[0], old.shape[0])
        self.positions = torch.cat([old.expand(rows, -1), k.expand(rows, -1)], dim=-1)
        return self.positions

    def reset(self) -> None:
        self.k = self.v = self.positions = self.decay = self.state = self.write = self.real = self.conv = None
        self.transport = None
        self.start = 0

    def claim(self, layout: str) -> None:
        """Mark the cache as filled by a layer that keeps ``layout`` in it (see ``transport``).

        Raises:
            ValueError: the cache holds what a layer of another layout or spec stored (keys transported or not,
                rotated or not, or a state: they mean something else there).
        """
        if self.transport is not None and self.transport != layout and self.seen:
            raise ValueError(
                f"this KVCache was filled by a layer that keeps {self.transport!r}; a layer that keeps "
                f"{layout!r} cannot decode from it (one cache per layer and spec; reset() it)"
            )
        self.transport = layout


def _with_stored(cache: KVCache, k: Tensor, v: Tensor, gates: TransportGates) -> tuple[Tensor, Tensor, TransportGates]:
    """The cache's keys (transported to the last token: identity gates) before the new keys, values and gates."""
    if cache.k is None or cache.v is None:
        return k, v, gates
    past = cache.length
    old_write = cache.write if cache.write is not None else k.new_ones(k.shape[0], k.shape[1], past)
    new_write = gates.write if gates.write is not None else k.new_ones(k.shape[0], k.shape[1], k.shape[-2])

    def front(t: Tensor, last: tuple[int, ...]) -> Tensor:
        return torch.cat([t.new_zeros(*t.shape[:2], past, *last), t], dim=2)

    ld = gates.log_decay
    stored = TransportGates(
        front(ld, ld.shape[3:]),
        None if gates.beta is None else front(gates.beta, ()),
        None if gates.w is None else front(gates.w, k.shape[3:]),
        torch.cat([old_write.expand(k.shape[0], k.shape[1], -1), new_write.expand(k.shape[0], k.shape[1], -1)], -1),
    )
    return torch.cat([cache.k, k], dim=-2), torch.cat([cache.v, v], dim=-2), stored


def _drop_front(mask: Tensor | None, start: int, total: int) -> Tensor | None:
    """A mask over every token seen (last dim ``total``) cut to the stored ones (a sliding-window cache dropped the
    first ``start``); other masks pass unchanged (the mask check names their shape)."""
    if mask is None or not start or mask.dim() == 0 or mask.shape[-1] != total:
        return mask
    return mask[..., start:]


class _CallOptions(NamedTuple):
    """The keyword arguments of :meth:`Attention.forward` (see there), by their names."""

    attn_mask: Tensor | None
    key_padding_mask: Tensor | None
    need_weights: bool
    cache: KVCache | None
    position_ids: Tensor | None
    key_position_ids: Tensor | None


class Attention(nn.Module):
    """Multi-head attention built from an :class:`AttentionSpec`.

    With ``AttentionSpec.standard(dim, heads)`` this is ``torch.nn.MultiheadAttention`` (batch-first), numerically.

    Args:
        spec: the point of the design space.
        engine: ``"auto"`` routes to the fastest engine that runs the spec exactly (see ``axiomformer.engines``);
            an engine name forces it.
        double_backward: route only to engines that are differentiable to every order (second-order gradients:
            gradient penalties, ``create_graph=True``). The default CPU engines are already; this excludes flex
            (CUDA) and is needed for SDPA with dropout in training, whose error names this switch.
        layer_index: the layer's 0-based depth in its stack (``TransformerLM`` passes it); only the Differential
            Transformer's released layer reads it (``diff_authors``: lambda_init = 0.8 - 0.6 exp(-0.3 layer_index),
            the authors' ``depth``). A spec describes every layer of a stack alike, so the depth is the model's.

    Attributes:
        last_engine: name of the engine that ran the last forward or :meth:`core` (``None`` before the first call).
        plan: the spec resolved once (``axiomformer.engines.Plan``), rebuilt only when ``spec`` is replaced.
    """

    def __init__(
        self, spec: AttentionSpec, *, engine: str = "auto", double_backward: bool = False, layer_index: int = 0
    ):
        super().__init__()
        if not isinstance(spec, AttentionSpec):
            raise TypeError(f"Attention expects an AttentionSpec, got {type(spec).__name__}")
        if isinstance(layer_index, bool) or not isinstance(layer_index, int) or layer_index < 0:
            raise ValueError(f"layer_index must be an int >= 0 (the layer's depth, from 0), got {layer_index!r}")
        self.layer_index = layer_index
        self.spec = spec
        self.engine = engine
        self.double_backward = double_backward
        self.num_heads, self.head_dim = spec.num_heads, spec.head_dim
        self.q_proj = nn.Linear(spec.dim, spec.dim, bias=spec.bias)
        self.k_proj: nn.Module = nn.Linear(spec.dim, spec.kv_dim, bias=spec.bias)
        self.v_proj = build_value(spec)  # A3
        self.kv_down: nn.Linear | None = None
        if spec.kv_latent:  # MLA: k = W_uk c, v = W_uv c, c = W_dkv x, one latent shared (DeepSeek-V2, eq. 9-11)
            self.kv_down = nn.Linear(spec.dim, spec.kv_latent, bias=False)
            self.k_proj = nn.Sequential(self.kv_down, nn.Linear(spec.kv_latent, spec.kv_dim, bias=spec.bias))
            self.v_proj = nn.Sequential(self.kv_down, nn.Linear(spec.kv_latent, spec.kv_dim, bias=spec.bias))
        if spec.kv_rope_dim:  # MLA's decoupled RoPE: q^R per head, one k^R shared by the heads (eq. 14-19)
            self.q_rope = nn.Linear(spec.dim, spec.num_heads * spec.kv_rope_dim, bias=False)
            self.k_rope = nn.Linear(spec.dim, spec.kv_rope_dim, bias=False)
        self.score_fn = build_score(spec)  # A4
        self.scale = Scale(spec)  # A5 temperature
        self.normalizer = Normalizer(spec, layer_index=layer_index)  # A5
        self.contribution = build_contribution(spec)  # A2
        self.aggregator = build_aggregator(spec, layer_index=layer_index)  # A1
        self.position = Position(spec)
        self.transport: Transport | None = build_transport(spec)  # the relevance through the tokens in between
        self.select = Select(spec) if spec.select != "none" else None  # a second score picks the keys (A4)
        self.out_proj = nn.Linear(spec.dim, spec.dim, bias=spec.bias)
        self.last_engine: str | None = None
        self._plan: Plan | None = None
        self._reset_parameters()

    @property
    def plan(self) -> Plan:
        """The spec resolved into a :class:`~axiomformer.engines.Plan` (once; again only when ``spec`` changes)."""
        plan = self._plan
        if plan is None or plan.spec is not self.spec:
            slope = max(map(abs, alibi_slope_list(self.spec.num_heads))) if self.spec.position == "alibi" else None
            plan = Plan(self.spec, self.score_fn, self.contribution, self.normalizer, alibi_max_slope=slope)
            self._plan = plan
        return plan

    def _reset_parameters(self) -> None:
        # As nn.MultiheadAttention: Xavier-uniform projections, zero biases.
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            if isinstance(proj, nn.Linear):
                nn.init.xavier_uniform_(proj.weight)
                if proj.bias is not None:
                    nn.init.zeros_(proj.bias)
        if self.out_proj.bias is not None:
            nn.init.zeros_(self.out_proj.bias)

    # ------------------------------------------------------------------ helpers
    def _split_heads(self, x: Tensor, heads: int | None = None) -> Tensor:
        b, n, width = x.shape
        heads = heads or self.num_heads
        return x.view(b, n, heads, width // heads).transpose(1, 2)  # explicit head_dim: n may be 0

    def _merge_heads(self, x: Tensor) -> Tensor:
        b, heads, n, head_dim = x.shape
        return x.transpose(1, 2).reshape(b, n, heads * head_dim)

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        dim = self.spec.dim
        for name, x in (("query", query), ("key", key), ("value", value)):
            if x.dim() != 3 or x.shape[-1] != dim:
                raise ValueError(f"{name} must be (batch, seq, dim={dim}); got shape {tuple(x.shape)}")
        if not query.shape[0] == key.shape[0] == value.shape[0]:
            raise ValueError(
                f"batch sizes differ: query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
            )
        if key.shape[1] != value.shape[1]:
            raise ValueError(f"key and value lengths differ: key {tuple(key.shape)}, value {tuple(value.shape)}")

    # ------------------------------------------------------------------ forward
    def _position_bias(
        self,
        bias: Tensor | None,
        pos: TokenPositions,
        all_k_pos: Tensor,
        key: Tensor,
        key_padding_mask: Tensor | None,
        cache: KVCache | None,
        q_len: int,
        q_offset: int,
    ) -> tuple[Tensor | None, bool]:
        """``bias`` plus the position's score biases (ALiBi, forget-gate decay), and whether ALiBi was absent.

        Updates ``cache.decay`` when the position has a decay and a cache is given.
        """
        alibi = self.position.score_bias(pos, all_k_pos, self.spec.causal)
        if alibi is not None:  # ALiBi from token positions, as a score bias
            bias = alibi if bias is None else bias + alibi
        if "decay" in self.plan.position_traits:  # the forget gates' decay, as a score bias
            sums = self.position.forget_sums(key, key_padding_mask, cache.decay if cache is not None else None)
            if cache is not None:
                cache.decay = sums
            decay = self.position.decay_bias(sums, q_len, q_offset)
            bias = decay if bias is None else bias + decay
        return bias, alibi is None

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *,
        attn_mask: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = False,
        cache: KVCache | None = None,
        position_ids: Tensor | None = None,
        key_position_ids: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: (batch, q_len, dim).
            key: (batch, k_len, dim); defaults to ``query``.
            value: (batch, k_len, dim); defaults to ``key``.
            attn_mask: bool (True = may attend) or float (added to the scores; ``-inf`` blocks), broadcastable to
                (batch, heads, q_len, k_len) (each dimension 1 or the full size); 1-D (k_len,), 2-D (q_len, k_len)
                and 3-D (batch, q_len, k_len) are accepted (an MHA-style (batch * heads, q_len, k_len) is refused).
            key_padding_mask: (batch, k_len) bool, True = real token (k_len includes cached tokens). In
                self-attention with ``normalizer="sinkhorn"`` the padded tokens are taken out as queries too.
            need_weights: also return the attention weights (batch, heads, q_len, k_len), before dropout.
            cache: a :class:`KVCache`; the new keys/values are appended and attention runs over all cached ones.
                The new queries continue the cached positions (bottom-right alignment).
            position_ids: (q_len,) or (batch, q_len) int positions of the queries (and, in self-attention, of the
                new keys). Without them a self-attention call derives positions from ``key_padding_mask`` (a real
                token sits at the number of real tokens before it, so left padding changes nothing), else continues
                the cache, else uses the indices (``axiomformer.axes.position.token_positions``).
            key_position_ids: (new_k_len,) or (batch, new_k_len) positions of the keys of a cross-attention call.

        Returns:
            out (batch, q_len, dim), or ``(out, weights)`` when ``need_weights``. A query with no visible key gets
            an all-zero output row.

        Raises:
            ValueError: wrong ranks, widths, batch sizes or key/value lengths, masks or position ids that do not fit
                (the error names the shapes), or a learned position at or beyond ``spec.max_len``.
        """
        key = query if key is None else key
        value = key if value is None else value
        self._check_inputs(query, key, value)
        options = _CallOptions(attn_mask, key_padding_mask, need_weights, cache, position_ids, key_position_ids)
        dtype = _common_dtype(self, query, key, value)
        if dtype is not None:  # mixed floating dtypes: run once more with everything in the promoted one
            return _in_dtype(self, dtype, (query, key, value), options._asdict())
        return self._forward(query, key, value, options)

    def _forward(
        self, query: Tensor, key: Tensor, value: Tensor, options: _CallOptions
    ) -> Tensor | tuple[Tensor, Tensor]:
        """``forward`` on inputs of one floating dtype."""
        cache = options.cache
        if cache is not None:
            cache.claim(f"{self._cache_layout()} of the spec {self.spec.variant}")
        past, start = (cache.seen, cache.start) if cache is not None else (0, 0)
        total = past + key.shape[1]
        pos = self._positions(
            query,
            key,
            query.shape[1],
            past,
            cache,
            options.position_ids,
            options.key_position_ids,
            options.key_padding_mask,
        )
        attn_mask = _drop_front(options.attn_mask, start, total)
        key_padding_mask = _drop_front(options.key_padding_mask, start, total)
        q, k, v = self._project(query, key, value, pos, key_padding_mask, cache)
        if self.transport is not None:
            return self._transported(
                self.transport, query, key, q, k, v, attn_mask, key_padding_mask, options.need_weights, cache
            )
        return self._attend_keys(
            query, key, value, (q, k, v), pos, attn_mask, key_padding_mask, options.need_weights, cache, past
        )

    def _project(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        pos: TokenPositions,
        key_padding_mask: Tensor | None,
        cache: KVCache | None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """q (batch, heads, q_len, head_dim) and the new k, v (batch, kv_heads, new_k_len, head_dim): the projections
        (A3) with the position's input encodings, short convolution and rotations."""
        new_k_len = key.shape[1]
        # Position enters through the query/key inputs (sinusoidal, learned) or by rotating q and k (RoPE).
        q, k, v = (
            self.q_proj(self.position.encode_inputs(query, pos.q)),
            self.k_proj(self.position.encode_inputs(key, pos.k)),
            self.v_proj(value),
        )  # A3
        if "conv" in self.plan.position_traits:  # a short convolution of the projections (Canon-B)
            keep = None if key_padding_mask is None else key_padding_mask[:, -new_k_len:]
            q, k, v, history = self.position.short_conv(q, k, v, keep, cache.conv if cache is not None else None)
            if cache is not None:
                cache.conv = history
        q, k, v = (
            self._split_heads(q),
            self._split_heads(k, self.spec.kv_heads),
            self._split_heads(v, self.spec.kv_heads),
        )
        q, k = self.position.rotate(q, pos.q), self.position.rotate(k, pos.k)
        if self.spec.kv_rope_dim:
            q, k = self._decoupled_rope(query, key, q, k, pos)
        return q, k, v

    def _attend_keys(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        qkv: tuple[Tensor, Tensor, Tensor],
        pos: TokenPositions,
        attn_mask: Tensor | None,
        key_padding_mask: Tensor | None,
        need_weights: bool,
        cache: KVCache | None,
        past: int,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """``forward`` without a transport from the projected ``qkv``: the cached keys, masks and score biases, the
        routed engine, rho and the output projection."""
        q, k, v = qkv
        batch, q_len, _ = query.shape
        all_k_pos = pos.k
        if cache is not None:
            all_k_pos = cache.key_positions(pos)
            if self.kv_down is not None:  # MLA's compressed cache: the latent c alone, k and v rebuilt from it
                k, v = self._latent_keys(self.kv_down, query, key, value, pos, all_k_pos, cache)
            else:
                k, v = cache.append(k, v)  # the cache holds kv_heads heads (GQA's memory saving)
        k_len = k.shape[-2]
        q_offset = k_len - q_len
        mask, bias = prepare_masks(attn_mask, key_padding_mask, batch, self.num_heads, q_len, k_len)
        if key is query and not past:
            mask = self._pad_queries(mask, key_padding_mask)
        bias, no_alibi = self._position_bias(bias, pos, all_k_pos, key, key_padding_mask, cache, q_len, q_offset)
        result = self._attend_heads(q, k, v, mask, bias, q_offset, no_alibi, need_weights, self.engine)
        if cache is not None and self.spec.window:
            # The next query, at position p, sees p - window + 1 .. p: the last window - 1 stored keys and its own.
            cache.keep_last(self.spec.window - 1)
        out = self.out_proj(self.aggregator(self._merge_heads(result.out), query))  # A1
        if mask is not None or (self.spec.causal and q_offset < 0) or self.spec.window:
            # The heads' rows are zero already; rho and W_o's bias would make the output row non-zero.
            seen = KeyVisibility(q_len, k_len, mask, self.spec.causal, q_offset, self.spec.window, query.device)
            empty = seen.rows_without_keys()
            if empty is not None:
                out = out.masked_fill(empty.all(1).unsqueeze(-1), 0.0)
        return _with_weights(out, result.weights, need_weights)

    def _transported(
        self,
        transport: Transport,
        query: Tensor,
        key: Tensor,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        attn_mask: Tensor | None,
        key_padding_mask: Tensor | None,
        need_weights: bool,
        cache: KVCache | None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """``forward`` for a spec with a transport (``axes/transport.py``): the gates from the key input, then the
        routed engine (reference: the parallel form; recurrent: the state form), or with a cache its state (trait
        ``state``) or its keys transported to the last token. Padded keys change nothing (their gates are zero)."""
        if attn_mask is not None:
            raise ValueError(
                f"transport={self.spec.transport!r} carries the relevance through every key in between: only the "
                f"causal mask and key_padding_mask are defined, got an attn_mask"
            )
        q, k = transport.prepare(q, k)
        new = k.shape[-2]
        keep = None if key_padding_mask is None else key_padding_mask[:, -new:]
        gates = transport.gates(key, k, keep)
        weights = None
        if cache is not None and self._cache_layout().endswith("(state)"):
            if need_weights:
                raise ValueError(
                    f"transport={self.spec.transport!r} decodes from its state, which has no weights; "
                    f"call without need_weights (or without a cache)"
                )
            heads, empty = self._state_step(q, k, v, gates, keep, cache)
        else:
            first = 0
            if cache is not None:  # the stored keys, transported to the last token, transport nothing more
                first = cache.length
                k, v, gates = _with_stored(cache, k, v, gates)
            mask, _ = prepare_masks(None, key_padding_mask, q.shape[0], self.num_heads, q.shape[-2], k.shape[-2])
            q_offset = k.shape[-2] - q.shape[-2]
            result = self._attend_heads(q, k, v, mask, None, q_offset, True, need_weights, self.engine, gates)
            heads, weights = result.out, result.weights
            if cache is not None:
                tail = gates.tokens(slice(first, None))
                cache.k, cache.v, cache.write = transport_keys(k, tail, first), v, gates.write
            seen = KeyVisibility(q.shape[-2], k.shape[-2], mask, causal=True, q_offset=q_offset, device=q.device)
            empty = seen.rows_without_keys()
            empty = None if empty is None else empty.all(1)
        out = self.out_proj(self.aggregator(self._merge_heads(heads), query))
        if empty is not None:  # a query that sees no real key: a zero row (W_o's bias would make it non-zero)
            out = out.masked_fill(empty.unsqueeze(-1), 0.0)
        return _with_weights(out, weights, need_weights)

    def _decoupled_rope(
        self, query: Tensor, key: Tensor, q: Tensor, k: Tensor, pos: TokenPositions
    ) -> tuple[Tensor, Tensor]:
        """[q; RoPE(W_qr x)] per head and [k; RoPE(W_kr x)] with the rotated part shared by the key heads."""
        qr = apply_rope(self._split_heads(self.q_rope(query)), pos.q)
        kr = apply_rope(self.k_rope(key).unsqueeze(1), pos.k)  # (batch, 1, k_len, kv_rope_dim)
        return torch.cat([q, qr], -1), torch.cat([k, kr.expand(-1, k.shape[1], -1, -1)], -1)

    def _latent_keys(
        self,
        kv_down: nn.Linear,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        pos: TokenPositions,
        all_k_pos: Tensor,
        cache: KVCache,
    ) -> tuple[Tensor, Tensor]:
        """MLA with a KV cache: append the new tokens' latent c = W_dkv x (batch, 1, new, kv_latent) to the cache and
        rebuild every key (rotated at its position) and value from the stored latents.

        Raises:
            ValueError: separate key and value inputs (the joint latent is one per token).
        """
        if value is not key:
            raise ValueError(
                f"kv_latent={self.spec.kv_latent}: a KV cache stores one joint latent per token, so key and value "
                f"must be the same input"
            )
        latent = kv_down(self.position.encode_inputs(key, pos.k)).unsqueeze(1)
        if self.spec.kv_rope_dim:  # the decoupled RoPE key, rotated once at its position, is cached beside it
            latent = torch.cat([latent, apply_rope(self.k_rope(key).unsqueeze(1), pos.k)], -1)
        stored, _ = cache.append(latent, latent[..., :0])  # values: nothing beyond the latent
        c, kr = stored[:, 0, :, : self.spec.kv_latent], stored[:, :, :, self.spec.kv_latent :]
        k_up, v_up = self.k_proj, self.v_proj
        assert isinstance(k_up, nn.Sequential) and isinstance(v_up, nn.Sequential)  # (W_dkv, W_u) with kv_latent
        k = self.position.rotate(self._split_heads(k_up[-1](c), self.spec.kv_heads), all_k_pos)
        if self.spec.kv_rope_dim:
            k = torch.cat([k, kr.expand(-1, k.shape[1], -1, -1)], -1)
        return k, self._split_heads(v_up[-1](c), self.spec.kv_heads)

    def _cache_layout(self) -> str:
        """What this layer keeps in a KV cache: ``"transport=<name> (state)"`` for a state transport (unless an engine
        without a state form is forced: every transport can decode from its keys transported to the last token, the
        reference engine's way), ``"transport=<name> (keys)"``, or ``"keys"`` without a transport."""
        if self.transport is None:
            return f"latent={self.spec.kv_latent}" if self.spec.kv_latent else "keys"
        state = "state" in self.plan.transport_traits and self.engine in ("auto", "recurrent")
        return f"transport={self.spec.transport} ({'state' if state else 'keys'})"

    def _state_step(
        self, q: Tensor, k: Tensor, v: Tensor, gates: TransportGates, keep: Tensor | None, cache: KVCache
    ) -> tuple[Tensor, Tensor | None]:
        """The new tokens folded into the cache's state (``engines/state_form.state_form``); (heads' output, the
        (batch, q_len) queries that see no real key, or None)."""
        if cache.state is not None and cache.state.shape[:2] != k.shape[:2]:
            raise ValueError(
                f"the cached state of shape {tuple(cache.state.shape)} does not fit keys of shape {tuple(k.shape)} "
                f"(batch and heads must match; reset() the cache)"
            )
        scale = self.scale(None)
        scale = scale.to(q.dtype) if isinstance(scale, Tensor) else scale
        lead = k.shape[-2] - q.shape[-2]
        qs = torch.nn.functional.pad(q * scale, (0, 0, lead, 0))
        out, cache.state = state_form(
            qs, k, v, gates, cache.state, chunk=chunk_for(self.plan.transport_traits, DEFAULT_CHUNK)
        )
        cache.start += k.shape[-2]
        self.last_engine = "recurrent"
        flags = torch.ones_like(k[:, 0, :, 0]) if keep is None else keep.to(k.dtype)
        counts = flags.cumsum(-1) + (0.0 if cache.real is None else cache.real[:, None])
        cache.real = counts[:, -1]
        empty = counts[:, lead:] == 0
        return out[:, :, lead:], (empty if bool(empty.any()) else None)

    def _contextual_bias(
        self, q: Tensor, k: Tensor, mask: Tensor | None, bias: Tensor | None, scale: float | Tensor, q_offset: int
    ) -> Tensor:
        """``bias`` plus the position's bias from the layer's scaled scores (CoPE), the blocked keys (causal, window,
        ``mask``) opening no gate; (batch, heads, q_len, k_len)."""
        q_len, k_len = q.shape[-2], k.shape[-2]
        visible = causal_mask(q_len, k_len, q_offset, q.device)
        if self.spec.window:
            visible = visible & window_mask(q_len, k_len, q_offset, self.spec.window, True, q.device)
        if mask is not None:
            visible = visible & mask
        # the score's parameters in q's dtype (LASER lifts q and k to float32 while they may stay in bfloat16)
        logits = call_in(self.score_fn, (q, k), q.dtype) * scale
        if bias is not None:
            logits = logits + bias
        extra = self.position.contextual_bias(q, logits.masked_fill(~visible, float("-inf")))
        return extra if bias is None else bias + extra

    def _pad_queries(self, mask: Tensor | None, key_padding_mask: Tensor | None) -> Tensor | None:
        """In self-attention under a normalizer that sums over the queries (trait ``columns``: sinkhorn), a padded
        query takes no part in the column sums either (its row is empty: a zero output), so padding changes no real
        token; other normalizers keep ``mask``."""
        if key_padding_mask is None or mask is None or "columns" not in self.plan.normalizer_traits:
            return mask
        return mask & key_padding_mask[:, None, :, None]

    def _positions(
        self,
        query: Tensor,
        key: Tensor,
        q_len: int,
        past: int,
        cache: KVCache | None,
        position_ids: Tensor | None,
        key_position_ids: Tensor | None,
        key_padding_mask: Tensor | None,
    ) -> TokenPositions:
        """Token positions of the queries and new keys (absolute: a cache's dropped tokens count)."""
        new_k_len = key.shape[1]
        k_len = past + new_k_len
        if self.plan.position_traits or cache is not None:  # positions are read, or kept by the cache
            return token_positions(
                q_len,
                new_k_len,
                past,
                query.device,
                position_ids=position_ids,
                key_position_ids=key_position_ids,
                key_padding_mask=key_padding_mask,
                cached=cache.positions if cache is not None else None,
                self_attention=key is query,
            )
        # No value of the positions is read: no need to derive them.
        return TokenPositions(
            torch.arange(k_len - q_len, k_len, device=query.device),
            torch.arange(past, k_len, device=query.device),
            default=True,
        )

    def _selected(
        self, q: Tensor, k: Tensor, mask: Tensor | None, q_offset: int
    ) -> tuple[Tensor | None, Selection | None]:
        """The keys a second score picks (``axes/select.py``): ``(mask, selection)``, the selection lazy where
        nothing before the engine reads the mask (so that an engine gathering the kept keys may run it,
        ``engines/selected.py``; the router folds it into the mask for any other), else folded into ``mask`` here:
        under ``torch.compile``, a per-row scale (it counts the visible keys), a contextual position (CoPE) or an
        aggregator that encodes the values under the mask (LASER)."""
        if self.select is None:
            return mask, None
        keep = None if mask is None or mask.shape[-2] != 1 or mask.shape[1] != 1 else mask[:, 0, 0, :]
        plan = self.plan
        if not (
            torch.compiler.is_compiling()
            or self.scale.per_row
            or "contextual" in plan.position_traits
            or "log_values" in plan.aggregator_traits
        ):
            return mask, self.select.selection(q, k, q_offset, self.spec.causal, keep)
        chosen = self.select.mask(q, k, q_offset, self.spec.causal, keep)
        return (chosen if mask is None or chosen is None else mask & chosen), None

    def _attend_heads(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        bias: Tensor | None,
        q_offset: int,
        index_alibi: bool,
        need_weights: bool,
        engine: str,
        transport: TransportGates | None = None,
    ) -> Attended:
        """GQA's head sharing, then the engine the router picks for this layer's plan (A2, A4, A5; the transport's
        gates for a spec with one)."""
        groups = self.num_heads // k.shape[1]
        if groups > 1:  # key/value head g serves query heads g * groups ...
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        mask, selection = self._selected(q, k, mask, q_offset)
        # The trait log_values promises the aggregator's encode and decode.
        wrap = cast(LogValuesAggregator, self.aggregator) if "log_values" in self.plan.aggregator_traits else None
        if wrap is not None:  # A1 around the weighted sum: LASER's exp(v - m) in, m + log(out) out
            dtype = v.dtype
            v, shift = wrap.encode(v, mask)  # exp(v - m) in max(dtype, float32): q and k follow, one dtype per call
            q, k = q.to(v.dtype), k.to(v.dtype)
        seen = KeyVisibility(q.shape[-2], k.shape[-2], mask, self.spec.causal, q_offset, self.spec.window, q.device)
        scale = self.scale(seen.counts() if self.scale.per_row else None)  # log_n: per row
        if "contextual" in self.plan.position_traits:  # CoPE: a bias from the scores themselves
            bias = self._contextual_bias(q, k, mask, bias, scale, q_offset)
        result = attend(
            q,
            k,
            v,
            parts=self.plan,
            mask=mask,
            bias=bias,
            scale=scale,
            causal=self.spec.causal,
            q_offset=q_offset,
            alibi_slopes=self.position.slopes if self.spec.position == "alibi" and index_alibi else None,
            dropout_p=self.spec.dropout,
            training=self.training,
            need_weights=need_weights,
            engine=engine,
            double_backward=self.double_backward,
            transport=transport,
            select=selection,
        )
        self.last_engine = result.engine
        if wrap is not None:
            result = result._replace(out=wrap.decode(result.out, shift).to(dtype))
        return result

    def core(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        mask: Tensor | None = None,
        bias: Tensor | None = None,
        q_offset: int | None = None,
        need_weights: bool = False,
        engine: str | None = None,
    ) -> Attended:
        """What ``forward`` runs between the projections and the output projection, on head-split tensors.

        RoPE at the index positions (query i at ``q_offset + i``, key j at j), GQA's head sharing, ALiBi, the
        layer's score, normalizer and contribution on the engine the router picks. For benchmarks and surgery.

        Args:
            q: (batch, heads, q_len, head_dim) projected queries (before RoPE).
            k: (batch, kv_heads, k_len, head_dim) projected keys (before RoPE); v: (batch, kv_heads, k_len,
                head_dim) values.
            mask: bool, True = may attend, broadcastable to (batch, heads, q_len, k_len); bias: float, likewise.
            q_offset: position of query 0 among the keys (default ``k_len - q_len``, bottom-right aligned).
            need_weights: also return the weights (batch, heads, q_len, k_len) float32.
            engine: an engine name to force (default: the layer's ``engine``).

        Returns:
            :class:`~axiomformer.engines.Attended` ``(out (batch, heads, q_len, head_dim), weights, engine)``;
            ``last_engine`` names the engine too.

        Raises:
            ValueError: see :func:`axiomformer.engines.attend`; a position choice that reads the layer's inputs
                (``position="forget"``'s gates), which only ``forward`` has; a transport with a mask, bias or query
                offset (its gates are computed from the merged keys ``k`` in place of the key input).
        """
        if "decay" in self.plan.position_traits:
            raise ValueError(
                f"position={self.spec.position!r} reads the key inputs x_l for its gates; core() sees "
                f"only projected q, k, v: call the layer (forward) instead"
            )
        q_len, k_len = q.shape[-2], k.shape[-2]
        q_offset = k_len - q_len if q_offset is None else q_offset
        if "conv" in self.plan.position_traits:  # the short convolution of the (merged) projections
            # on (batch, seq, heads, head_dim) views: the convolution keeps their head-split layout, no merged copy
            convolved = self.position.short_conv(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), None, None)
            q, k, v = (t.transpose(1, 2) for t in convolved[:3])
        if self.transport is not None:  # the gates read the (merged) keys in place of the key input (bench, surgery)
            if mask is not None or bias is not None or q_offset != k_len - q_len:
                raise ValueError(
                    f"transport={self.spec.transport!r}: core() takes no mask, bias or query offset (the causal "
                    f"mask and key padding are the transport's, in forward)"
                )
            q, k = self.transport.prepare(q, k)
            gates = self.transport.gates(k.to(self.q_proj.weight.dtype), k)  # head-split: no merged copy kept
            return self._attend_heads(q, k, v, None, None, q_offset, True, need_weights, engine or self.engine, gates)
        q = self.position.rotate(q, torch.arange(q_offset, q_offset + q_len, device=q.device))
        k = self.position.rotate(k, torch.arange(k_len, device=k.device))
        return self._attend_heads(q, k, v, mask, bias, q_offset, True, need_weights, engine or self.engine)

    # ------------------------------------------------------------------ interop
    @classmethod
    def from_multihead_attention(
        cls, mha: nn.MultiheadAttention, *, causal: bool = False, **spec_fields: Any
    ) -> Attention:
        """A standard-spec Attention carrying the weights of ``mha`` (``batch_first`` either way).

        Our ``forward`` is always batch-first and takes ``key_padding_mask`` with True = real token, whereas ``mha``
        takes True = padding. Extra keyword arguments go to the spec (e.g. ``position="rope"``).

        Raises:
            ValueError: ``mha`` uses ``add_bias_kv``, ``add_zero_attn`` or key/value widths other than ``embed_dim``.
        """
        if mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError("add_bias_kv and add_zero_attn have no counterpart in AttentionSpec")
        if not mha._qkv_same_embed_dim:
            raise ValueError(
                f"kdim={mha.kdim}, vdim={mha.vdim} differ from embed_dim={mha.embed_dim}; "
                "AttentionSpec needs key/value inputs of width dim"
            )
        spec = AttentionSpec.standard(
            mha.embed_dim, mha.num_heads, causal=causal, bias=mha.in_proj_bias is not None, dropout=mha.dropout
        ).relax(spec_fields)
        module = cls(spec).to(device=mha.in_proj_weight.device, dtype=mha.in_proj_weight.dtype)
        weights = mha.in_proj_weight.detach().chunk(3, dim=0)
        biases = (None,) * 3 if mha.in_proj_bias is None else mha.in_proj_bias.detach().chunk(3)
        with torch.no_grad():
            for proj, weight, bias in zip((module.q_proj, module.k_proj, module.v_proj), weights, biases):
                _load_linear(proj, weight, bias)
            _load_linear(module.out_proj, mha.out_proj.weight, None if mha.in_proj_bias is None else mha.out_proj.bias)
        return module

    def extra_repr(self) -> str:
        return self.spec.describe()
