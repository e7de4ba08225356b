"""The ``axiomformer`` command line (typer + rich). Each command lives in ``axiomformer/commands/<name>.py``."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="axiomformer",
    help="Transformer attention derived from its assumptions: flip, check and measure each one.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)



@app.callback()
def _root() -> None:
    """Transformer attention derived from its assumptions: flip, check and measure each one."""


COMMANDS = ("spec", "derive", "audit", "train", "study", "flow", "bench", "surgery")


def _register_all() -> None:
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"axiomformer.commands.{name}")
        except ModuleNotFoundError as err:
            if err.name == f"axiomformer.commands.{name}":
                continue  # command not part of this build
            raise
        module.register(app)


_register_all()


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
