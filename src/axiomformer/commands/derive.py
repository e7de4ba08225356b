"""``axiomformer derive``: run the chain of assumptions A0 -> A5 that produces attention, checking each step's
property."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from axiomformer.errors import expect_file_path


def register(app: typer.Typer) -> None:
    @app.command("derive")
    def derive_command(
        as_json: bool = typer.Option(False, "--json", help="print one JSON object (the last line of stdout)"),
        fmt: str = typer.Option("text", "--format", help="text or md (Markdown with LaTeX formulas)"),
        out: Path = typer.Option(None, "--out", help="write the text/Markdown here instead of stdout"),
        seed: int = typer.Option(0, help="seed of the modules and inputs"),
        plant: str = typer.Option(
            None,
            "--plant",
            help="A0..A5: plant the standard wrong version of that step in "
            "every module; the chain must fail first there",
        ),
    ) -> None:
        """Build the modules A0..A5, measure each assumption's property before and after its step, and compare the
        last module with PyTorch's SDPA. Exit code 1 when the chain does not pass."""
        from axiomformer.derive import PLANTS, run_derivation, to_markdown, to_text

        expect_file_path(out, "--out")
        if fmt not in ("text", "md"):
            raise typer.BadParameter(f"unknown format {fmt!r}; choose one of: text, md", param_hint="--format")
        if plant is not None and plant not in PLANTS:
            raise typer.BadParameter(
                f"unknown step {plant!r}; choose one of: {', '.join(PLANTS)}", param_hint="--plant"
            )
        chain = run_derivation(seed=seed, plant=plant)
        if as_json:
            typer.echo(json.dumps(chain.to_dict()))
        else:
            text = to_markdown(chain) if fmt == "md" else to_text(chain) + "\n"
            if out is not None:
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(text)
                typer.echo(f"wrote {out}")
            else:
                typer.echo(text, nl=False)
        if not chain.passed:
            raise typer.Exit(1)
