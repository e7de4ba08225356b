"""``axiomformer derive``: run and check the chain of assumptions A0 -> A5 that produces attention."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("derive")
    def derive_command(
        as_json: bool = typer.Option(False, "--json", help="print one JSON object (the last line of stdout)"),
        fmt: str = typer.Option("text", "--format", help="text or md (Markdown with LaTeX formulas)"),
        out: Path = typer.Option(None, "--out", help="write the text/Markdown here instead of stdout"),
        seed: int = typer.Option(0, help="seed of the modules and inputs"),
    ) -> None:
        """Build the modules A0..A5, check each step numerically, and compare the last one with PyTorch's SDPA."""
        from axiomformer.derive import derive, to_markdown, to_text

        if fmt not in ("text", "md"):
            raise typer.BadParameter(f"unknown format {fmt!r}; choose one of: text, md", param_hint="--format")
        chain = derive(seed=seed)
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
