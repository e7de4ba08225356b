"""Merge ``axiomformer flow`` results run in parts (e.g. ``--theta fixed`` and ``--theta learned`` as two processes,
same seeds, same data, same fitted classifiers) into one result and redraw its figures:

    python benchmarks/flow_merge.py OUT_DIR RUN_DIR [RUN_DIR ...]

It recomputes the paired comparisons over the merged family (Holm over all of them) and writes ``flow_results.md``
(``axiomformer.flows.report.markdown``).

Each RUN_DIR holds a ``flow_results.json``. The fits, the test-time flow and the sanity section depend only on the
seeds and the data, so they must agree across runs (checked); the arms are concatenated.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from axiomformer.flows.comparisons import compare_arms
from axiomformer.flows.figures import write_figures
from axiomformer.flows.report import markdown


def merge(results: list[dict]) -> dict:
    first = results[0]
    for other in results[1:]:
        for key in ("data", "n_train", "n_test", "model", "patch", "readout", "noise", "K", "seeds", "test_time_flow"):
            if other[key] != first[key]:
                raise ValueError(f"runs disagree on {key!r}: they are not parts of one experiment")
    merged = dict(first)
    merged["arms"] = [row for r in results for row in r["arms"]]
    merged["lr"] = {k: v for r in results for k, v in r["lr"].items()}
    merged["config"] = dict(first["config"], thetas=[t for r in results for t in r["config"]["thetas"]])
    merged["runtime_s"] = [r["runtime_s"] for r in results]
    merged["merged_from"] = [f"--theta {','.join(r['config']['thetas'])}" for r in results]
    # one family: Holm over the comparisons of every part together, not per part
    acc = {(r["theta"], r["arm"], r["K"], r["noise"]): r["acc"] for r in merged["arms"]}
    merged["comparisons"], merged["equivalence"] = compare_arms(acc, first["config"]["equivalence_margin"])
    return merged


def main(out: str, *runs: str) -> None:
    result = merge([json.loads((Path(r) / "flow_results.json").read_text()) for r in runs])
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result["figures"] = write_figures(out_dir, result)
    (out_dir / "flow_results.json").write_text(json.dumps(result, indent=1))
    (out_dir / "flow_results.md").write_text(markdown(result))


if __name__ == "__main__":
    main(*sys.argv[1:])
