"""Every single-assumption variant trains on ``needle`` at L = 10,000 (issue 7's memory goal), one process each.

Trains (what ``axiomformer train --task needle --seq-len 10000 --batch-size 1 --steps 1 --eval-batches 1`` runs) the
standard spec and every single-axis relaxation, in a fresh process per variant (so each peak is its own), and writes a
Markdown table of the trainer's seconds, peak memory (``peak_mem_mb``) and engines to
``benchmarks/results/needle_10k.md``.
Usage: ``python benchmarks/needle_10k.py [--timeout SECONDS] [--only relax1;relax2]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from axiomformer.spec import AXES, AttentionSpec

SEQ_LEN = 10000
OUT = Path(__file__).parent / "results" / "needle_10k.md"


PAIRWISE = ("contribution=joint", "score=additive", "score=mlp")
"""Variants that build a (query, key, hidden) tensor per block: by far the slowest, so they run last."""


def variants() -> list[str]:
    """ "standard" and every single-axis relaxation (feature maps other than elu with the linear normalizer),
    the :data:`PAIRWISE` ones last."""
    base = AttentionSpec.standard(64, 4, causal=True)
    found = ["standard"]
    for axis, choices in AXES.items():
        for choice in choices:
            if axis == "feature_map":
                if choice != base.feature_map:
                    found.append(f"normalizer=linear,feature_map={choice}")
            elif choice != getattr(base, axis):
                found.append(f"{axis}={choice}")
    return [v for v in found if v not in PAIRWISE] + list(PAIRWISE)


PROGRAM = """
import json, sys
from axiomformer.train import TrainConfig, train
r = train(TrainConfig(task="needle", seq_len=int(sys.argv[1]), batch_size=1, steps=1, eval_batches=1,
                      spec=sys.argv[2]))
print(json.dumps({"peak_mem_mb": r.peak_mem_mb, "engine": r.engine, "seconds": r.seconds}))
"""


def run(relax: str, timeout: float) -> dict:
    """One variant in a fresh process: one training step and one eval batch at ``SEQ_LEN``."""
    cmd = [sys.executable, "-c", PROGRAM, str(SEQ_LEN), relax]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"variant": relax, "status": f"timeout after {timeout:.0f} s"}
    if done.returncode != 0:
        return {"variant": relax, "status": "failed: " + (done.stderr.strip().splitlines() or ["?"])[-1][:120]}
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "variant": relax,
        "status": "ok",
        "seconds": round(result["seconds"], 1),
        "peak_mem_mb": round(result["peak_mem_mb"], 1),
        "engine": result["engine"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    chosen = args.only.split(";") if args.only else variants()
    rows = []
    for relax in chosen:
        rows.append(run(relax, args.timeout))
        print(json.dumps(rows[-1]), flush=True)
    lines = [
        f"`needle`, L = {SEQ_LEN}, batch 1, dim 64, 4 heads, 2 layers: one training step and one eval batch per "
        "variant, each in a fresh process; peak memory as the trainer measures it (`TrainResult.peak_mem_mb`).",
        "",
        "| variant | status | seconds | peak MiB | engine |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['variant']} | {r['status']} | {r.get('seconds', '')} | {r.get('peak_mem_mb', '')} | "
        f"{r.get('engine', '')} |"
        for r in rows
    ]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    print(OUT)


if __name__ == "__main__":
    main()
