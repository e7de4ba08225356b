"""The ``axiomformer`` command line (typer + rich). Each command lives in ``axiomformer/commands/<name>.py``."""

from __future__ import annotations

import importlib
import sqlite3

import typer
from typer.core import TyperCommand, TyperGroup

from axiomformer.errors import UserInputError


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


class _Commands(TyperGroup):
    """Every command's bad input ends the same way: one line on stderr naming the input and what was expected,
    exit code 2, no traceback. Bad input is a :class:`UserInputError`, a click usage error, or an ``OSError`` on a
    named path (a file where a folder was expected, a missing or unreadable file)."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except typer.TyperException as err:  # typer's usage errors (BadParameter, NoSuchOption, ...)
            if type(err).__name__ == "NoArgsIsHelpError" or not hasattr(err, "format_message"):
                raise  # help on a bare command is not an error line
            message = err.format_message()
        except UserInputError as err:
            message = str(err)
        except OSError as err:
            if err.filename is None:
                raise
            message = f"cannot use {err.filename}: {err.strerror or err}"
        except sqlite3.DatabaseError as err:
            if isinstance(err, sqlite3.OperationalError):
                raise
            message = f"not an SQLite database: {err}"
        typer.echo(f"error: {_one_line(message)}", err=True)
        raise typer.Exit(2)


class _Command(TyperCommand):
    """A subcommand that sets the command line's process defaults (:func:`axiomformer.runtime.command_line_defaults`)
    and owns the process's memory readings (:func:`axiomformer.memory.owning_process_memory`) only when it runs:
    ``--help`` is answered before ``invoke`` and so never imports PyTorch."""

    def invoke(self, ctx):
        from axiomformer.memory import owning_process_memory
        from axiomformer.runtime import command_line_defaults

        command_line_defaults()
        with owning_process_memory():
            return super().invoke(ctx)


app = typer.Typer(
    name="axiomformer",
    cls=_Commands,
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
    for info in app.registered_commands:
        if info.cls in (None, TyperCommand):  # typer's default class: make it ours
            info.cls = _Command


_register_all()


def main() -> None:  # pragma: no cover - console entry
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
