"""The flow experiment's learning-rate check, from two merged stores of the same seeds and data:

    python benchmarks/flow_lr_check.py MAIN_STORE SECOND_STORE [OUT_JSON]

MAIN_STORE is the default run's ``flow_results.json`` (every arm at its chosen rate); SECOND_STORE the same arms at
their second-best rates (``axiomformer flow --lr-rank 2``, on the K it has: the check costs a full run per K, so the
committed one covers the cheap K only). Every verdict of MAIN_STORE's comparisons whose two arms SECOND_STORE has is
recomputed with either side at its second-best rate (``axiomformer.flows.comparisons.lr_check``); a verdict that
changes is ``lr_sensitive``. Writes OUT_JSON (default: ``lr_check.json`` beside MAIN_STORE) and prints a summary.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from axiomformer.flows.comparisons import lr_check


def _acc(store: dict) -> dict[tuple, list[float]]:
    return {(r["theta"], r["arm"], r["K"], r["noise"]): r["acc"] for r in store["arms"]}


def main(main_path: str, second_path: str, out: str | None = None) -> None:
    main_store, second = (json.loads(Path(p).read_text()) for p in (main_path, second_path))
    if main_store["seeds"] != second["seeds"] or main_store["noise"] != second["noise"]:
        raise SystemExit("the two stores differ in seeds or noise levels: not the same experiment")
    if second["config"].get("lr_rank") != 2 or main_store["config"].get("lr_rank", 1) != 1:
        raise SystemExit("MAIN_STORE must be trained at the chosen rates (lr_rank 1), SECOND_STORE at lr_rank 2")
    rows = lr_check(_acc(main_store), _acc(second), main_store["equivalence"])
    target = Path(out) if out else Path(main_path).with_name("lr_check.json")
    payload = {"main": main_path, "second": second_path, "K": sorted({r["K"] for r in rows}), "rows": rows}
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    tmp.replace(target)
    sensitive = [r for r in rows if r["lr_sensitive"]]
    print(f"{len(rows)} verdicts checked at K = {payload['K']}; {len(sensitive)} lr-sensitive -> {target}")
    for r in rows:
        flag = "  LR-SENSITIVE" if r["lr_sensitive"] else ""
        print(
            f"{r['theta']:7} {r['a']} - {r['b']} K={r['K']} noise={r['noise']:g}: {r['verdict']} | a at its 2nd: "
            f"{r['a_second']} | b at its 2nd: {r['b_second']}{flag}"
        )


if __name__ == "__main__":
    main(*sys.argv[1:4])
