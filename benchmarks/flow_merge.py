"""Merge ``axiomformer flow`` results run in parts (e.g. ``--theta fixed`` and ``--theta learned``, or disjoint
``--mixing`` lists, as separate processes: same seeds, same data, same fitted classifiers) into one result and redraw
its figures:

    python benchmarks/flow_merge.py OUT_DIR RUN_DIR [RUN_DIR ...]

It recomputes the paired comparisons over the merged family (Holm over all of them) and writes ``flow_results.md``
(``axiomformer.flows.report.markdown``).

Each RUN_DIR holds a ``flow_results.json``, or, for a part that was cut off, its resumable
``flow_results.partial.json`` (its finished arms only): then the merged result is marked ``"partial": true`` and lists
every cell of the parts' protocols that is not finished under ``"missing"`` (``axiomformer flow`` with the part's
options and ``--out RUN_DIR`` resumes it). The fits, the test-time flow and the sanity section depend only on the
seeds and the data, so they must agree across runs (checked); the arms are concatenated. An arm row that two parts
both have (``neither`` and every arm's K = 0: the same fitted network) must carry the same per-seed accuracies (checked)
and is kept once; so must a learning rate both parts chose.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from axiomformer.flows.comparisons import compare_arms
from axiomformer.flows.experiment import default_config
from axiomformer.flows.figures import write_figures
from axiomformer.flows.report import markdown


def _expected(result: dict) -> set[tuple]:
    """Every (theta, arm, K, noise) cell that a part's protocol reports."""
    from axiomformer.flows.experiment import FlowConfig, arm_names

    fields = set(FlowConfig.__dataclass_fields__)
    cfg = FlowConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in result["config"].items() if k in fields})
    return {
        (t, a, k, s) for t in cfg.thetas for a, _, _ in arm_names(cfg) for k in result["K"] for s in result["noise"]
    }


def merge(results: list[dict]) -> dict:
    done = [r for r in results if not r.get("partial_part")]
    first = done[0] if done else results[0]
    with_tt = [r for r in results if r["test_time_flow"]]
    for other in results:
        for key in ("data", "n_train", "n_test", "model", "patch", "readout", "noise", "K", "seeds"):
            if other[key] != first[key]:
                raise ValueError(f"runs disagree on {key!r}: they are not parts of one experiment")
        if other["test_time_flow"] and other["test_time_flow"] != with_tt[0]["test_time_flow"]:
            raise ValueError("runs disagree on 'test_time_flow': they are not parts of one experiment")
    merged = dict(first)
    merged["test_time_flow"] = with_tt[0]["test_time_flow"] if with_tt else []
    merged.pop("partial_part", None)
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
    for key in ("thetas", "mixings", "values"):
        config[key] = list(dict.fromkeys(x for r in results for x in r["config"][key]))
    merged["config"] = config
    merged["runtime_s"] = [r.get("runtime_s") for r in results]
    merged["cpu_s"] = [r.get("cpu_s") for r in results]
    expected = set().union(*(_expected(r) for r in results))
    default = asdict(default_config())
    split = ("thetas", "mixings", "values")
    if all(json.loads(json.dumps(v)) == config.get(k) for k, v in default.items() if k not in split):
        # the parts are pieces of the default protocol: every cell of it that no part finished is missing
        expected |= _expected({"config": default, "K": merged["K"], "noise": merged["noise"]})
    missing = sorted(expected - set(rows), key=str)
    merged["partial"] = bool(missing)
    merged["missing"] = [{"theta": t, "arm": a, "K": k, "noise": s} for t, a, k, s in missing]
    merged["merged_from"] = [
        f"--theta {','.join(r['config']['thetas'])} --mixing {','.join(r['config']['mixings'])}" for r in results
    ]
    # one family: the corrections over the comparisons of every part together, not per part
    acc = {(r["theta"], r["arm"], r["K"], r["noise"]): r["acc"] for r in merged["arms"]}
    merged["comparisons"], merged["equivalence"] = compare_arms(acc, first["config"]["equivalence_margin"])
    return merged


def _load(run: str) -> dict:
    path = Path(run) / "flow_results.json"
    if path.exists():
        return json.loads(path.read_text())
    return json.loads((Path(run) / "flow_results.partial.json").read_text()) | {"partial_part": True}


def main(out: str, *runs: str) -> None:
    result = merge([_load(r) for r in runs])
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result["figures"] = write_figures(out_dir, result)
    (out_dir / "flow_results.json").write_text(json.dumps(result, indent=1))
    (out_dir / "flow_results.md").write_text(markdown(result))


if __name__ == "__main__":
    main(*sys.argv[1:])
