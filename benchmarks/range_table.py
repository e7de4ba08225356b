"""The range of `axiomformer bench` ratios over repeated runs, as a Markdown table against the goals of issue 25.

    python benchmarks/range_table.py RUN_DIR [RUN_DIR ...] > table.md

Each RUN_DIR holds the `bench.json` of one run (or, for a run stopped early, its `bench.log`: the rows it printed). For every (variant, engine, L) row: the ratio to SDPA of each run
(measured side by side within the run), its min-max range, and the peak memory (MiB, the largest over the runs) with
SDPA's. A goal is stated as met only when it holds in every run.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

TIME_GOALS = {
    "standard": 1.05,
    "score=cosine": 1.3,
    "score=neg_l2": 1.3,
    "position=rope": 1.3,
    "position=alibi": 1.3,
    "normalizer=softmax1": 1.3,
    "normalizer=sigmoid": 1.5,
    "normalizer=relu": 1.5,
    "normalizer=sparsemax": 2.0,
    "normalizer=entmax15": 2.0,
}
FASTER_THAN_SDPA_AT_4096 = ("normalizer=linear", "window=256")


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


if __name__ == "__main__":
    print(table(load(sys.argv[1:])), end="")
