#!/usr/bin/env bash
# The GPU paths in one go (under 10 minutes on one GPU): the CUDA-marked tests (every registered engine -- sdpa, linear,
# elementwise, sparse, chunked, flex -- against the reference in fp32, and in bf16 where the engine takes half types;
# the compiled flex engine; the trainer on CUDA), the engine matrix's routing on CUDA (the router's kind holds the
# device, so CUDA problems get decisions of their own), then `axiomformer bench --device cuda` (x-transformers' math
# and flash rows included).
# Output: benchmarks/results/gpu/{environment.txt,tests.txt,bench.log,bench.json,bench.md,bench.png}
# (or under $OUT when set, e.g. on a lent device machine). Run from anywhere: bash benchmarks/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
DEST="${OUT:-benchmarks/results}/gpu"
mkdir -p "$DEST"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA device visible to torch; nothing to check" >&2
    exit 2
fi
python - > "$DEST/environment.txt" <<'PY'
import platform, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "python", platform.python_version())
print("device", torch.cuda.get_device_name(), torch.cuda.get_device_properties(0).total_memory // 2**20, "MiB")
PY
cat "$DEST/environment.txt"

status=0
# 1. The CUDA tests (a few minutes at most, mostly compiling flex_attention).
timeout 300 python -m pytest -q -m cuda -rs tests/test_cuda.py tests/test_engine_matrix.py 2>&1 | tee "$DEST/tests.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

# 2. The benchmark on CUDA: the full variant list, fallback to --quick when it would not finish in time.
if ! timeout 300 python -m axiomformer bench --device cuda --out "$DEST" 2>&1 | tee "$DEST/bench.log"; then
    echo "gpu_check: the full bench did not finish in 300 s; running --quick" | tee -a "$DEST/bench.log"
    timeout 150 python -m axiomformer bench --device cuda --quick --out "$DEST" 2>&1 | tee -a "$DEST/bench.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
echo "gpu_check: exit status $status; results in $DEST"
exit $status
