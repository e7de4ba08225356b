"""The feature-refinement experiment of ``axiomformer flow`` (protocol: ``docs/flows.md``; all of it **our choice**).

Source 2 of ``docs/SOURCES.md`` reports that, with a multinomial regression held fixed, "a few iterative attention
updates markedly improve classification on clean and noisy inputs" (Fashion-MNIST). Its model, noise model, step counts
and numbers were not available to us, so this is our own protocol, and every number it prints is ours:

1. data: images as patch tokens (quadratic model) or one vector per image (linear model); pixels standardized by the
   training pixel mean and std, so the noise sigma is in units of the pixel std;
2. fit: per (seed, noise), the K = 0 network (embedding + multinomial regression theta, no intercept) is trained with
   Gaussian noise augmentation at that sigma: this fits theta;
3. arms: every (theta setting, mixing, value map, K) network starts from that fit and is trained for the same number of
   epochs with the same learning-rate rule; ``theta=fixed`` freezes theta (not in the optimizer), ``theta=learned``
   trains it too. K = 0 and the ``neither`` arm have no flow parameters, so they are one network per theta setting,
   reported under every arm (identical by construction);
4. evaluation: test accuracy at the same sigma with one fixed noise draw per seed; mean over seeds and a 95% Student-t
   interval (``scipy.stats.t``);
5. test-time flow (``inference_flow.py``): the fitted network's test features flowed without labels, and the oracle flow
   with true labels as a sanity check only.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from axiomformer.flows.data import Dataset, load_dataset, patchify
from axiomformer.flows.loss import MODELS
from axiomformer.flows.net import ATTENTION_MIXINGS, MIXING_READOUTS, MIXINGS, READOUTS, VALUES, FlowNet
from axiomformer.runtime import seeded

THETAS = ("fixed", "learned")
AA_ARM = "attention/tied (A/A)"
"""The A/A control's arm: attention/tied again, its flow parameters drawn from another initialization stream
(:data:`AA_INIT_OFFSET`), trained at attention/tied's chosen learning rate on the same batches and noise. Compared with
attention/tied it must never come out higher or lower: if it does, the design is broken."""
AA_INIT_OFFSET = 7_919_000
"""Added to a run's seed for the A/A arm's initialization (far from every reported and selection seed)."""
INTERVAL = "95% Student-t interval over seeds (scipy.stats.t.interval); null when n_seeds < 2"


@dataclass
class FlowConfig:
    """The protocol's settings (our choice; see docs/flows.md). Validated by :func:`run_flow_experiment`."""

    model: str = "quadratic"
    patch: int = 7
    readout: str = "mean"
    thetas: tuple[str, ...] = ("fixed", "learned")
    mixings: tuple[str, ...] = ("attention", "shuffled", "uniform", "token_mlp", "mlp", "both", "neither")
    values: tuple[str, ...] = ("tied", "classifier")
    dim: int = 16
    hidden: int = 32
    step_size: float = 0.5
    share_steps: bool = True
    transposed_term: str = "drop"
    fit_epochs: int = 10
    epochs: int = 15
    batch_size: int = 128
    lr: float = 3e-3
    lr_grid: tuple[float, ...] = ()
    lr_epochs: int | None = None
    """The epochs of each learning-rate selection run (None: ``epochs``, the default). A shorter selection run is
    cheaper but can choose a rate that diverges at the full budget (``benchmarks/results/flow/pilot_80ep_lr20``)."""
    lr_rank: int = 1
    """Which rate of each cell's validation ranking the arms train at: 1, the chosen one; 2, the second best (the
    runs of the learning-rate check, :func:`axiomformer.flows.comparisons.lr_check`)."""
    weight_decay: float = 0.0
    seeds: int = 5
    max_train: int | None = None
    max_test: int | None = None
    val_fraction: float = 0.2
    lr_seeds: int = 2
    oracle_steps: int = 100
    equivalence_margin: float = 0.02
    aa_control: bool = True
    """Train the A/A arm :data:`AA_ARM` beside attention/tied (needs the attention mixing and the tied value)."""
    K: tuple[int, ...] = (0, 1, 2, 4, 8)
    """The numbers of flow steps K of the arms (0 = multinomial regression): the command line's ``--steps``, the
    store's ``"K"`` (its list, and each row's value)."""


def default_config(quick: bool = False, **overrides: Any) -> FlowConfig:
    """The default run: theta fixed (the source's setting) and learned, K = 0, 1, 2, 4, 8, the A/A copy of
    attention/tied, 16 seeds (a power calculation from a previous store's variance, ``benchmarks/flow_power.py``),
    2,000 training / 1,000 test images, 10 fit + 80 arm epochs of batch 128 (the committed pilot to 80 epochs,
    ``benchmarks/flow_curve.py`` at K = 8, ``benchmarks/results/flow/budget_x4``: token_mlp stays within 0.01 of its
    best from epoch 70 on, attention/tied from 55, mlp from 38), the learning rate chosen per (theta, arm, K) from
    {1e-3, 3e-3, 1e-2, 3e-2} on a validation split with 2 selection seeds of its own, each rate trained for the full
    80 epochs (a pilot that chose them on 20-epoch runs, ``benchmarks/results/flow/pilot_80ep_lr20``, saw deep arms
    diverge at 80 epochs at those rates: a rate must be chosen at the budget it trains for).
    ``quick`` (a pilot that claims nothing): 2 seeds (so intervals exist), 1,000 / 500 images, 4 + 4 epochs of
    batch 128, the fixed lr 3e-3 for every arm."""
    cfg = FlowConfig(lr_grid=(1e-3, 3e-3, 1e-2, 3e-2), max_train=2000, max_test=1000, seeds=16, epochs=80)
    if quick:
        cfg = FlowConfig(seeds=2, max_train=1000, max_test=500, fit_epochs=4, epochs=4, batch_size=128, oracle_steps=50)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    if cfg.model == "linear":  # no token_mlp; the classifier value is the tied one there
        if "mixings" not in overrides:
            cfg.mixings = tuple(m for m in cfg.mixings if m != "token_mlp")
        if "values" not in overrides:
            cfg.values = tuple(v for v in cfg.values if v != "classifier") + ("free",)
    return cfg


def _validate(cfg: FlowConfig, noise: list[float]) -> None:
    def check(name: str, values: list[str], choices: tuple[str, ...]) -> None:
        bad = [v for v in values if v not in choices]
        if bad or not values:
            raise ValueError(f"unknown {name} {bad or values!r}; choose from: {', '.join(choices)}")

    check("model", [cfg.model], MODELS)
    check("readout", [cfg.readout], READOUTS)
    check("theta setting", list(cfg.thetas), THETAS)
    check("mixing", list(cfg.mixings), MIXINGS)
    check("value map", list(cfg.values), VALUES)
    if cfg.model == "linear" and "token_mlp" in cfg.mixings:
        raise ValueError(
            "mixing token_mlp needs --model quadratic (the linear model's tied attention step has no "
            "parameters to match)"
        )
    if any(s < 0 for s in noise) or any(k < 0 for k in cfg.K) or not noise or not cfg.K:
        raise ValueError(f"noise levels and flow steps K must be non-empty and >= 0; got noise={noise}, K={cfg.K}")
    if not 1 <= cfg.lr_rank <= max(1, len(cfg.lr_grid)):
        raise ValueError(f"lr_rank must be 1 or at most the grid's size {len(cfg.lr_grid)}; got {cfg.lr_rank}")
    if cfg.seeds < 1 or min(cfg.epochs, cfg.fit_epochs, cfg.lr_epochs or 0) < 0:
        raise ValueError(
            f"seeds must be >= 1 and epochs >= 0; got seeds={cfg.seeds}, epochs={cfg.epochs}, "
            f"fit_epochs={cfg.fit_epochs}, lr_epochs={cfg.lr_epochs}"
        )


def t_interval(values: Sequence[float]) -> tuple[float, float | None, float | None]:
    """(mean, low, high): the 95% Student-t interval of the mean over seeds; (mean, None, None) for one value."""
    from scipy import stats

    a = np.asarray(values, dtype=float)
    mean = float(a.mean())
    if len(a) < 2:
        return mean, None, None
    sem = float(stats.sem(a))
    if sem == 0.0:
        return mean, mean, mean
    low, high = stats.t.interval(0.95, len(a) - 1, loc=mean, scale=sem)
    return mean, float(low), float(high)


def prepare(ds: Dataset, cfg: FlowConfig) -> tuple[torch.Tensor, ...]:
    """Standardized float32 inputs: (n, tokens, patch^2) for ``quadratic``, (n, pixels) for ``linear``."""
    xtr, ytr, xte, yte = ds.x_train, ds.y_train, ds.x_test, ds.y_test
    if cfg.max_train:
        xtr, ytr = xtr[: cfg.max_train], ytr[: cfg.max_train]
    if cfg.max_test:
        xte, yte = xte[: cfg.max_test], yte[: cfg.max_test]
    mu, sd = xtr.mean(), xtr.std()  # one scalar each: noise is measured in units of the pixel std

    def f(a):
        a = (a - mu) / sd
        if cfg.model == "quadratic":
            a = patchify(a, ds.side, cfg.patch)
        return torch.tensor(a, dtype=torch.float32)

    return f(xtr), torch.tensor(ytr), f(xte), torch.tensor(yte)


def make_net(
    cfg: FlowConfig, *, x: torch.Tensor, num_classes: int, K: int, mixing: str = "neither", value: str = "tied"
) -> FlowNet:
    """The FlowNet of one arm, K flow steps, for inputs shaped like ``x``."""
    tokens = x.shape[1] if cfg.model == "quadratic" else None
    return FlowNet(
        x.shape[-1],
        num_classes,
        cfg.dim,
        K,
        model=cfg.model,
        mixing=mixing,
        value=value,
        readout=cfg.readout,
        share_steps=cfg.share_steps,
        step_size=cfg.step_size,
        hidden=cfg.hidden,
        num_tokens=tokens,
        transposed_term=cfg.transposed_term,
    )


def train_group(
    nets: list[FlowNet],
    *,
    x: torch.Tensor,
    y: torch.Tensor,
    sigmas: list[float],
    seeds: list[int],
    epochs: int,
    lr: float,
    cfg: FlowConfig,
    on_epoch: Callable[[int, list[FlowNet]], None] | None = None,
) -> list[FlowNet]:
    """Train networks of one architecture side by side (``torch.func.vmap`` over their stacked parameters).

    Network m sees its own batches and noise: a generator seeded by ``seeds[m]`` draws the permutation of every epoch
    and the Gaussian noise of std ``sigmas[m]`` of every batch, in the same order as training it alone. AdamW is
    element-wise, so one optimizer over the stacked parameters is one AdamW per network. Parameters with
    ``requires_grad=False`` (a frozen theta) are not in the optimizer and come back bit-identical.

    ``on_epoch(epoch, nets)``, if given, is called after every epoch (1, 2, ...) with ``nets`` holding that epoch's
    weights, in eval mode (a training curve; the training itself is unchanged).

    Returns:
        ``nets``, trained in place, in eval mode.
    """
    from torch.func import functional_call, stack_module_state

    for net in nets:
        net.train()
    params, buffers = stack_module_state(nets)
    trainable = [p for p in params.values() if p.requires_grad]
    if trainable and epochs > 0:
        base = copy.deepcopy(nets[0]).to("meta")
        batched = torch.vmap(lambda p, b, xb: functional_call(base, (p, b), (xb,)))
        gens = [torch.Generator().manual_seed(s) for s in seeds]
        scale = torch.tensor(sigmas, dtype=x.dtype).reshape(-1, *[1] * x.dim())
        opt = torch.optim.AdamW(trainable, lr=lr, weight_decay=cfg.weight_decay)
        for epoch in range(epochs):
            perms = [torch.randperm(len(x), generator=g) for g in gens]
            for i in range(0, len(x), cfg.batch_size):
                idx = torch.stack([perm[i : i + cfg.batch_size] for perm in perms])  # (M, b)
                xb = x[idx]
                noise = torch.stack([torch.randn(xb.shape[1:], generator=g) for g in gens])
                logits = batched(params, buffers, xb + scale * noise)  # (M, b, classes)
                loss = F.cross_entropy(logits.flatten(0, 1), y[idx].flatten()) * len(nets)  # sum of per-net means
                opt.zero_grad()
                loss.backward()
                opt.step()
            if on_epoch is not None:
                _unstack(nets, params)
                on_epoch(epoch + 1, [net.eval() for net in nets])
                for net in nets:
                    net.train()
    _unstack(nets, params)
    return [net.eval() for net in nets]


def _unstack(nets: list[FlowNet], params: dict[str, torch.Tensor]) -> None:
    """Copy the stacked trained parameters back into each network (those that require grad)."""
    with torch.no_grad():
        for m, net in enumerate(nets):
            for name, p in net.named_parameters():
                if p.requires_grad:
                    p.copy_(params[name][m])


def train(
    net: FlowNet, *, x: torch.Tensor, y: torch.Tensor, sigma: float, epochs: int, lr: float, seed: int, cfg: FlowConfig
) -> FlowNet:
    """Train one network: :func:`train_group` of one (AdamW on the parameters that require grad; a frozen theta is
    not in the optimizer; cross-entropy; fresh Gaussian noise of std ``sigma`` on every batch)."""
    return train_group([net], x=x, y=y, sigmas=[sigma], seeds=[seed], epochs=epochs, lr=lr, cfg=cfg)[0]


def accuracy(net: FlowNet, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((net(x).argmax(-1) == y).float().mean())


def fixed_noise(shape: torch.Size | tuple[int, ...], seed: int) -> torch.Tensor:
    """The one fixed standard-normal test noise draw of seed ``seed``."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(10_000 + seed))


def arm_names(cfg: FlowConfig) -> list[tuple[str, str, str]]:
    """(arm, mixing, value) for every arm of ``cfg``; the value map only matters where there is attention."""
    out = []
    for mixing in cfg.mixings:
        if mixing in ATTENTION_MIXINGS:
            out += [(f"{mixing}/{v}", mixing, v) for v in cfg.values]
        else:
            out.append((mixing, mixing, "none"))
    if cfg.aa_control and ("attention/tied", "attention", "tied") in out:
        out.insert(out.index(("attention/tied", "attention", "tied")) + 1, (AA_ARM, "attention", "tied"))
    return out


@dataclass(frozen=True)
class ArmSetup:
    """What one arm's network is: the ``theta`` setting (``fixed``: frozen), its ``mixing`` and ``value`` map
    (``none`` where there is no attention), ``K`` flow steps, and the ``init_stream`` of its flow parameters
    (0: seeded by the run's seed; 1: by ``seed + AA_INIT_OFFSET``, the A/A arm)."""

    theta: str
    mixing: str
    value: str
    K: int
    init_stream: int = 0


def build_arm(fit: FlowNet, arm: ArmSetup, *, cfg: FlowConfig, x: torch.Tensor, seed: int) -> FlowNet:
    """``arm``'s untrained network: the fitted K = 0 network ``fit``'s embedding and theta, new flow parameters
    seeded from ``seed`` in ``arm.init_stream``, theta frozen if ``arm.theta == 'fixed'``."""
    value = arm.value if arm.value != "none" else "tied"
    with seeded(seed + AA_INIT_OFFSET * arm.init_stream):
        net = make_net(cfg, x=x, num_classes=fit.theta.shape[0], K=arm.K, mixing=arm.mixing, value=value)
    net.load_state_dict(fit.state_dict(), strict=False)
    if arm.theta == "fixed":
        net.freeze_classifier()
    return net


def train_arm(
    fits: list[FlowNet],
    arm: ArmSetup,
    *,
    cfg: FlowConfig,
    x: torch.Tensor,
    y: torch.Tensor,
    sigmas: list[float],
    seeds: list[int],
    lr: float,
) -> list[FlowNet]:
    """Build (:func:`build_arm`) and train ``arm`` for every (fit, sigma, seed), side by side."""
    nets = [build_arm(f, arm, cfg=cfg, x=x, seed=s) for f, s in zip(fits, seeds)]
    return train_group(nets, x=x, y=y, sigmas=sigmas, seeds=[s + 1 for s in seeds], epochs=cfg.epochs, lr=lr, cfg=cfg)


def fit_classifiers(
    cfg: FlowConfig, x: torch.Tensor, y: torch.Tensor, sigmas: list[float], seeds: list[int]
) -> list[FlowNet]:
    """Stage 1: the K = 0 network (embedding + theta) trained end to end per (sigma, seed): the multinomial
    regression fit."""
    nets = []
    for s in seeds:
        with seeded(s):
            nets.append(make_net(cfg, x=x, num_classes=int(y.max()) + 1, K=0))
    return train_group(nets, x=x, y=y, sigmas=sigmas, seeds=seeds, epochs=cfg.fit_epochs, lr=cfg.lr, cfg=cfg)


def lr_key(theta: str, arm: str, K: int) -> str:
    """The key of one learning rate in ``result["lr"]``: ``"theta:arm:K"`` (``neither``: K = 0 only)."""
    return f"{theta}:{arm}:{0 if arm == 'neither' else K}"


def selection_seeds(cfg: FlowConfig, seed: int) -> list[int]:
    """The seeds of the learning-rate selection: ``seed + 500 + i``, never a reported run's seed (checked)."""
    return [seed + 500 + i for i in range(cfg.lr_seeds)]


def _check_disjoint(select: list[int], reported: list[int]) -> None:
    def used(seeds: list[int]) -> set[int]:
        return {v for s in seeds for v in (s, s + 1)}  # train_arm trains with seed + 1

    if used(select) & used(reported):
        raise ValueError(f"learning-rate selection seeds {select} overlap the reported seeds {reported}")


def choose_lrs(
    cfg: FlowConfig,
    *,
    x: torch.Tensor,
    y: torch.Tensor,
    noise: list[float],
    seed: int,
    say: Callable[..., None],
    known: dict[str, float] | None = None,
    scores_out: dict[str, dict[str, float]] | None = None,
) -> dict[str, float]:
    """One learning rate per (theta setting, arm, K), the same rule for all: the best mean validation accuracy over
    ``cfg.lr_grid`` at that K (``neither``: the K = 0 network), the median noise level, ``cfg.lr_seeds`` seeds of its
    own (:func:`selection_seeds`, disjoint from the reported seeds and never reported), on the last
    ``val_fraction`` of the training split (the test set is never used). Ties go to the smaller learning rate.
    ``known``: choices already made (a resumed run), kept as they are. ``scores_out``: filled with the validation
    accuracy of every rate tried, ``{"theta:arm:K": {"lr": accuracy}}`` (the store's ``lr_scores``).
    The A/A arm is not selected: it trains at attention/tied's rate."""
    cells = _lr_cells(cfg)
    chosen = dict(known or {})
    if len(cfg.lr_grid) < 2:
        lr = cfg.lr_grid[0] if cfg.lr_grid else cfg.lr
        return {lr_key(t, a, k): lr for t, a, _, _, k in cells}
    n_val = max(1, int(len(x) * cfg.val_fraction))
    xt, yt, xv, yv = x[:-n_val], y[:-n_val], x[-n_val:], y[-n_val:]
    sigma = float(np.median(noise))
    val_seeds = selection_seeds(cfg, seed)
    xv = xv + sigma * fixed_noise(xv.shape, seed + 777)
    split = (xt, yt, xv, yv)
    fits: list[FlowNet] | None = None
    for theta, arm, mixing, value, k in cells:
        if lr_key(theta, arm, k) in chosen:
            continue
        fits = fits or fit_classifiers(cfg, xt, yt, [sigma] * len(val_seeds), val_seeds)
        arm_setup = ArmSetup(theta, mixing, value, k)
        scores = {
            lr: _validation_accuracy(fits, split, arm_setup, cfg=cfg, sigma=sigma, seeds=val_seeds, lr=lr)
            for lr in cfg.lr_grid
        }
        chosen[lr_key(theta, arm, k)] = rate_ranking(scores)[0]
        if scores_out is not None:
            scores_out[lr_key(theta, arm, k)] = {f"{lr:g}": v for lr, v in scores.items()}
        say(f"lr for theta={theta} {arm} K={k}: {chosen[lr_key(theta, arm, k)]:g}  (validation accuracy {scores})")
    return chosen


def rate_ranking(scores: Mapping[Any, float]) -> list[float]:
    """The rates of ``{rate: validation accuracy}`` best first, ties to the smaller rate: the selection's rule."""
    return [float(lr) for lr, _ in sorted(scores.items(), key=lambda kv: (-kv[1], float(kv[0])))]


def ranked_lr(lrs: dict[str, float], scores: dict[str, dict[str, float]], key: str, rank: int) -> float:
    """The rate cell ``key`` trains at: its chosen rate ``lrs[key]`` (``rank`` 1), or the rate of that rank in its
    validation ranking ``scores[key]`` (best accuracy first, ties to the smaller rate: the rule of
    :func:`choose_lrs`).

    Raises:
        ValueError: ``rank`` > 1 and the cell has fewer than ``rank`` scored rates (a store without ``lr_scores``).
    """
    if rank == 1:
        return lrs[key]
    ranking = rate_ranking(scores.get(key, {}))
    if len(ranking) < rank:
        raise ValueError(f"lr_rank={rank} needs {rank} scored learning rates for {key}; the store has {len(ranking)}")
    return ranking[rank - 1]


def _validation_accuracy(
    fits: list[FlowNet],
    split: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    arm: ArmSetup,
    *,
    cfg: FlowConfig,
    sigma: float,
    seeds: list[int],
    lr: float,
) -> float:
    """The mean validation accuracy over ``seeds`` of ``arm`` trained at ``lr`` (:func:`train_arm`) on the training
    part of ``split`` = (x_train, y_train, x_val, y_val)."""
    xt, yt, xv, yv = split
    if cfg.lr_epochs is not None:
        cfg = replace(cfg, epochs=cfg.lr_epochs)
    nets = train_arm(fits, arm, cfg=cfg, x=xt, y=yt, sigmas=[sigma] * len(seeds), seeds=seeds, lr=lr)
    return float(np.mean([accuracy(n, xv, yv) for n in nets]))


def _lr_cells(cfg: FlowConfig) -> list[tuple[str, str, str, str, int]]:
    """(theta, arm, mixing, value, K) of every learning rate :func:`choose_lrs` chooses (``neither``: K = 0 only,
    chosen even when ``neither`` is not an arm: every arm's K = 0 is that network)."""
    arms = [a for a in arm_names(cfg) if a[0] != AA_ARM]
    arms += [] if "neither" in cfg.mixings else [("neither", "neither", "none")]
    return list(
        dict.fromkeys(
            (t, a, m, v, 0 if m == "neither" else k)
            for t in cfg.thetas
            for a, m, v in arms
            for k in cfg.K
            if k > 0 or m == "neither"
        )
    )


def _flow_params(cfg: FlowConfig, *, x: torch.Tensor, num_classes: int, mixing: str, value: str, K: int) -> int:
    """An arm's ``flow_params``: the scalars of its flow steps (0 at K = 0, for ``neither`` and the classifier form)."""
    with seeded(0):  # the count needs a network, not the caller's random stream
        net = make_net(
            cfg, x=x, num_classes=num_classes, K=K, mixing=mixing, value=value if value != "none" else "tied"
        )
        return net.flow_parameter_count()


def _assemble(
    ds: Dataset,
    *,
    cfg: FlowConfig,
    xtr: torch.Tensor,
    xte: torch.Tensor,
    noise: list[float],
    seeds: list[int],
    acc: dict,
    tt: dict,
    lrs: dict[str, float],
    quick: bool,
    lr_scores: dict[str, dict[str, float]] | None = None,
) -> dict:
    """The result dict (the store ``flow_results.json``) of the cells finished so far."""
    from axiomformer.flows.comparisons import compare_arms

    arms = [
        {
            "arm": arm,
            "theta": theta,
            "mixing": mixing,
            "value": value,
            "K": K,
            "noise": sigma,
            "flow_params": _flow_params(cfg, x=xtr, num_classes=ds.num_classes, mixing=mixing, value=value, K=K),
            **_seed_summary(values),
        }
        for (theta, arm, mixing, value, K, sigma), values in acc.items()
    ]
    flows = [
        {"method": method, "K": K, "noise": sigma, **_seed_summary(values)} for (method, K, sigma), values in tt.items()
    ]
    comparisons, equivalence = compare_arms(
        {(t, a, k, s): v for (t, a, _, _, k, s), v in acc.items()}, cfg.equivalence_margin
    )
    return {
        "data": ds.name,
        "n_train": len(xtr),
        "n_test": len(xte),
        "model": cfg.model,
        "patch": cfg.patch if cfg.model == "quadratic" else None,
        "readout": cfg.readout,
        "readout_mixes_tokens": cfg.model == "quadratic" and cfg.readout in MIXING_READOUTS,
        "noise": noise,
        "K": list(cfg.K),
        "seeds": seeds,
        "interval": INTERVAL,
        "arms": arms,
        "test_time_flow": flows,
        "comparisons": comparisons,
        "equivalence": equivalence,
        "sanity": {},
        "lr": lrs,
        "lr_scores": lr_scores or {},
        "lr_selection_seeds": selection_seeds(cfg, seeds[0]) if len(cfg.lr_grid) > 1 else [],
        "config": asdict(cfg),
        "quick": quick,
        "figures": [],
    }


def _seed_summary(values: list[float]) -> dict[str, Any]:
    """A result row's accuracies over seeds: their mean, 95 % interval (:func:`t_interval`), count and the values."""
    mean, low, high = t_interval(values)
    return {"acc_mean": mean, "ci_low": low, "ci_high": high, "n_seeds": len(values), "acc": values}


def _write_json(path: Path, payload: dict) -> None:
    """Write ``payload`` to ``path`` atomically (a temporary file, then a rename): never half-written."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    tmp.replace(path)


def _resume(
    out_dir: str | Path | None, header: dict[str, Any]
) -> tuple[dict[tuple[Any, ...], list[float]], dict[str, float], dict[str, dict[str, float]]]:
    """(per-seed accuracies, learning rates, their validation scores) of an interrupted run of the same protocol in ``out_dir``; empty if
    there is none, it is unreadable, or any setting differs."""
    path = Path(out_dir) / "flow_results.partial.json" if out_dir is not None else None
    if path is None or not path.exists():
        return {}, {}, {}
    try:
        old = json.loads(path.read_text())
        # A store written before a config field existed ran with that field's default: it is the same protocol.
        old["config"] = json.loads(json.dumps(asdict(FlowConfig()))) | old.get("config", {})
        if any(old.get(k) != v for k, v in header.items()):
            return {}, {}, {}
        return (
            {(r["theta"], r["arm"], r["mixing"], r["value"], r["K"], r["noise"]): r["acc"] for r in old["arms"]},
            dict(old["lr"]),
            dict(old.get("lr_scores", {})),
        )
    except (json.JSONDecodeError, KeyError, TypeError):
        return {}, {}, {}


def _train_arms(
    run: _Run,
    *,
    fits: list[FlowNet],
    runs: list[tuple[int, float]],
    x_tests: list[torch.Tensor],
    say: Callable[..., None],
    t0: float,
) -> None:
    """Train and score every (theta, arm, K) not yet in ``run.acc``; ``run.save()`` after each arm (resumable)."""
    cfg, acc, lrs = run.cfg, run.acc, run.lrs
    noise = list(dict.fromkeys(r[1] for r in runs))
    sigmas, run_seeds = [r[1] for r in runs], [1000 * r[0] for r in runs]

    def train(arm: ArmSetup, key: str) -> list[FlowNet]:
        lr = ranked_lr(lrs, run.lr_scores, key, cfg.lr_rank)
        return train_arm(fits, arm, cfg=cfg, x=run.xtr, y=run.ytr, sigmas=sigmas, seeds=run_seeds, lr=lr)

    for theta in cfg.thetas:
        base = None  # K = 0 and 'neither' have no flow parameters: one network, reported under every arm
        for arm, mixing, value in arm_names(cfg):
            for K in cfg.K:
                if all((theta, arm, mixing, value, K, s) in acc for s in noise):
                    continue
                if K == 0 or mixing == "neither":
                    base = base or train(ArmSetup(theta, "neither", "none", 0), lr_key(theta, "neither", 0))
                    nets = base
                elif arm == AA_ARM:  # the A/A copy: attention/tied's rate, another initialization stream
                    aa = ArmSetup(theta, mixing, value, K, init_stream=1)
                    nets = train(aa, lr_key(theta, "attention/tied", K))
                else:
                    nets = train(ArmSetup(theta, mixing, value, K), lr_key(theta, arm, K))
                cell = (theta, arm, mixing, value, K)
                _score_arm(acc, cell, runs, nets, x_tests, run.yte)
                say(
                    f"theta={theta} {arm} K={K}: "
                    + ", ".join(f"noise {sigma:g} {np.mean(acc[cell + (sigma,)]):.3f}" for sigma in noise)
                    + f"  [{time.perf_counter() - t0:.0f} s wall, {time.process_time():.0f} s CPU]"
                )
            run.save()


def _score_arm(
    acc: dict[tuple[Any, ...], list[float]],
    cell: tuple[str, str, str, str, int],
    runs: list[tuple[int, float]],
    nets: list[FlowNet],
    x_tests: list[torch.Tensor],
    yte: torch.Tensor,
) -> None:
    """Replace the test accuracies of ``cell`` = (theta, arm, mixing, value, K) in ``acc``, one per (seed, noise) run,
    keyed by (*cell, noise)."""
    for sigma in dict.fromkeys(r[1] for r in runs):
        acc.pop(cell + (sigma,), None)
    for (_, sigma), net, x_test in zip(runs, nets, x_tests):
        acc.setdefault(cell + (sigma,), []).append(accuracy(net, x_test, yte))


def run_flow_experiment(
    dataset: str = "mnist5k",
    *,
    noise: Iterable[float] = (0.0, 1.0),
    out_dir: str | Path | None = None,
    quiet: bool = True,
    seed: int = 0,
    quick: bool = False,
    data_dir: str | Path | None = None,
    config: FlowConfig | None = None,
) -> dict[str, Any]:
    """Run the flow experiment (protocol in the module docstring and ``docs/flows.md``).

    Args:
        dataset: ``"mnist5k"`` (default), ``"digits"`` or ``"fashion-mnist"`` (the four IDX files in
            ``data_dir``).
        noise: noise levels sigma, in units of the training pixel standard deviation.
        out_dir: folder for ``flow_results.json``, ``flow_results.md`` and the figures (None: write nothing). An
            interrupted run of the same protocol there (``flow_results.partial.json``) is resumed.
        quiet: no progress lines.
        seed: base seed (runs use seed, seed + 1, ...).
        quick: the small protocol of :func:`default_config` (a pilot: it claims nothing).
        config: the settings (default :func:`default_config`), the numbers of flow steps ``K`` among them.

    Returns:
        ``{"data", "n_train", "n_test", "model", "patch", "readout", "readout_mixes_tokens", "interval",
        "arms": [{"arm", "theta", "mixing", "value", "K", "noise", "flow_params", "acc_mean", "ci_low", "ci_high",
        "n_seeds", "acc"}], "comparisons": [{"a", "b", "theta", "K", "noise", "diff", "ci_low", "ci_high", "p",
        "p_holm"}], "equivalence": {...}, "test_time_flow": [...], "sanity": {...}, "lr", "lr_selection_seeds",
        "config", "seeds", "figures", "runtime_s", "cpu_s"}`` (``comparisons``: ``flows.comparisons``).

    Raises:
        DataError: missing or malformed data files.
        ValueError: an unknown choice in the config, a negative K or noise level, or a patch size that does not
            divide the image side.
    """
    from axiomformer.flows.inference_flow import sanity_checks

    t0, c0 = time.perf_counter(), time.process_time()
    say: Callable[..., None] = (lambda *_: None) if quiet else (lambda *a: print(*a, flush=True))
    run = _start_run(dataset, noise, out_dir, seed=seed, quick=quick, data_dir=data_dir, config=config, say=say)
    runs, fits = _run_arms(run, seed, say, t0)
    result = run.assemble()
    first, sigma = run.seeds[0], max(run.noise)
    result["sanity"] = sanity_checks(
        fits[runs.index((first, sigma))], x=run.xtr, y=run.ytr, sigma=sigma, seed=first, steps=run.cfg.oracle_steps
    )
    result["runtime_s"] = round(time.perf_counter() - t0, 2)
    result["cpu_s"] = round(time.process_time() - c0, 2)
    if out_dir is not None:
        _write_outputs(Path(out_dir), result)
    return result


@dataclass
class _Run:
    """One run of :func:`run_flow_experiment`: its data and settings, and the results so far (per-seed accuracies
    ``acc``, test-time flows ``tt``, learning rates ``lrs``), which :meth:`save` writes as the partial store."""

    ds: Dataset
    cfg: FlowConfig
    xtr: torch.Tensor
    ytr: torch.Tensor
    xte: torch.Tensor
    yte: torch.Tensor
    noise: list[float]
    seeds: list[int]
    quick: bool
    out_dir: str | Path | None
    acc: dict[tuple[Any, ...], list[float]]
    lrs: dict[str, float]
    tt: dict[tuple[Any, ...], list[float]] = field(default_factory=dict)
    lr_scores: dict[str, dict[str, float]] = field(default_factory=dict)

    def assemble(self) -> dict[str, Any]:
        return _assemble(
            self.ds,
            cfg=self.cfg,
            xtr=self.xtr,
            xte=self.xte,
            noise=self.noise,
            seeds=self.seeds,
            acc=self.acc,
            tt=self.tt,
            lrs=self.lrs,
            quick=self.quick,
            lr_scores=self.lr_scores,
        )

    def save(self) -> None:
        if self.out_dir is not None:  # finished arms survive an interruption
            Path(self.out_dir).mkdir(parents=True, exist_ok=True)
            _write_json(Path(self.out_dir) / "flow_results.partial.json", self.assemble())


def _start_run(
    dataset: str,
    noise: Iterable[float],
    out_dir: str | Path | None,
    *,
    seed: int,
    quick: bool,
    data_dir: str | Path | None,
    config: FlowConfig | None,
    say: Callable[..., None],
) -> _Run:
    """The checked settings, the data and what an interrupted run in ``out_dir`` left (:func:`_resume`)."""
    levels = [float(s) for s in noise]
    cfg = config or default_config(quick)
    cfg = replace(cfg, K=tuple(sorted({int(k) for k in cfg.K})))
    _validate(cfg, levels)
    ds = load_dataset(dataset, data_dir, seed=seed)
    xtr, ytr, xte, yte = prepare(ds, cfg)
    seeds = [seed + i for i in range(cfg.seeds)]
    _check_disjoint(selection_seeds(cfg, seed), [1000 * s for s in seeds])
    acc, lrs, lr_scores = _resume(out_dir, _header(ds.name, levels, seeds, quick, cfg))
    if acc or lrs:
        say(f"resuming {out_dir}: {len(acc)} finished cells, {len(lrs)} learning rates")
    return _Run(ds, cfg, xtr, ytr, xte, yte, levels, seeds, quick, out_dir, acc, lrs, lr_scores=lr_scores)


def _run_arms(
    run: _Run, seed: int, say: Callable[..., None], t0: float
) -> tuple[list[tuple[int, float]], list[FlowNet]]:
    """Choose the learning rates, fit theta per (seed, noise) run, the test-time flows, then train every arm; the
    runs and their fitted K = 0 networks."""
    cfg = run.cfg
    run.lrs.update(
        choose_lrs(
            cfg, x=run.xtr, y=run.ytr, noise=run.noise, seed=seed, say=say, known=run.lrs, scores_out=run.lr_scores
        )
    )
    run.save()
    runs = [(s, sigma) for s in run.seeds for sigma in run.noise]  # every arm trains these side by side
    fits = fit_classifiers(cfg, run.xtr, run.ytr, [r[1] for r in runs], [1000 * r[0] for r in runs])
    x_tests = [run.xte + sigma * fixed_noise(run.xte.shape, s) for s, sigma in runs]
    _test_time_flow(runs, fits=fits, x_tests=x_tests, yte=run.yte, K=cfg.K, tt=run.tt)
    say(f"fitted theta for {len(runs)} (seed, noise) runs  [{time.perf_counter() - t0:.0f} s]")
    _train_arms(run, fits=fits, runs=runs, x_tests=x_tests, say=say, t0=t0)
    return runs, fits


def _header(name: str, noise: list[float], seeds: list[int], quick: bool, cfg: FlowConfig) -> dict:
    """The protocol a partial result in ``out_dir`` must match to be resumed (:func:`_resume`)."""
    return {
        "data": name,
        "noise": noise,
        "K": list(cfg.K),
        "seeds": seeds,
        "quick": quick,
        "config": json.loads(json.dumps(asdict(cfg))),
    }


def _test_time_flow(
    runs: list[tuple], *, fits: list, x_tests: list, yte: torch.Tensor, K: tuple[int, ...], tt: dict
) -> None:
    """Append the label-free test-time flow of each (seed, noise) run to ``tt``, keyed by (*flow key, noise)."""
    from axiomformer.flows.inference_flow import label_free_flow

    for (_, sigma), fit, x_test in zip(runs, fits, x_tests):
        for key, value in label_free_flow(fit, x_test, yte, K).items():
            tt.setdefault((*key, sigma), []).append(value)


def _write_outputs(out: Path, result: dict) -> None:
    """The figures, ``flow_results.json`` and ``flow_results.md``; then the partial store is removed."""
    from axiomformer.flows.figures import write_figures
    from axiomformer.flows.report import markdown

    out.mkdir(parents=True, exist_ok=True)
    result["figures"] = write_figures(out, result)
    _write_json(out / "flow_results.json", result)
    (out / "flow_results.md").write_text(markdown(result))
    (out / "flow_results.partial.json").unlink(missing_ok=True)


__all__ = [
    "AA_ARM",
    "AA_INIT_OFFSET",
    "INTERVAL",
    "THETAS",
    "ArmSetup",
    "FlowConfig",
    "arm_names",
    "build_arm",
    "choose_lrs",
    "default_config",
    "fit_classifiers",
    "lr_key",
    "make_net",
    "run_flow_experiment",
    "selection_seeds",
    "t_interval",
    "train",
    "train_arm",
    "train_group",
]
