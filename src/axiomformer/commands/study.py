"""``axiomformer study``: the main job (relax each assumption, train, measure, report); ``axiomformer report DIR``."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from axiomformer.study.config import StudyConfig
    from axiomformer.study.runner import StudySummary


@contextlib.contextmanager
def interrupts_end_at_once():
    """Ctrl-C handling of ``axiomformer study`` (a command-line entry point: it sets the process's SIGINT handler
    for the block and restores it). The first Ctrl-C raises ``KeyboardInterrupt``: the study stops its workers at
    once, keeps every finished run and the command prints one line. A second Ctrl-C, while that cleanup runs, ends
    the process at once with one line and exit code 130, no traceback (workers die with their parent)."""

    def second(signum, frame):
        os.write(2, b"\ninterrupted again: stopped at once; finished runs are stored\n")
        os._exit(130)

    def first(signum, frame):
        signal.signal(signal.SIGINT, second)
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():  # signal handlers live on the main thread
        yield
        return
    previous = signal.signal(signal.SIGINT, first)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def register(app: typer.Typer) -> None:
    app.command("study")(study_command)
    app.command("report")(report_command)


def study_command(
    *,
    suite: str = typer.Option(
        "main",
        "--suite",
        help="which study: main | long-range | positions | rho | scale | "
        "gumbel (docs/study.md, docs/open_questions.md)",
    ),
    quick: bool = typer.Option(False, "--quick", help="the quick preset (about 3 minutes on 2 cores)"),
    preset: str | None = typer.Option(
        None, "--preset", help="quick | default | full (full: the complete protocol, for Ray or a GPU)"
    ),
    config: Path | None = typer.Option(None, "--config", help="TOML study file, merged over the built-in sweep"),
    out: Path | None = typer.Option(
        None, "--out", help="out dir (default runs/study-<timestamp>/); an existing one is resumed"
    ),
    seeds: int | None = typer.Option(None, "--seeds", min=1, help="seeds per run (overrides the config)"),
    backend: str = typer.Option("local", "--backend", help="local | ray"),
    address: str | None = typer.Option(None, "--address", help="Ray cluster address (with --backend ray)"),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="show the overall progress bar"),
) -> None:
    """Run a study suite (default: relax each assumption of the derivation), every model under one matched budget
    with its own learning rate chosen on validation, and write results.sqlite, report.md, report.html and
    figures/ to the out dir. Rerun with the same --out to resume."""
    cfg = _study_config(suite, quick=quick, preset=preset, config=config, seeds=seeds, backend=backend, address=address)
    out_dir = out or Path("runs") / f"study-{datetime.now():%Y%m%d-%H%M%S}"
    summary = _run_study(cfg, out_dir, backend, address, progress)
    typer.echo(
        f"trained {summary.trained} run(s) ({summary.already_stored} already stored) in "
        f"{summary.seconds:.1f} s; report: {summary.report.get('markdown')}, {summary.report.get('html')}"
    )
    if summary.failed:
        typer.echo(f"{len(summary.failed)} run(s) failed (see the report); rerun to retry them", err=True)
        raise typer.Exit(1)


def _study_config(
    suite: str,
    *,
    quick: bool,
    preset: str | None,
    config: Path | None,
    seeds: int | None,
    backend: str,
    address: str | None,
) -> StudyConfig:
    """The checked study config of ``study``'s options; bad input is a ``typer.BadParameter``."""
    from axiomformer.study.config import StudyConfigError, load_config, validate_config
    from axiomformer.study.runner import BACKENDS
    from axiomformer.study.sweep import default_sweep

    if backend not in BACKENDS:
        raise typer.BadParameter(
            f"unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}", param_hint="--backend"
        )
    if address and backend != "ray":
        raise typer.BadParameter("--address is only used with --backend ray", param_hint="--address")
    if quick and preset not in (None, "quick"):
        raise typer.BadParameter(f"--quick contradicts --preset {preset}", param_hint="--preset")
    try:
        base = default_sweep(quick=quick, suite=suite, preset=preset)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--suite/--preset") from None
    try:
        cfg = load_config(config, base=base) if config else validate_config(base, source="built-in sweep")
        if seeds is not None:
            cfg = validate_config({"seeds": seeds}, base=cfg.model_dump(), source="--seeds")
    except StudyConfigError as err:
        raise typer.BadParameter(str(err), param_hint="--config") from None
    if cfg.seeds < 2:
        raise typer.BadParameter(
            f"seeds must be >= 2 (a paired interval needs two reported seeds), got {cfg.seeds}",
            param_hint="--config/--seeds",
        )
    return cfg


def _run_study(cfg: StudyConfig, out_dir: Path, backend: str, address: str | None, progress: bool) -> StudySummary:
    """Run the study, Ctrl-C handled; a study error or an interrupt is one error line and its exit code."""
    from axiomformer.study.runner import StudyError, run_study

    try:
        with interrupts_end_at_once():
            return run_study(cfg, out_dir, backend=backend, address=address, progress=progress)
    except StudyError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        typer.echo(
            f"\ninterrupted: the runs in progress were stopped (not stored); finished runs are stored in "
            f"{out_dir}/results.sqlite; rerun with --out {out_dir} to resume",
            err=True,
        )
        raise typer.Exit(130) from None


def report_command(
    directory: Path = typer.Argument(..., help="a study out dir (holds results.sqlite)"),
    as_json: bool = typer.Option(
        False,
        "--json",
        help="print the verdicts as JSON on stdout and write nothing: cells (mean, "
        "95% CI, seeds, lr, converged) and comparisons with the "
        "standard model (paired difference, Bonferroni-corrected CI and p-value over each family)",
    ),
) -> None:
    """Rebuild report.md, report.html and figures/ of a study from its results.sqlite alone; with --json, print the
    verdicts instead and write nothing (a reader: the study folder may be read-only or shared)."""
    import json

    from axiomformer.study.report import build_report, study_json

    try:
        if as_json:
            typer.echo(json.dumps(study_json(directory), indent=1))
            return
        paths = build_report(directory)
    except FileNotFoundError as err:
        raise typer.BadParameter(str(err), param_hint="DIRECTORY") from None
    else:
        typer.echo(f"wrote {paths['markdown']}, {paths['html']} and {len(paths['figures'])} figure(s)")
