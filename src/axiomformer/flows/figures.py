"""Figures of ``axiomformer flow`` (matplotlib, Agg backend): oracle loss, accuracy against K, PCA of trajectories."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def write_figures(out: Path, result: dict, oracle: dict, noisy: dict, theta: torch.Tensor) -> list[str]:
    """Write ``flow_loss.png``, ``flow_accuracy.png``, ``flow_pca.png`` into ``out``; return their paths.

    ``oracle`` is the clean oracle flow (loss figure); ``noisy`` the oracle flow from noisy features (PCA figure).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.decomposition import PCA

    paths = []

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(result["oracle_loss"], marker=".")
    ax.set_xlabel("flow step (Lie-Trotter, h = 1/||theta||^2)")
    ax.set_ylabel("mean cross-entropy")
    ax.set_title(f"oracle flow on {result['dataset']} training features")
    fig.tight_layout()
    paths.append(out / "flow_loss.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for noise, row in result["accuracy"].items():
        ks = sorted(row, key=int)
        ax.plot([int(k) for k in ks], [row[k] for k in ks], marker="o", label=f"noise {float(noise):g}")
    ax.set_xlabel("flow steps K (0 = multinomial regression)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"FlowNet on {result['dataset']} (mean of {len(result['seeds'])} seed(s))")
    ax.legend()
    fig.tight_layout()
    paths.append(out / "flow_accuracy.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    # PCA of the oracle trajectories: a few points per class and their class embeddings (drawn as directions).
    traj = noisy["sample"].numpy()                                   # (steps + 1, m, d)
    yy = noisy["sample_labels"].numpy()
    pca = PCA(n_components=2).fit(np.concatenate([traj[0], traj[-1]]))
    fig, ax = plt.subplots(figsize=(5.5, 5))
    cmap = plt.get_cmap("tab10")
    for i in range(traj.shape[1]):
        path = pca.transform(traj[:, i])
        ax.plot(path[:, 0], path[:, 1], color=cmap(yy[i] % 10), lw=0.7, alpha=0.7)
        ax.scatter(path[-1, 0], path[-1, 1], color=cmap(yy[i] % 10), s=8)
    th = theta.numpy() @ pca.components_.T                           # class embedding directions in the PCA plane
    radius = np.abs(pca.transform(traj[-1])).max()
    for c, v in enumerate(th):
        v = v / max(np.linalg.norm(v), 1e-12) * radius
        ax.scatter(v[0], v[1], marker="*", s=160, color=cmap(c % 10), edgecolor="k", zorder=3)
        ax.annotate(str(c), (v[0], v[1]), fontsize=8)
    ax.set_title(f"oracle flow from noisy features (noise {result['oracle_noisy']['noise']:g}), 2-D PCA:\n"
                 "features move toward their class embedding (* = direction of theta_c)")
    ax.title.set_fontsize(9)
    fig.tight_layout()
    paths.append(out / "flow_pca.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return [str(p) for p in paths]
