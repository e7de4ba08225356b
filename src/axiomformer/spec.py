"""AttentionSpec: one point of the attention design space.

Each field of :class:`AttentionSpec` that is an *axis* corresponds to one assumption of the derivation in
Somani, "A Minimal Route to Transformer Attention" (see ``docs/SOURCES.md``):

=============  =====  ============================  ======================================
field          alias  assumption                    choices
=============  =====  ============================  ======================================
aggregator     A1     rho = identity                ``axes/aggregator.py``: AGGREGATORS
contribution   A2     contribution = u_ij * v_j     ``axes/contribution.py``: CONTRIBUTIONS
value          A3     v(x) = W_v x                  ``axes/value.py``: VALUES
score          A4     s_ij = q_i . k_j              ``axes/score.py``: SCORES
normalizer     A5     u_ij = softmax_j(s_ij/sqrt d) ``axes/normalizer.py``: NORMALIZERS
scale          (A5)   the 1/sqrt(d_k) temperature   ``axes/scale.py``: SCALES
position       (A0)   order re-injected             ``axes/position.py``: POSITIONS
feature_map    (A5)   linear attention's kernel     ``axes/normalizer.py``: FEATURE_MAPS
transport      (A4)   T_{i<-j} = I (no transport)   ``axes/transport.py``: TRANSPORTS
select         (A4)   one score picks and weighs    ``axes/select.py``: SELECTS
=============  =====  ============================  ======================================

The choice lists (:data:`AXES`) are read from those registries; the first choice of each is the standard one.
All axes at their first choice is standard scaled dot-product attention (Vaswani et al. 2017, eq. 1).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from typing import Any

from axiomformer.axes.aggregator import AGGREGATORS
from axiomformer.axes.contribution import CONTRIBUTIONS
from axiomformer.axes.normalizer import FEATURE_MAPS, NORMALIZERS, changed_options
from axiomformer.axes.plugins import load_choices
from axiomformer.axes.position import POSITIONS
from axiomformer.axes.registry import Registry
from axiomformer.axes.scale import SCALES
from axiomformer.axes.score import SCORES
from axiomformer.axes.select import SELECTS, check_select
from axiomformer.axes.transport import TRANSPORTS, check_transport
from axiomformer.axes.value import VALUES

REGISTRIES: dict[str, Registry] = {
    "aggregator": AGGREGATORS,
    "contribution": CONTRIBUTIONS,
    "value": VALUES,
    "score": SCORES,
    "normalizer": NORMALIZERS,
    "scale": SCALES,
    "position": POSITIONS,
    "feature_map": FEATURE_MAPS,
    "transport": TRANSPORTS,
    "select": SELECTS,
}
"""The registry of every axis (``axes/<axis>.py``): each choice with its formula, source, implementation, traits."""

PLUGIN_CHOICES: list[str] = load_choices(REGISTRIES)
"""``axis.name`` of every choice other packages registered through the entry-point group ``axiomformer.choices``
(``axes/plugins.py``)."""

AXES: dict[str, tuple[str, ...]] = {axis: registry.names() for axis, registry in REGISTRIES.items()}
"""Every axis and its choices, read from :data:`REGISTRIES`; the first choice of each axis is the standard one."""

ALIASES: dict[str, str] = {"A1": "aggregator", "A2": "contribution", "A3": "value", "A4": "score", "A5": "normalizer"}
"""Assumption names accepted by :meth:`AttentionSpec.relax` in place of field names."""

ASSUMPTIONS: dict[str, str] = {
    "A0": "symmetry: the output does not depend on the order of the visible tokens (no position information)",
    "A1": "simplicity: the aggregator rho is the identity",
    "A2": "relevance-contribution proportionality: phi(x_j, u_ij) = u_ij * v(x_j)",
    "A3": "linear change of coordinates: v(x) = W_v x",
    "A4": "efficient parallel scoring: s_ij = q_i . k_j with q = W_q x, k = W_k x",
    "A5": "normalization: u_ij = softmax_j(s_ij / sqrt(d_k))",
}
"""The assumptions of the derivation, in words: A0 (order, the ``position`` axis) and the five A1..A5."""

FIELD_RELAXATIONS: dict[str, tuple[str, str, str]] = {
    "softcap": (
        "scores <- softcap * tanh(scores / softcap) before any normalizer (0 = off)",
        "A4: the score becomes softcap * tanh(q . k / (softcap sqrt(d))), a bounded function of q . k",
        "Gemma Team 2024, Gemma 2, sec. 2",
    ),
    "diff_authors": (
        "normalizer=diff as its authors' layer: lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init by depth, each "
        "head's output through RMSNorm times (1 - lambda_init), the half-head RoPE",
        "A1: the per-head RMSNorm is a rho after the sum over tokens (with normalizer=diff only)",
        "Ye et al. 2024, arXiv:2410.05258, eq. 1-3; microsoft/unilm Diff-Transformer, multihead_diffattn.py",
    ),
}
"""Fields that relax an assumption without being an axis: formula, assumption relaxed and how, source (the
design-space table's rows)."""

CONVENTION_FLAGS = (
    "softpick_shifted_eps",
    "stick_attend_current",
    "stick_remainder",
    "talking_heads_residual",
    "sinkhorn_authors",
    "diff_authors",
)
"""Boolean fields that switch a choice to its authors' released convention (the defaults follow the papers)."""

ECONOMY_NOTES: dict[str, tuple[str, str, str]] = {
    "num_kv_heads": (
        "key/value heads each shared by num_heads / num_kv_heads consecutive query heads (1: multi-query)",
        "none: an economy (every head keeps a linear key and value map and the score q . k)",
        "Ainslie et al. 2023, GQA; Shazeer 2019, multi-query attention",
    ),
    "window": (
        "key j visible from query i iff i - window < j <= i (causal), |i - j| < window otherwise",
        "none: an economy (a mask on the keys)",
        "Beltagy et al. 2020, Longformer; Child et al. 2019",
    ),
    "kv_latent": (
        "k = W_uk c, v = W_uv c from one latent c = W_dkv x of width kv_latent per token, all a KV cache stores",
        "none: an economy (the key and value maps stay linear, W_k = W_uk W_dkv: A3 and A4 hold)",
        "DeepSeek-AI 2024, DeepSeek-V2, arXiv:2405.04434, sec. 2.1.2, eq. 9-11 (multi-head latent attention)",
    ),
    "kv_rope_dim": (
        "s_ij = [q_i; RoPE(W_qr x_i)] . [k_j; RoPE(W_kr x_j)] / sqrt(head_dim + kv_rope_dim), k^R shared by the heads",
        "A0 (order re-enters): MLA's decoupled RoPE key is the layer's position mechanism",
        "DeepSeek-AI 2024, DeepSeek-V2, arXiv:2405.04434, sec. 2.1.3, eq. 14-19",
    ),
}
"""Fields that are not assumptions but the field's usual economies (0 = off): formula, assumption relaxed and how,
source (``axiomformer spec`` and the design-space table print them); :attr:`AttentionSpec.variant` names them."""

ECONOMIES = tuple(ECONOMY_NOTES)
"""The economy fields of :data:`ECONOMY_NOTES`."""


def required_fields(axis: str, name: str) -> dict[str, Any]:
    """Fields a choice needs beside itself: ``{"causal": True}`` for a choice defined only under a causal mask
    (trait ``causal``: ``normalizer=stick_breaking``, ``position=forget``), ``{"causal": False}`` for one defined only
    without (trait ``noncausal``: ``normalizer=sinkhorn``), and the fields of its ``extra["requires"]`` (a transport's
    paired normalizer: ``transport=decay_householder`` needs ``normalizer=none``), else ``{}``. For code that visits every choice (the audit
    matrix, the bench, the docs): ``base.relax({axis: name, **required_fields(axis, name)})``."""
    registry = REGISTRIES.get(axis)
    if registry is None or name not in registry:
        return {}
    out = dict(registry[name].extra.get("requires", {}))  # e.g. the normalizer a transport's paper pairs it with
    if registry.has(name, "causal"):
        out["causal"] = True
    elif registry.has(name, "noncausal"):
        out["causal"] = False
    return out


def allows_causal(axis: str, name: str, causal: bool) -> bool:
    """Whether choice ``name`` of ``axis`` is defined with ``causal`` as given (see :func:`required_fields`)."""
    return required_fields(axis, name).get("causal", causal) == causal


def spec_requirements(spec: AttentionSpec) -> dict[str, Any]:
    """The :func:`required_fields` of every axis choice of ``spec``, merged."""
    out: dict[str, Any] = {}
    for axis in REGISTRIES:
        out.update(required_fields(axis, getattr(spec, axis)))
    return out


def relax_with_requirements(base: AttentionSpec, changes: str | dict[str, Any]) -> AttentionSpec:
    """``base.relax(changes)`` with the fields its choices need (:func:`required_fields`: a causal mask, a transport's
    paired normalizer) filled in first wherever ``changes`` does not set them, so ``"transport=decay_householder"``
    alone names a defined spec; a field ``changes`` sets keeps its value (and the spec's error names the conflict).

    Raises:
        ValueError: as :meth:`AttentionSpec.relax`.
    """
    items = parse_relax(changes)
    given = {ALIASES.get(k, ALIASES.get(k.upper(), k)) for k, _ in items}
    needed: dict[str, Any] = {}
    for key, value in items:
        axis = ALIASES.get(key, ALIASES.get(key.upper(), key))
        needed.update({f: v for f, v in required_fields(axis, str(value)).items() if f not in given})
    return base.relax(needed).relax(dict(items))


LAYER_SEPARATOR = "/"
"""Separates the per-layer relax strings of a hybrid stack in a spec string (``train``, study arms), e.g.
``"transport=decay_householder/transport=decay_householder/transport=decay_householder/standard"``."""


def stack_specs(base: AttentionSpec, text: str, num_layers: int) -> list[AttentionSpec]:
    """The spec of each of ``num_layers`` layers from a spec string: relax strings separated by ``/`` repeated over
    the layers (three Gated DeltaNet layers and a softmax one, repeated, is Qwen3-Next's 3:1), each with the fields
    its choices need filled in (:func:`relax_with_requirements`); one relax string gives every layer the same spec.

    Raises:
        ValueError: an empty layer, or as :meth:`AttentionSpec.relax`.
    """
    parts = [p.strip() for p in text.split(LAYER_SEPARATOR)]
    if len(parts) > 1 and not all(parts):
        raise ValueError(f"empty layer in {text!r}: give one relax string per layer, separated by '/'")
    if len(parts) == 1:
        return [base.relax(text)] * num_layers
    specs = [relax_with_requirements(base, p) for p in parts]
    return [specs[i % len(specs)] for i in range(num_layers)]


def stack_assumptions(specs: list[AttentionSpec]) -> dict[str, bool]:
    """An assumption holds for a stack when it holds in every layer."""
    return {a: all(s.assumptions()[a] for s in specs) for a in specs[0].assumptions()}


def parse_relax(changes: str | dict[str, Any] | None) -> list[tuple[str, Any]]:
    """The ``(key, value)`` items of a relax string (``"score=cosine,normalizer=sigmoid"``) or dict, in order.

    Raises:
        ValueError: a malformed ``key=value`` item.
    """
    if isinstance(changes, dict):
        return [(str(k), v) for k, v in changes.items()]
    items = []
    text = (changes or "").strip()
    if text and text != "standard":
        for item in text.split(","):
            item = item.strip()
            if not item:
                continue
            if "=" not in item:
                raise ValueError(f"malformed relaxation {item!r}: expected key=value, e.g. 'score=cosine'")
            key, value = (part.strip() for part in item.split("=", 1))
            items.append((key, value))
    return items


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _integer(name: str, value: Any) -> int:
    """An integer field's value: an int, an integral float or an integer string; never a bool or a fraction (which
    ``int()`` would silently truncate)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} expects an integer, got {value!r}")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        raise ValueError(f"{name} expects an integer, got {value!r}") from None


@dataclass(frozen=True)
class AttentionSpec:
    """A frozen description of one attention layer in the design space.

    Args:
        dim: model width (size of the residual stream), must be divisible by ``num_heads``.
        num_heads: number of attention heads; ``head_dim = dim // num_heads``.
        causal: mask keys after the query (aligned bottom-right when query and key lengths differ).
        dropout: dropout probability on the attention weights, training only.
        bias: whether the query/key/value/output projections carry a bias (as ``nn.MultiheadAttention``).
        aggregator, contribution, value, score, normalizer, scale, position: the axes (see module docstring).
        feature_map: kernel feature map of the ``linear`` normalizer, phi(x) = elu(x) + 1 by default
            (Katharopoulos et al. 2020, eq. 7); ignored by the other normalizers.
        max_len: largest position index for ``position="learned"`` (size of the position table).
        num_kv_heads: key/value heads for grouped-query attention (Ainslie et al. 2023): each key/value head is
            shared by ``num_heads // num_kv_heads`` consecutive query heads; 1 is multi-query attention (Shazeer
            2019); 0 (the default) means ``num_heads``, plain multi-head attention.
        window: sliding-window (local) attention over ``window`` keys (Beltagy et al. 2020; Child et al. 2019):
            causal, key j is visible from the query at position i iff i - window < j <= i (the ``window`` most
            recent keys, its own included); not causal, iff |i - j| < window. Positions are absolute, as in the KV
            cache. 0 (the default): every key.
        gumbel_tau: temperature tau > 0 of ``normalizer="gumbel_softmax"``: u = softmax((s + g) / tau) in training
            (Jang et al. 2017, eq. 1); ignored by the other normalizers.
        gumbel_hard: ``gumbel_softmax`` returns one-hot rows in the forward (the argmax of s + g) with the soft
            sample's gradient (straight-through, Jang et al. 2017, sec. 2.2); ignored by the other normalizers.
        topk: keys kept per row by ``normalizer="topk"`` (an int >= 1, default 8; Zhao et al. 2019); ignored by the
            other normalizers.
        softpick_shifted_eps: ``normalizer="softpick"`` as the authors' released layer: the epsilon 1e-8 added to the
            denominator after the max shift, sum_j |e^(s_j - m) - e^-m| + 1e-8 with m = max_j s_j, instead of the
            paper's eq. 2 (1e-6 before it; the default); ignored by the other normalizers.
        stick_attend_current: ``normalizer="stick_breaking"`` lets a query attend to its own key (the row's last
            visible key), as Tan et al. 2024's eq. 3 (the default, True); False leaves the diagonal out, as the
            authors' released layer (``attend_current=False``); ignored by the other normalizers.
        stick_remainder: ``normalizer="stick_breaking"`` gives the stick's remainder 1 - sum_j u_ij to the query's
            own key (o_i += rem_i v_i), as the authors' released layer; False (the default): the paper's eq. 3, rows
            sum to at most 1; ignored by the other normalizers.
        talking_heads_residual: ``score="talking_heads"`` as x-transformers' layer, s_h + sum_g P_hg s_g with P from
            the identity (so it starts at 2 q . k); False (the default): the paper's P s with P from the identity
            (Shazeer et al. 2020, sec. 4), which starts at the standard score; ignored by the other scores.
        sinkhorn_authors: ``normalizer="sinkhorn"`` as the authors' released layer (Sander et al. 2022's code):
            marginals 1 / q_len and 1 / k_len, the plan times k_len, so rows sum to k_len / q_len (1 only when
            q_len = k_len) and columns about to 1, the column potential detached; False (the default): rows sum to
            1 and columns about to q_len / k_len, every step differentiated; ignored by the other normalizers.
        diff_authors: ``normalizer="diff"`` as the authors' released layer (microsoft/unilm Diff-Transformer,
            ``multihead_diffattn.py``; Ye et al. 2024, eq. 1-3): one lambda per layer, exp(lq1 . lk1) - exp(lq2 .
            lk2) + lambda_init, lambda_init = 0.8 - 0.6 exp(-0.3 layer_index) from the layer's 0-based depth (which
            the model passes, ``Attention(spec, layer_index=i)``; 0 for a layer alone); the per-head RMSNorm of the
            output (eps 1e-5, a learned scale shared by the heads) times (1 - lambda_init), an A1 change; with
            ``position="rope"`` each half of a head rotated apart (the half-head RoPE, pairs interleaved; needs
            head_dim divisible by 4). False (the default): eq. 1 alone, lambda_h learned per head from 0.2, the
            full-head RoPE; ignored by the other normalizers.
        transport: the relevance carried through the tokens in between (``axes/transport.py``): ``none`` (default),
            ``decay`` (Mamba-2), ``householder`` (PaTH), ``decay_householder`` (Gated DeltaNet),
            ``diag_decay_householder`` (Kimi Linear's KDA); each needs ``causal=True`` and its paper's normalizer.
        kv_latent: multi-head latent attention's joint key/value compression (DeepSeek-AI 2024, DeepSeek-V2,
            arXiv:2405.04434, sec. 2.1.2, eq. 9-11): k = W_uk c, v = W_uv c with one latent c = W_dkv x of this width
            per token, which is all a KV cache stores; 0 (the default) is off. An economy like ``num_kv_heads``: the
            key and value maps stay linear (A3, A4 hold). Its decoupled RoPE key is not built: ``position="rope"``
            rotates the whole rebuilt key; ``kv_rope_dim`` builds the decoupled one.
        kv_rope_dim: MLA's decoupled RoPE key (DeepSeek-V2, eq. 14-19): q_i gains RoPE(W_qr x_i) per head and k_j a
            RoPE(W_kr x_j) shared by the heads, both of this (even) width, scored with the latent part:
            s_ij = [q_i; q_i^R] . [k_j; k_j^R] / sqrt(head_dim + kv_rope_dim); the cache keeps k^R beside the
            latent. Needs ``kv_latent`` and ``position="none"`` (it is the layer's position mechanism: A0 relaxed).
        select: the keys each query attends to, chosen by a second score (``axes/select.py``): ``none`` (default),
            ``block_mean`` (MoBA), ``indexer`` (DeepSeek-V3.2's lightning indexer), ``nsa`` (NSA's selection).
        select_block: keys per block of a selection (>= 2; default 2 **(our choice: small enough that a selection
            acts on the audit's 8 tokens; MoBA uses 512, NSA 64)**).
        select_topk: blocks kept per query, forced ones included (``indexer``: select_topk * select_block tokens).
        softcap: logit soft-capping, scores <- softcap * tanh(scores / softcap) after the scale and before any bias
            or normalizer (Gemma 2: Gemma Team 2024, sec. 2); a float >= 0, 0 (the default) is off. It relaxes A4:
            the score becomes a bounded function of q . k (the audit's bilinear checks see it).

    Raises:
        ValueError: on an unknown choice (naming the valid ones), non-positive sizes, ``dim`` not divisible by
            ``num_heads``, an odd ``head_dim`` with RoPE, a ``linear`` normalizer with a score other than ``dot``, or
            ``gumbel_tau <= 0`` (the message names ``gumbel_tau``), ``topk < 1``, ``softcap < 0``, a causal-only
            choice (``stick_breaking``, ``forget``) without ``causal=True``, ``diff`` with an odd head_dim or a score
            with head_dim-sized parameters, ``softcap`` with a kernel normalizer.
    """

    dim: int = 64
    num_heads: int = 4
    causal: bool = False
    dropout: float = 0.0
    bias: bool = True
    aggregator: str = "identity"
    contribution: str = "proportional"
    value: str = "linear"
    score: str = "dot"
    normalizer: str = "softmax"
    scale: str = "inv_sqrt_d"
    position: str = "none"
    feature_map: str = "elu"
    max_len: int = 2048
    num_kv_heads: int = 0
    window: int = 0
    gumbel_tau: float = 1.0
    gumbel_hard: bool = False
    topk: int = 8
    softpick_shifted_eps: bool = False
    stick_attend_current: bool = True
    stick_remainder: bool = False
    talking_heads_residual: bool = False
    sinkhorn_authors: bool = False
    diff_authors: bool = False
    softcap: float = 0.0
    transport: str = "none"
    select: str = "none"
    select_block: int = 2
    select_topk: int = 2
    kv_latent: int = 0
    kv_rope_dim: int = 0

    def __post_init__(self) -> None:
        for name, registry in REGISTRIES.items():
            registry[getattr(self, name)]  # ValueError naming the choices

        if not isinstance(self.dim, int) or self.dim <= 0:
            raise ValueError(f"dim must be a positive int, got {self.dim!r}")
        if not isinstance(self.num_heads, int) or self.num_heads <= 0:
            raise ValueError(f"num_heads must be a positive int, got {self.num_heads!r}")
        if self.dim % self.num_heads:
            raise ValueError(f"dim={self.dim} is not divisible by num_heads={self.num_heads}")
        if not 0.0 <= float(self.dropout) < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if self.max_len <= 0:
            raise ValueError(f"max_len must be positive, got {self.max_len!r}")
        if (
            not isinstance(self.num_kv_heads, int)
            or self.num_kv_heads < 0
            or (self.num_kv_heads and self.num_heads % self.num_kv_heads)
        ):
            raise ValueError(
                f"num_kv_heads must be 0 (= num_heads) or divide num_heads={self.num_heads}, got {self.num_kv_heads!r}"
            )
        if not isinstance(self.window, int) or self.window < 0:
            raise ValueError(f"window must be a non-negative int (0 = every key), got {self.window!r}")
        if self.kv_heads != self.num_heads and self.value == "identity":
            raise ValueError(
                f"value='identity' keeps the width dim={self.dim} and cannot give "
                f"num_kv_heads={self.num_kv_heads} value heads; use value='linear' or 'mlp'"
            )
        tau = self.gumbel_tau
        if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not math.isfinite(tau) or tau <= 0:
            raise ValueError(f"gumbel_tau must be a finite float > 0, got {self.gumbel_tau!r}")
        for name in ("gumbel_hard", *CONVENTION_FLAGS):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        self._check_relaxations()
        check_transport(self)
        check_select(self)
        self._check_latent()
        self._check_sign_blind()
        if self.position == "rope" and self.head_dim % 2:
            raise ValueError(f"position='rope' needs an even head_dim, got head_dim={self.head_dim}")
        if NORMALIZERS.has(self.normalizer, "kernel") and self.score != "dot":
            raise ValueError(
                f"normalizer={self.normalizer!r} replaces the score by a kernel phi(q).phi(k) and needs score='dot', "
                f"got score={self.score!r}"
            )

    def _check_latent(self) -> None:
        """MLA's latent needs the linear value map it factors, and no choice that works on the projected keys."""
        for name in ("kv_latent", "kv_rope_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0 (0 = off), got {value!r}")
        if self.kv_rope_dim and (self.kv_rope_dim % 2 or not self.kv_latent or self.position != AXES["position"][0]):
            raise ValueError(
                f"kv_rope_dim={self.kv_rope_dim} (MLA's decoupled RoPE key) needs an even width, kv_latent > 0 and "
                f"position='none' (it is the position mechanism), got kv_latent={self.kv_latent}, "
                f"position={self.position!r}"
            )
        if not self.kv_latent:
            return
        bad = {
            "value": (self.value != AXES["value"][0], "the latent factors the linear value map W_v = W_uv W_dkv"),
            "transport": (self.transport != AXES["transport"][0], "a transport's gates are not defined on it"),
            "position": (POSITIONS.has(self.position, "conv"), "a short convolution of the keys breaks the cache"),
        }
        for field, (wrong, why) in bad.items():
            if wrong:
                raise ValueError(
                    f"kv_latent={self.kv_latent} needs another {field} ({why}), got {field}={getattr(self, field)!r}"
                )

    def _check_sign_blind(self) -> None:
        """A normalizer blind to the sign of the scores (``power``: s^2) turns an additive penalty into weight."""
        additive = {"bias", "decay", "contextual"}  # ALiBi, the forget gates, CoPE: biases added to the scores
        if NORMALIZERS.has(self.normalizer, "sign_blind") and POSITIONS[self.position].traits & additive:
            valid = ", ".join(c.name for c in POSITIONS if not c.traits & additive)
            raise ValueError(
                f"normalizer={self.normalizer!r} weighs a score by its magnitude whatever its sign, so "
                f"position={self.position!r}'s additive penalty would become weight; choose one of: {valid}"
            )

    def _check_relaxations(self) -> None:
        """The published relaxations' own conditions (topk, softcap, causal-only choices, diff's halves)."""
        if isinstance(self.topk, bool) or not isinstance(self.topk, int) or self.topk < 1:
            raise ValueError(f"topk must be an int >= 1 (keys kept per row by normalizer='topk'), got {self.topk!r}")
        cap = self.softcap
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not math.isfinite(cap) or cap < 0:
            raise ValueError(f"softcap must be a finite float >= 0 (0 = off), got {self.softcap!r}")
        for axis in ("normalizer", "position", "transport"):
            if REGISTRIES[axis].has(getattr(self, axis), "causal") and not self.causal:
                raise ValueError(
                    f"{axis}={getattr(self, axis)!r} is defined only under a causal mask: it needs "
                    f"causal=True, got causal=False"
                )
            if REGISTRIES[axis].has(getattr(self, axis), "noncausal") and self.causal:
                raise ValueError(
                    f"{axis}={getattr(self, axis)!r} is defined only without a causal mask (it normalizes over "
                    f"the queries too, and a causal query would see later ones): it needs causal=False, got "
                    f"causal=True"
                )
        self._check_log_values()
        if NORMALIZERS.has(self.normalizer, "halves"):
            if self.head_dim % 2:
                raise ValueError(
                    f"normalizer={self.normalizer!r} splits each head's query and key in two halves "
                    f"and needs an even head_dim (>= 2), got head_dim={self.head_dim}"
                )
            if self.position == "rope" and self.head_dim % 4:
                raise ValueError(
                    f"normalizer={self.normalizer!r} with position='rope' rotates each half of a head apart (so that "
                    f"each half's score depends on relative positions only) and needs head_dim divisible by 4, got "
                    f"head_dim={self.head_dim}"
                )
            if not SCORES.has(self.score, "any_width"):
                valid = ", ".join(c.name for c in SCORES if c.has("any_width"))
                raise ValueError(
                    f"normalizer={self.normalizer!r} scores half-width queries and keys and needs a score "
                    f"without head_dim-sized parameters (one of: {valid}), got score={self.score!r}"
                )
        if cap and NORMALIZERS.has(self.normalizer, "kernel"):
            raise ValueError(
                f"softcap caps scores, and normalizer={self.normalizer!r} has none (a kernel replaces "
                f"them): it needs softcap=0, got softcap={self.softcap!r}"
            )

    def _check_log_values(self) -> None:
        """An aggregator that takes log sum_j u_ij exp(v_j) (``laser``) needs u_ij >= 0 and the proportional
        contribution u_ij * exp(v_j)."""
        if not AGGREGATORS.has(self.aggregator, "log_values"):
            return
        if self.contribution != AXES["contribution"][0]:
            raise ValueError(
                f"aggregator={self.aggregator!r} takes log sum_j u_ij exp(v_j) and needs "
                f"contribution={AXES['contribution'][0]!r}, got contribution={self.contribution!r}"
            )
        signed = NORMALIZERS.has(self.normalizer, "signed") or (
            NORMALIZERS.has(self.normalizer, "kernel") and FEATURE_MAPS.has(self.feature_map, "signed")
        )
        if signed:
            what = f" with feature_map={self.feature_map!r}" if NORMALIZERS.has(self.normalizer, "kernel") else ""
            bad = [c.name for c in NORMALIZERS if c.has("signed")] + [
                f"linear with feature_map={c.name}" for c in FEATURE_MAPS if c.has("signed")
            ]
            raise ValueError(
                f"aggregator={self.aggregator!r} takes the log of sum_j u_ij exp(v_j) and needs weights >= 0 (any "
                f"normalizer but: {', '.join(bad)}); normalizer={self.normalizer!r}{what} gives signed weights"
            )

    # ------------------------------------------------------------------ construction
    @classmethod
    def standard(cls, dim: int = 64, num_heads: int = 4, causal: bool = False, **kwargs: Any) -> AttentionSpec:
        """Standard multi-head scaled dot-product attention: every assumption A1..A5 holds."""
        return cls(dim=dim, num_heads=num_heads, causal=causal, **kwargs)

    def relax(self, changes: str | dict[str, Any] | None = None, **kwargs: Any) -> AttentionSpec:
        """Return a new spec with some fields changed.

        Args:
            changes: ``"score=cosine,normalizer=sigmoid"`` (keys are field names or the aliases ``A1``..``A5``),
                a dict of the same, or ``None``/``""``/``"standard"`` for no change.
            **kwargs: more changes, as keyword arguments.

        Raises:
            ValueError: unknown field (naming the valid ones), unknown choice, or a malformed ``key=value`` item.
        """
        updates: dict[str, Any] = {}
        items: list[tuple[Any, Any]] = list(changes.items()) if isinstance(changes, dict) else parse_relax(changes)
        items += list(kwargs.items())
        for key, value in items:
            name = ALIASES.get(key, ALIASES.get(str(key).upper(), key))
            updates[name] = self._coerce(name, value)
        return dataclasses.replace(self, **updates)

    @classmethod
    def from_string(cls, text: str, **base: Any) -> AttentionSpec:
        """``AttentionSpec(**base).relax(text)``; ``text`` may be ``"standard"`` or a relax string."""
        return cls(**base).relax(text)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def _coerce(self, name: str, value: Any) -> Any:
        """``value`` (from a relax string or a keyword) as the type of the field ``name``; ``ValueError`` if it is
        not one."""
        names = self.field_names()
        if name not in names:
            raise ValueError(
                f"unknown field {name!r}; choose one of: {', '.join(names)} (or the aliases {', '.join(ALIASES)})"
            )
        current = getattr(self, name)
        if isinstance(current, bool):
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
            raise ValueError(f"{name} expects a boolean (true/false), got {value!r}")
        if isinstance(current, int):
            return _integer(name, value)
        if isinstance(current, float):
            try:
                return float(value)
            except (TypeError, ValueError):
                raise ValueError(f"{name} expects a number, got {value!r}") from None
        return str(value)

    # ------------------------------------------------------------------ inspection
    @property
    def head_dim(self) -> int:
        """Width of one head: ``dim // num_heads``."""
        return self.dim // self.num_heads

    @property
    def kv_heads(self) -> int:
        """Key/value heads: ``num_kv_heads``, or ``num_heads`` when it is 0."""
        return self.num_kv_heads or self.num_heads

    @property
    def kv_dim(self) -> int:
        """Width of the key and value projections: ``kv_heads * head_dim``."""
        return self.kv_heads * self.head_dim

    def assumptions(self) -> dict[str, bool]:
        """Which of the assumptions A0..A5 this spec satisfies (A0: no position information and no normalizer that
        reads the keys' order, as the audit's ``set_symmetry`` check, no transport through the keys in between and no
        selection of blocks of consecutive keys; A1
        fails with the per-head RMSNorm of ``diff_authors``; A3
        fails with an aggregator that maps the values before the sum, ``laser``'s exp; A4 fails with ``softcap`` and
        with a transport; A5 needs softmax
        *and* the 1/sqrt(d) scale)."""
        return {
            "A0": self.position == AXES["position"][0]
            and not self.kv_rope_dim
            and not NORMALIZERS.has(self.normalizer, "ordered")
            and not TRANSPORTS.has(self.transport, "ordered")
            and not SELECTS.has(self.select, "ordered"),
            "A1": self.aggregator == "identity" and not self.diff_head_norm,
            "A2": self.contribution == "proportional",
            "A3": self.value == "linear" and not AGGREGATORS.has(self.aggregator, "log_values"),
            "A4": self.score == "dot"
            and not self.softcap
            and self.transport == AXES["transport"][0]
            and self.select == AXES["select"][0],
            "A5": self.normalizer == "softmax" and self.scale == "inv_sqrt_d",
        }

    def relaxed_axes(self) -> dict[str, str]:
        """The axes that differ from the standard choice, e.g. ``{"score": "cosine"}``."""
        out = {name: getattr(self, name) for name, choices in AXES.items() if getattr(self, name) != choices[0]}
        if not NORMALIZERS.has(self.normalizer, "kernel"):
            out.pop("feature_map", None)
        return out

    @property
    def variant(self) -> str:
        """``"standard"`` or the relax string of the non-standard axes, e.g. ``"score=cosine,normalizer=sigmoid"``,
        followed by the economies in use (``num_kv_heads``, ``window``), e.g. ``"window=256"``, and the normalizer's
        options that differ from their defaults (``gumbel_tau``, ``gumbel_hard``), e.g. ``"gumbel_tau=0.5"``."""
        relaxed = {
            **self.relaxed_axes(),
            **{k: getattr(self, k) for k in ECONOMIES if getattr(self, k)},
            **({"softcap": f"{self.softcap:g}"} if self.softcap else {}),
            **changed_options(self),
            **self._convention_options(),
        }
        return ",".join(f"{k}={v}" for k, v in relaxed.items()) if relaxed else "standard"

    def _convention_options(self) -> dict[str, str]:
        """The convention fields away from their defaults that no configured normalizer reports
        (``talking_heads_residual``, ``diff_authors``), as relax values."""
        out = {}
        if self.score == "talking_heads" and self.talking_heads_residual:
            out["talking_heads_residual"] = "true"
        if self.diff_head_norm:
            out["diff_authors"] = "true"
        return out

    @property
    def diff_head_norm(self) -> bool:
        """The Differential Transformer's layer as its authors released it (``normalizer="diff"`` with
        ``diff_authors``): its per-head RMSNorm after the sum is a rho (A1)."""
        return self.normalizer == "diff" and self.diff_authors

    @property
    def is_standard(self) -> bool:
        """No axis relaxed, no soft-capping and no decoupled RoPE key (MLA's ``kv_rope_dim``)."""
        return not self.relaxed_axes() and not self.softcap and not self.kv_rope_dim

    def describe(self) -> str:
        """One readable line, e.g. ``standard attention: dim=64 heads=4 head_dim=16 causal; A0-A5 hold``."""
        held = self.assumptions()
        broken = [a for a, ok in held.items() if not ok]
        shape = f"dim={self.dim} heads={self.num_heads} head_dim={self.head_dim}"
        shape += (
            (f" kv_heads={self.kv_heads}" if self.kv_heads != self.num_heads else "")
            + (f" window={self.window}" if self.window else "")
            + (f" kv_latent={self.kv_latent}" if self.kv_latent else "")
            + (f" kv_rope_dim={self.kv_rope_dim}" if self.kv_rope_dim else "")
            + (" causal" if self.causal else "")
        )
        if self.is_standard:
            return f"standard attention: {shape}; A0-A5 hold"
        relaxed = {
            **self.relaxed_axes(),
            **({"softcap": f"{self.softcap:g}"} if self.softcap else {}),
            **changed_options(self),  # topk, gumbel_tau, ...: the relaxation is not known without them
            **self._convention_options(),
            **({"kv_rope_dim": self.kv_rope_dim} if self.kv_rope_dim else {}),  # MLA's decoupled RoPE key
        }
        axes = ", ".join(f"{k}={v}" for k, v in relaxed.items())
        status = f"relaxes {', '.join(broken)}" if broken else "A0-A5 hold"
        return f"attention ({axes}): {shape}; {status}"

    def to_dict(self) -> dict[str, Any]:
        """All fields as a JSON-ready dict (inverse: ``AttentionSpec(**d)``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AttentionSpec:
        """Build from :meth:`to_dict` output; unknown keys raise ``ValueError`` naming the valid ones."""
        names = cls.field_names()
        unknown = [k for k in data if k not in names]
        if unknown:
            raise ValueError(f"unknown field(s) {unknown}; choose from: {', '.join(names)}")
        return cls(**data)
