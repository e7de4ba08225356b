"""Decode-step cost of a sliding-window layer against the length decoded so far (issue 25, deliverable 4).

One ``Attention`` layer (dim 512, 8 heads, causal, window 16, RoPE) is prefilled with T tokens through a ``KVCache``
and then decodes 32 single tokens, the lengths' steps interleaved; the median step time and the cache size are printed
for each T. With the cache
keeping only the window, both stay flat in T (before: 3.05 ms at 1k and 16.3 ms at 16k). Timings are medians on a
shared machine: read them as a trend, not as absolute numbers.

    python benchmarks/window_decode.py [--lengths 1024,4096,16384] [--out benchmarks/results/window_decode.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from axiomformer import Attention, AttentionSpec, KVCache


def prefilled(length: int, window: int = 16) -> tuple[Attention, KVCache]:
    torch.manual_seed(0)
    layer = Attention(AttentionSpec.standard(512, 8, causal=True).relax(window=window, position="rope")).eval()
    cache = KVCache()
    with torch.no_grad():
        layer(torch.randn(1, length, 512), cache=cache)
    return layer, cache


def decode_ms(lengths: list[int], steps: int = 32) -> list[tuple[float, int]]:
    """Median decode-step ms and cache size per prefill length, the lengths' steps interleaved (A B C A B C ...) so
    that load from other processes hits every length alike."""
    layers = [prefilled(length) for length in lengths]
    times: list[list[float]] = [[] for _ in lengths]
    with torch.no_grad():
        for _ in range(steps):
            for (layer, cache), record in zip(layers, times):
                x = torch.randn(1, 1, 512)
                start = time.perf_counter()
                layer(x, cache=cache)
                record.append((time.perf_counter() - start) * 1000)
    return [(statistics.median(record), cache.length) for record, (_, cache) in zip(times, layers)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1024,4096,16384")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)  # a one-token step gains nothing from a second thread on a busy machine
    lengths = [int(x) for x in args.lengths.split(",")]
    rows = []
    for length, (ms, stored) in zip(lengths, decode_ms(lengths)):
        rows.append({"tokens_before": length, "decode_ms": round(ms, 3), "cache_positions": stored})
        print(f"T={length:>6}: decode step {ms:7.3f} ms (median of 32), cache holds {stored} positions")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows}, indent=1)
        )


if __name__ == "__main__":
    main()
