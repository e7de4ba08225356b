"""``axiomformer flow``: attention as implicit multinomial regression, the feature-refinement experiment (Source 2)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

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


def _floats(text: str, name: str) -> list[float]:
    return _numbers(text, name, float, "0,0.5,1.0")


def _ints(text: str, name: str) -> list[int]:
    return _numbers(text, name, int, "0,1,2,4,8")


def register(app: typer.Typer) -> None:
    @app.command("flow")
    def flow_command(
        data: str = typer.Option("digits", "--data", help="digits (scikit-learn) or fashion-mnist (IDX files)"),
        data_dir: Path = typer.Option(None, "--data-dir", help="folder with the Fashion-MNIST IDX files (raw or .gz)"),
        noise: str = typer.Option("0,0.5,1.0", "--noise", help="noise levels, in units of the pixel std"),
        steps: str = typer.Option("0,1,2,4,8", "--steps", help="numbers of flow steps K (0 = multinomial regression)"),
        out: Path = typer.Option(None, "--out", help="folder for the figures and flow_results.json"),
        seed: int = typer.Option(0, "--seed", help="base seed"),
        quick: bool = typer.Option(False, "--quick", help="fewer epochs and one seed (about 30 s on digits)"),
        quiet: bool = typer.Option(False, "--quiet", help="no progress lines"),
        as_json: bool = typer.Option(False, "--json", help="print the result dict as JSON on the last line"),
    ) -> None:
        """Oracle feature flow, then FlowNet accuracy against the number of flow steps K on clean and noisy inputs."""
        from axiomformer.flows.data import DATASETS, DataError
        from axiomformer.flows.experiment import run_flow_experiment

        expect_folder(out)
        if data not in DATASETS:
            raise typer.BadParameter(f"unknown dataset {data!r}; choose one of: {', '.join(DATASETS)}",
                                     param_hint="--data")
        noise_levels, step_counts = _floats(noise, "--noise"), _ints(steps, "--steps")
        try:
            result = run_flow_experiment(data, noise=noise_levels, steps=step_counts, out_dir=out,
                                         quiet=quiet or as_json, seed=seed, quick=quick, data_dir=data_dir)
        except DataError as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(2) from None
        if not (quiet or as_json):
            _print_table(result)
        if as_json:
            typer.echo(json.dumps(result))


def _print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"FlowNet test accuracy on {result['dataset']} (mean of {len(result['seeds'])} seed(s))")
    ks = sorted(next(iter(result["accuracy"].values())), key=int)
    table.add_column("noise (pixel std)")
    for k in ks:
        table.add_column(f"K={k}", justify="right")
    for noise, row in result["accuracy"].items():
        table.add_row(f"{float(noise):g}", *(f"{row[k]:.4f}" for k in ks))
    console = Console()
    console.print(table)
    console.print(f"oracle flow loss {result['oracle_loss'][0]:.4f} -> {result['oracle_loss'][-1]:.4f}, "
                  f"monotone: {result['oracle_loss_monotone']}")
    for noise, row in result["ablation_no_attention"].items():
        for k, acc in row.items():
            console.print(f"ablation, noise {float(noise):g}, K={k} without attention: {acc:.4f}")
    if result["figures"]:
        console.print("figures: " + ", ".join(result["figures"]))
