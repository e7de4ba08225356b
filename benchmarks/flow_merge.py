"""Merge ``axiomformer flow`` results run per theta setting into one result and redraw its figures.

The default flow experiment was run as two processes on the shared machine, ``--theta fixed`` and ``--theta learned``
(same seeds, same data, same fitted classifiers), to use both cores:

    python benchmarks/flow_merge.py OUT_DIR RUN_DIR [RUN_DIR ...]

It also writes ``flow_results.md``: the accuracy tables, the paired differences that say whether attention helps, and
the test-time flow table.

Each RUN_DIR holds a ``flow_results.json``. The fits, the test-time flow and the sanity section depend only on the
seeds and the data, so they must agree across runs (checked); the arms are concatenated.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from axiomformer.flows.experiment import t_interval
from axiomformer.flows.figures import write_figures


def merge(results: list[dict]) -> dict:
    first = results[0]
    for other in results[1:]:
        for key in ("data", "n_train", "n_test", "model", "patch", "readout", "noise", "K", "seeds",
                    "test_time_flow"):
            if other[key] != first[key]:
                raise ValueError(f"runs disagree on {key!r}: they are not parts of one experiment")
    merged = dict(first)
    merged["arms"] = [row for r in results for row in r["arms"]]
    merged["lr"] = {k: v for r in results for k, v in r["lr"].items()}
    merged["config"] = dict(first["config"], thetas=[t for r in results for t in r["config"]["thetas"]])
    merged["runtime_s"] = [r["runtime_s"] for r in results]
    merged["merged_from"] = [f"--theta {','.join(r['config']['thetas'])}" for r in results]
    return merged


def _cell(mean, low, high) -> str:
    return f"{mean:.3f}" if low is None else f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def _diff(mean, low, high) -> str:
    return f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]"


def tables(result: dict) -> str:
    """Markdown: accuracy per arm (mean [95% t-interval]), the paired effects of attention, the test-time flow."""
    ks, noise = result["K"], result["noise"]
    cell = {(r["theta"], r["arm"], r["noise"], r["K"]): r for r in result["arms"]}
    lines = [f"Data: {result['data']} ({result['n_train']} train / {result['n_test']} test), model {result['model']}, "
             f"patch {result['patch']}, readout {result['readout']}; seeds {result['seeds']}; {result['interval']}.", ""]
    for theta in dict.fromkeys(r["theta"] for r in result["arms"]):
        lines += [f"**theta {theta}**", "", "| arm | noise | " + " | ".join(f"K={k}" for k in ks) + " |",
                  "|---|---|" + "---|" * len(ks)]
        for arm in dict.fromkeys(r["arm"] for r in result["arms"] if r["theta"] == theta):
            for sigma in noise:
                rows = [cell[(theta, arm, sigma, k)] for k in ks]
                lines.append(f"| {arm} | {sigma:g} | " + " | ".join(
                    _cell(r["acc_mean"], r["ci_low"], r["ci_high"]) for r in rows) + " |")
        lines.append("")
    # Paired over seeds (same seed = same fit, same data order and noise): what adding attention changes.
    pairs = [("attention/tied", "neither"), ("attention/free", "neither"), ("both/tied", "mlp"), ("both/free", "mlp"),
             ("mlp", "neither")]
    lines += ["**Paired differences (arm A minus arm B, same seeds), mean [95% t-interval]**", "",
              "| theta | A - B | noise | " + " | ".join(f"K={k}" for k in ks if k) + " |",
              "|---|---|---|" + "---|" * len([k for k in ks if k])]
    for theta in dict.fromkeys(r["theta"] for r in result["arms"]):
        for a, b in pairs:
            if (theta, a, noise[0], ks[-1]) not in cell or (theta, b, noise[0], ks[-1]) not in cell:
                continue
            for sigma in noise:
                diffs = [_diff(*t_interval([x - y for x, y in zip(cell[(theta, a, sigma, k)]["acc"],
                                                                   cell[(theta, b, sigma, k)]["acc"])]))
                         for k in ks if k]
                lines.append(f"| {theta} | {a} - {b} | {sigma:g} | " + " | ".join(diffs) + " |")
    lines += ["", "**Test-time flow (theta fixed, test features flowed without labels)**", "",
              "| method | noise | " + " | ".join(f"K={k}" for k in ks) + " |", "|---|---|" + "---|" * len(ks)]
    tt = {(r["method"], r["noise"], r["K"]): r for r in result["test_time_flow"]}
    for method in dict.fromkeys(r["method"] for r in result["test_time_flow"]):
        for sigma in noise:
            lines.append(f"| {method} | {sigma:g} | " + " | ".join(
                _cell(tt[(method, sigma, k)]["acc_mean"], tt[(method, sigma, k)]["ci_low"],
                      tt[(method, sigma, k)]["ci_high"]) for k in ks) + " |")
    return "\n".join(lines) + "\n"


def main(out: str, *runs: str) -> None:
    result = merge([json.loads((Path(r) / "flow_results.json").read_text()) for r in runs])
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result["figures"] = write_figures(out_dir, result)
    (out_dir / "flow_results.json").write_text(json.dumps(result, indent=1))
    (out_dir / "flow_results.md").write_text(tables(result))


if __name__ == "__main__":
    main(*sys.argv[1:])
