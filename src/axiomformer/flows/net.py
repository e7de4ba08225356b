"""``FlowNet``: K unrolled steps of the feature flow, with a learned token-wise MLP in place of the label term.

Source 2 of ``docs/SOURCES.md``. At inference the labels C are unknown, so the label term of the flow (C theta in the
linear model, (C + C^T) Z theta in the quadratic one) is replaced by a learned token-wise MLP, trained end to end
(option (b) of SOURCES.md, **our choice**). Each step is one Lie-Trotter step with explicit-Euler sub-steps, i.e. one
Transformer block:

    Z <- Z + h * attention(Z)        linear model:    -CA(Z, theta_k)      (cross-attention to the class embeddings)
                                     quadratic model: -SA(Z) [- RA(Z)]     (self-attention across tokens)
    Z <- Z + h * MLP_k(Z)            the learned stand-in for the label term
    Z <- r * Z / |Z|                 optional sphere projection (LayerNorm analogue, our choice)

followed by the multinomial-regression classifier on top. With ``steps=0`` the network is the embedding followed by
the classifier: plain multinomial regression on the (linearly embedded) inputs.

Linear model: one feature vector per sample, Z (batch, dim); the attention keys/values are the classifier's own class
embeddings ``theta`` (K, dim) — the fixed-classifier reading of the source — and the logits are Z theta^T + b.
Quadratic model: tokens Z (batch, tokens, dim) from a linear patch embedding plus a learned position embedding;
theta_k = phi_k phi_k^T; the classifier reads the flattened tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from axiomformer.flows.integrators import project_to_sphere
from axiomformer.flows.loss import MODELS, TRANSPOSED_TERMS
from axiomformer.flows.operators import cross_attention, reverse_attention, self_attention


def _mlp(dim: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))


class FlowNet(nn.Module):
    """K flow steps between a linear embedding and a multinomial-regression classifier.

    Args:
        in_features: input width (per sample for ``linear``; per token for ``quadratic``).
        num_classes: number of classes K.
        dim: feature width d.
        steps: number of unrolled flow steps (layers); 0 gives multinomial regression.
        model: ``"linear"`` (cross-attention to class embeddings) or ``"quadratic"`` (self-attention over tokens).
        tied: share the MLP (and, quadratic, phi) across steps (a time-invariant flow) or not.
        step_size: h, the residual scale.
        hidden: hidden width of the token-wise MLP (default 2 * dim).
        project: sphere radius for the projection after each step, or None (no projection).
        num_tokens: tokens per sample (``quadratic`` only; inputs are (batch, num_tokens, in_features)).
        transposed_term: ``keep`` | ``drop`` | ``symmetrize`` for the quadratic attention (see ``loss.py``).
        attention: ``False`` removes the attention sublayer (an MLP-only residual network: the ablation that tells
            whether the attention term itself helps).

    Shapes:
        forward(x): x (batch, in_features) for ``linear``, (batch, num_tokens, in_features) for ``quadratic``;
        returns logits (batch, num_classes). ``forward(x, return_features=True)`` returns the list of the
        ``steps + 1`` feature tensors too.

    Raises:
        ValueError: unknown model / transposed_term, negative steps, or ``quadratic`` without ``num_tokens``.
    """

    def __init__(self, in_features: int, num_classes: int, dim: int = 64, steps: int = 2, *, model: str = "linear",
                 tied: bool = True, step_size: float = 0.5, hidden: int | None = None, project: float | None = None,
                 num_tokens: int | None = None, transposed_term: str = "drop", attention: bool = True):
        super().__init__()
        if model not in MODELS:
            raise ValueError(f"unknown model {model!r}; choose one of: {', '.join(MODELS)}")
        if transposed_term not in TRANSPOSED_TERMS:
            raise ValueError(f"unknown transposed_term {transposed_term!r}; choose one of: {', '.join(TRANSPOSED_TERMS)}")
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        if model == "quadratic" and not num_tokens:
            raise ValueError("model='quadratic' needs num_tokens (inputs are (batch, num_tokens, in_features))")
        self.model, self.steps, self.tied, self.step_size = model, steps, tied, step_size
        self.project, self.transposed_term, self.attention = project, transposed_term, attention
        hidden = hidden or 2 * dim
        n_blocks = 0 if steps == 0 else (1 if tied else steps)
        self.embed = nn.Linear(in_features, dim)
        self.mlps = nn.ModuleList(_mlp(dim, hidden) for _ in range(n_blocks))
        if model == "linear":
            self.theta = nn.Parameter(torch.randn(num_classes, dim) / dim ** 0.5)
            self.bias = nn.Parameter(torch.zeros(num_classes))
        else:
            self.position = nn.Parameter(torch.zeros(num_tokens, dim))
            self.phis = nn.ParameterList(nn.Parameter(torch.randn(dim, dim) / dim) for _ in range(n_blocks))
            self.classifier = nn.Linear(num_tokens * dim, num_classes)

    def _attention(self, Z: Tensor, k: int) -> Tensor:
        if self.model == "linear":
            return -cross_attention(Z, self.theta)
        phi = self.phis[0 if self.tied else k]
        theta = phi @ phi.T
        if self.transposed_term == "drop":
            return -self_attention(Z, theta)
        if self.transposed_term == "symmetrize":
            return -2 * self_attention(Z, theta)
        return -(self_attention(Z, theta) + reverse_attention(Z, theta))

    def features(self, x: Tensor) -> list[Tensor]:
        """The features after 0, 1, ..., steps flow steps (a list of ``steps + 1`` tensors)."""
        Z = self.embed(x)
        if self.model == "quadratic":
            Z = Z + self.position
        if self.project is not None:
            Z = project_to_sphere(Z, self.project)
        out = [Z]
        h = self.step_size
        for k in range(self.steps):
            if self.attention:
                Z = Z + h * self._attention(Z, k)                       # attention sublayer + residual
            Z = Z + h * self.mlps[0 if self.tied else k](Z)             # label-term stand-in + residual
            if self.project is not None:
                Z = project_to_sphere(Z, self.project)
            out.append(Z)
        return out

    def classify(self, Z: Tensor) -> Tensor:
        """Logits (batch, num_classes) of the classifier on top."""
        if self.model == "linear":
            return Z @ self.theta.T + self.bias
        return self.classifier(Z.flatten(1))

    def forward(self, x: Tensor, return_features: bool = False):
        feats = self.features(x)
        logits = self.classify(feats[-1])
        return (logits, feats) if return_features else logits
