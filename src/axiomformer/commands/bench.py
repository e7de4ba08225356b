"""``axiomformer bench``: time and peak memory of every variant's attention against SDPA."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from axiomformer.errors import expect_folder


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
    @app.command("bench")
    def bench_command(
        quick: bool = typer.Option(
            False,
            "--quick",
            help="goal variants, causal, L = 1024 and 4096, without the reference rows (minutes on a CPU)",
        ),
        lengths: str = typer.Option(None, "--lengths", help="comma-separated sequence lengths, e.g. 512,1024,2048"),
        as_json: bool = typer.Option(False, "--json", help="print the rows as JSON on the last line"),
        out: Path = typer.Option(Path("bench-results"), "--out", help="folder for bench.json, bench.md, bench.png"),
        variants: str = typer.Option(
            None, "--variants", help="';'-separated relax strings (default: the goal variants; more without --quick)"
        ),
        heads: int = typer.Option(8, help="attention heads"),
        head_dim: int = typer.Option(64, help="head dimension"),
        batch: int = typer.Option(1, help="batch size"),
        repeats: int = typer.Option(
            0, help="timed pairs (default 7: the 95 % interval of each ratio, ratio_ci, needs them)"
        ),
        device: str = typer.Option(None, help="cpu or cuda (default: cuda when available)"),
        threads: int = typer.Option(0, help="torch CPU threads (default: torch's choice)"),
    ) -> None:
        """Forward + backward time and peak memory per variant and engine, against SDPA, interleaved, medians."""
        import torch

        from axiomformer import bench

        expect_folder(out)
        chosen = (
            tuple(v.strip() for v in variants.split(";") if v.strip())
            if variants
            else (bench.QUICK_VARIANTS if quick else bench.FULL_VARIANTS)
        )
        for relax in chosen:
            try:
                bench.variant_spec(heads * head_dim, heads, relax)  # causal-only and non-causal-only ok
            except ValueError as err:
                raise typer.BadParameter(f"variant {relax!r}: {err}") from None
        if device and device not in ("cpu", "cuda"):
            raise typer.BadParameter(f"--device must be cpu or cuda, got {device!r}")
        if device == "cuda" and not torch.cuda.is_available():
            raise typer.BadParameter("--device cuda: no CUDA device is available")
        if threads < 0:
            raise typer.BadParameter(f"--threads must be >= 0, got {threads}")
        if threads:
            torch.set_num_threads(threads)
        log = (lambda line: typer.echo(line, err=True)) if as_json else typer.echo
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
