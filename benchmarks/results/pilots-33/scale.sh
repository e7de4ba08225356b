#!/bin/bash
export OMP_NUM_THREADS=1 MPLBACKEND=Agg
A=/work/venv/bin/axiomformer
while pgrep -f "pilot/run.sh" >/dev/null; do sleep 20; done
for h in 8 4 1; do for s in standard scale=none; do
 n=s_h${h}_${s/=/_}
 /usr/bin/time -f "$n cpu %U" $A train --task induction --seq-len 32 -o vocab=16 --dim 64 --heads $h --layers 2 --spec $s --steps 1200 --lr 3e-3 --batch-size 32 --warmup 20 --eval-every 50 --eval-batches 8 --seed 7 --no-early-stop --quiet --json > $n.out 2> $n.err; tail -1 $n.out > $n.json
done; done
