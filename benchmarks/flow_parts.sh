#!/usr/bin/env bash
# The default flow store, trained in parts by WORKERS processes (one thread each), then merged:
#   bash benchmarks/flow_parts.sh OUT_ROOT [WORKERS]     # resumable: rerun it after an interruption
#   python benchmarks/flow_merge.py OUT OUT_ROOT/*_*/    # once every part has its flow_results.json
# Each part is `axiomformer flow --theta T --mixing M --out OUT_ROOT/T_NAME` (the default protocol otherwise), its
# learning rates first carried from the committed store where that store chose them by the same rule
# (benchmarks/flow_prefill.py checks it). Parts run in the order below: theta fixed (the source's setting) first.
set -uo pipefail
root="$1"; workers="${2:-2}"
source_store="${SOURCE_STORE:-benchmarks/results/flow/flow_results.json}"
py="${PYTHON:-python}"
parts=(
    "fixed attention attention" "fixed neither neither" "fixed uniform uniform" "fixed mlps token_mlp,mlp"
    "fixed shuffled shuffled" "fixed both both"
    "learned attention attention" "learned neither neither" "learned uniform uniform" "learned mlps token_mlp,mlp"
    "learned shuffled shuffled" "learned both both"
)
mkdir -p "$root"

worker() {
    for part in "${parts[@]}"; do
        read -r theta name mixing <<<"$part"
        dir="$root/${theta}_${name}"
        mkdir "$dir.lock" 2>/dev/null || continue  # another worker has it (or had it: remove stale locks by hand)
        if [ ! -f "$dir/flow_results.json" ]; then
            mkdir -p "$dir"
            [ -f "$dir/flow_results.partial.json" ] || \
                "$py" benchmarks/flow_prefill.py "$dir" --theta "$theta" --mixing "$mixing" "$source_store" >>"$dir/run.log"
            echo "# $(date -u) code of commit $(git rev-parse --short HEAD)" >>"$dir/run.log"
            OMP_NUM_THREADS=1 /usr/bin/time -v nice -n 5 "$py" -m axiomformer flow --theta "$theta" --mixing "$mixing" \
                --out "$dir" >>"$dir/run.log" 2>&1
        fi
        rmdir "$dir.lock"
    done
}

for _ in $(seq "$workers"); do worker & sleep 5; done
wait
