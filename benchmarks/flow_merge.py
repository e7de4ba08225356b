"""Merge ``axiomformer flow`` results run in parts (e.g. ``--theta fixed`` and ``--theta learned``, or disjoint
``--mixing`` lists, as separate processes: same seeds, same data, same fitted classifiers) into one result and redraw
its figures:

    python benchmarks/flow_merge.py OUT_DIR RUN_DIR [RUN_DIR ...]

It recomputes the paired comparisons over the merged family (Holm over all of them) and writes ``flow_results.md``
(``axiomformer.flows.report.markdown``).

Each RUN_DIR holds a ``flow_results.json``. The fits, the test-time flow and the sanity section depend only on the
seeds and the data, so they must agree across runs (checked); the arms are concatenated. An arm row that two parts
both have (``neither`` and every arm's K = 0: the same fitted network) must carry the same per-seed accuracies (checked)
and is kept once; so must a learning rate both parts chose.
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
    rows: dict[tuple, dict] = {}
    for r in results:
        for row in r["arms"]:
            key = (row["theta"], row["arm"], row["K"], row["noise"])
            if key in rows and rows[key]["acc"] != row["acc"]:
                raise ValueError(f"parts disagree on the accuracies of {key}: they are not parts of one experiment")
            rows.setdefault(key, row)
    merged["arms"] = list(rows.values())
    merged["lr"], merged["lr_scores"] = {}, {}
    for r in results:
        for k, v in r["lr"].items():
            if merged["lr"].setdefault(k, v) != v:
                raise ValueError(f"parts chose different learning rates for {k}")
        merged["lr_scores"].update(r.get("lr_scores", {}))
    config = dict(first["config"])
    for key in ("thetas", "mixings"):
        config[key] = list(dict.fromkeys(x for r in results for x in r["config"][key]))
    merged["config"] = config
    merged["runtime_s"] = [r["runtime_s"] for r in results]
    merged["cpu_s"] = [r.get("cpu_s") for r in results]
    merged["merged_from"] = [
        f"--theta {','.join(r['config']['thetas'])} --mixing {','.join(r['config']['mixings'])}" for r in results
    ]
    # one family: the corrections over the comparisons of every part together, not per part
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
