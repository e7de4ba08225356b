"""Axis A5 — the normalizer turning scaled scores into attention weights, and its temperature.

Source: Somani, assumption A5 (relevance is relative and differentiable): u_ij = softmax_j(s_ij / sqrt(d_k)); the
1/sqrt(d_k) keeps the logits O(1) because Var(q.k) = d_k for unit-variance entries.

Every normalizer maps scores (batch, heads, q_len, k_len) and an optional boolean mask (True = may attend,
broadcastable to the scores) to weights of the same shape, computed in max(scores dtype, float32) (float16 is upcast,
float64 kept: ``axiomformer.precision``). Masked keys get weight 0; a query row
with no visible key gets all-zero weights with finite gradients.

Choices (n_i is the number of keys visible to query i, so appending masked keys changes nothing); each is one entry
of :data:`NORMALIZERS` below with its formula, source, implementation and traits:
    softmax         u = exp(s) / sum_j exp(s_j)                       (A5 holds with scale inv_sqrt_d)
    sigmoid         u = sigmoid(s - log n_i)                          (Ramapuram et al. 2024)
    relu            u = relu(s) / n_i                                 (Wortsman et al. 2023)
    sparsemax       u = relu(s - tau)                                 (Martins & Astudillo 2016, entmax package)
    entmax15        u = relu(s / 2 - tau)^2                           (Peters et al. 2019, entmax package)
    gumbel_softmax  u = softmax((s + g) / tau), g ~ Gumbel(0, 1), in training (Jang et al. 2017, eq. 1); with
                    ``gumbel_hard`` the forward is the one-hot argmax_j (s + g) and the backward the soft sample's
                    (straight-through, Jang et al. 2017, sec. 2.2). Outside training the noise-free limit:
                    softmax(s / tau), or one-hot argmax_j s when hard (the mode of the Gumbel-max sample) **(our
                    choice)**. tau and hard are the spec fields ``gumbel_tau``, ``gumbel_hard`` (trait ``configured``).
    linear          u = K_ij / sum_j K_ij, K_ij = phi(s q_i).phi(k_j) (Katharopoulos et al. 2020, eq. 6-7; a
                    temperature s enters through the query, see ``axes/scale.py``)
    entmax_alpha    u = alpha-entmax(s), alpha_h in (1, 32] learned per head (Peters et al. 2019; Correia et al. 2019)
    softmax1        u = exp(s) / (1 + sum_j exp(s_j)), a zero-logit sink (Miller 2023)
    diff            u = softmax(s1) - lambda_h softmax(s2), s1, s2 the scaled scores of the first and second halves
                    of each head's q and k, lambda_h learned per head from 0.2 (Ye et al. 2024, arXiv:2410.05258;
                    trait ``halves``; needs an even head_dim and a score without head_dim-sized parameters). The
                    default is eq. 1 alone; ``diff_authors=true`` is the authors' released layer (eq. 1-3 as
                    microsoft/unilm's ``multihead_diffattn.py`` computes them): one lambda per layer, exp(lq1 . lk1)
                    - exp(lq2 . lk2) + lambda_init with lambda_init = 0.8 - 0.6 exp(-0.3 layer_index) (the layer's
                    0-based depth, passed by the model: ``Attention(spec, layer_index=...)``), and after the sum the
                    per-head RMSNorm times (1 - lambda_init) (``axes/aggregator.py``, an A1 change) and, with
                    ``position=rope``, the half-head RoPE (``axes/position.py``)
    stick_breaking  u_ij = beta_ij prod_{visible l, j < l <= i} (1 - beta_il), beta = sigmoid(s) (Tan et al. 2024,
                    arXiv:2410.17980); causal only. The default is the paper's eq. 3 (the diagonal included, no
                    remainder); the authors' released layer is ``stick_attend_current=false`` (the diagonal left
                    out) with ``stick_remainder=true`` (o_i += (1 - sum_j u_ij) v_i) (trait ``configured``)
    softmax_sink    u = exp(s) / (exp(b_h) + sum_j exp(s_j)), b_h learned per head from 0 (gpt-oss's sinks;
                    softmax1 is b_h = 0)
    softpick        u = relu(exp(s) - 1) / (sum_j |exp(s_j) - 1| + 1e-6), computed with numerator and denominator
                    times exp(-max(0, max_j s_j)) (Zuhri et al. 2025, arXiv:2504.20966); the default is the paper's
                    eq. 2, ``softpick_shifted_eps=true`` the authors' released function (1e-8 added after the shift
                    by max_j s_j) (trait ``configured``)
    topk            softmax over the row's ``topk`` largest visible scores, 0 elsewhere (Zhao et al. 2019,
                    arXiv:1912.11637); ``topk`` is a spec field (trait ``configured``); every key tied with the k-th
                    largest score is kept, as in the paper's code (a row keeps k keys or more), so that no engine
                    breaks an exact tie its own way. Scores equal only in exact arithmetic are not ties: identical
                    keys give dot products that the matrix product rounds column by column, and engines whose
                    products round differently may keep different ones of them (top-k jumps there)
    sinkhorn        u = the Sinkhorn iterates of exp(s) over the visible entries: rows, columns, rows normalized
                    in turn (SINKHORN_NORMALIZATIONS = 3), so rows sum to 1 and columns about to q_len / k_len
                    (Sander et al. 2022, arXiv:2110.11773, sec. 3); a query's weights depend on the other queries'
                    scores (trait ``columns``); not causal (trait ``noncausal``). The default is the paper's;
                    ``sinkhorn_authors=true`` the authors' released layer: marginals 1 / q_len, 1 / k_len and the
                    plan times k_len (rows sum to k_len / q_len: 1 only for square problems), the column potential
                    detached (trait ``configured``)
    power           u = s^p / sum_j s_j^p, p = POWER_P = 2 (even: the weights are >= 0); a row whose visible scores
                    are all 0 gets uniform weights 1 / n_i **(our convention)** (Buckman, Gelada & Zhang 2024,
                    "Symmetric Power Transformers", Manifest AI, the power attention A = (q.k)^p / sum (q.k)^p)
    none            u = s, no normalization (Katharopoulos et al. 2020, eq. 4 without its denominator; the
                    delta-rule family and Mamba-2's SSD, which the transport axis pairs with it)
Scale choices (A5's temperature, ``axes/scale.py``: SCALES): inv_sqrt_d (1/sqrt(d_k); 1 for the kernel normalizer,
whose kernel is no scaled score: Katharopoulos et al. 2020 apply none, and the taylor map carries its own 1/sqrt(d)),
none (1), learned (per head), log_n (c_h log n_i / sqrt(d_k), Scalable-Softmax). An explicit or learned scale s is
honoured by every normalizer; the kernel's enters through the query, phi(s q).phi(k), so f(q, scale=s) == f(s q,
scale=1).
Feature maps of the linear normalizer (:data:`FEATURE_MAPS`): elu (elu(x) + 1), relu, identity, taylor
([1, y, vec(y y^T) / sqrt 2], y = x / d^(1/4)).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from entmax import entmax15, sparsemax
from torch import Tensor, nn

from axiomformer.axes import traceable
from axiomformer.axes.registry import Choice, Registry
from axiomformer.precision import upcast

if TYPE_CHECKING:
    from axiomformer.spec import AttentionSpec

DIFF_LAMBDA_INIT = 0.2
"""lambda_h of ``normalizer=diff`` at initialisation: the paper's lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1)) at layer
l = 1 (Ye et al. 2024, sec. 2.1), since the spec does not know its depth **(our choice)**. With ``diff_authors``
lambda_init follows the layer's depth (:func:`diff_lambda_init`)."""

DIFF_LAMBDA_STD = 0.1
"""Standard deviation of the normal initialisation of the authors' lambda_q1, lambda_k1, lambda_q2, lambda_k2
(``diff_authors``; microsoft/unilm Diff-Transformer, ``multihead_diffattn.py``: ``normal_(mean=0, std=0.1)``)."""


def diff_lambda_init(layer_index: int) -> float:
    """lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1)) of the Differential Transformer (Ye et al. 2024, sec. 2.1) for the
    0-based ``layer_index`` = l - 1 (the authors' ``lambda_init_fn(depth)``, ``depth`` the layer's index)."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer_index)


SOFTPICK_EXPM1_BELOW = 1.0
"""Rows of softpick whose largest logit is below this compute e^(s) - 1 with expm1 (``softpick_terms``)."""

SOFTPICK_EPS = 1e-6
"""The epsilon in softpick's denominator (Zuhri et al. 2025, eq. 2)."""

SOFTPICK_SHIFTED_EPS = 1e-8
"""The epsilon of the authors' released softpick (spec field ``softpick_shifted_eps``): ``eps=1e-8`` added to the
denominator after the shift by m = max_j s_j (github.com/zaydzuhri/softpick-attention, ``softpick``)."""

TOPK_DEFAULT = 8
"""Default of the spec field ``topk`` (keys kept per row by ``normalizer=topk``)."""

SINKHORN_NORMALIZATIONS = 3
"""Normalizations of ``normalizer=sinkhorn``: row, column, row (the last a row's, so rows sum to 1). The authors'
attention module runs ``max_iter=3`` of them, starting with the rows (Sander et al. 2022, code at
github.com/michaelsdr/sinkformers, ``vit_pytorch/vit.py`` and ``sinkhorn.py``)."""

POWER_P = 2
"""The even power p of ``normalizer=power`` (Buckman, Gelada & Zhang 2024 train p = 2 to 8; 2 is the smallest even
one, **our choice** of default)."""

LINEAR_EPS = 1e-6
"""Added to the row sum of the linear-attention kernel (Katharopoulos et al. 2020 use the same 1e-6)."""

NORMALIZER_TRAITS = {
    "row": "impl(s, training) -> weights, from a whole row of scores whose blocked entries are -inf",
    "elementwise": "impl(s, n) -> weights, u_ij from s_ij and the row's count n_i of visible keys alone",
    "kernel": "impl(kernel) -> weights; the scores are the kernel phi(q).phi(k) of the feature map (linear attention)",
    "softmax": "equals softmax(s) (in every mode)",
    "softmax_in_eval": "equals softmax(s) outside training (for a ``configured`` choice: at its default options)",
    "sink": "equals softmax over the row plus one extra logit 0 whose value is 0 (softmax with +1 in the denominator)",
    "random": "draws random numbers in training",
    "sorting": "its implementation sorts each row (several row-sized temporaries)",
    "configured": "reads spec fields: extra['options'](spec) gives the keyword arguments of impl, extra['defaults'] "
    "their values at which every other trait holds; elsewhere only engines that call impl with "
    "them (reference, chunked) may run it",
    "parametric": "has learned parameters: extra['parameters'](spec) creates them, extra['params'](module) gives the "
    "keyword arguments of impl",
    "halves": "scores the two halves of each head's query and key apart: impl receives them stacked, (2, batch, "
    "heads, q_len, k_len), and the score width d_k is head_dim / 2",
    "causal": "defined only under a causal mask: the spec refuses causal=False",
    "ordered": "the weights depend on the order of the keys: A0 is relaxed too (the audit's set_symmetry fails)",
    "closed_vjp": "extra['vjp'](z, u, g, delta, **options) -> dL/dz in closed form, from the logits z (blocked keys "
    "-inf), u = impl(z), g = dL/du and delta = sum_j u_j g_j (the rowwise engine's backward)",
    "closed_grad": "an ``elementwise`` choice whose du/ds is a function of u and n: extra['impl_'](s, n) is impl "
    "computed in place in s, extra['grad_'](u, n, g) -> g * du/ds in place in g (it may overwrite u) -- the "
    "elementwise engine's forward and backward; without the trait it calls impl and differentiates it per chunk",
    "entmax": "equals alpha-entmax(s) = relu((alpha - 1) s - tau)^(1 / (alpha - 1)), rows summing to 1, for the fixed "
    "alpha = extra['alpha'] > 1 (Peters et al. 2019, eq. 8; the sparse engine computes the alphas of its ``ALPHAS``)",
    "columns": "a query's weights depend on the other queries' scores (column sums): impl receives the whole (q_len x "
    "k_len) matrix, a row without a visible key all -inf; engines that split the queries into chunks decline it",
    "noncausal": "defined only without a causal mask: the spec refuses causal=True",
    "signed": "weights may be negative",
    "identity": "u = s: the weights are the scaled scores themselves, no normalization (a state recurrence can run "
    "it: the transport axis's ``state`` choices)",
    "sign_blind": "a score's weight grows with its magnitude whatever its sign (an additive penalty becomes weight): "
    "the spec refuses additive position biases, attend a float bias or mask",
}


def _softmax(s: Tensor, training: bool, **params: Tensor) -> Tensor:
    return torch.softmax(s, dim=-1)


def _gumbel_softmax(s: Tensor, training: bool, tau: float = 1.0, hard: bool = False, **params: Tensor) -> Tensor:
    if training:
        return F.gumbel_softmax(s, tau=tau, hard=hard, dim=-1)
    if hard:
        # The noise-free limit of the hard sample: the one-hot argmax of the scores (our choice).
        return torch.zeros_like(s).scatter_(-1, s.argmax(dim=-1, keepdim=True), 1.0)
    return torch.softmax(s / tau, dim=-1)


def _gumbel_options(spec: AttentionSpec) -> dict:
    return {"tau": float(spec.gumbel_tau), "hard": bool(spec.gumbel_hard)}


def _sparsemax(s: Tensor, training: bool, **params: Tensor) -> Tensor:
    if torch.compiler.is_compiling():  # the package's autograd.Function breaks the graph
        return traceable.sparsemax(s)
    return sparsemax(s, dim=-1)


def _entmax15(s: Tensor, training: bool, **params: Tensor) -> Tensor:
    if torch.compiler.is_compiling():
        return traceable.entmax15(s)
    return entmax15(s, dim=-1)


def _softmax1(s: Tensor, training: bool, **params: Tensor) -> Tensor:
    # A softmax over the row and one extra logit 0 whose column is dropped: exp(s_j) / (1 + sum_k exp(s_k)), stable.
    return torch.softmax(torch.cat([s, torch.zeros_like(s[..., :1])], dim=-1), dim=-1)[..., :-1]


ENTMAX_BISECTIONS = 20
"""Bisection steps of :func:`entmax_alpha` before its Newton steps (the bracket is log(k_len) wide)."""

ENTMAX_RECENTRE = 0.5
"""From this alpha - 1 on, :func:`entmax_alpha` uses the recentred float64 form (see ``_entmax_recentred``); below it
the m form, accurate as alpha -> 1 (where the recentred one divides by alpha - 1)."""

ENTMAX_POLISH = 64
"""Bisection steps on the recentred threshold tau, halving the count of doubles in its bracket (``_float_midpoint``):
64 reach adjacent doubles. tau lies near 0, where float64 resolves far below the u_i = p_i^beta that matter."""

ENTMAX_TINY = 1e-300
"""u_i at or below this counts as outside the support (its weight u^(1 / beta) is below 1e-300^(1 / beta))."""

_LOG1P_SERIES = 0.1
"""Below this |t|, log1p(t) / t is summed as its series (16 terms: error < 1e-17) instead of divided."""


def _log1p_ratio(t: Tensor) -> Tensor:
    """log1p(t) / t for t > -1 (1 at t = 0), accurate, with an accurate derivative, also as t -> 0 (the quotient's
    derivative, (t / (1 + t) - log1p(t)) / t^2, cancels there)."""
    small = t.abs() < _LOG1P_SERIES
    ts = torch.where(small, t, 0.0)
    series = torch.zeros_like(ts)
    for k in range(15, -1, -1):  # Horner: sum_k (-t)^k / (k + 1)
        series = series * -ts + 1.0 / (k + 1)
    tb = torch.where(small, 1.0, t)
    return torch.where(small, series, torch.log1p(tb) / tb)


def _entmax_terms(x: Tensor, m: Tensor, beta: Tensor, differentiable: bool = True) -> Tensor:
    """p_i = [1 + beta (x_i - m)]_+^(1 / beta) = exp(y log1p(beta y) / (beta y)), y = x_i - m: the alpha-entmax
    weights for the threshold m (beta = alpha - 1 >= 0; beta = 0 is exp(y), the softmax). Without
    ``differentiable`` the value alone (log1p(beta y) / beta is accurate, only its beta-derivative is not)."""
    finite = x > float("-inf")
    y = torch.where(finite, x, m) - m  # blocked keys: y = 0 here, so no 0 * inf reaches a gradient
    t = beta * y
    inside = finite & (t > -1.0)
    ys, ts = torch.where(inside, y, 0.0), torch.where(inside, t, 0.0)
    if differentiable:
        exponent = ys * _log1p_ratio(ts)
    else:
        exponent = torch.where(beta > 0, torch.log1p(ts) / torch.where(beta > 0, beta, 1.0), ys)
    return torch.where(inside, torch.exp(exponent), 0.0)


def entmax_alpha(x: Tensor, alpha: Tensor | float, alpha_minus_one: Tensor | None = None) -> Tensor:
    """alpha-entmax over the last dimension, accurate for every alpha >= 1 (Peters et al. 2019, eq. 8).

    p = [(alpha - 1) x - tau]_+^(1 / (alpha - 1)), written with beta = alpha - 1 and tau = beta m - 1 as
    p_i = [1 + beta (x_i - m)]_+^(1 / beta) = exp(log1p(beta y_i) / beta), y_i = x_i - m: this form has no
    1 / beta that cancels, so it is accurate as alpha -> 1 (where it is the softmax, also at alpha = 1 exactly), and
    its autograd derivative in alpha is too (the entmax package's backward divides by (alpha - 1)^2 and loses it in
    float32 near 1). m solves sum_i p_i = 1 in [max x, max x + log k_len]: bisection, then Newton steps; the last step
    carries the implicit-function gradient (dm = dS / sum_i dp_i/dm) **(our implementation; the entmax package's
    ``entmax_bisect`` is its reference in the tests)**.

    Args:
        x: (..., k_len) float scores; -inf entries get weight 0 (each row needs one finite entry).
        alpha: >= 1, a float or a tensor broadcastable to (..., 1) (e.g. (1, heads, 1, 1)). Weights below
            1e-300^(1 / (alpha - 1)) (``ENTMAX_TINY`` for u = p^(alpha - 1) in float64) come out 0: below 2.2e-10
            up to ``ENTMAX_ALPHA_MAX`` = 32, the bound of the learned alpha, but 0.1 at alpha = 300.
        alpha_minus_one: alpha - 1 itself (>= 0), read instead of ``alpha`` when given: 1 + a tiny beta rounds to 1
            (below 1e-16 even in float64), beta itself does not.
    """
    if alpha_minus_one is not None:
        beta = alpha_minus_one.to(x.dtype)
    elif isinstance(alpha, Tensor):
        beta = (alpha - 1.0).to(x.dtype)
    else:
        beta = torch.tensor(alpha - 1.0, dtype=x.dtype)
    beta = beta.to(x.device)
    if isinstance(alpha, Tensor) or alpha_minus_one is not None or alpha - 1.0 < ENTMAX_RECENTRE:
        near_one = _entmax_near_one(x, beta)
    if not isinstance(alpha, Tensor) and alpha_minus_one is None:
        if alpha - 1.0 < ENTMAX_RECENTRE:
            return near_one
        return _entmax_recentred(x, beta).to(x.dtype)
    # alpha per head, a tensor: both forms, each where it is accurate (a branch on its value would break a graph)
    # (the recentred form gets beta = 1 where it is not used: its 1 / beta must not put a NaN in the gradient)
    small = beta < ENTMAX_RECENTRE
    recentred = _entmax_recentred(x, torch.where(small, torch.ones_like(beta), beta)).to(x.dtype)
    return torch.where(small, near_one, recentred)


def _threshold(x: Tensor, beta: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The threshold m of :func:`_entmax_terms` (sum_i p_i(m) = 1) and the bracket [lo, hi] it lies in, no grad."""
    with torch.no_grad():
        top = x.amax(dim=-1, keepdim=True)
        # S(lo) >= 1 >= S(hi) for every beta >= 0, with n the row's finite entries (a tensor, not the length: under
        # torch.compile a Python number from the shape would compile one graph per length).
        finite = (x > float("-inf")).sum(-1, keepdim=True).clamp_min(1).to(x.dtype)
        lo, hi = top, top + finite.log()
        for _ in range(ENTMAX_BISECTIONS):
            mid = (lo + hi) / 2
            above = _entmax_terms(x, mid, beta, False).sum(-1, keepdim=True) >= 1.0
            lo, hi = torch.where(above, mid, lo), torch.where(above, hi, mid)
        m = (lo + hi) / 2
        for _ in range(2):
            m = torch.minimum(torch.maximum(m + _newton(x, m, beta, False), lo), hi)
    return m, lo, hi


def _entmax_near_one(x: Tensor, beta: Tensor) -> Tensor:
    """alpha-entmax in the m form (accurate as beta -> 0, with its beta-derivative), in x's dtype."""
    m, _, _ = _threshold(x.detach(), beta.detach())
    m = m + _newton(x, m, beta)  # carries dm/dx and dm/dbeta
    p = _entmax_terms(x, m, beta)
    return p / p.sum(-1, keepdim=True)


def _entmax_recentred(x: Tensor, beta: Tensor) -> Tensor:
    """alpha-entmax for beta = alpha - 1 >= ENTMAX_RECENTRE, in float64, with u_i = beta (x_i - c) - tau.

    A weight p = u^(1 / beta) needs u to the precision p^beta: at alpha = 10 a weight of 0.02 has u = 5e-16, and
    1 + beta (x_i - m) (the m form) cancels to an absolute error of eps there, so small weights came out wrong by
    up to 0.43 and p was not monotone in x (deep-spin/entmax#36). Shifting the scores by c, where the
    m form's support ends (its smallest score), puts the support's edge at 0: x_i - c is exact near it
    (Sterbenz), tau is near 0,
    and bisection on tau gives every u_i to a relative precision, so each weight to about eps / p_i. The last
    step carries the implicit-function gradient (dtau = dS / sum_i dp_i/dtau), as in the m form **(our
    implementation)**."""
    x64, b64 = x.double(), beta.double()
    _, lo, hi = _threshold(x64.detach(), b64.detach())
    with torch.no_grad():  # c: the smallest score in the support at lo (the widest the bracket allows)
        support = _entmax_terms(x64, lo, b64, False) > 0
        c = torch.where(support, x64, float("inf")).amin(-1, keepdim=True)
    shifted = x64 - c  # the shift cancels in exact arithmetic (entmax(x - c) = entmax(x)): c carries no gradient
    tau_lo, tau_hi = b64.detach() * (lo - c) - 1.0, b64.detach() * (hi - c) - 1.0
    with torch.no_grad():  # bisection: Newton crawls on S's concave side, where the edge makes it steep
        for _ in range(ENTMAX_POLISH):
            mid = _float_midpoint(tau_lo, tau_hi)
            above = _tau_terms(shifted.detach(), mid, b64.detach()).sum(-1, keepdim=True) >= 1.0
            tau_lo, tau_hi = torch.where(above, mid, tau_lo), torch.where(above, tau_hi, mid)
        tau = (tau_lo + tau_hi) / 2
    # the score gradient from _Recentred's closed form, the alpha gradient from autograd through the implicit
    # Newton step on the shifted scores held fixed (a plain graph: no torch.autograd.grad that would break
    # torch.compile's graph); the second term is zero in value
    through_beta = _recentred_weights(shifted.detach(), b64, tau)
    return _Recentred.apply(shifted, b64.detach(), tau) + (through_beta - through_beta.detach())


def _recentred_weights(shifted: Tensor, beta: Tensor, tau: Tensor) -> Tensor:
    p = _tau_terms(shifted, tau + _tau_step(shifted, tau, beta), beta)
    return p / p.sum(-1, keepdim=True)


class _Recentred(torch.autograd.Function):
    """The recentred weights; the score gradient in the closed form g (w - sum g w / sum g), g_i = p_i^(2 - alpha)
    (Peters et al. 2019, Prop. 2), with the largest g's term summed without it: autograd through the Newton step
    forms 1 - g_e / sum g for the edge weight (g_e ~ 1e32 at alpha = 10) and lost that gradient entirely. The
    alpha gradient is added outside it (``_entmax_recentred``)."""

    @staticmethod
    def forward(ctx: Any, shifted: Tensor, beta: Tensor, tau: Tensor) -> Tensor:
        p = _recentred_weights(shifted, beta, tau)
        ctx.save_for_backward(shifted, beta, tau, p)
        return p

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, None, None]:
        shifted, beta, tau, p = ctx.saved_tensors
        dx = None
        if ctx.needs_input_grad[0]:
            u = beta * torch.where(shifted > float("-inf"), shifted, 0.0) - tau
            log_g = torch.where(p > 0, (1.0 - beta) / beta * torch.log(torch.where(p > 0, u, 1.0)), float("-inf"))
            g = torch.exp(log_g - log_g.amax(-1, keepdim=True))  # scaled to max 1
            top = torch.nn.functional.one_hot(g.argmax(-1), g.shape[-1]).to(torch.bool)
            rest_g = torch.where(top, 0.0, g).sum(-1, keepdim=True)
            rest_gw = torch.where(top, 0.0, g * grad).sum(-1, keepdim=True)
            w_top = torch.where(top, grad, 0.0).sum(-1, keepdim=True)
            centred = torch.where(
                top, (w_top * rest_g - rest_gw) / (1.0 + rest_g), grad - (rest_gw + w_top) / (1.0 + rest_g)
            )
            dx = g * centred * torch.exp(log_g.amax(-1, keepdim=True))
        return dx, None, None


_SIGN = -(2**63)
_MAGNITUDE = 2**63 - 1


def _float_midpoint(lo: Tensor, hi: Tensor) -> Tensor:
    """The float64 halfway between lo and hi in *order* (by the count of doubles between them, not by value), so
    64 bisection steps reach adjacent doubles from any bracket, also one around 0, where a value midpoint would need
    a step per binade."""
    a, b = _ordered(lo), _ordered(hi)
    mid = a // 2 + b // 2 + (a % 2 + b % 2) // 2  # no int64 overflow
    return torch.where(mid < 0, (-mid) | _SIGN, mid).view(torch.float64)


def _ordered(x: Tensor) -> Tensor:
    """float64 -> int64 keys in the order of the values (sign-magnitude bits to two's complement)."""
    bits = x.view(torch.int64)
    return torch.where(bits < 0, -(bits & _MAGNITUDE), bits)


def _tau_terms(shifted: Tensor, tau: Tensor, beta: Tensor) -> Tensor:
    """p_i = [beta x_i - tau]_+^(1 / beta) (beta > 0), 0 for blocked keys, with no 0 * inf in a gradient."""
    u = beta * torch.where(shifted > float("-inf"), shifted, 0.0) - tau
    inside = (shifted > float("-inf")) & (u > ENTMAX_TINY)
    return torch.where(inside, torch.exp(torch.log(torch.where(inside, u, 1.0)) / beta), 0.0)


def _tau_step(shifted: Tensor, tau: Tensor, beta: Tensor) -> Tensor:
    """The Newton step for sum_i p_i(tau) = 1: (S - 1) / sum_i p_i / (beta u_i), the denominator detached."""
    p = _tau_terms(shifted, tau, beta)
    with torch.no_grad():
        u = beta * torch.where(shifted > float("-inf"), shifted, 0.0) - tau
        g = torch.where(p > 0, p / (beta * torch.where(p > 0, u, 1.0)), 0.0).sum(-1, keepdim=True)
    return (p.sum(-1, keepdim=True) - 1.0) / g


def _newton(x: Tensor, m: Tensor, beta: Tensor, differentiable: bool = True) -> Tensor:
    """The Newton step for sum_i p_i(m) = 1: (S(m) - 1) / sum_i g_i, g_i = -dp_i/dm = p_i / (1 + beta y_i) (the
    denominator detached: differentiating the step gives the implicit-function gradient of m)."""
    p = _entmax_terms(x, m, beta, differentiable)
    with torch.no_grad():
        base = 1.0 + beta * torch.where(x > float("-inf"), x - m, 0.0)
        g = torch.where(p > 0, p / torch.where(p > 0, base, 1.0), 0.0).sum(-1, keepdim=True)
    return (p.sum(-1, keepdim=True) - 1.0) / g


def _entmax_alpha(
    s: Tensor, training: bool, alpha: Tensor | float = 1.5, alpha_minus_one: Tensor | None = None, **params: Tensor
) -> Tensor:
    # alpha (1, heads, 1, 1) or a float, >= 1; alpha_minus_one, when given, is alpha - 1 without the rounding of 1 +.
    return entmax_alpha(s, alpha, alpha_minus_one)


ENTMAX_ALPHA_MAX = 32.0
"""The largest alpha a learned ``entmax_alpha`` takes (alpha = 1 + min(softplus(theta), 31)) **(our bound)**. A weight
p is held as u = p^(alpha - 1) in float64, and u at or below ``ENTMAX_TINY`` = 1e-300 counts as outside the support:
weights below 1e-300^(1 / (alpha - 1)) are dropped. Up to alpha = 32 that is below 2.2e-10, so a row of a million
keys loses less than 3e-4 of its mass; at alpha = 300 weights below 0.1 would vanish. Above alpha of about 10 the weights are
already close to an argmax, so the bound costs the model nothing it could use."""


def _alpha_parameters(spec: AttentionSpec) -> dict[str, nn.Parameter]:
    # alpha = 1 + softplus(theta) > 1, initialised to 1.5 (1.5-entmax) in every head.
    return {"alpha_raw": nn.Parameter(torch.full((spec.num_heads,), math.log(math.expm1(0.5))))}


def _alpha_params(module: nn.Module) -> dict[str, Tensor]:
    # alpha - 1 = softplus(theta) is handed over as itself: 1 + softplus(theta) rounds to exactly 1 in float32 for
    # theta below about -17 (in float64 below -37), and entmax_alpha, accurate down to alpha = 1, reads alpha - 1.
    # The bound (ENTMAX_ALPHA_MAX) is a clamp: below it the values and gradients are softplus's own.
    raw = module.alpha_raw
    assert isinstance(raw, Tensor)  # the parameter, or torch.func.functional_call's stand-in for it
    top = ENTMAX_ALPHA_MAX - 1.0
    beta = F.softplus(raw).clamp(max=top).view(1, -1, 1, 1)
    alpha = 1.0 + F.softplus(raw.double()).clamp(max=top).view(1, -1, 1, 1)
    return {"alpha": alpha, "alpha_minus_one": beta}


def _diff(s: Tensor, training: bool, lam: Tensor | float = DIFF_LAMBDA_INIT, **params: Tensor) -> Tensor:
    # s (2, ..., k_len): the scores of the first and of the second halves of q and k.
    lam = lam.to(s.dtype) if isinstance(lam, Tensor) else lam  # s is in the compute dtype (float64 kept)
    return torch.softmax(s[0], dim=-1) - lam * torch.softmax(s[1], dim=-1)


def _diff_parameters(spec: AttentionSpec) -> dict[str, nn.Parameter]:
    if not spec.diff_authors:  # the paper's eq. 1: lambda_h itself, per head
        return {"diff_lambda": nn.Parameter(torch.full((spec.num_heads,), DIFF_LAMBDA_INIT))}
    # The authors' layer: one lambda for the layer's heads from four vectors of the half-head width.
    half = spec.head_dim // 2
    return {
        name: nn.Parameter(torch.zeros(half).normal_(mean=0.0, std=DIFF_LAMBDA_STD))
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")
    }


def _diff_params(module: nn.Module) -> dict[str, Tensor]:
    """lambda_h (1, heads, 1, 1), or with ``diff_authors`` the authors' lambda = exp(lq1 . lk1) - exp(lq2 . lk2) +
    lambda_init (1, 1, 1, 1), lambda_init from the module's ``layer_index`` (Ye et al. 2024, sec. 2.1, eq. 2)."""
    if not hasattr(module, "lambda_q1"):
        lam = module.diff_lambda
        assert isinstance(lam, Tensor)
        return {"lam": lam.view(1, -1, 1, 1)}
    q1, k1, q2, k2 = (getattr(module, f"lambda_{n}") for n in ("q1", "k1", "q2", "k2"))
    init = diff_lambda_init(int(getattr(module, "layer_index", 0)))
    return {"lam": (torch.exp((q1 * k1).sum()) - torch.exp((q2 * k2).sum()) + init).view(1, 1, 1, 1)}


def _current_key(s: Tensor) -> Tensor:
    """Bool, shaped like s: the row's last visible key (s > -inf), under a causal mask the query's own."""
    visible = s > float("-inf")
    return visible & (visible.cumsum(dim=-1) == visible.sum(dim=-1, keepdim=True))


def _stick_breaking(
    s: Tensor, training: bool, attend_current: bool = True, remainder: bool = False, **params: Tensor
) -> Tensor:
    # log u_ij = log beta_ij + sum_{l > j} log(1 - beta_il); a blocked key (s = -inf) has log(1 - beta) = 0, so the
    # product runs over the visible keys only. The sum over l > j is an exclusive reverse cumulative sum.
    current = _current_key(s) if not attend_current or remainder else None
    if current is not None and not attend_current:  # the authors' default: the diagonal is not a key to break on
        s = s.masked_fill(current, float("-inf"))
    log_keep = F.logsigmoid(-s)
    after = torch.flip(torch.cumsum(torch.flip(log_keep[..., 1:], dims=(-1,)), dim=-1), dims=(-1,))
    after = F.pad(after, (0, 1))
    u = torch.exp(F.logsigmoid(s) + after)
    if current is not None and remainder:  # the authors' o_i += rem_i v_i: the stick's rest to the own key
        u = u + current.to(u.dtype) * (1.0 - u.sum(dim=-1, keepdim=True))
    return u


def _stick_options(spec: AttentionSpec) -> dict:
    return {"attend_current": bool(spec.stick_attend_current), "remainder": bool(spec.stick_remainder)}


def _softmax_sink(s: Tensor, training: bool, sink: Tensor | float = 0.0, **params: Tensor) -> Tensor:
    # softmax over the row and one extra logit b_h whose column is dropped: exp(s_j) / (exp(b_h) + sum_l exp(s_l)).
    if isinstance(sink, Tensor):
        column = torch.broadcast_to(sink.to(s.dtype), s.shape[:-1] + (1,))
    else:
        column = torch.full_like(s[..., :1], float(sink))
    return torch.softmax(torch.cat([s, column.to(s.dtype)], dim=-1), dim=-1)[..., :-1]


def _sink_parameters(spec: AttentionSpec) -> dict[str, nn.Parameter]:
    return {"sink_logit": nn.Parameter(torch.zeros(spec.num_heads))}


def softpick_terms(s: Tensor) -> tuple[Tensor, Tensor]:
    """(a, e^-m) of softpick: a_j = e^-m (e^(s_j) - 1), m = max(0, max_j s_j) (numerator and denominator times e^-m, so
    that no exp overflows), 0 at a blocked key (s = -inf).

    A row whose largest logit is below SOFTPICK_EXPM1_BELOW takes a_j = e^-m expm1(s_j): there every |a_j| may be
    small, and e^(s - m) - e^-m by subtraction lost 1e-4 of the output at logits ~1e-4 in float32. Any other row
    takes the subtraction: a key with a_j near 0 then weighs little against the row's largest, a_max = 1 - e^-m
    >= 0.63 **(our choice: the rowwise engine keeps one exp pass per block)**."""
    m = s.amax(dim=-1, keepdim=True).clamp_min(0.0).detach()
    floor = torch.exp(-m)
    small = m < SOFTPICK_EXPM1_BELOW  # both forms for every row: no data-dependent branch for torch.compile
    a = torch.where(small, torch.expm1(s.clamp_max(SOFTPICK_EXPM1_BELOW)) * floor, torch.exp(s - m) - floor)
    return torch.where(torch.isneginf(s), torch.zeros_like(a), a), floor


def softpick_eps(floor: Tensor, shifted_eps: bool = False) -> Tensor | float:
    """The epsilon added to softpick's shifted denominator sum_j |a_j|: the paper's 1e-6 scaled by the shift,
    SOFTPICK_EPS e^-m (the default), or the authors' released layer's SOFTPICK_SHIFTED_EPS after it. Their shift is
    m = max_j s_j unclamped; below 0 every a_j < 0 and the weights are 0 under either shift, so only the epsilon
    differs."""
    return SOFTPICK_SHIFTED_EPS if shifted_eps else SOFTPICK_EPS * floor


def _softpick(s: Tensor, training: bool, shifted_eps: bool = False, **params: Tensor) -> Tensor:
    # relu(e^s - 1) / (sum |e^s - 1| + eps), in the terms of softpick_terms; blocked keys are left out of the sum.
    a, floor = softpick_terms(s)
    return F.relu(a) / (a.abs().sum(dim=-1, keepdim=True) + softpick_eps(floor, shifted_eps))


def _softpick_options(spec: AttentionSpec) -> dict:
    return {"shifted_eps": bool(spec.softpick_shifted_eps)}


def _topk(s: Tensor, training: bool, k: int = TOPK_DEFAULT, **params: Tensor) -> Tensor:
    kk = min(int(k), s.shape[-1])
    if kk == 0:
        return torch.zeros_like(s)
    kth = s.topk(kk, dim=-1).values[..., -1:]  # -inf when fewer than k keys are visible: all of them are kept
    return torch.softmax(s.masked_fill(s < kth, float("-inf")), dim=-1)


def _topk_options(spec: AttentionSpec) -> dict:
    return {"k": int(spec.topk)}


def _masked_logsumexp(f: Tensor, visible: Tensor, dim: int) -> Tensor:
    """log sum exp of f over ``dim`` (blocked entries are -inf in f); 0 for a line without a visible entry, whose
    gradient then stays 0 instead of 0 * inf."""
    some = visible.any(dim=dim, keepdim=True)
    return torch.logsumexp(f.masked_fill(~some, 0.0), dim=dim, keepdim=True).masked_fill(~some, 0.0)


def _sinkhorn(s: Tensor, training: bool, authors: bool = False, **params: Tensor) -> Tensor:
    # Sinkhorn's algorithm on K = exp(s) in the log domain: f <- f - logsumexp over a row, then over a column, ...;
    # blocked entries stay -inf (weight 0, out of every sum), an empty row or column is left alone. With ``authors``
    # the released layer (sinkformers' SinkhornDistance and ``attn * attn.shape[-1]``): marginals 1 / q_len and
    # 1 / k_len, the plan times k_len (rows sum to k_len / q_len, columns about to 1) and the column potential
    # detached (``v.detach()``); q_len, k_len count the rows and columns with a visible entry.
    visible = s > float("-inf")
    f = s
    for step in range(SINKHORN_NORMALIZATIONS):
        dim = -1 if step % 2 == 0 else -2
        lse = _masked_logsumexp(f, visible, dim)
        f = f - (lse.detach() if authors and dim == -2 else lse)
    if not authors:
        return torch.exp(f)
    rows = visible.any(dim=-1).sum(dim=-1, keepdim=True).clamp_min(1).to(f.dtype)  # the ratio in f's dtype
    cols = visible.any(dim=-2).sum(dim=-1, keepdim=True).to(f.dtype)
    return torch.exp(f) * (cols / rows).unsqueeze(-1)


def _sinkhorn_options(spec: AttentionSpec) -> dict:
    return {"authors": bool(spec.sinkhorn_authors)}


def _power_terms(s: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(t, m, has) with t = s / m, m = max_j |s_j| over the visible keys (so |t| <= 1 and t^p cannot overflow;
    u is unchanged by the common factor), t = 1 at every visible key of a row whose visible scores are all 0 and
    0 at a blocked key; ``has``: m > 0."""
    visible = s > float("-inf")
    a = torch.where(visible, s, 0.0)
    m = a.abs().amax(dim=-1, keepdim=True).detach()  # u is homogeneous of degree 0: dm contributes nothing
    has = m > 0
    safe = torch.where(has, m, 1.0)
    return torch.where(has, a / safe, visible.to(s.dtype)), safe, has


def _power(s: Tensor, training: bool, **params: Tensor) -> Tensor:
    t, _, _ = _power_terms(s)
    w = t.pow(POWER_P)
    return w / w.sum(dim=-1, keepdim=True)


# ---------------------------------------------------------------------------------------------- closed-form VJPs
# For the trait ``closed_vjp``: dL/dz from the logits z (blocked keys -inf), the weights u = impl(z), g = dL/du (which
# the function may overwrite) and delta = sum_j u_j g_j (= rowsum(dO * O) when out = u V), without autograd (the
# rowwise engine's backward).
def _softmax_vjp(z: Tensor, u: Tensor, g: Tensor, delta: Tensor, **options: Any) -> Tensor:
    return g.sub_(delta).mul_(u)  # softmax, and topk: the softmax over the kept keys (u = 0 elsewhere)


def _softpick_vjp(z: Tensor, u: Tensor, g: Tensor, delta: Tensor, **options: Any) -> Tensor:
    # u_j = relu(a_j) / D, a_j = e^(z_j - m) - e^-m, D = sum_l |a_l| + eps e^-m:
    # dL/da_k = ([a_k > 0] g_k - sign(a_k) sum_j g_j u_j) / D, and da_k/dz_k = e^(z_k - m) (0 at a blocked key).
    a, floor = softpick_terms(z)
    e = torch.exp(z - z.amax(dim=-1, keepdim=True).clamp_min_(0.0))
    denom = a.abs().sum(dim=-1, keepdim=True) + softpick_eps(floor, bool(options.get("shifted_eps", False)))
    return g.mul_(u > 0).sub_(a.sign_().mul_(delta)).div_(denom).mul_(e)


def _stick_breaking_vjp(z: Tensor, u: Tensor, g: Tensor, delta: Tensor, **options: Any) -> Tensor:
    # log u_j = logsigmoid(z_j) + sum_{l > j} logsigmoid(-z_l): with dA = g u,
    # dL/dz_j = dA_j sigmoid(-z_j) - sigmoid(z_j) sum_{j' < j} dA_j'. At the default options only: the row kernels
    # decline the authors' conventions (``RowKernel.reads_options``).
    d = g.mul_(u)
    before = torch.cumsum(d, dim=-1).sub_(d)
    return d.mul_(torch.sigmoid(-z)).sub_(before.mul_(torch.sigmoid(z)))


def _power_vjp(z: Tensor, u: Tensor, g: Tensor, delta: Tensor, **options: Any) -> Tensor:
    # u_j = t_j^p / W, t = z / m, W = sum_l t_l^p: dL/dz_k = p t_k^(p-1) (g_k - delta) / (m W); 0 in a row of zeros
    # (uniform there by convention, a constant) and at a blocked key (t = 0).
    t, m, has = _power_terms(z)
    coef = t.pow(POWER_P - 1).mul_(POWER_P).div_(m * torch.where(has, t.pow(POWER_P).sum(-1, keepdim=True), 1.0))
    return g.sub_(delta).mul_(coef.masked_fill_(~has, 0.0))


def _sigmoid(s: Tensor, n: Tensor) -> Tensor:
    return torch.sigmoid(s - n.log())


def _sigmoid_(s: Tensor, n: Tensor) -> Tensor:
    return s.sub_(n.log()).sigmoid_()


def _sigmoid_grad_(u: Tensor, n: Tensor, g: Tensor) -> Tensor:
    return g.mul_(u.addcmul_(u, u, value=-1.0))  # du/ds = u (1 - u)


def _relu(s: Tensor, n: Tensor) -> Tensor:
    return F.relu(s) / n


def _relu_(s: Tensor, n: Tensor) -> Tensor:
    return s.relu_().div_(n)


def _relu_grad_(u: Tensor, n: Tensor, g: Tensor) -> Tensor:
    return g.mul_(u.sign_().div_(n))  # du/ds = [s > 0] / n = [u > 0] / n


def _none(s: Tensor, n: Tensor) -> Tensor:
    return s


def _none_(s: Tensor, n: Tensor) -> Tensor:
    return s


def _none_grad_(u: Tensor, n: Tensor, g: Tensor) -> Tensor:
    return g  # du/ds = 1


def _elementwise(
    name: str,
    formula: str,
    source: str,
    impl: Callable[[Tensor, Tensor], Tensor],
    *,
    impl_: Callable[[Tensor, Tensor], Tensor],
    grad_: Callable[[Tensor, Tensor, Tensor], Tensor],
    relaxes: str,
    traits: frozenset[str] = frozenset(),
) -> Choice:
    """An ``elementwise`` choice with a ``closed_grad`` (the elementwise engine's forward and backward, see
    :data:`NORMALIZER_TRAITS`): ``impl`` (s, n) -> u, ``impl_`` the same in place in s, ``grad_`` (u, n, g) -> g du/ds
    in place in g; ``traits`` besides those two."""
    extra = {"impl_": impl_, "grad_": grad_}
    return Choice(
        name, formula, source, impl, frozenset({"elementwise", "closed_grad"}) | traits, extra, relaxes=relaxes
    )


def _linear(kernel: Tensor) -> Tensor:
    return kernel / (kernel.sum(dim=-1, keepdim=True) + LINEAR_EPS)


NORMALIZERS = Registry(
    "normalizer",
    [
        Choice(
            "softmax",
            "u = exp(s) / sum_j exp(s_j)",
            "Vaswani et al. 2017, eq. 1 (A5 holds with scale inv_sqrt_d)",
            _softmax,
            frozenset({"row", "softmax", "softmax_in_eval", "closed_vjp"}),
            {"vjp": _softmax_vjp},
        ),
        _elementwise(
            "sigmoid",
            "u = sigmoid(s - log n_i)",
            "Ramapuram et al. 2024, sigmoid attention with b = -log n",
            _sigmoid,
            impl_=_sigmoid_,
            grad_=_sigmoid_grad_,
            relaxes="A5: each weight from its own score; rows need not sum to 1",
        ),
        _elementwise(
            "relu",
            "u = relu(s) / n_i",
            "Wortsman et al. 2023, ReLU attention",
            _relu,
            impl_=_relu_,
            grad_=_relu_grad_,
            relaxes="A5: each weight from its own score; not shift invariant, rows need not sum to 1",
        ),
        Choice(
            "sparsemax",
            "u = argmin_{p in simplex} |p - s|^2 = relu(s - tau)",
            "Martins & Astudillo 2016, eq. 2",
            _sparsemax,
            frozenset({"row", "sorting", "entmax"}),
            {"alpha": 2.0},
            relaxes="A5: a Euclidean projection onto the simplex; "
            "exact zeros, weights depend on score differences linearly",
        ),
        Choice(
            "entmax15",
            "u = relu(s / 2 - tau)^2 (1.5-entmax)",
            "Peters et al. 2019, eq. 10 (alpha = 1.5)",
            _entmax15,
            frozenset({"row", "sorting", "entmax"}),
            {"alpha": 1.5},
            relaxes="A5: the Tsallis-1.5 regularised argmax; exact zeros",
        ),
        Choice(
            "gumbel_softmax",
            "u = softmax((s + g) / tau), g ~ Gumbel(0, 1), in training (one-hot argmax_j (s + g) "
            "forward, soft backward when hard); softmax(s / tau), or one-hot argmax_j s when hard, in eval",
            "Jang et al. 2017, eq. 1 and sec. 2.2 (straight-through)",
            _gumbel_softmax,
            frozenset({"row", "softmax_in_eval", "random", "configured"}),
            {
                "options": _gumbel_options,
                "defaults": {"tau": 1.0, "hard": False},
                "fields": {"tau": "gumbel_tau", "hard": "gumbel_hard"},
            },
            relaxes="design (A5 holds in eval): the weights are sampled in training",
        ),
        Choice(
            "linear",
            "u = K_ij / sum_j K_ij, K_ij = phi(q_i).phi(k_j)",
            "Katharopoulos et al. 2020, eq. 6-7",
            _linear,
            frozenset({"kernel"}),
            relaxes="A5 (and A4): exp(s) replaced by a kernel phi(q).phi(k)",
        ),
        Choice(
            "entmax_alpha",
            "u = alpha-entmax(s) = relu((alpha - 1) s - tau)^(1 / (alpha - 1)), alpha_h in (1, 32] learned "
            "per head (initialised to 1.5); the softmax at alpha = 1",
            "Peters et al. 2019, eq. 8; Correia et al. "
            "2019 (adaptively sparse transformers, learned alpha); our log1p form of the bisection (accurate for "
            "every alpha >= 1, see entmax_alpha)",
            _entmax_alpha,
            frozenset({"row", "parametric"}),
            {"parameters": _alpha_parameters, "params": _alpha_params},
            relaxes="A5: alpha-entmax with a learned alpha per head; exact zeros",
        ),
        Choice(
            "softmax1",
            "u = exp(s) / (1 + sum_j exp(s_j)): softmax with a zero-logit, zero-value sink",
            "Miller 2023, 'Attention Is Off By One' (softmax_1); the sink of Xiao et al. 2024, sec. 3.3",
            _softmax1,
            frozenset({"row", "sink"}),
            relaxes="A5: rows may sum below 1 (a zero-logit sink)",
        ),
        Choice(
            "diff",
            "u = softmax(q1.k1 / sqrt(d/2)) - lambda_h softmax(q2.k2 / sqrt(d/2)), q = [q1, q2], k = [k1, k2] "
            "split in halves per head, lambda_h learned per head (from 0.2)",
            "Ye et al. 2024, arXiv:2410.05258, eq. 1 (differential attention; its per-head normalization after the "
            "sum is an A1 change, not part of this choice)",
            _diff,
            frozenset({"row", "parametric", "halves", "signed"}),
            {"parameters": _diff_parameters, "params": _diff_params},
            relaxes="A5: signed weights, the difference of two softmaxes; rows sum to 1 - lambda_h",
        ),
        Choice(
            "stick_breaking",
            "u_ij = beta_ij prod_{visible l, j < l <= i} (1 - beta_il), beta_ij = sigmoid(s_ij)",
            "Tan et al. 2024, arXiv:2410.17980, eq. 3 (stick-breaking attention)",
            _stick_breaking,
            frozenset({"row", "causal", "ordered", "closed_vjp", "configured"}),
            {
                "vjp": _stick_breaking_vjp,
                "options": _stick_options,
                "defaults": {"attend_current": True, "remainder": False},
                "fields": {"attend_current": "stick_attend_current", "remainder": "stick_remainder"},
            },
            relaxes="A5 and order together: the nearest keys take their share first; "
            "rows sum to at most 1, not shift invariant (causal only)",
        ),
        Choice(
            "softmax_sink",
            "u = exp(s) / (exp(b_h) + sum_j exp(s_j)), a learned sink logit b_h per head (from 0)",
            "gpt-oss (OpenAI 2025, attention sinks); softmax1 is b_h = 0 (Miller 2023)",
            _softmax_sink,
            frozenset({"row", "parametric"}),
            {"parameters": _sink_parameters, "params": lambda module: {"sink": module.sink_logit.view(1, -1, 1, 1)}},
            relaxes="A5: rows sum below 1 by a learned amount (a sink logit per head)",
        ),
        Choice(
            "softpick",
            "u = relu(exp(s) - 1) / (sum_j |exp(s_j) - 1| + 1e-6)",
            "Zuhri et al. 2025, arXiv:2504.20966, eq. 2 (softpick)",
            _softpick,
            frozenset({"row", "closed_vjp", "configured"}),
            {
                "vjp": _softpick_vjp,
                "options": _softpick_options,
                "defaults": {"shifted_eps": False},
                "fields": {"shifted_eps": "softpick_shifted_eps"},
            },
            relaxes="A5: not shift invariant; exact zeros where s <= 0; rows may sum below 1",
        ),
        Choice(
            "topk",
            "u = softmax over the visible scores >= the row's topk-th largest, 0 elsewhere (ties kept; spec field topk)",
            "Zhao et al. 2019, arXiv:1912.11637, eq. 4-5 (explicit sparse transformer)",
            _topk,
            frozenset({"row", "configured", "closed_vjp"}),
            {"options": _topk_options, "defaults": {"k": TOPK_DEFAULT}, "fields": {"k": "topk"}, "vjp": _softmax_vjp},
            relaxes="A5: only the k largest scores of a row get weight (ratios depend on the other scores' ranks)",
        ),
        Choice(
            "sinkhorn",
            "u = S_R(S_C(S_R(exp(s)))) over the visible entries, S_R / S_C dividing each row / column by its sum "
            "(Sinkhorn's algorithm, 3 normalizations): rows sum to 1, columns about to q_len / k_len; not causal",
            "Sander et al. 2022, arXiv:2110.11773, sec. 3 (Sinkformers; Sinkhorn's algorithm alternating row and "
            "column normalizations, 3 as in the authors' code)",
            _sinkhorn,
            frozenset({"row", "columns", "noncausal", "configured"}),
            {"options": _sinkhorn_options, "defaults": {"authors": False}, "fields": {"authors": "sinkhorn_authors"}},
            relaxes="A5: the weights are normalized over the queries too (approximately doubly stochastic), so a "
            "query's weights depend on the other queries' scores; rows are no longer computed independently",
        ),
        Choice(
            "power",
            "u = s^p / sum_j s_j^p, p = 2 (visible keys; a row of zeros gets 1 / n_i, a row without keys 0)",
            "Buckman, Gelada & Zhang 2024, 'Symmetric Power Transformers' (Manifest AI), power attention "
            "A_ij = (q_i.k_j)^p / sum_l (q_i.k_l)^p with even p",
            _power,
            frozenset({"row", "closed_vjp", "sign_blind"}),
            {"vjp": _power_vjp},
            relaxes="A5: a polynomial instead of exp: not shift invariant, blind to the temperature (u is "
            "homogeneous of degree 0 in s) and to the sign of s",
        ),
        _elementwise(
            "none",
            "u = s (no normalization)",
            "Katharopoulos et al. 2020, eq. 4 without the denominator, as the delta-rule family and Mamba-2's SSD "
            "(Dao & Gu 2024, sec. 3) use it",
            _none,
            impl_=_none_,
            grad_=_none_grad_,
            traits=frozenset({"signed", "identity"}),
            relaxes="A5: nothing normalizes the relevance (weights are the scaled scores, signed and unbounded)",
        ),
    ],
    NORMALIZER_TRAITS,
)
"""Every normalizer (A5): see the module docstring and :data:`NORMALIZER_TRAITS`."""


class _EluPlusOne(torch.autograd.Function):
    """phi(x) = elu(x) + 1 keeping only phi for the backward: phi'(x) = 1 for x > 0 and exp(x) = phi(x) for x <= 0,
    i.e. min(phi, 1) (``F.elu(x) + 1`` keeps elu's output besides phi: one more (L x head_dim) tensor per input)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        phi = torch.where(x > 0, x + 1, torch.exp(torch.clamp(x, max=0.0)))
        ctx.save_for_backward(phi)
        return phi

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (phi,) = ctx.saved_tensors
        return grad * torch.clamp(phi, max=1.0)  # differentiable again through phi (double backward)


def _elu_plus_one(x: Tensor) -> Tensor:
    return _EluPlusOne.apply(x)


def _taylor(x: Tensor) -> Tensor:
    # [1, y, vec(y y^T) / sqrt(2)] with y = x / d^(1/4): phi(q).phi(k) = 1 + t + t^2 / 2, t = q.k / sqrt(d), which is
    # positive for every t (its discriminant is negative), so every row sum is positive.
    y = x * x.shape[-1] ** -0.25
    outer = (y.unsqueeze(-1) * y.unsqueeze(-2)).flatten(-2) / math.sqrt(2.0)
    return torch.cat([torch.ones_like(y[..., :1]), y, outer], dim=-1)


FEATURE_MAPS = Registry(
    "feature_map",
    [
        Choice("elu", "phi(x) = elu(x) + 1", "Katharopoulos et al. 2020, eq. 7", _elu_plus_one),
        Choice(
            "relu",
            "phi(x) = relu(x)",
            "Choromanski et al. 2021 (ReLU kernel of the Performer paper)",
            F.relu,
            relaxes="the linear normalizer's kernel: relu features",
        ),
        Choice(
            "identity",
            "phi(x) = x (not positive: rows may sum to about 0)",
            "our choice: the plain bilinear kernel",
            lambda x: x,
            frozenset({"signed"}),
            relaxes="the linear normalizer's kernel: the plain bilinear form (weights may be negative)",
        ),
        Choice(
            "taylor",
            "phi(x) = [1, y, vec(y y^T) / sqrt 2], y = x / d^(1/4): phi(q).phi(k) = 1 + t + t^2 / 2 with "
            "t = q.k / sqrt(d), the second-order Taylor expansion of exp(t); width 1 + d + d^2",
            "Arora et al. 2024 (Based), sec. 3.1; Zhang et al. 2024 (Hedgehog), sec. 3",
            _taylor,
            relaxes="the linear normalizer's kernel: the second-order Taylor expansion of exp",
        ),
    ],
    {"signed": "phi(q).phi(k) may be negative, and with it the weights"},
)
"""Kernel feature maps of the ``linear`` normalizer."""


def spec_options(spec: AttentionSpec) -> dict:
    """Keyword arguments of the spec's normalizer read from spec fields (trait ``configured``), else empty."""
    choice = NORMALIZERS[spec.normalizer]
    return choice.extra["options"](spec) if choice.has("configured") else {}


def at_defaults(spec: AttentionSpec) -> bool:
    """Whether the spec's normalizer options are at their defaults, where every trait of its choice holds."""
    choice = NORMALIZERS[spec.normalizer]
    return not choice.has("configured") or spec_options(spec) == choice.extra["defaults"]


def changed_options(spec: AttentionSpec) -> dict[str, str]:
    """The spec fields of the normalizer's options that differ from their defaults, as relax-string values,
    e.g. ``{"gumbel_tau": "0.5", "gumbel_hard": "true"}``."""
    choice = NORMALIZERS[spec.normalizer]
    if not choice.has("configured"):
        return {}
    out = {}
    for key, value in spec_options(spec).items():
        if value != choice.extra["defaults"][key]:
            text = ("true" if value else "false") if isinstance(value, bool) else f"{value:g}"
            out[choice.extra["fields"][key]] = text
    return out


def feature_map(x: Tensor, kind: str = "elu") -> Tensor:
    """Kernel feature map of linear attention (:data:`FEATURE_MAPS`): ``elu(x) + 1`` by default."""
    return FEATURE_MAPS[kind].implementation()(x)


def normalize(
    scores: Tensor,
    mask: Tensor | None,
    kind: str | Choice,
    *,
    training: bool = False,
    n_visible: Tensor | None = None,
    params: dict[str, Tensor] | None = None,
) -> Tensor:
    """Attention weights from scores.

    Args:
        scores: (batch, heads, q_len, k_len) float scores, already scaled and biased. For a ``kernel`` normalizer
            these are the non-negative kernel values phi(q).phi(k); for a ``halves`` one (``diff``) the scores of the
            two halves stacked, (2, batch, heads, q_len, k_len).
        mask: bool, True = may attend, broadcastable to ``scores``; ``None`` means every key is visible.
        kind: a name of :data:`NORMALIZERS`, or its resolved :class:`Choice` (engines pass the one their plan
            resolved, so that no name is looked up per call).
        training: enables the randomness of ``random`` normalizers (Gumbel noise).
        n_visible: float (..., q_len, 1), the n_i of ``elementwise`` normalizers (keys visible to each query, the
            key length for a row with none); computed from ``mask`` when None. Engines that score one block of
            keys at a time pass the count over the whole row.
        params: keyword arguments of the implementation (``Normalizer.params()``): the learned parameters of a
            ``parametric`` normalizer, the spec's options of a ``configured`` one (``spec_options(spec)``, e.g.
            Gumbel-softmax's ``tau`` and ``hard``); defaults otherwise.

    Returns:
        weights shaped like ``scores`` (without the leading 2 of ``halves``) in max(scores dtype, float32) (float64
        stays float64); masked entries and rows without a visible key are exactly 0.

    Raises:
        ValueError: unknown ``kind`` (naming the choices).
    """
    choice = kind if isinstance(kind, Choice) else NORMALIZERS[kind]
    impl = choice.implementation()
    s = upcast(scores)
    visible = None
    if mask is not None:
        mask = torch.broadcast_to(mask, s.shape)
        s, visible = _visible_keys(s, mask, choice)
    if choice.has("kernel"):
        return impl(s if mask is None else s.masked_fill(~mask, 0.0))
    if choice.has("elementwise"):
        weights = impl(s, _visible_counts(s, visible, n_visible))
    else:
        weights, mask = _row_weights(impl, choice, s, mask, visible, training, params or {})
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return weights


def _visible_keys(s: Tensor, mask: Tensor, choice: Choice) -> tuple[Tensor, Tensor]:
    # Returns the scores and the keys the normalizer sees. A row with no visible key is normalized as if every key
    # were visible with score 0, then zeroed by the mask: the weights are 0 and every gradient stays finite. Under
    # ``columns`` an empty row stays blocked: it takes no part in the column sums (impl gives it 0).
    if choice.has("columns"):
        return s, mask
    has_key = mask.any(dim=-1, keepdim=True)
    return s.masked_fill(~has_key, 0.0), mask | ~has_key


def _visible_counts(s: Tensor, visible: Tensor | None, n_visible: Tensor | None) -> Tensor:
    # The n_i of an elementwise normalizer, in the scores' dtype (n_i counted in float32 by some engines).
    if n_visible is None:
        if visible is None:
            return torch.full_like(s[..., :1], float(s.shape[-1]))
        return visible.sum(dim=-1, keepdim=True).to(s.dtype)
    return n_visible.to(s.dtype)


def _row_weights(
    impl: Callable[..., Tensor],
    choice: Choice,
    s: Tensor,
    mask: Tensor | None,
    visible: Tensor | None,
    training: bool,
    params: dict[str, Tensor],
) -> tuple[Tensor, Tensor | None]:
    # The weights of a normalizer over whole rows, and the mask still to apply to them (a ``halves`` normalizer
    # makes one weight matrix of two stacked score matrices: the first one's mask).
    if visible is not None:
        s = s.masked_fill(~visible, float("-inf"))
    # A sort-based threshold fails on NaN; such rows are computed on zeros and reported as NaN.
    nan_rows = torch.isnan(s).any(dim=-1, keepdim=True)
    weights = impl(s.masked_fill(nan_rows, 0.0), training, **params)
    if choice.has("halves"):
        nan_rows = nan_rows.any(dim=0)
        mask = None if mask is None else mask[0]
    return weights.masked_fill(nan_rows, float("nan")), mask


class Normalizer(nn.Module):
    """Module form of :func:`normalize` for ``spec.normalizer`` (Gumbel noise follows ``self.training``); it owns the
    learned parameters of a ``parametric`` normalizer."""

    def __init__(self, spec: AttentionSpec, *, layer_index: int = 0):
        super().__init__()
        self.layer_index = layer_index  # the layer's 0-based depth: diff_authors' lambda_init reads it
        self.kind = spec.normalizer
        self.feature_map = spec.feature_map
        self.options = spec_options(spec)
        choice = NORMALIZERS[spec.normalizer]
        if choice.has("parametric"):
            for name, parameter in choice.extra["parameters"](spec).items():
                self.register_parameter(name, parameter)

    def params(self) -> dict[str, Tensor]:
        """Keyword arguments of the normalizer's implementation: the spec's options (``configured``) and the learned
        parameters (``parametric``); empty for the others."""
        choice = NORMALIZERS[self.kind]
        return {**self.options, **(choice.extra["params"](self) if choice.has("parametric") else {})}

    def forward(self, scores: Tensor, mask: Tensor | None = None) -> Tensor:
        return normalize(scores, mask, self.kind, training=self.training, params=self.params())
