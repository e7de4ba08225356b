"""The range of `axiomformer bench` ratios over repeated runs, as a Markdown table against the goals of `axiomformer bench` (``axiomformer.bench.GOALS``).

    python benchmarks/range_table.py RUN_DIR [RUN_DIR ...] > table.md            # one row per (variant, engine, L)
    python benchmarks/range_table.py --worst RUN_DIR [RUN_DIR ...] > table.md    # one row per goal, its worst L

Each RUN_DIR holds the `bench.json` of one run (or, for a run stopped early, its `bench.log`: the rows it printed). For every (variant, engine, L) row: the ratio to SDPA of each run
(measured side by side within the run), its min-max range, and the peak memory (MiB, the largest over the runs) with
SDPA's. A goal is stated as met only when it holds in every run.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from axiomformer.bench import FASTER_THAN_SDPA, GOALS

TIME_GOALS = GOALS
FASTER_THAN_SDPA_AT_4096 = tuple(FASTER_THAN_SDPA)


ROW = re.compile(
    r"^(\S+)\s+(\S+)\s+L=(\d+)\s+causal=(\w+)\s+([\d.]+) ms \(\s*([\d.]+)x SDPA ([\d.]+) ms\)\s+"
    r"peak\s+([\d.]+) MiB \(SDPA ([\d.]+)\)"
)


def parse_log(text: str) -> list[dict]:
    """The rows a run printed (for a run stopped before it wrote ``bench.json``)."""
    rows = []
    for line in text.splitlines():
        if m := ROW.match(line):
            rows.append(
                {
                    "variant": m[1],
                    "engine": m[2],
                    "seq_len": int(m[3]),
                    "causal": m[4] == "True",
                    "ms": float(m[5]),
                    "ratio_vs_sdpa": float(m[6]),
                    "sdpa_ms": float(m[7]),
                    "peak_mem_mb": float(m[8]),
                    "sdpa_peak_mem_mb": float(m[9]),
                }
            )
    return rows


def load(dirs: list[str]) -> list[list[dict]]:
    """Each run's rows: ``bench.json``, or the rows its ``bench.log`` holds when the run was stopped early."""
    runs = []
    for d in map(Path, dirs):
        done = d / "bench.json"
        runs.append(json.loads(done.read_text())["rows"] if done.exists() else parse_log((d / "bench.log").read_text()))
    return runs


def goal(row: dict) -> str:
    variant, length = row["variant"], row["seq_len"]
    if row["engine"].startswith("x-transformers"):
        return "(comparison)"
    if variant in TIME_GOALS:
        return f"<= {TIME_GOALS[variant]}x"
    if variant in FASTER_THAN_SDPA_AT_4096:
        return "< 1x" if length >= 4096 else "-"
    return "-"


def holds(row: dict, ratio: float) -> bool | None:
    variant, length = row["variant"], row["seq_len"]
    if row["engine"].startswith("x-transformers"):
        return None
    if variant in TIME_GOALS:
        return ratio <= TIME_GOALS[variant]
    if variant in FASTER_THAN_SDPA_AT_4096 and length >= 4096:
        return ratio < 1.0
    return None


def table(runs: list[list[dict]]) -> str:
    keyed = [{(r["variant"], r["engine"], r["seq_len"]): r for r in rows} for rows in runs]
    keys = list(dict.fromkeys(k for run in keyed for k in run))
    lines = [
        "| variant | engine | L | ratio to SDPA per run | range | goal | time goal | peak MiB (SDPA) | "
        "memory <= 2x SDPA |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key in keys:
        rows = [run[key] for run in keyed if key in run]
        ratios = [r["ratio_vs_sdpa"] for r in rows]
        verdicts = [holds(rows[0], x) for x in ratios]
        if verdicts[0] is None:
            verdict = "-"
        else:
            verdict = (
                "met"
                if all(verdicts)
                else ("NOT met" if not any(verdicts) else f"met in {sum(verdicts)} of {len(verdicts)} runs")
            )
        peak, sdpa_peak = max(r["peak_mem_mb"] for r in rows), max(r["sdpa_peak_mem_mb"] for r in rows)
        memory = (
            "-"
            if key[2] < 4096 or key[1].startswith("x-transformers")
            else ("met" if peak <= 2 * sdpa_peak else "NOT met")
        )
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {', '.join(f'{x:.2f}' for x in ratios)} | "
            f"{min(ratios):.2f}-{max(ratios):.2f} | {goal(rows[0])} | {verdict} | {peak:.0f} ({sdpa_peak:.0f}) | "
            f"{memory} |"
        )
    return "\n".join(lines) + "\n"


def _auto(rows: list[dict], variant: str, length: int | None = None) -> list[dict]:
    """The auto-routed rows of a variant (not the reference engine's, not x-transformers'), at one length or all."""
    return [
        r
        for r in rows
        if r["variant"] == variant
        and r["engine"] != "reference"
        and not r["engine"].startswith("x-")
        and (length is None or r["seq_len"] == length)
    ]


def worst_table(runs: list[list[dict]]) -> str:
    """One row per goal: each run's worst ratio over the lengths, their range, whether the goal held in every run, and
    the peak memory at L = 4096; then whether peak memory stayed within 2x SDPA's at L = 4096 in each run."""
    lines = [
        "| variant | engine | goal | "
        + " | ".join(f"run {i + 1}" for i in range(len(runs)))
        + " | range | status | peak MiB at L = 4096 (per run; SDPA) |",
        "|---|---|---|" + "---|" * len(runs) + "---|---|---|",
    ]
    goals = [(v, f"time <= {g}x SDPA", lambda x, g=g: x <= g, None) for v, g in TIME_GOALS.items()]
    goals += [(v, f"faster than {b} at L>=4096", lambda x: x < 1.0, 4096) for v, b in FASTER_THAN_SDPA.items()]
    for variant, text, ok, length in goals:
        mine = [_auto(rows, variant, length) for rows in runs]
        if not all(mine):
            continue
        worst = [max(r["ratio_vs_sdpa"] for r in rows) for rows in mine]
        held = [ok(x) for x in worst]
        status = "met in all" if all(held) else ("not met" if not any(held) else f"met in {sum(held)}")
        long = [_auto(rows, variant, 4096)[0] for rows in runs]
        peaks = ", ".join(f"{r['peak_mem_mb']:.0f}" for r in long)
        lines.append(
            f"| `{variant}` | {mine[0][0]['engine']} | {text} | "
            + " | ".join(f"{x:.2f}x" for x in worst)
            + f" | {min(worst):.2f}-{max(worst):.2f}x | {status} | {peaks} ({long[0]['sdpa_peak_mem_mb']:.0f}) |"
        )
    memory = []
    for i, rows in enumerate(runs):
        over = sorted(
            {
                r["variant"]
                for r in rows
                if r["seq_len"] == 4096
                and r in _auto(rows, r["variant"])
                and r["peak_mem_mb"] > 2 * r["sdpa_peak_mem_mb"]
            }
        )
        memory.append(f"run {i + 1}: " + ("met for every variant" if not over else "NOT met for " + ", ".join(over)))
    return "\n".join(lines) + "\n\nPeak memory (<= 2x SDPA at L = 4096): " + "; ".join(memory) + ".\n"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worst"]:
        print(worst_table(load(sys.argv[2:])), end="")
    else:
        print(table(load(sys.argv[1:])), end="")
