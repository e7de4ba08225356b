"""``FlowNet``: K unrolled steps of the feature flow between an embedding and a multinomial-regression classifier.

Source 2 of ``docs/SOURCES.md``. Each step is one Lie-Trotter step with explicit-Euler sub-steps, i.e. one Transformer
block, and the arm (``mixing``) says which sub-steps are present:

    Z <- Z + h * attention(Z)        linear model:    cross-attention to the class embeddings theta (K, d)
                                     quadratic model: self-attention across tokens, theta_k = phi_k phi_k^T
    Z <- Z + h * MLP_k(Z)            token-wise MLP: the learned stand-in for the label term (option (b) of
                                     SOURCES.md, **our choice**: at inference the labels C are unknown)
    Z <- r * Z / |Z|                 optional sphere projection (LayerNorm analogue, our choice)

``value``: ``tied`` is the flow's own value map with its own sign (-CA(Z, theta) = -sigma(Z theta^T) theta, or
-SA(Z) = -sigma(Z theta_k Z^T) Z theta_k: repulsive); ``free`` keeps the attention weights of the flow and replaces
the values by a learned map (sigma(Z theta^T) V with V (K, d), or sigma(Z theta_k Z^T) Z W_v with W_v (d, d));
``classifier`` is ``tied`` with the form derived from the classifier instead of learned: quadratic model
theta_k = theta^T theta / ||theta||_2^2, i.e. phi = theta^T / ||theta||_2, so the token-to-token logits are the inner
products of the tokens' class-logit vectors Z theta^T (derivation: ``docs/flows.md``); in the linear model it is the
tied -CA(Z, theta) itself, whose keys and values already are theta. It has no parameters of its own.

Controls (``docs/flows.md``): ``token_mlp`` is a token-wise MLP step whose hidden width is chosen so that its
parameter count is that of the tied attention step (d^2, within 15 %): no token mixing, the same capacity.
``shuffled`` is the attention step with its weights computed from *another image's* tokens (the batch rolled by one,
``Z.roll(1, 0)``) and its values from the image's own: mixing without information about the image. ``uniform`` is
the attention step with every weight 1/n (the tokens' mean; the linear model: the classes' mean): mixing with no
scores at all, the uniform-mixing control of the study's task battery.

Classifier: logits = readout(Z) theta^T (no intercept, the source's N = Z theta^T), theta (K, r). ``readout`` (quadratic
model): ``mean`` (mean over tokens, r = d) and ``cls`` (a learned class token prepended to the image tokens, r = d) do
not mix tokens, so any token mixing comes from attention; ``flatten`` (all tokens concatenated, r = n d) mixes tokens
itself. ``freeze_classifier()`` holds theta fixed (the source's setting: the features move, the classifier does not).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from axiomformer.flows.integrators import project_to_sphere
from axiomformer.flows.loss import MODELS, TRANSPOSED_TERMS
from axiomformer.flows.operators import quadratic_weights

MIXINGS = ("attention", "mlp", "both", "neither", "token_mlp", "shuffled", "uniform")
#: Mixings with an attention sub-step (their arms cross the value maps).
ATTENTION_MIXINGS = ("attention", "both", "shuffled", "uniform")
VALUES = ("tied", "free", "classifier")
#: token_mlp's parameter count may differ from the tied attention step's by at most this fraction.
PARAM_TOLERANCE = 0.15
READOUTS = ("mean", "cls", "flatten")
#: Readouts that combine tokens themselves, so accuracy differences cannot be attributed to attention alone.
MIXING_READOUTS = ("flatten",)


def _mlp(dim: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))


def matched_hidden(dim: int, target: int) -> int:
    """The hidden width h >= 1 whose token-wise MLP ``Linear(d, h) -> GELU -> Linear(h, d)`` (2 d h + h + d
    parameters) comes closest to ``target`` parameters (ties: the smaller h)."""
    best = max(1, round((target - dim) / (2 * dim + 1)))
    return min({max(1, best - 1), best, best + 1}, key=lambda h: (abs(2 * dim * h + h + dim - target), h))


def _choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; choose one of: {', '.join(choices)}")


def _check_options(
    model: str, mixing: str, value: str, readout: str, transposed_term: str, steps: int, num_tokens: int | None
) -> None:
    """The checks of :class:`FlowNet`'s options (its Raises, all but the token MLP's width and ``shuffled``)."""
    _choice("model", model, MODELS)
    _choice("mixing", mixing, MIXINGS)
    _choice("value", value, VALUES)
    _choice("readout", readout, READOUTS)
    _choice("transposed_term", transposed_term, TRANSPOSED_TERMS)
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    if model == "quadratic" and not num_tokens:
        raise ValueError("model='quadratic' needs num_tokens (inputs are (batch, num_tokens, in_features))")
    if value == "free" and transposed_term != "drop" and model == "quadratic":
        raise ValueError(
            "value='free' replaces the values of the row-normalized self-attention; it needs transposed_term='drop'"
        )
    if model == "linear" and mixing == "token_mlp":
        raise ValueError(
            "mixing=token_mlp needs model='quadratic': the linear model's tied attention step has "
            "no parameters to match (its keys and values are the classifier's theta)"
        )


def _mlp_hidden(mixing: str, dim: int, hidden: int | None) -> int:
    """The MLP's hidden width: ``hidden`` (default 2 dim), or for ``token_mlp`` the width whose parameter count comes
    closest to the attention step's d^2 (ValueError when not within :data:`PARAM_TOLERANCE`)."""
    if mixing != "token_mlp":
        return hidden or 2 * dim
    hidden = matched_hidden(dim, dim * dim)
    count = 2 * dim * hidden + hidden + dim
    if abs(count - dim * dim) > PARAM_TOLERANCE * dim * dim:
        raise ValueError(
            f"mixing=token_mlp: no hidden width gives within 15% of the attention step's "
            f"{dim * dim} parameters at dim={dim} (closest: {count}); use dim=3 or dim >= 5"
        )
    return hidden


class FlowNet(nn.Module):
    """K flow steps between a linear embedding and a multinomial-regression classifier theta.

    Args:
        in_features: input width (per sample for ``linear``; per token for ``quadratic``).
        num_classes: number of classes K.
        dim: feature width d.
        steps: number of unrolled flow steps (layers); 0 gives multinomial regression on the embedded (read-out) input.
        model: ``"linear"`` (one feature per sample, cross-attention to the class embeddings) or ``"quadratic"``
            (patch tokens, self-attention across tokens).
        mixing: ``attention`` | ``mlp`` | ``both`` | ``neither`` | ``token_mlp`` | ``shuffled`` | ``uniform``: which
            sub-steps each flow step has (``token_mlp``: an MLP with the tied attention step's parameter count;
            ``shuffled``: the attention step with weights from another image of the batch; ``uniform``: the attention
            step with every weight 1/n).
        value: ``tied`` (the flow's own value map and sign), ``free`` (a learned value map) or ``classifier`` (tied,
            with the form theta^T theta / ||theta||_2^2 derived from the classifier; in the linear model the same as
            ``tied``, whose cross-attention already takes its keys and values from theta).
        readout: ``mean`` | ``cls`` | ``flatten`` (quadratic only; the linear model has one feature per sample).
        share_steps: share the step weights (MLP, phi, W_v) across steps (a time-invariant flow) or not.
        step_size: h, the residual scale.
        hidden: hidden width of the token-wise MLP (default 2 * dim).
        project: sphere radius for the projection after each step, or None (no projection).
        num_tokens: image tokens per sample (``quadratic`` only; inputs are (batch, num_tokens, in_features)).
        transposed_term: ``keep`` | ``drop`` | ``symmetrize`` for the tied quadratic attention (see ``loss.py``).

    Shapes:
        forward(x): x (batch, in_features) for ``linear``, (batch, num_tokens, in_features) for ``quadratic``,
        float32; returns logits (batch, num_classes). ``forward(x, return_features=True)`` also returns the list of
        the ``steps + 1`` feature tensors ((batch, d) or (batch, tokens, d), class token first when ``cls``).

    Raises:
        ValueError: an unknown choice (naming the valid ones), negative steps, ``quadratic`` without ``num_tokens``,
            ``token_mlp`` with the linear model, a ``token_mlp`` whose parameter count cannot come
            within 15 % of d^2 at this ``dim``, or (at forward time) ``shuffled`` on a batch of one image.
    """

    def __init__(
        self,
        in_features: int,
        num_classes: int,
        dim: int = 64,
        steps: int = 2,
        *,
        model: str = "linear",
        mixing: str = "both",
        value: str = "tied",
        readout: str = "mean",
        share_steps: bool = True,
        step_size: float = 0.5,
        hidden: int | None = None,
        project: float | None = None,
        num_tokens: int | None = None,
        transposed_term: str = "drop",
    ) -> None:
        super().__init__()
        _check_options(model, mixing, value, readout, transposed_term, steps, num_tokens)
        self.model, self.steps, self.share_steps, self.step_size = model, steps, share_steps, step_size
        self.mixing, self.value, self.readout = mixing, value, readout
        self.project, self.transposed_term = project, transposed_term
        self.use_attention = mixing in ATTENTION_MIXINGS
        self.use_mlp = mixing in ("mlp", "both", "token_mlp")
        hidden = _mlp_hidden(mixing, dim, hidden)
        n_blocks = 0 if steps == 0 else (1 if share_steps else steps)
        self.embed = nn.Linear(in_features, dim)
        self.mlps = nn.ModuleList(_mlp(dim, hidden) for _ in range(n_blocks if self.use_mlp else 0))
        attn_blocks = n_blocks if self.use_attention else 0
        if model == "linear":
            width = dim
            if value == "free":
                self.values = nn.ParameterList(
                    nn.Parameter(torch.randn(num_classes, dim) / dim**0.5) for _ in range(attn_blocks)
                )
        else:
            assert num_tokens is not None  # _check_options: the quadratic model needs it
            width = self._build_token_parameters(num_tokens, dim, attn_blocks)
        self.theta = nn.Parameter(torch.randn(num_classes, width) / width**0.5)

    def _build_token_parameters(self, num_tokens: int, dim: int, attn_blocks: int) -> int:
        """The quadratic model's positions, CLS token, forms phi and free values (in this order: the random draws and
        the parameters' order follow it); returns the readout's width."""
        tokens = num_tokens + (1 if self.readout == "cls" else 0)
        self.position = nn.Parameter(torch.zeros(tokens, dim))
        if self.readout == "cls":
            self.cls_token = nn.Parameter(torch.zeros(dim))
        learned_form = attn_blocks if self.value != "classifier" else 0
        self.phis = nn.ParameterList(nn.Parameter(torch.randn(dim, dim) / dim) for _ in range(learned_form))
        if self.value == "free":
            self.values = nn.ParameterList(nn.Parameter(torch.randn(dim, dim) / dim**0.5) for _ in range(attn_blocks))
        return tokens * dim if self.readout == "flatten" else dim

    @property
    def classifier_parameters(self) -> list[nn.Parameter]:
        """The multinomial-regression classifier: [theta] (K, r)."""
        return [self.theta]

    def freeze_classifier(self) -> FlowNet:
        """Hold theta fixed (``requires_grad = False``): the source's setting, where only the features move."""
        for p in self.classifier_parameters:
            p.requires_grad_(False)
        return self

    @property
    def flow_parameters(self) -> list[nn.Parameter]:
        """The flow steps' parameters (phi, W_v or V, MLP): none for K = 0, ``neither`` and ``attention/classifier``."""
        skip = {"embed.weight", "embed.bias", "position", "cls_token", "theta"}
        return [p for name, p in self.named_parameters() if name not in skip]

    def flow_parameter_count(self) -> int:
        """Number of scalars in :attr:`flow_parameters` (an arm's ``flow_params``)."""
        return sum(p.numel() for p in self.flow_parameters)

    def classifier_form(self) -> Tensor:
        """theta_k = theta^T theta / ||theta||_2^2 (d, d): the token-to-token form derived from the classifier theta
        (K, d) (``value='classifier'``; spectral norm 1, so h alone sets the step size; ``docs/flows.md``)."""
        return self.theta.T @ self.theta / torch.linalg.matrix_norm(self.theta, ord=2) ** 2

    def _block(self, k: int) -> int:
        return 0 if self.share_steps else k

    def _weight_source(self, Z: Tensor) -> Tensor:
        """The features the attention weights are computed from: Z, or the previous image's (``shuffled``)."""
        if self.mixing != "shuffled":
            return Z
        batch_dim = -3 if self.model == "quadratic" else -2
        if Z.dim() < -batch_dim or Z.shape[batch_dim] < 2:
            raise ValueError(
                f"mixing='shuffled' takes its attention weights from another image of the batch; "
                f"got features of shape {tuple(Z.shape)} (a batch of at least 2 images is needed)"
            )
        return Z.roll(1, dims=batch_dim)

    def _mix(self, weights: Tensor | None, values: Tensor) -> Tensor:
        """weights @ values; ``weights=None`` (``uniform``): every row the mean of ``values``' rows, 1/n each."""
        if weights is None:
            return values.mean(dim=-2, keepdim=True).expand_as(values)
        return weights @ values

    def _attention(self, Z: Tensor, k: int) -> Tensor:
        """The attention sub-step's direction: weights from :meth:`_weight_source` (none for ``uniform``), values
        from Z itself."""
        b = self._block(k)
        W = self._weight_source(Z)
        uniform = self.mixing == "uniform"
        if self.model == "linear":
            targets = self.values[b] if self.value == "free" else -self.theta  # (K, d): tied is repulsive
            if uniform:
                return targets.mean(dim=0).expand_as(Z)
            return torch.softmax(W @ self.theta.T, dim=-1) @ targets
        if self.value == "classifier":
            theta = self.classifier_form()
        else:
            phi = self.phis[b]
            theta = phi @ phi.T
        weights = None if uniform else quadratic_weights(W, theta)
        if self.value == "free":
            return self._mix(weights, Z @ self.values[b])
        values = Z @ theta
        if self.transposed_term == "drop":
            return -self._mix(weights, values)
        if self.transposed_term == "symmetrize":
            return -2 * self._mix(weights, values)
        transposed = None if weights is None else weights.transpose(-1, -2)
        return -(self._mix(weights, values) + self._mix(transposed, values))

    def embed_inputs(self, x: Tensor) -> Tensor:
        """Z_0: the embedded inputs ((batch, d), or (batch, tokens, d) with positions and the class token)."""
        Z = self.embed(x)
        if self.model == "quadratic":
            if self.readout == "cls":
                Z = torch.cat([self.cls_token.expand(Z.shape[0], 1, -1), Z], dim=1)
            Z = Z + self.position
        if self.project is not None:
            Z = project_to_sphere(Z, self.project)
        return Z

    def step(self, Z: Tensor, k: int) -> Tensor:
        """One flow step k: attention sub-step + residual, then MLP sub-step + residual (those the arm has)."""
        h = self.step_size
        if self.use_attention:
            Z = Z + h * self._attention(Z, k)
        if self.use_mlp:
            Z = Z + h * self.mlps[self._block(k)](Z)
        if self.project is not None:
            Z = project_to_sphere(Z, self.project)
        return Z

    def features(self, x: Tensor) -> list[Tensor]:
        """The features after 0, 1, ..., steps flow steps (a list of ``steps + 1`` tensors)."""
        out = [self.embed_inputs(x)]
        for k in range(self.steps):
            out.append(self.step(out[-1], k))
        return out

    def read_out(self, Z: Tensor) -> Tensor:
        """(batch, r) classifier input: Z itself (linear), the token mean, the class token, or the flattened tokens."""
        if self.model == "linear":
            return Z
        if self.readout == "mean":
            return Z.mean(dim=-2)
        if self.readout == "cls":
            return Z[..., 0, :]
        return Z.flatten(-2)

    def classify(self, Z: Tensor) -> Tensor:
        """Logits (batch, num_classes) = readout(Z) theta^T."""
        return self.read_out(Z) @ self.theta.T

    def forward(self, x: Tensor, return_features: bool = False) -> Tensor | tuple[Tensor, list[Tensor]]:
        feats = self.features(x)
        logits = self.classify(feats[-1])
        return (logits, feats) if return_features else logits
