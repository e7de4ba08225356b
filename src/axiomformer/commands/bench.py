"""``axiomformer bench``: time and peak memory of every variant's attention against SDPA; with ``--train``, runs per
CPU-hour of the study's model on the plain training loop and on the fast path (``axiomformer.train_bench``)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from axiomformer.errors import expect_writable_folder

if TYPE_CHECKING:
    from axiomformer.bench import Row


def _lengths(text: str | None, quick: bool) -> tuple[int, ...]:
    if not text:
        return (1024, 4096) if quick else (512, 1024, 2048, 4096)
    try:
        lengths = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise typer.BadParameter(f"--lengths expects comma-separated integers, e.g. 512,1024; got {text!r}") from None
    if not lengths or min(lengths) < 1:
        raise typer.BadParameter(f"--lengths expects positive integers, got {text!r}")
    return lengths


def register(app: typer.Typer) -> None:
    app.command("bench")(bench_command)


# The options of ``bench`` (``Annotated``: each default stays in the signature, so a direct call gets real values).
_Quick = Annotated[
    bool,
    typer.Option(
        "--quick", help="goal variants, causal, L = 1024 and 4096, without the reference rows (minutes on a CPU)"
    ),
]
_Lengths = Annotated[str | None, typer.Option("--lengths", help="comma-separated sequence lengths, e.g. 512,1024,2048")]
_AsJson = Annotated[bool, typer.Option("--json", help="print the rows as JSON on the last line")]
_Out = Annotated[Path, typer.Option("--out", help="folder for bench.json, bench.md, bench.png")]
_Variants = Annotated[
    str | None,
    typer.Option("--variants", help="';'-separated relax strings (default: the goal variants; more without --quick)"),
]
_Heads = Annotated[int, typer.Option(help="attention heads")]
_HeadDim = Annotated[int, typer.Option(help="head dimension")]
_Batch = Annotated[int, typer.Option(help="batch size")]
_Repeats = Annotated[
    int, typer.Option(help="timed pairs (default 7: the 95 % interval of each ratio, ratio_ci, needs them)")
]
_Device = Annotated[str | None, typer.Option(help="cpu or cuda (default: cuda when available)")]
_Threads = Annotated[int, typer.Option(help="torch CPU threads (default: torch's choice)")]
_Train = Annotated[
    bool,
    typer.Option(
        "--train",
        help="instead: train the study's model on the plain loop and on the fast path, paired, one thread; "
        "runs per CPU-hour and the speedup with a 95 % interval (--json: 'speedup', 'plain', 'fast', 'tasks')",
    ),
]
_TrainSteps = Annotated[int, typer.Option("--train-steps", help="with --train: steps per run")]
_TrainTasks = Annotated[
    str, typer.Option("--train-tasks", help="with --train: comma-separated tasks (copy, induction)")
]


def bench_command(
    *,
    quick: _Quick = False,
    lengths: _Lengths = None,
    as_json: _AsJson = False,
    out: _Out = Path("bench-results"),
    variants: _Variants = None,
    heads: _Heads = 8,
    head_dim: _HeadDim = 64,
    batch: _Batch = 1,
    repeats: _Repeats = 0,
    device: _Device = None,
    threads: _Threads = 0,
    train: _Train = False,
    train_steps: _TrainSteps = 1500,
    train_tasks: _TrainTasks = "copy,induction",
) -> None:
    """Forward + backward time and peak memory per variant and engine, against SDPA, interleaved, medians
    (``--train``: training runs per CPU-hour, plain loop against the fast path)."""
    from axiomformer import bench

    expect_writable_folder(out)
    if train:
        _train_bench(out, as_json, train_steps, train_tasks, repeats or 5)
        return
    chosen = _variants(variants, quick, heads, head_dim)
    _check_device(device, threads)
    log: Callable[[str], None] = (lambda line: typer.echo(line, err=True)) if as_json else typer.echo
    log(
        f"bench: {len(chosen)} variant(s) against SDPA, L = {', '.join(map(str, _lengths(lengths, quick)))}; "
        "first the peak memory of each (one line each), then the timings (one line per row)"
    )
    rows, method = bench.run_bench(
        chosen,
        _lengths(lengths, quick),
        (True,) if quick else (True, False),
        batch=batch,
        heads=heads,
        head_dim=head_dim,
        repeats=repeats or bench.MIN_CI_REPEATS,
        reference_max_len=0 if quick else 1024,
        device=device,
        log=log,
    )
    _write_bench(out, rows, method, device, as_json, log)


def _variants(text: str | None, quick: bool, heads: int, head_dim: int) -> tuple[str, ...]:
    """``--variants`` (';'-separated relax strings, each checked) or the default set of ``--quick`` or not."""
    from axiomformer import bench

    chosen = (
        tuple(v.strip() for v in text.split(";") if v.strip())
        if text
        else (bench.QUICK_VARIANTS if quick else bench.FULL_VARIANTS)
    )
    for relax in chosen:
        try:
            bench.variant_spec(heads * head_dim, heads, relax)  # causal-only and non-causal-only ok
        except ValueError as err:
            raise typer.BadParameter(f"variant {relax!r}: {err}") from None
    return chosen


def _check_device(device: str | None, threads: int) -> None:
    """Check ``--device`` and ``--threads``; set torch's CPU threads when asked."""
    import torch

    if device and device not in ("cpu", "cuda"):
        raise typer.BadParameter(f"--device must be cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise typer.BadParameter("--device cuda: no CUDA device is available")
    if threads < 0:
        raise typer.BadParameter(f"--threads must be >= 0, got {threads}")
    if threads:
        torch.set_num_threads(threads)


def _write_bench(
    out: Path, rows: list[Row], method: str, device: str | None, as_json: bool, log: Callable[[str], None]
) -> None:
    """``bench.json``, ``bench.md`` and ``bench.png`` into ``out``; the goal report; the JSON with ``--json``."""
    import torch

    from axiomformer import bench

    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name() if dev == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    out.mkdir(parents=True, exist_ok=True)
    payload = {"device": name, "torch": torch.__version__, "rows": bench.rows_as_dicts(rows)}
    (out / "bench.json").write_text(json.dumps(payload, indent=1))
    (out / "bench.md").write_text(bench.markdown(rows, name, method))
    bench.plot(rows, out / "bench.png")
    log(f"peak memory method: {method}")
    for line in bench.goal_report(rows):
        log(line)
    log(f"wrote {out / 'bench.json'}, {out / 'bench.md'}, {out / 'bench.png'}")
    if as_json:
        typer.echo(json.dumps(payload))


def _train_bench(out: Path, as_json: bool, steps: int, tasks_text: str, repeats: int) -> None:
    """``bench --train``: checks its options, runs :func:`axiomformer.train_bench.run_train_bench`, writes
    ``train_bench.json`` into ``out`` and prints the report (as JSON on the last line with ``--json``)."""
    from axiomformer import train_bench

    tasks = tuple(t.strip() for t in tasks_text.split(",") if t.strip())
    unknown = [t for t in tasks if t not in train_bench.TRAIN_BENCH_TASKS]
    if not tasks or unknown:
        raise typer.BadParameter(
            f"--train-tasks {tasks_text!r}: choose from {', '.join(train_bench.TRAIN_BENCH_TASKS)}"
        )
    if steps < 1:
        raise typer.BadParameter(f"--train-steps must be >= 1, got {steps}")
    if repeats < 1:
        raise typer.BadParameter(f"--repeats must be >= 1, got {repeats}")
    log = (lambda line: typer.echo(line, err=True)) if as_json else typer.echo
    log(f"bench --train: {', '.join(tasks)}; {repeats} pairs of {steps}-step runs per task, plain and fast, 1 thread")
    report = train_bench.run_train_bench(tasks, steps=steps, repeats=repeats, log=log)
    import torch

    report = {"device": "cpu (1 thread)", "torch": torch.__version__, **report}
    out.mkdir(parents=True, exist_ok=True)
    (out / "train_bench.json").write_text(json.dumps(report, indent=1))
    for line in train_bench.describe(report):
        log(line)
    log(f"wrote {out / 'train_bench.json'}")
    if as_json:
        typer.echo(json.dumps(report))
