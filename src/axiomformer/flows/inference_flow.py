"""Flows of a fitted network's features with theta held fixed: test-time flows (no labels) and the oracle flow.

Source 2 of ``docs/SOURCES.md``: with theta fixed the features follow -dL/dZ. At test time the labels C are unknown,
so the label-free flow measured is (**our choice**):

    attention_term   the attention term of the flow alone, Z <- Z + h A(Z): linear model A = -CA(Z, theta);
                     quadratic model A = -SA(Z) with the token-to-token form theta_q = theta^T theta built from the
                     class embeddings (mean / cls readout only); h = 1/||theta||_2^2.

A pseudo-label flow (gradient steps of the cross-entropy with C = one-hot of the network's own current prediction)
was measured and removed: it cannot change a prediction. Descending -log p_c for the predicted class c raises p_c, and
near a decision boundary between c and j (p_c = p_j = 1/2, the other classes negligible) one step moves the margin
l_c - l_j by h |theta_c - theta_j|^2 / 2 > 0 (linear logits; through the mean readout the same with h / n): it widens
exactly the margins that could flip. Over every seed, noise level and K of the committed run its accuracy equalled
K = 0's (max |difference| 0.0).

Every step of a label-free flow must move the features: a step that leaves them unchanged raises (a no-op arm would
otherwise report K = 0's accuracy as a flow result).

The oracle flow uses the true labels, so its accuracy rise is guaranteed by construction: it is a sanity check of the
integrator and the step size, reported under "sanity" and never beside accuracies.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from axiomformer.flows.integrators import lie_trotter
from axiomformer.flows.loss import feature_gradient, multinomial_loss, vector_fields
from axiomformer.flows.net import FlowNet
from axiomformer.flows.operators import cross_attention, self_attention

LABEL_FREE_METHODS = ("attention_term",)


def _spectral_sq(theta: Tensor) -> float:
    return float(torch.linalg.matrix_norm(theta.double(), ord=2)) ** 2


def label_free_flow(
    net: FlowNet, x: Tensor, y: Tensor, K: Sequence[int], methods: Sequence[str] = LABEL_FREE_METHODS
) -> dict[tuple[str, int], float]:
    """Accuracy of ``net``'s classifier after K label-free flow steps of its test features, theta fixed.

    Args:
        net: a trained network (its embedding gives Z_0; its theta (K, r) is the fixed classifier).
        x: test inputs shaped as ``net`` expects; y: (n,) labels, used only to score.
        K: the numbers of flow steps to report (0 = no flow), ``FlowConfig.K``.

    Returns:
        ``{(method, K): accuracy}``; ``attention_term`` is absent for the ``flatten`` readout (no (d, d) form).

    Raises:
        RuntimeError: a flow step left the features unchanged (a no-op arm).
    """
    out: dict[tuple[str, int], float] = {}
    with torch.no_grad():
        Z0 = net.embed_inputs(x)
    for method in methods:
        if method == "attention_term" and net.model == "quadratic" and net.readout == "flatten":
            continue
        step = flow_step(net, method)
        Z = Z0
        for k in range(max(K) + 1):
            if k in K:
                with torch.no_grad():
                    out[(method, k)] = float((net.classify(Z).argmax(-1) == y).float().mean())
            if k < max(K):
                moved = step(Z)
                if torch.equal(moved, Z):
                    raise RuntimeError(
                        f"the label-free flow {method!r} left the features unchanged at step {k + 1}: a no-op arm "
                        "would report K = 0's accuracy as a flow result"
                    )
                Z = moved
    return out


def flow_step(net: FlowNet, method: str) -> Callable[[Tensor], Tensor]:
    """One step Z -> Z + h A(Z) of the label-free flow ``method`` (one of :data:`LABEL_FREE_METHODS`) with ``net``'s
    theta fixed: features (batch, d) for the linear model, (batch, tokens, d) for the quadratic one.

    Raises:
        ValueError: an unknown method (the valid ones are named).
    """
    if method not in LABEL_FREE_METHODS:
        raise ValueError(f"unknown label-free flow {method!r}; choose one of {', '.join(LABEL_FREE_METHODS)}")
    theta = net.theta.detach()
    norm_sq = _spectral_sq(theta)
    if net.model == "linear":
        return lambda Z: Z - cross_attention(Z, theta) / norm_sq
    theta_q = theta.T @ theta
    return lambda Z: Z - self_attention(Z, theta_q) / norm_sq


def oracle_flow(Z0: Tensor, theta: Tensor, y: Tensor, steps: int) -> dict:
    """Oracle flow with the true labels: dZ/dt = C theta - CA(Z, theta), Lie-Trotter with h = 1/||theta||_2^2.

    h is below 2/Lipschitz of the per-row gradient (Hessian theta^T (diag p - p p^T) theta, norm <= ||theta||^2), so
    every step is a descent step and the loss must fall monotonically.

    Returns:
        ``loss`` and ``accuracy`` per step (mean over rows), ``monotone``, ``step_size``.
    """
    Z, theta = Z0.double(), theta.double()
    C = F.one_hot(y, theta.shape[0]).double()
    h = 1.0 / _spectral_sq(theta)
    attention, label = vector_fields(theta, C, "linear")
    losses, acc = [], []
    for step in range(steps + 1):
        if step:
            Z = lie_trotter(attention, label, Z, h, 1)
        losses.append(float(multinomial_loss(Z, theta, C)) / len(Z))
        acc.append(float(((Z @ theta.T).argmax(-1) == y).double().mean()))
    monotone = all(b <= a + 1e-12 * abs(a) for a, b in itertools.pairwise(losses))
    return {"loss": losses, "accuracy": acc, "monotone": monotone, "step_size": h}


def _soft_target_check(seed: int) -> dict:
    """Closed-form gradient against autograd for targets whose rows do not sum to 1 (float64)."""
    g = torch.Generator().manual_seed(seed)
    errors = {}
    for model, term in (("linear", "keep"), ("quadratic", "keep")):
        n, d = 6, 4
        Z = torch.randn(n, d, generator=g, dtype=torch.float64)
        if model == "linear":
            theta = torch.randn(3, d, generator=g, dtype=torch.float64)
            C = 2 * torch.rand(n, 3, generator=g, dtype=torch.float64)
        else:
            phi = torch.randn(d, 2, generator=g, dtype=torch.float64)
            theta = phi @ phi.T
            C = 2 * torch.rand(n, n, generator=g, dtype=torch.float64)
        Zg = Z.clone().requires_grad_(True)
        (auto,) = torch.autograd.grad(multinomial_loss(Zg, theta, C, model), Zg)
        errors[model] = float((feature_gradient(Z, theta, C, model, term) - auto).abs().max())
    return errors


def sanity_checks(net: FlowNet, *, x: Tensor, y: Tensor, sigma: float, seed: int, steps: int) -> dict:
    """The oracle flow of ``net``'s read-out training features (true labels, noise ``sigma``) and the soft-target
    gradient check; JSON-ready. Not results: the oracle's accuracy rise is guaranteed by construction."""
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(20_000 + seed))
    with torch.no_grad():
        Z = net.read_out(net.embed_inputs(x + sigma * noise))
    oracle = oracle_flow(Z, net.theta.detach(), y, steps)
    return {
        "oracle_flow": {
            "note": "uses the TRUE training labels: the loss must fall and the accuracy must rise by construction; "
            "a check of the integrator and step size, not an accuracy result",
            "noise": sigma,
            "steps": steps,
            "step_size": oracle["step_size"],
            "monotone": oracle["monotone"],
            "loss_first": oracle["loss"][0],
            "loss_last": oracle["loss"][-1],
            "accuracy_first": oracle["accuracy"][0],
            "accuracy_last": oracle["accuracy"][-1],
        },
        "soft_targets_closed_form_vs_autograd_max_abs": _soft_target_check(seed),
        "k0_and_neither_shared": "K = 0 and the 'neither' arm have no flow parameters: one network per theta "
        "setting, reported under every arm",
        "mean_features_norm": float(np.linalg.norm(Z.numpy(), axis=-1).mean()),
    }
