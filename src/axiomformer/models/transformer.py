"""``TransformerLM``: a Transformer over token ids whose every attention layer is ``Attention(spec)``: a causal
decoder with a causal spec, a bidirectional encoder (every token sees every token) with a non-causal one.

    x_0 = sqrt(dim) E[ids] + PE          (token embedding, Vaswani et al. 2017 sec. 3.4; PE see ``input_position``)
    x_l = x_{l-1} + Attn_l(LN(x_{l-1}));  x_l = x_l + MLP_l(LN(x_l))      (pre-norm residual blocks, Xiong et al. 2020)
                                         (attention-only blocks, ``mlp_ratio=0``: the MLP sublayer is left out)
    logits = LN(x_L) E^T                 (output head tied to the embedding, Press & Wolf 2017)

Incremental decoding: ``model(ids, caches=model.new_caches())`` prefills, then ``model(next_ids, caches=caches)``
continues with the same cache objects (one ``KVCache`` per layer); the logits equal those of the full forward.
"""

from __future__ import annotations

import dataclasses
import math
from typing import cast

import torch
from torch import Tensor, nn

from axiomformer.attention import Attention, KVCache
from axiomformer.axes.mlp import two_layer_mlp
from axiomformer.axes.position import sinusoidal_table, token_positions
from axiomformer.spec import AttentionSpec

INPUT_POSITIONS = ("auto", "none", "sinusoidal", "learned")


def _layer_specs(
    spec: AttentionSpec, num_layers: int, max_len: int, layer_specs: list[AttentionSpec] | None
) -> list[AttentionSpec]:
    """Each layer's spec (``spec`` repeated by default), checked against the model's width and causality."""
    if layer_specs is None:
        return [spec] * num_layers
    layers = list(layer_specs)
    if len(layers) != num_layers:
        raise ValueError(f"layer_specs has {len(layers)} specs; need one per layer (num_layers={num_layers})")
    for i, s in enumerate(layers):
        if not isinstance(s, AttentionSpec):
            raise ValueError(f"layer_specs[{i}] must be an AttentionSpec, got {type(s).__name__}")
        if s.dim != spec.dim or s.causal != spec.causal:
            raise ValueError(
                f"layer_specs[{i}] has dim={s.dim}, causal={s.causal}; every layer needs the model's "
                f"dim={spec.dim}, causal={spec.causal}"
            )
    return [
        dataclasses.replace(s, max_len=max_len) if s.position == "learned" and s.max_len < max_len else s
        for s in layers
    ]


class Block(nn.Module):
    """Pre-norm residual block: ``x + Attn(LN(x))`` then ``x + MLP(LN(x))``; x (batch, seq, dim).

    ``mlp_ratio=0`` leaves the MLP sublayer out (an attention-only block: after the sum over tokens only the
    aggregator rho of the spec, A1, and the output projection act on it).
    """

    def __init__(self, spec: AttentionSpec, *, mlp_ratio: int = 4, engine: str = "auto", layer_index: int = 0):
        super().__init__()
        self.norm1 = nn.LayerNorm(spec.dim)
        self.attn = Attention(spec, engine=engine, layer_index=layer_index)  # the depth: diff_authors' lambda_init
        self.norm2 = nn.LayerNorm(spec.dim) if mlp_ratio > 0 else None
        self.mlp = two_layer_mlp(spec.dim, mlp_ratio * spec.dim, spec.dim) if mlp_ratio > 0 else None

    def forward(
        self,
        x: Tensor,
        cache: KVCache | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> Tensor:
        x = x + self.attn(self.norm1(x), cache=cache, key_padding_mask=key_padding_mask, position_ids=position_ids)
        if self.mlp is None or self.norm2 is None:  # attention-only: both are None together
            return x
        return x + self.mlp(self.norm2(x))


class TransformerLM(nn.Module):
    """Transformer over tokens: token ids (batch, seq) int64 -> logits (batch, seq, vocab_size).

    Args:
        spec: the attention of every layer; causal (a language model) or not (a bidirectional encoder, whose
            logits at position t may use every token). ``spec.dim`` is the model width.
        vocab_size: number of token ids.
        num_layers: number of blocks.
        max_len: longest sequence (cache included) the model accepts.
        mlp_ratio: MLP hidden width = ``mlp_ratio * dim``; 0 builds attention-only blocks (no MLP sublayer).
        input_position: position encoding added to the token embeddings: ``"sinusoidal"`` (Vaswani et al. 2017,
            sec. 3.5), ``"learned"``, ``"none"``, or ``"auto"``: sinusoidal when ``spec.position == "none"``, else none
            **(our choice: the standard spec is Vaswani's Transformer, with its input encoding; a spec that brings its
            own position (RoPE, ALiBi, ...) is measured without a second one)**.
        engine: attention engine for every layer (``"auto"`` routes, see ``axiomformer.engines``).
        layer_specs: one spec per layer for a hybrid stack (like Hugging Face's ``config.layer_types``), e.g. three
            Gated DeltaNet layers then one softmax layer, repeated (Qwen3-Next's 3:1); default ``spec`` in every
            layer. Each must have ``spec``'s ``dim`` and ``causal``; ``spec`` still decides ``input_position="auto"``.

    Raises:
        ValueError: non-positive sizes, a negative ``mlp_ratio``, an unknown ``input_position``, ``layer_specs`` of
            another length than ``num_layers`` or with another ``dim`` or ``causal``, or (in forward) a sequence
            longer than ``max_len`` or a KV cache with a non-causal spec.
    """

    def __init__(
        self,
        spec: AttentionSpec,
        vocab_size: int,
        num_layers: int,
        max_len: int,
        *,
        mlp_ratio: int = 4,
        input_position: str = "auto",
        engine: str = "auto",
        layer_specs: list[AttentionSpec] | None = None,
    ):
        super().__init__()
        if mlp_ratio < 0:
            raise ValueError(f"mlp_ratio must be >= 0 (0: attention-only blocks), got {mlp_ratio}")
        for name, value in (("vocab_size", vocab_size), ("num_layers", num_layers), ("max_len", max_len)):
            if value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
        if input_position not in INPUT_POSITIONS:
            raise ValueError(f"unknown input_position {input_position!r}; choose one of: {', '.join(INPUT_POSITIONS)}")
        if spec.position == "learned" and spec.max_len < max_len:
            spec = dataclasses.replace(spec, max_len=max_len)
        self.spec, self.vocab_size, self.max_len, self.dim = spec, vocab_size, max_len, spec.dim
        if input_position == "auto":
            input_position = "sinusoidal" if spec.position == "none" else "none"
        self.input_position = input_position
        self.embed = nn.Embedding(vocab_size, spec.dim)
        nn.init.normal_(self.embed.weight, std=spec.dim**-0.5)
        self.pos_embed = nn.Embedding(max_len, spec.dim) if input_position == "learned" else None
        if self.pos_embed is not None:
            nn.init.normal_(self.pos_embed.weight, std=0.02)
        layers = _layer_specs(spec, num_layers, max_len, layer_specs)
        self.blocks = nn.ModuleList(
            Block(s, mlp_ratio=mlp_ratio, engine=engine, layer_index=i) for i, s in enumerate(layers)
        )
        self.norm = nn.LayerNorm(spec.dim)
        self.config = {
            "kind": "transformer",
            "vocab_size": vocab_size,
            "dim": spec.dim,
            "num_layers": num_layers,
            "max_len": max_len,
            "spec": spec.to_dict(),
            "causal": spec.causal,
            "mlp_ratio": mlp_ratio,
            "input_position": input_position,
            "engine": engine,
        }
        if layer_specs is not None:
            self.config["layer_specs"] = [s.to_dict() for s in layers]

    @property
    def layer_specs(self) -> list[AttentionSpec]:
        """The spec of each layer (all ``spec`` unless the model was built with ``layer_specs``)."""
        return [attn.spec for attn in self._attentions()]

    def new_caches(self) -> list[KVCache]:
        """One empty :class:`KVCache` per layer, for incremental decoding."""
        return [KVCache() for _ in self.blocks]

    @property
    def engines(self) -> list[str]:
        """Names of the attention engines that ran in the last forward, one per layer."""
        return [attn.last_engine or "" for attn in self._attentions()]

    def _attentions(self) -> list[Attention]:
        """Each block's attention layer, first to last (``self.blocks`` holds only :class:`Block`)."""
        return [cast(Block, block).attn for block in self.blocks]

    def embed_tokens(self, ids: Tensor, offset: int = 0, positions: Tensor | None = None) -> Tensor:
        """(batch, seq, dim): scaled token embeddings plus the input position encoding of ``positions``
        ((seq,) or (batch, seq); default offset, offset + 1, ...)."""
        x = self.embed(ids) * math.sqrt(self.dim)
        if self.input_position != "none":
            if positions is None:
                positions = torch.arange(offset, offset + ids.shape[1], device=ids.device)
            table = sinusoidal_table(positions, self.dim) if self.pos_embed is None else self.pos_embed(positions)
            x = x + table.to(x.dtype)
        return x

    def forward(
        self,
        ids: Tensor,
        caches: list[KVCache] | None = None,
        *,
        key_padding_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> Tensor:
        """Logits (batch, seq, vocab_size) for token ids (batch, seq) int64.

        Args:
            caches: ``new_caches()`` output, carried across calls: the new tokens continue the cached ones
                (their positions continue the cached positions) and their keys/values are appended.
            key_padding_mask: (batch, cached + seq) bool, True = real token: padding is never attended, and
                without ``position_ids`` the real tokens' positions are counted from it (left padding changes
                nothing).
            position_ids: (seq,) or (batch, seq) int positions of the tokens, for the input encoding and every
                layer (see ``axiomformer.axes.position``).

        Raises:
            ValueError: wrong shapes, a cache list of the wrong length, or a position at or beyond ``max_len``.
        """
        if ids.dim() != 2:
            raise ValueError(f"ids must be (batch, seq) int64, got shape {tuple(ids.shape)}")
        if caches is not None and not self.spec.causal:
            raise ValueError("incremental decoding needs a causal spec; a bidirectional encoder has no KV cache")
        if caches is not None and len(caches) != len(self.blocks):
            raise ValueError(f"need one cache per layer ({len(self.blocks)}), got {len(caches)}")
        offset = caches[0].seen if caches is not None else 0
        pos = token_positions(
            ids.shape[1],
            ids.shape[1],
            offset,
            ids.device,
            position_ids=position_ids,
            key_padding_mask=key_padding_mask,
            cached=caches[0].positions if caches is not None else None,
        )
        # Index positions end at offset + seq - 1: known without reading the tensor (no host sync, and no graph
        # break under torch.compile, the trainer's fast path).
        last = offset + ids.shape[1] - 1 if pos.default else (int(pos.q.max()) if pos.q.numel() else -1)
        if offset + ids.shape[1] > self.max_len or last >= self.max_len:
            raise ValueError(
                f"sequence of {offset + ids.shape[1]} tokens (last position {last}) exceeds max_len={self.max_len}"
            )
        x = self.embed_tokens(ids, offset, pos.q)
        layer_positions = None if pos.default else pos.q
        for i, block in enumerate(self.blocks):
            x = block(
                x,
                cache=None if caches is None else caches[i],
                key_padding_mask=key_padding_mask,
                position_ids=layer_positions,
            )
        return self.norm(x) @ self.embed.weight.t()
