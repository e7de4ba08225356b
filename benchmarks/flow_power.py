"""Seeds for the flow experiment's paired comparisons: a power calculation from a previous store's variance.

    python benchmarks/flow_power.py [STORE_JSON] [--family M] [--effect D] [--seeds N]

Reads the per-seed accuracies of a stored ``flow_results.json`` (default ``benchmarks/results/flow/power_source.json``:
the 16-seed default store of a23110c, theta fixed, K = 0, 1, 2, 4, which the current default replaced), takes the
standard deviation over seeds of the paired differences of every pair of the main family it has (theta fixed,
K = 1, 2, 4, every noise level), and asks statsmodels' ``TTestPower`` (a paired t-test is a one-sample t-test of the
differences) how many seeds detect a difference D with power 0.8 at the Bonferroni level 0.05 / M. It also prints the
half-width of the Bonferroni interval (level 1 - 0.05 / M) at N seeds: the symmetric verdict rule can say "no
difference within +-m" only where that half-width is below m. The default run's main family has M = 128 (8 pairs x
theta fixed, learned x K = 1, 2, 4, 8 x 2 noise levels).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

MAIN_PAIRS = (
    ("attention/tied", "neither"),
    ("attention/tied", "token_mlp"),
    ("attention/tied", "shuffled/tied"),
    ("attention/classifier", "neither"),
    ("attention/classifier", "shuffled/classifier"),
    ("both/tied", "mlp"),
)


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


def half_width(sd: float, n: int, family: int) -> float:
    """Half-width of the paired t-interval at the Bonferroni level 1 - 0.05 / family, n seeds."""
    from scipy import stats

    return float(stats.t.ppf(1 - 0.05 / (2 * family), n - 1) * sd / np.sqrt(n))


def main(path: str, family: int, effect: float, n: int) -> None:
    store = json.loads(Path(path).read_text())
    sds = paired_sds(store, MAIN_PAIRS)
    for key, sd in sds.items():
        print(f"{key}: sd of paired differences {sd:.4f}")
    alpha = 0.05 / family
    for name, sd in (
        ("median", float(np.median(list(sds.values())))),
        ("75th percentile", float(np.percentile(list(sds.values()), 75))),
    ):
        print(
            f"{name} sd {sd:.4f}: seeds for D = {effect} at alpha {alpha:.4g}, power 0.8: "
            f"{seeds_needed(sd, effect, alpha)}; Bonferroni half-width at {n} seeds: {half_width(sd, n, family):.4f}"
        )


if __name__ == "__main__":
    args = sys.argv[1:]
    opts = {"--family": "128", "--effect": "0.02", "--seeds": "16"}
    for flag in list(opts):
        if flag in args:
            i = args.index(flag)
            opts[flag] = args[i + 1]
            del args[i : i + 2]
    main(
        args[0] if args else "benchmarks/results/flow/power_source.json",
        int(opts["--family"]),
        float(opts["--effect"]),
        int(opts["--seeds"]),
    )
