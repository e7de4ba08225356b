"""Seeds for the flow experiment's paired comparisons: a power calculation from the previous store's variance.

    python benchmarks/flow_power.py [STORE_JSON] [--family M] [--effect D]

Reads the per-seed accuracies of a stored ``flow_results.json`` (default ``benchmarks/results/flow/power_source.json``:
the 5-seed store of main f26c7b1, which this run replaced), takes the standard deviation over seeds of the paired
differences of the tied-value comparisons it has (attention/tied - neither and both/tied - mlp, theta fixed, K = 1
and 2, every noise level; K = 4 and 8 are left out: they had diverged seeds under the old single learning rate), and
asks statsmodels' ``TTestPower`` (a paired t-test is a one-sample t-test of the differences) how many seeds detect a
difference D with power 0.8 at the Bonferroni level 0.05 / M, a conservative bound for Holm over a family of M
comparisons. The default run has M = 36 (6 pairs x K = 1, 2, 4 x 2 noise levels).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np


def paired_sds(store: dict, pairs, ks=(1, 2, 4)) -> dict[tuple, float]:
    cell = {(r["theta"], r["arm"], r["noise"], r["K"]): r["acc"] for r in store["arms"]}
    out = {}
    for a, b in pairs:
        for k in ks:
            for sigma in store["noise"]:
                if ("fixed", a, sigma, k) in cell and ("fixed", b, sigma, k) in cell:
                    d = np.subtract(cell[("fixed", a, sigma, k)], cell[("fixed", b, sigma, k)])
                    out[(a, b, k, sigma)] = float(np.std(d, ddof=1))
    return out


def seeds_needed(sd: float, effect: float, alpha: float, power: float = 0.8) -> int:
    from statsmodels.stats.power import TTestPower

    n = 2
    while n < 200 and TTestPower().power(effect / sd, n, alpha, alternative="two-sided") < power:
        n += 1
    return n


def main(path: str, family: int, effect: float) -> None:
    store = json.loads(Path(path).read_text())
    sds = paired_sds(store, [("attention/tied", "neither"), ("both/tied", "mlp")], ks=(1, 2))
    for key, sd in sds.items():
        print(f"{key}: sd of paired differences {sd:.4f}")
    alpha = 0.05 / family
    for name, sd in (
        ("median", float(np.median(list(sds.values())))),
        ("75th percentile", float(np.percentile(list(sds.values()), 75))),
    ):
        print(
            f"{name} sd {sd:.4f}: seeds for D = {effect} at alpha {alpha:.4g}, power 0.8: "
            f"{seeds_needed(sd, effect, alpha)}"
        )


if __name__ == "__main__":
    args = sys.argv[1:]
    opts = {"--family": "36", "--effect": "0.02"}
    for flag in list(opts):
        if flag in args:
            i = args.index(flag)
            opts[flag] = args[i + 1]
            del args[i : i + 2]
    main(
        args[0] if args else "benchmarks/results/flow/power_source.json", int(opts["--family"]), float(opts["--effect"])
    )
