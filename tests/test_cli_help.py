"""The command line feels like one: --help without PyTorch, one error style, tables whole when piped."""

from __future__ import annotations

import subprocess
import sys

import pytest

from axiomformer.cli import COMMANDS

PROBE = """
import sys
from axiomformer.cli import app
try:
    app(sys.argv[1:], prog_name="axiomformer")
except SystemExit as stop:
    code = stop.code
print("TORCH" if "torch" in sys.modules else "NO-TORCH", code)
"""


def _help(*args: str) -> str:
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120)
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("command", [None, *COMMANDS, "report"])
def test_help_does_not_import_torch(command):
    args = ["--help"] if command is None else [command, "--help"]
    assert _help(*args) == "NO-TORCH 0"


def test_the_probe_sees_torch_when_a_command_runs():
    """The check above can fail: a command that runs imports PyTorch, and the probe says so."""
    assert _help("spec", "A4=cosine").startswith("TORCH")


def test_every_command_runs_with_the_command_lines_process_defaults():
    """Each command sets flush-to-zero and owns the process's memory readings only when it runs (cli._Command)."""
    import typer.main

    from axiomformer.cli import _Command, app

    commands = typer.main.get_command(app).commands
    assert set(COMMANDS) <= set(commands)
    kinds = {name: type(command).__name__ for name, command in commands.items()}
    assert kinds == dict.fromkeys(commands, _Command.__name__)


def test_train_bad_input_is_one_error_line_with_exit_2():
    from typer.testing import CliRunner

    from axiomformer.cli import app

    result = CliRunner().invoke(app, ["train", "--task", "nope"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown task 'nope'; choose one of:"), result.output


def test_a_piped_table_is_never_truncated(capsys):
    from rich.table import Table

    from axiomformer.commands import output_console

    long_cell = "attention (score=cosine, normalizer=sigmoid, position=rope): " + "x" * 150
    table = Table(title="t")
    for column in ("relaxation", "cosine", "retrieval agreement", "untrained new parameters"):
        table.add_column(column)
    table.add_row(long_cell, "0.9", "1.0", "-")
    output_console().print(table)  # stdout is captured: not a terminal
    out = capsys.readouterr().out
    assert long_cell in out and "…" not in out
    assert max(len(line) for line in out.splitlines()) < 400  # as wide as the table needs, no wider


def test_a_plain_rich_console_would_truncate_the_same_table(capsys):
    """The failure the helper prevents: rich assumes 80 columns when the output is not a terminal."""
    from rich.console import Console
    from rich.table import Table

    table = Table()
    table.add_column("relaxation")
    table.add_column("untrained new parameters")
    table.add_row("attention " + "y" * 150, "-")
    Console().print(table)
    assert "y" * 150 not in capsys.readouterr().out


def test_report_help_names_the_correction_the_report_applies():
    from typer.testing import CliRunner

    from axiomformer.cli import app
    from axiomformer.study.statistics import CORRECTION

    text = " ".join(CliRunner().invoke(app, ["report", "--help"], terminal_width=200).output.split())
    assert CORRECTION == "bonferroni" and "Bonferroni" in text and "Holm" not in text, text
