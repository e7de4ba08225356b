"""The range of `axiomformer bench` ratios over repeated runs, as a Markdown table against the goals of issue 25.

    python benchmarks/range_table.py RUN_DIR [RUN_DIR ...] > table.md

Each RUN_DIR holds the `bench.json` of one run. For every (variant, engine, L) row: the ratio to SDPA of each run
(measured side by side within the run), its min-max range, and the peak memory (MiB, the largest over the runs) with
SDPA's. A goal is stated as met only when it holds in every run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TIME_GOALS = {"standard": 1.05, "score=cosine": 1.3, "score=neg_l2": 1.3, "position=rope": 1.3,
              "position=alibi": 1.3, "normalizer=softmax1": 1.3, "normalizer=sigmoid": 1.5, "normalizer=relu": 1.5,
              "normalizer=sparsemax": 2.0, "normalizer=entmax15": 2.0}
FASTER_THAN_SDPA_AT_4096 = ("normalizer=linear", "window=256")


def load(dirs: list[str]) -> list[list[dict]]:
    return [json.loads((Path(d) / "bench.json").read_text())["rows"] for d in dirs]


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
    keys = [k for k in keyed[0] if all(k in run for run in keyed)]
    lines = ["| variant | engine | L | ratio to SDPA per run | range | goal | time goal | peak MiB (SDPA) | "
             "memory <= 2x SDPA |", "|---|---|---|---|---|---|---|---|---|"]
    for key in keys:
        rows = [run[key] for run in keyed]
        ratios = [r["ratio_vs_sdpa"] for r in rows]
        verdicts = [holds(rows[0], x) for x in ratios]
        if verdicts[0] is None:
            verdict = "-"
        else:
            verdict = "met" if all(verdicts) else ("NOT met" if not any(verdicts) else
                                                   f"met in {sum(verdicts)} of {len(verdicts)} runs")
        peak, sdpa_peak = max(r["peak_mem_mb"] for r in rows), max(r["sdpa_peak_mem_mb"] for r in rows)
        memory = "-" if key[2] < 4096 or key[1].startswith("x-transformers") else (
            "met" if peak <= 2 * sdpa_peak else "NOT met")
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {', '.join(f'{x:.2f}' for x in ratios)} | "
                     f"{min(ratios):.2f}-{max(ratios):.2f} | {goal(rows[0])} | {verdict} | {peak:.0f} ({sdpa_peak:.0f}) | "
                     f"{memory} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(table(load(sys.argv[1:])), end="")
