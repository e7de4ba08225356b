"""The flow experiment's budget pilot: validation accuracy after every epoch, to twice the default budget.

    OMP_NUM_THREADS=1 nice -n 19 python benchmarks/flow_curve.py [LR_STORE] [OUT_DIR] [TIMES]

Same data, split, noise (the median level), selection seeds (never reported) and code as the learning-rate choice of
``axiomformer flow`` (``axiomformer.flows.experiment.choose_lrs``): the K = 0 fit (embedding + theta) trained for
2 x ``fit_epochs``, and the arms at the largest default K with theta fixed trained for 2 x ``epochs`` from the
standard ``fit_epochs`` fit, each at the rate the default run chose for it (``LR_STORE``: a ``flow_results.json`` or
``flow_results.partial.json`` with ``"lr"``, or several, comma-separated; default the committed store).
Writes ``OUT_DIR/flow_curve.json``
(default ``benchmarks/results/flow``) with every curve and, per curve, the gain from the default budget's epoch to the
best later epoch (``gain_after_budget``, mean over the seeds), and ``flow_curve.png``.

``TIMES`` (default 2): how many times the default budget the curves run (4: to 80 arm epochs, to find where the
MLP arms' curves, still rising at 40, level off).

A pilot: it claims nothing about the arms; it shows whether the default epochs reach the plateau.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np


def main(lr_store: str, out_dir: str, times: int = 2) -> None:
    from axiomformer.flows.data import load_dataset
    from axiomformer.flows.experiment import (
        ArmSetup,
        accuracy,
        arm_names,
        build_arm,
        default_config,
        fixed_noise,
        lr_key,
        make_net,
        prepare,
        selection_seeds,
        train_group,
    )
    from axiomformer.runtime import seeded

    t0, c0 = time.perf_counter(), time.process_time()
    cfg = default_config()
    lrs = {k: v for path in lr_store.split(",") for k, v in json.loads(Path(path).read_text())["lr"].items()}
    ds = load_dataset("mnist5k", None, seed=0)
    x, y, _, _ = prepare(ds, cfg)
    n_val = max(1, int(len(x) * cfg.val_fraction))
    xt, yt, xv, yv = x[:-n_val], y[:-n_val], x[-n_val:], y[-n_val:]
    sigma = float(np.median([0.0, 1.0]))  # the default noise levels' median, as choose_lrs
    seeds = selection_seeds(cfg, 0)
    xv = xv + sigma * fixed_noise(xv.shape, 777)
    K = max(cfg.K)
    curves: dict[str, dict] = {}

    def record(name: str, budget: int, lr: float):
        rows: list[list[float]] = []
        curves[name] = {"lr": lr, "budget_epochs": budget, "val_acc": rows}

        def on_epoch(epoch: int, nets: list) -> None:
            rows.append([accuracy(n, xv, yv) for n in nets])

        return on_epoch

    fit_nets = []
    for s in seeds:
        with seeded(s):
            fit_nets.append(make_net(cfg, x=xt, num_classes=int(yt.max()) + 1, K=0))
    train_group(
        fit_nets,
        x=xt,
        y=yt,
        sigmas=[sigma] * len(seeds),
        seeds=seeds,
        epochs=times * cfg.fit_epochs,
        lr=cfg.lr,
        cfg=cfg,
        on_epoch=record("fit (K = 0, theta trained)", cfg.fit_epochs, cfg.lr),
    )
    fits = []
    for s in seeds:  # the standard fit the arms start from
        with seeded(s):
            fits.append(make_net(cfg, x=xt, num_classes=int(yt.max()) + 1, K=0))
    fits = train_group(
        fits, x=xt, y=yt, sigmas=[sigma] * len(seeds), seeds=seeds, epochs=cfg.fit_epochs, lr=cfg.lr, cfg=cfg
    )
    arms = [
        a
        for a in arm_names(cfg)
        if a[0] in ("attention/tied", "attention/classifier", "token_mlp", "mlp", "both/tied", "neither")
    ]
    for arm, mixing, value in arms:
        k = 0 if mixing == "neither" else K
        lr = lrs[lr_key("fixed", arm, k)]
        name = f"{arm} K={k}"
        train_arm_curve = record(name, cfg.epochs, lr)
        nets = [  # as train_arm builds them; batches and noise from seed + 1, as train_arm
            build_arm(f, ArmSetup("fixed", mixing, value, k), cfg=cfg, x=xt, seed=s) for f, s in zip(fits, seeds)
        ]
        train_group(
            nets,
            x=xt,
            y=yt,
            sigmas=[sigma] * len(seeds),
            seeds=[s + 1 for s in seeds],
            epochs=times * cfg.epochs,
            lr=lr,
            cfg=cfg,
            on_epoch=train_arm_curve,
        )
        print(name, "done", f"[{time.perf_counter() - t0:.0f} s wall]", flush=True)
    for c in curves.values():
        mean = np.asarray(c["val_acc"]).mean(axis=1)
        b = c["budget_epochs"]
        c["mean"] = mean.tolist()
        c["at_budget"] = float(mean[b - 1])
        c["best_after_budget"] = float(mean[b:].max())
        c["gain_after_budget"] = float(mean[b:].max() - mean[b - 1])
        c["best_epoch"] = int(mean.argmax()) + 1
    result = {
        "what": f"validation accuracy after every epoch, to {times}x the default budget (a pilot, claims nothing)",
        "data": "mnist5k",
        "n_train": len(xt),
        "n_val": len(xv),
        "noise": sigma,
        "seeds": seeds,
        "theta": "fixed",
        "lr_store": lr_store,
        "config": {"fit_epochs": cfg.fit_epochs, "epochs": cfg.epochs, "K": K, "dim": cfg.dim, "batch": cfg.batch_size},
        "curves": curves,
        "runtime_s": round(time.perf_counter() - t0, 1),
        "cpu_s": round(time.process_time() - c0, 1),
    }
    out = Path(out_dir)
    (out / "flow_curve.json").write_text(json.dumps(result, indent=1))
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5, 4))
    ax = fig.subplots()
    for name, c in curves.items():
        ax.plot(range(1, len(c["mean"]) + 1), c["mean"], label=f"{name} (lr {c['lr']:g})")
        ax.axvline(c["budget_epochs"], color="grey", lw=0.5, ls=":")
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation accuracy (mean of 2 selection seeds)")
    ax.set_title(f"flow budget pilot: mnist5k, noise {sigma:g}, theta fixed; dotted: default budgets", fontsize=8)
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out / "flow_curve.png", dpi=110)
    for name, c in curves.items():
        print(
            f"{name}: at budget {c['at_budget']:.3f}, best later {c['best_after_budget']:.3f} (gain {c['gain_after_budget']:+.3f}), best epoch {c['best_epoch']}"
        )
    print(f"{result['runtime_s']} s wall, {result['cpu_s']} s CPU")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(
        args[0] if args else "benchmarks/results/flow/flow_results.json",
        args[1] if len(args) > 1 else "benchmarks/results/flow",
        int(args[2]) if len(args) > 2 else 2,
    )
