"""Seed a part's resumable store with learning rates another part of the same run already chose:

    python benchmarks/flow_prefill.py OUT_DIR --theta T --mixing M1,M2 [--value V] [--steps K] [--lr-rank R] SOURCE [...]

The learning-rate choice (``axiomformer.flows.experiment.choose_lrs``) depends only on the data, the selection seeds
and the (theta, arm, K) cell, not on which other arms a process trains, so a part that trains arms whose rates a
running part has already chosen (its ``lr for theta=... arm K=k: lr  (validation accuracy {...})`` progress lines in
LOG) need not choose them again. This writes ``OUT_DIR/flow_results.partial.json`` with the header of
``axiomformer flow --theta T --mixing M1,M2 --out OUT_DIR`` (the default protocol otherwise), those rates and their
validation scores, and no finished arms; the command then resumes from it and chooses only the rates still missing.

A SOURCE ending in ``.json`` is a finished store (``flow_results.json``): its ``lr`` and ``lr_scores`` of theta T are
taken. That is right only where the store chose its rates by the same rule: the same grid, selection seeds and data,
each rate trained for this protocol's ``lr_epochs`` (a store of ``epochs`` = 20 without ``lr_epochs`` chose them as
``lr_epochs`` = 20 does); the script checks those settings and refuses a store that differs.
"""

from __future__ import annotations

import ast
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

LINE = re.compile(r"^lr for theta=(\S+) (\S+(?: \(A/A\))?) K=(\d+): (\S+)  \(validation accuracy (\{.*\})\)$")


def main(
    out: str,
    theta: str,
    mixing: str,
    logs: list[str],
    value: str | None = None,
    lr_rank: int = 1,
    steps: str | None = None,
) -> None:
    from axiomformer.commands.flow import _flow_config
    from axiomformer.flows.experiment import _header

    cfg, noise = _flow_config(
        "mnist5k",
        model="quadratic",
        patch=7,
        readout="mean",
        theta=theta,
        mixing=mixing,
        value=value,
        seeds=None,
        noise="0,1.0",
        steps=steps,
        quick=False,
        lr_rank=lr_rank,
    )
    cfg = replace(cfg, K=tuple(sorted(set(cfg.K))))
    lrs, scores = {}, {}
    for log in logs:
        if log.endswith(".json"):
            store = json.loads(Path(log).read_text())
            _check_same_selection(store["config"], cfg)
            keep = [k for k in store["lr"] if k.startswith(f"{theta}:")]
            lrs |= {k: store["lr"][k] for k in keep}
            scores |= {k: store.get("lr_scores", {})[k] for k in keep if k in store.get("lr_scores", {})}
            continue
        for line in Path(log).read_text().splitlines():
            m = LINE.match(line)
            if m and m.group(1) == theta:
                key = f"{m.group(1)}:{m.group(2)}:{m.group(3)}"
                lrs[key] = float(m.group(4))
                scores[key] = {f"{k:g}": v for k, v in ast.literal_eval(m.group(5)).items()}
    header = _header("mnist5k", noise, list(range(cfg.seeds)), False, cfg)
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / "flow_results.partial.json").write_text(
        json.dumps(header | {"arms": [], "lr": lrs, "lr_scores": scores})
    )
    print(f"{out}: {len(lrs)} learning rates carried: {sorted(lrs)}")


def _check_same_selection(old: dict, cfg) -> None:
    """Refuse a store whose learning rates were chosen by another rule than ``cfg``'s."""
    old_epochs = old.get("lr_epochs") or old["epochs"]
    same = {
        "lr_epochs": old_epochs == (cfg.lr_epochs or cfg.epochs),
        **{k: old[k] == getattr(cfg, k) for k in ("lr_seeds", "fit_epochs", "max_train", "val_fraction", "batch_size")},
        "lr_grid": tuple(old["lr_grid"]) == tuple(cfg.lr_grid),
    }
    if not all(same.values()):
        raise SystemExit(f"the store chose its rates by another rule: {[k for k, v in same.items() if not v]} differ")


if __name__ == "__main__":
    args = sys.argv[1:]
    out = args.pop(0)
    opts: dict[str, str | None] = {"--value": None, "--lr-rank": "1", "--steps": None}
    for flag in ("--theta", "--mixing", "--value", "--lr-rank", "--steps"):
        if flag in args:
            i = args.index(flag)
            opts[flag] = args[i + 1]
            del args[i : i + 2]
    main(
        out,
        str(opts["--theta"]),
        str(opts["--mixing"]),
        args,
        opts["--value"],
        int(str(opts["--lr-rank"])),
        opts["--steps"],
    )
