"""``axiomformer spec``: describe a point of the design space."""

from __future__ import annotations

import json

import typer


def register(app: typer.Typer) -> None:
    @app.command("spec")
    def spec_command(
        relax: str = typer.Argument("standard", help="relax string, e.g. 'A4=cosine,normalizer=sigmoid'"),
        dim: int = typer.Option(64, help="model width"),
        heads: int = typer.Option(4, help="number of heads"),
        causal: bool = typer.Option(False, help="causal mask"),
        as_json: bool = typer.Option(False, "--json", help="print the spec as JSON"),
    ) -> None:
        """Describe a spec: which assumptions hold and every field."""
        from axiomformer.spec import AttentionSpec

        try:
            spec = AttentionSpec.standard(dim, heads, causal=causal).relax(relax)
        except ValueError as err:
            raise typer.BadParameter(str(err)) from None
        if as_json:
            typer.echo(json.dumps({"spec": spec.to_dict(), "assumptions": spec.assumptions(), "variant": spec.variant}))
        else:
            typer.echo(spec.describe())
            for a, held in spec.assumptions().items():
                typer.echo(f"  {a}: {'holds' if held else 'relaxed'}")
