"""Adapters: turn an audit target into the map (q, k, v, *, causal) -> out, all (batch, seq, dim), plus metadata.

Built in: axiomformer ``Attention`` and ``AttentionSpec``, ``torch.nn.MultiheadAttention``, PyTorch's
``scaled_dot_product_attention`` and plain ``(q, k, v) -> out`` callables; target strings ``spec:<relax string>``,
``torch.nn.MultiheadAttention``, ``torch.nn.functional.scaled_dot_product_attention``, ``module:<import.path>:<attr>``.
Other libraries plug in with :func:`register_adapter` (e.g. a Hugging Face BERT self-attention adapter).

What is audited **(our choice)**: the attention *core*. Projections of the queries, keys and outputs are generic
learned linear maps that no assumption constrains, and they hide the scores' arguments (a joint rotation of the
inputs is not a rotation of W_q x and W_k x). So for ``Attention`` and ``nn.MultiheadAttention`` targets the adapter
works on a private float64 copy whose query/key/output projection *weights* are the identity: the audit's q, k are
the per-head queries and keys before their biases, heads concatenated along dim. The projection biases are kept, so
the audited map is the target's (a query bias b_q adds b_q.k_j to the scores: a per-key content term outside the
strictly bilinear class, which the A4 checks report); ``Adapter.notes`` says what each nonzero bias contributes. The
value map is kept: it is the object of A3. Position encodings, masks, score, normalizer, contribution and aggregator
are kept as they are.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from axiomformer.attention import Attention, KVCache
from axiomformer.engines.problem import causal_mask
from axiomformer.errors import UserInputError
from axiomformer.runtime import seeded
from axiomformer.spec import REGISTRIES, AttentionSpec, relax_with_requirements

DEFAULT_DIM, DEFAULT_HEADS, DEFAULT_SEED = 16, 2, 0


class Adapter:
    """A target seen as a map (q, k, v) -> out; subclass it to audit a new kind of attention.

    Attributes (metadata the checks read):
        name: what the report calls the target.
        dim: width of q, k, v and out; num_heads: heads, contiguous blocks of ``dim`` (1 if unknown).
        dtype: dtype the target computes in (inputs are cast to it).
        causal: the target always applies a causal mask; supports_causal: it can apply one on request.
        has_positions: the target injects token positions (True/False, or None when unknown).
        exposes_weights: :meth:`weights` returns the attention weights; otherwise they are probed through
            linearity in the values.
        dropout: dropout probability in training mode (randomness that training mode may legitimately have).
        precision: the dtype whose rounding bounds the target's error (None: ``dtype``); tolerances follow it.
        derivative_precision: the dtype whose rounding bounds its finite differences (None: ``dtype``); their step
            eps^(1/3) and tolerance follow it. Set with ``precision`` when the precision is probed
            (:func:`measured_precision`): a target that rounds inside at that precision everywhere.
        notes: what the adapter changed or kept and what it contributes (e.g. projection biases); printed in the
            report.
    """

    name: str = "target"
    dim: int = DEFAULT_DIM
    num_heads: int = 1
    dtype: torch.dtype = torch.float64
    causal: bool = False
    supports_causal: bool = False
    has_positions: bool | None = None
    exposes_weights: bool = False
    dropout: float = 0.0
    precision: torch.dtype | None = None
    derivative_precision: torch.dtype | None = None
    notes: tuple[str, ...] = ()

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, *, causal: bool = False) -> Tensor:
        """out (batch, q_len, dim) for q (batch, q_len, dim), k and v (batch, k_len, dim)."""
        raise NotImplementedError

    def weights(self, q: Tensor, k: Tensor, *, causal: bool = False) -> Tensor | None:
        """Attention weights (batch, heads, q_len, k_len) if the target exposes them, else None."""
        return None

    def with_head_dim(self, head_dim: int) -> Adapter | None:
        """The same kind of target with ``head_dim`` (same heads, learned scalars carried over), or None if fixed."""
        return None

    def decode(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor | None:
        """Causal outputs (batch, seq, dim) computed one token at a time through the target's own cache, or None
        when it has none (``--practice``'s ``cache_decode`` compares them with the full forward)."""
        return None

    def value_map(self) -> Callable[[Tensor], Tensor] | None:
        """The target's own value map v(x), (..., dim) -> (..., dim), when it has one (a module with a value
        projection); None for a plain function of (q, k, v), whose values arrive already mapped."""
        return None

    def contribution_map(self) -> Callable[[Tensor, Tensor], Tensor] | None:
        """The target's own contribution map, ``phi(weights (batch, heads, q_len, k_len), v (batch, heads, k_len,
        head_dim)) -> (batch, heads, q_len, head_dim)`` = sum_j phi(v_j, u_ij), when it exposes one; None when only
        (q, k, v) -> out is visible."""
        return None

    def set_training(self, flag: bool) -> bool:
        """Switch training mode; return False if the target has no such mode."""
        return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


def _seeded(seed: int, build: Callable[[], Any]) -> Any:
    with seeded(seed):
        return build()


@torch.no_grad()
def _identity_linear(linear: nn.Linear) -> None:
    """Identity weight; the bias is kept (see :func:`bias_notes`)."""
    linear.weight.copy_(torch.eye(linear.out_features, linear.in_features, dtype=linear.weight.dtype))


class AddBias(nn.Module):
    """x + bias (the identity when ``bias`` is None): a projection whose weight is the identity, bias kept."""

    def __init__(self, bias: Tensor | None):
        super().__init__()
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        return x if self.bias is None else x + self.bias


def _size(bias: Tensor | None) -> float:
    return 0.0 if bias is None else float(bias.detach().abs().max())


def bias_notes(
    q: Tensor | None, k: Tensor | None, v: Tensor | None = None, out: Tensor | None = None
) -> tuple[str, ...]:
    """What each nonzero projection bias kept by an adapter contributes to the audited map."""
    notes = []
    if _size(q) > 0:
        notes.append(
            f"query projection bias kept (max |b_q| = {_size(q):.3g}): it adds b_q.k_j to every score of key "
            "j, a per-key content term outside the strictly bilinear class (the A4 checks see it)"
        )
    if _size(k) > 0:
        notes.append(
            f"key projection bias kept (max |b_k| = {_size(k):.3g}): it adds q_i.b_k to every score of row "
            "i, a row constant that a shift-invariant normalizer removes"
        )
    if _size(v) > 0:
        notes.append(
            f"value projection bias kept (max |b_v| = {_size(v):.3g}): it adds (sum_j w_ij) b_v, a constant "
            "offset when the weights sum to one (the probes difference it away)"
        )
    if _size(out) > 0:
        notes.append(f"output projection bias kept (max |b_o| = {_size(out):.3g}): a constant offset of every output")
    return tuple(notes)


class AttentionAdapter(Adapter):
    """axiomformer :class:`Attention`: a float64 copy whose q_proj, k_proj, out_proj weights are the identity and
    whose projection biases are kept (module doc; :func:`bias_notes` says what they contribute).

    A causal mask on request is passed as a bool ``attn_mask`` (True = may attend). Weights come from
    ``need_weights=True``. ``precision`` is float32: the normalizers compute the weights in float32
    (:mod:`axiomformer.axes.normalizer`).
    """

    exposes_weights = True
    supports_causal = True
    precision = torch.float32

    def __init__(self, module: Attention, name: str | None = None, seed: int = DEFAULT_SEED):
        self.original = module
        self.seed = seed
        m = copy.deepcopy(module).to(torch.float64).eval()
        biases = [getattr(getattr(m, n), "bias", None) for n in ("q_proj", "k_proj", "out_proj")]
        for proj, b in zip(("q_proj", "k_proj", "out_proj"), biases):
            setattr(m, proj, AddBias(b))
        self.notes = bias_notes(biases[0], biases[1], getattr(m.v_proj, "bias", None), biases[2])
        if any(_size(b) > 0 for b in biases):
            self.notes += (
                "scale_entropy rebuilds the target at other head dims without these biases (their shape "
                "depends on head_dim)",
            )
        self.module, self.spec = m, m.spec
        self.name = name or f"Attention({m.spec.variant})"
        self.dim, self.num_heads, self.causal = m.spec.dim, m.spec.num_heads, m.spec.causal
        self.has_positions = m.spec.position != "none" or bool(m.spec.kv_rope_dim)  # MLA's decoupled RoPE key
        self.dropout = m.spec.dropout

    def _mask(self, q: Tensor, k: Tensor, causal: bool) -> Tensor | None:
        if not causal or self.causal:
            return None
        return causal_mask(q.shape[1], k.shape[1], k.shape[1] - q.shape[1], q.device)

    def __call__(self, q, k, v, *, causal=False):
        return self.module(q, k, v, attn_mask=self._mask(q, k, causal))

    def weights(self, q, k, *, causal=False):
        v = torch.zeros_like(k)
        return self.module(q, k, v, attn_mask=self._mask(q, k, causal), need_weights=True)[1]

    def decode(self, q, k, v):
        cache = KVCache()
        steps = [self.module(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], cache=cache) for t in range(q.shape[1])]
        return torch.cat(steps, dim=1)

    def with_head_dim(self, head_dim):
        spec = self.spec.relax(dim=head_dim * self.num_heads)
        fresh = _seeded(self.seed, lambda: Attention(spec))
        # Parameters whose shape does not depend on head_dim (a learned scale, a cosine temperature) are carried
        # over: a learned number stays what it is when head_dim changes; the 1/sqrt(d) rule follows head_dim.
        own = self.original.state_dict()
        state = dict(fresh.state_dict().items())
        state.update(
            {
                k: v
                for k, v in own.items()
                if k in state and state[k].shape == v.shape and v.dim() <= 1 and not k.endswith("bias")
            }
        )
        fresh.load_state_dict(state)
        return AttentionAdapter(fresh, self.name, self.seed)

    def set_training(self, flag):
        self.module.train(flag)
        return True

    def value_map(self):
        return self.module.v_proj

    def contribution_map(self):
        return self.module.contribution


class MultiheadAttentionAdapter(Adapter):
    """``torch.nn.MultiheadAttention``: float64 copy, q/k/out projection weights = identity, value projection and
    every bias (``in_proj_bias``, ``out_proj.bias``) kept (:func:`bias_notes` says what they contribute).

    Converts masks to MHA's inverted polarity (bool True = may NOT attend) and its sequence-first layout when
    ``batch_first=False``. Weights: ``need_weights=True, average_attn_weights=False``.
    """

    exposes_weights = True
    supports_causal = True
    has_positions = False

    def __init__(self, mha: nn.MultiheadAttention, name: str = "torch.nn.MultiheadAttention", seed: int = DEFAULT_SEED):
        if not mha._qkv_same_embed_dim or mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError(
                "the MultiheadAttention adapter needs kdim = vdim = embed_dim, no add_bias_kv and no add_zero_attn"
            )
        m = copy.deepcopy(mha).to(torch.float64).eval()
        e = m.embed_dim
        with torch.no_grad():
            m.in_proj_weight[: 2 * e].copy_(torch.eye(e, dtype=torch.float64).repeat(2, 1))
        _identity_linear(m.out_proj)
        b = m.in_proj_bias
        q_b, k_b, v_b = (None, None, None) if b is None else (b[:e], b[e : 2 * e], b[2 * e :])
        self.notes = bias_notes(q_b, k_b, v_b, m.out_proj.bias)
        if any(_size(x) > 0 for x in (b, m.out_proj.bias)):
            self.notes += ("scale_entropy rebuilds the target at other head dims with PyTorch's initial (zero) biases",)
        self.module, self.name, self.seed = m, name, seed
        self.dim, self.num_heads, self.dropout = e, m.num_heads, m.dropout

    def _run(self, q, k, v, causal, need_weights):
        mask = None
        if causal:
            mask = ~causal_mask(q.shape[1], k.shape[1], k.shape[1] - q.shape[1], q.device)  # True = blocked
        if not self.module.batch_first:
            q, k, v = (t.transpose(0, 1) for t in (q, k, v))
        out, w = self.module(q, k, v, attn_mask=mask, need_weights=need_weights, average_attn_weights=False)
        return (out if self.module.batch_first else out.transpose(0, 1)), w

    def __call__(self, q, k, v, *, causal=False):
        return self._run(q, k, v, causal, False)[0]

    def weights(self, q, k, *, causal=False):
        return self._run(q, k, torch.zeros_like(k), causal, True)[1]

    def with_head_dim(self, head_dim):
        e = head_dim * self.num_heads
        fresh = _seeded(
            self.seed, lambda: nn.MultiheadAttention(e, self.num_heads, dropout=self.dropout, batch_first=True)
        )
        return MultiheadAttentionAdapter(fresh, self.name, self.seed)

    def set_training(self, flag):
        self.module.train(flag)
        return True

    def value_map(self):
        e = self.module.embed_dim
        weight = self.module.in_proj_weight[2 * e :]
        bias = None if self.module.in_proj_bias is None else self.module.in_proj_bias[2 * e :]
        return lambda x: torch.nn.functional.linear(x, weight, bias)


LOW_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
"""Dtypes a float64 target may compute in, coarsest grid first (bfloat16 values are float16 and float32 values in
range, float16 values float32 values)."""


def output_grid(y: Tensor) -> torch.dtype | None:
    """The coarsest dtype whose values every element of the float64 output ``y`` is (None: none of
    :data:`LOW_DTYPES`): a target that computes in float16 and casts back returns float16 numbers, which random
    float64 numbers are not (the first 2^-52 of 2^-10 bits)."""
    if y.dtype != torch.float64 or not bool(torch.isfinite(y).all()) or not bool(y.abs().gt(0).any()):
        return None
    for dtype in LOW_DTYPES:
        if bool((y.to(dtype).to(torch.float64) == y).all()):
            return dtype
    return None


@torch.no_grad()
def measured_precision(fn: Callable[..., Tensor], dim: int) -> torch.dtype | None:
    """float32 (or float16) when a float64 map ``fn(q, k, v)`` on (batch, seq, ``dim``) tensors rounds inside, else
    None (float64).

    First the outputs' grid (:func:`output_grid`): a map that computes in float16 / bfloat16 and casts back returns
    numbers of that dtype, whose rounding step a small probe may never cross. Then
    the inputs move along a random direction by t = 1e-8 and 2e-8 (relative): a smooth float64 map gives a
    second difference f(x + 2t) - 2 f(x + t) + f(x) near t^2 |f''| ~ 1e-16 of |f|; a map that rounds to float32
    inside (a softmax in float32) jumps by its rounding, ~1e-7, wherever an input crosses a rounding boundary,
    which some of the inputs do at that step **(our choice of test)**."""
    g = torch.Generator().manual_seed(0)
    x, d = (torch.randn(3, 1, 8, dim, generator=g, dtype=torch.float64) for _ in range(2))
    try:
        ys = [fn(*(x + t * d * x.abs().amax())) for t in (0.0, 1e-8, 2e-8)]
    except (RuntimeError, TypeError, ValueError):
        return None
    if not all(isinstance(y, Tensor) and y.is_floating_point() for y in ys):
        return None
    on_grid = output_grid(ys[0])
    if on_grid is not None:
        return on_grid
    second = float((ys[2] - 2 * ys[1] + ys[0]).abs().max() / ys[0].abs().max().clamp_min(1e-300))
    return None if not second > 1e-11 else torch.float32 if second < 1e-4 else torch.float16


class FunctionAdapter(Adapter):
    """A plain callable ``fn(q, k, v) -> out`` on (batch, seq, dim) tensors, of any width.

    It supports a causal mask on request if it takes a ``causal`` or ``is_causal`` keyword. ``causal=True`` declares
    that it is always causal. ``num_heads`` says how its width splits into heads (1 = one head). If it fails on
    float64 inputs, float32 is used.
    """

    def __init__(
        self,
        fn: Callable[..., Tensor],
        name: str | None = None,
        *,
        num_heads: int = 1,
        causal: bool = False,
        dim: int = DEFAULT_DIM,
        has_positions: bool | None = None,
    ):
        self.fn = fn
        self.name = name or getattr(fn, "__qualname__", None) or type(fn).__name__
        self.num_heads, self.causal, self.dim, self.has_positions = num_heads, causal, dim, has_positions
        self._causal_kw = None
        try:
            params = inspect.signature(fn).parameters
            self._causal_kw = next((p for p in ("causal", "is_causal") if p in params), None)
        except (TypeError, ValueError):
            pass
        self.supports_causal = self._causal_kw is not None
        self.dtype = self._working_dtype()

    def _working_dtype(self) -> torch.dtype:
        failure: Exception | None = None
        for dtype in (torch.float64, torch.float32):
            x = torch.zeros(1, 2, self.dim, dtype=dtype)
            try:
                with torch.no_grad():
                    out = self.fn(x, x, x)
            except (RuntimeError, TypeError, ValueError) as err:
                failure = err
                continue
            if isinstance(out, Tensor) and out.shape[:2] == (1, 2):
                if out.is_floating_point() and torch.finfo(out.dtype).eps > torch.finfo(dtype).eps:
                    self.precision = out.dtype  # it computes in a lower precision than its inputs
                elif dtype == torch.float64:
                    self.precision = self.derivative_precision = measured_precision(self.fn, self.dim)
                return dtype
            failure = TypeError(
                f"it returned {type(out).__name__}{tuple(out.shape) if isinstance(out, Tensor) else ''}"
            )
        raise UserInputError(
            f"cannot audit {self.name!r}: expected a callable (q, k, v) -> out on (batch, seq, "
            f"dim={self.dim}) tensors; calling it failed: {type(failure).__name__}: {failure}"
        )

    def __call__(self, q, k, v, *, causal=False):
        if causal and self._causal_kw is not None:
            return self.fn(q, k, v, **{self._causal_kw: True})
        return self.fn(q, k, v)

    def decode(self, q, k, v):
        """``fn.decode(q, k, v)`` when the function has one (its own token-by-token path), else None."""
        step = getattr(self.fn, "decode", None)
        return step(q, k, v) if callable(step) else None

    def with_head_dim(self, head_dim):
        other = copy.copy(self)
        other.dim = head_dim * self.num_heads
        return other


def sdpa_function(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """``torch.nn.functional.scaled_dot_product_attention`` on (batch, seq, dim) tensors, one head."""
    return torch.nn.functional.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None], is_causal=causal)[:, 0]


# ---------------------------------------------------------------------------------------------------- registry
_ADAPTERS: list[tuple[Any, Callable[..., Adapter]]] = []


def register_adapter(
    match: Any, factory: Callable[..., Adapter] | None = None, *, first: bool = True
) -> Callable[..., Any]:
    """Teach :func:`make_adapter` a new kind of target.

    Args:
        match: a type (``isinstance``), a string ending in ``":"`` (a prefix of target strings, e.g. ``"hf:"``), any
            other string (an exact target string), or a predicate ``obj -> bool``.
        factory: ``factory(target, **options) -> Adapter``; options are ``dim``, ``num_heads``, ``seed``
            (accept ``**options`` and ignore what you do not need). Without it, works as a decorator.
        first: try this adapter before the ones already registered (default), so a plug-in can override.
    """

    def add(f: Callable[..., Adapter]) -> Callable[..., Adapter]:
        entry = (match, f)
        _ADAPTERS.insert(0, entry) if first else _ADAPTERS.append(entry)
        return f

    return add(factory) if factory is not None else add


def _matches(match: Any, target: Any) -> bool:
    if isinstance(match, type):
        return isinstance(target, match)
    if isinstance(match, str):
        return isinstance(target, str) and (target.startswith(match) if match.endswith(":") else target == match)
    return bool(match(target))


COMPILED_NOTE = (
    "a torch.compile'd target: audited through its original (`_orig_mod` / the original callable, the same "
    "parameters), with its own adapter; the audit's many shapes would otherwise pass dynamo's recompile limit and "
    "run uncompiled unnoticed; `--practice`'s compiled_eager compares a compiled run with it"
)


def compiled_original(target: Any) -> Any:
    """The module or callable a ``torch.compile`` wrapper wraps (``OptimizedModule._orig_mod``, a compiled
    function's ``_torchdynamo_orig_callable``), or None for anything else."""
    if isinstance(target, nn.Module) and isinstance(getattr(target, "_orig_mod", None), nn.Module):
        return target._orig_mod
    original = getattr(target, "_torchdynamo_orig_callable", None)
    return original if callable(original) and original is not target else None


def make_adapter(target: Any, **options: Any) -> Adapter:
    """The adapter for ``target`` (first registered match wins).

    Raises:
        ValueError: a target string or object no adapter knows, naming the accepted forms.
    """
    if isinstance(target, Adapter):
        return target
    original = compiled_original(target)
    if original is not None:
        adapter = make_adapter(original, **options)
        adapter.notes = (*adapter.notes, COMPILED_NOTE)
        return adapter
    for match, factory in _ADAPTERS:
        if _matches(match, target):
            return factory(target, **options)
    if isinstance(target, str) and target.startswith("hf:"):
        raise ValueError(
            f"cannot audit {target!r} yet: hf: targets are registered by importing "
            "axiomformer.surgery.audit_adapter (the optional 'hf' extra); the command line does that"
        )
    raise ValueError(
        f"cannot audit {target!r}; give spec:standard, spec:<relax string>, torch.nn.MultiheadAttention, "
        "torch.nn.functional.scaled_dot_product_attention, module:<import.path>:<attr>, an Attention, "
        "an AttentionSpec, an nn.MultiheadAttention or a callable (q, k, v) -> out"
    )


PARTS = {"score": "score_fn"}
"""The ``Attention`` attribute holding each axis's module, where the attribute is not the axis's name."""


def _leave_standard(module: Attention, seed: int) -> Attention:
    """Move the parameters of choices that start exactly at the standard map (trait ``starts_standard``, e.g.
    talking heads' identity mixing) off that point, seeded: a ``spec:`` audit audits the relaxation **(our choice)**."""
    generator = torch.Generator().manual_seed(seed + 1)
    for axis, registry in REGISTRIES.items():
        choice = registry[getattr(module.spec, axis)]
        if "starts_standard" in registry.traits and choice.has("starts_standard"):
            choice.extra["move"](getattr(module, PARTS.get(axis, axis)), generator)
    return module


def _spec_adapter(spec: AttentionSpec, *, seed: int = DEFAULT_SEED, **_: Any) -> Adapter:
    module = _leave_standard(_seeded(seed, lambda: Attention(spec)), seed)
    return AttentionAdapter(module, f"spec:{spec.variant}", seed)


def _spec_string(target: str, *, dim: int = DEFAULT_DIM, num_heads: int = DEFAULT_HEADS, **options: Any) -> Adapter:
    text = target[len("spec:") :]
    # A choice defined only under a causal mask (stick_breaking, forget) is audited with one unless causal is given;
    # one defined only without (sinkhorn) without one; a transport with its paper's normalizer (required_fields).
    spec = relax_with_requirements(AttentionSpec.standard(dim, num_heads), text)
    adapter = _spec_adapter(spec, **options)
    adapter.name = target
    return adapter


def _mha_string(
    target: str, *, dim: int = DEFAULT_DIM, num_heads: int = DEFAULT_HEADS, seed: int = DEFAULT_SEED, **_: Any
) -> Adapter:
    mha = _seeded(seed, lambda: nn.MultiheadAttention(dim, num_heads, batch_first=True))
    return MultiheadAttentionAdapter(mha, target, seed)


def _sdpa_string(target: str, *, dim: int = DEFAULT_DIM, **_: Any) -> Adapter:
    return FunctionAdapter(sdpa_function, target, dim=dim, has_positions=False)


def _import_here_too(path: str) -> Any:
    """``importlib.import_module(path)``, also from the current folder when the module is not on ``sys.path``, as
    ``python -m`` finds it (``axiomformer audit module:myattn:Attn`` run beside myattn.py). The folder is on
    ``sys.path`` only during this import (the host's path is left as it was).

    Raises:
        ImportError: not found on sys.path nor in the current folder (said so), or the module's own import error.
    """
    top = path.split(".")[0]
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as err:
        if err.name != top:  # the module was found; something it imports was not
            raise
    here = os.getcwd()
    if here in sys.path or "" in sys.path:
        raise ModuleNotFoundError(f"No module named {top!r} on sys.path or in the current folder {here}")
    sys.path.insert(0, here)
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as err:
        if err.name != top:
            raise
        raise ModuleNotFoundError(
            f"No module named {top!r} on sys.path or in the current folder {here} (set PYTHONPATH to the folder "
            "that holds it)"
        ) from None
    finally:
        sys.path.remove(here)


def _module_string(target: str, **options: Any) -> Adapter:
    try:
        _, path, attr = target.split(":", 2)
        obj = getattr(_import_here_too(path), attr)
    except (ValueError, ImportError, AttributeError) as err:
        raise ValueError(f"cannot load {target!r} (expected module:<import.path>:<attr>): {err}") from None
    try:
        adapter = make_adapter(obj, **options)
    except UserInputError as err:
        raise UserInputError(f"{target}: {err}") from None
    adapter.name = target
    return adapter


def _function(fn: Callable[..., Tensor], *, dim: int = DEFAULT_DIM, num_heads: int | None = None, **_: Any) -> Adapter:
    if fn is torch.nn.functional.scaled_dot_product_attention:
        return _sdpa_string("torch.nn.functional.scaled_dot_product_attention", dim=dim)
    return FunctionAdapter(fn, num_heads=num_heads or 1, dim=dim)


def _attention(module: Attention, *, seed: int = DEFAULT_SEED, **_: Any) -> Adapter:
    return AttentionAdapter(module, seed=seed)


def _mha(mha: nn.MultiheadAttention, *, seed: int = DEFAULT_SEED, **_: Any) -> Adapter:
    return MultiheadAttentionAdapter(mha, seed=seed)


register_adapter(callable, _function)
register_adapter(nn.MultiheadAttention, _mha)
register_adapter(Attention, _attention)
register_adapter(AttentionSpec, _spec_adapter)
register_adapter("module:", _module_string)
register_adapter("torch.nn.functional.scaled_dot_product_attention", _sdpa_string)
register_adapter("torch.nn.MultiheadAttention", _mha_string)
register_adapter("spec:", _spec_string)
