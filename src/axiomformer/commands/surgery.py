"""``axiomformer surgery``: swap a pretrained BERT's attention for axiomformer's, relax it, measure the embeddings."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from axiomformer.commands import output_console

if TYPE_CHECKING:
    from axiomformer.surgery import SurgeryReport


def _parse_layers(text: str | None) -> list[int] | None:
    if text is None or not text.strip():
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"expected comma-separated layer indices such as '0,1', got {text!r}", param_hint="--layers"
        ) from None


def _fmt(x: float) -> str:
    return "nan" if math.isnan(x) else f"{x:.4f}"


def register(app: typer.Typer) -> None:
    app.command("surgery")(surgery_command)


# The options of ``surgery``, declared once here so that the command's signature stays short.
_MODEL_DIR = typer.Option(
    None,
    "--model-dir",
    help="Hugging Face BERT-family model folder (default: the bundled all-MiniLM-L6-v2 of the 'hf' extra)",
)
_RELAX = typer.Option(
    None,
    "--relax",
    help="relax string, e.g. 'normalizer=sigmoid'; repeat for several "
    "(default: a built-in set of single-axis relaxations)",
)
_SENTENCES = typer.Option(None, "--sentences", help="text file, one sentence a line (default: the built-in list)")
_LAYERS = typer.Option(None, "--layers", help="comma-separated layers to relax (default: all)")
_SEED = typer.Option(0, "--seed", help="seed of the parameters a relaxation adds (left untrained)")
_AS_JSON = typer.Option(False, "--json", help="print the result as one JSON line")


def surgery_command(
    *,
    model_dir: Path | None = _MODEL_DIR,
    relax: list[str] | None = _RELAX,
    sentences: Path | None = _SENTENCES,
    layers: str | None = _LAYERS,
    seed: int = _SEED,
    as_json: bool = _AS_JSON,
) -> None:
    """Replace every self-attention of a pretrained BERT by axiomformer's Attention (same weights), then relax
    assumptions post hoc and compare mean-pooled sentence embeddings with the original model's."""
    from axiomformer.surgery import SurgeryError, read_sentences, run_surgery
    from axiomformer.surgery.audit_adapter import audit_layer0

    layer_list = _parse_layers(layers)
    typer.echo(
        f"surgery: loading {model_dir or 'the bundled all-MiniLM-L6-v2'}, then "
        f"{len(relax) if relax else 'the built-in'} relaxation(s), each one forward pass",
        err=True,
    )
    try:
        texts = read_sentences(sentences) if sentences is not None else None
        report = run_surgery(model_dir, relax or None, texts, layers=layer_list, seed=seed, audit_fn=audit_layer0)
    except SurgeryError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    except ValueError as err:  # bad relax string or layer index
        raise typer.BadParameter(str(err)) from None
    if as_json:
        typer.echo(json.dumps(report.to_json()))
        return
    _print_report(report)


def _print_report(report: SurgeryReport) -> None:
    """The report as text: the model, the standard spec's reproduction error, a table per relaxation, the audit."""
    from rich.table import Table

    console = output_console()
    where = "all layers" if report.layers is None else f"layers {report.layers}"
    console.print(f"model: {report.model}; {report.n_sentences} sentences; relaxations applied to {where}")
    console.print(
        f"standard spec reproduces the original last hidden state: max abs err {report.standard_max_abs_err:.2e}"
    )
    table = Table(title="embedding change per relaxation (vs the original model)")
    for column in ("relaxation", "cosine", "retrieval agreement", "untrained new parameters"):
        table.add_column(column)
    for row in report.relaxations:
        fresh = ", ".join(report.fresh_parameters.get(row["spec"], [])) or "-"
        table.add_row(row["spec"], _fmt(row["cosine"]), _fmt(row["retrieval_agreement"]), fresh)
    console.print(table)
    if report.audit is not None:
        typer.echo(report.audit.get("text") or json.dumps(report.audit))  # plain: no re-wrapping by rich
