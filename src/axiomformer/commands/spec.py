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
        """Describe a spec: which assumptions hold, each non-standard choice's formula and source, and every field.

        Fields a choice needs (a causal mask, a transport's paired normalizer) are filled in unless given.
        """
        from axiomformer.spec import (
            ECONOMY_NOTES,
            FIELD_RELAXATIONS,
            REGISTRIES,
            AttentionSpec,
            relax_with_requirements,
        )

        try:
            spec = relax_with_requirements(AttentionSpec.standard(dim, heads, causal=causal), relax)
        except ValueError as err:
            raise typer.BadParameter(str(err)) from None
        if as_json:
            typer.echo(json.dumps({"spec": spec.to_dict(), "assumptions": spec.assumptions(), "variant": spec.variant}))
        else:
            typer.echo(spec.describe())
            for a, held in spec.assumptions().items():
                typer.echo(f"  {a}: {'holds' if held else 'relaxed'}")
            for axis, name in spec.relaxed_axes().items():
                choice = REGISTRIES[axis][name]
                typer.echo(f"  {axis}={name}: {choice.formula}")
                typer.echo(f"    source: {choice.source}")
                if choice.relaxes:
                    typer.echo(f"    relaxes: {choice.relaxes}")
            in_use = dict(item.split("=", 1) for item in spec.variant.split(",") if "=" in item)
            for name, (formula, how, source) in {**FIELD_RELAXATIONS, **ECONOMY_NOTES}.items():
                if name in in_use:  # soft-capping, diff_authors, the economies in use (MLA's latent, GQA, a window)
                    typer.echo(f"  {name}={in_use[name]}: {formula}")
                    typer.echo(f"    source: {source}")
                    typer.echo(f"    relaxes: {how}")
