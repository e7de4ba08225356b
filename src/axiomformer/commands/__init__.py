"""One module per CLI command; each exposes ``register(app: typer.Typer)`` and imports heavy libraries lazily."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

WIDE = 10_000
"""Width of a console that does not write to a terminal: wide enough that no table is cut or wrapped."""


def output_console(stderr: bool = False) -> Console:
    """The rich console for a command's tables: the terminal's width on a terminal; when the output goes to a pipe
    or a file, wide enough that no cell is truncated ("attent…") or wrapped (rich would assume 80 columns)."""
    from rich.console import Console

    console = Console(stderr=stderr)
    if not console.is_terminal:
        console = Console(stderr=stderr, width=WIDE)
    return console
