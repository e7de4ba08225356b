#!/bin/bash
export OMP_NUM_THREADS=1 MPLBACKEND=Agg
A=/work/venv/bin/axiomformer
run() { name=$1; shift; /usr/bin/time -f "$name cpu %U" $A train --task needle_kv --seq-len 64 --quiet --json --eval-every 100 --eval-batches 4 --test-batches 13 --batch-size 32 --warmup 20 --seed 7 "$@" > $name.out 2> $name.err; tail -1 $name.out > $name.json; }
run a_d64_p4 --dim 64 --heads 4 --steps 3000 --lr 3e-3 -o pairs=4
run b_d32_p2 --dim 32 --heads 2 --steps 3000 --lr 3e-3 -o pairs=2
run c_d32_p4 --dim 32 --heads 2 --steps 3000 --lr 3e-3 -o pairs=4
run d_d32_p4_l1e2 --dim 32 --heads 2 --steps 3000 --lr 1e-2 -o pairs=4
