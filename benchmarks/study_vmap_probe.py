"""Would batching the seeds of one arm into one model (``torch.func.stack_module_state`` + ``vmap``) speed up the
study? A side-by-side measurement on the main study's model and task (standard Transformer, width 32, 2 layers,
majority@32, batch 32): CPU seconds of ``STEPS`` forward+backward steps for ``SEEDS`` models one after another, and
for the same models stacked and vmapped. One torch thread. Prints one JSON line.

    nice -n 5 python benchmarks/study_vmap_probe.py
"""

from __future__ import annotations

import copy
import json
import time

import torch
from torch.func import functional_call, grad, stack_module_state, vmap

from axiomformer.evaluation import masked_loss
from axiomformer.models import build_model
from axiomformer.spec import AttentionSpec
from axiomformer.tasks import make_task

SEEDS, STEPS = 10, 20


def main() -> None:
    torch.set_num_threads(1)
    task = make_task("majority", seq_len=32)
    models = []
    for seed in range(SEEDS):
        torch.manual_seed(seed)
        models.append(
            build_model(
                "transformer",
                vocab_size=task.vocab_size,
                dim=32,
                num_layers=2,
                max_len=32,
                spec=AttentionSpec.standard(32, 2, causal=True),
            )
        )
    batches = [task.batch(32, seed=s) for s in range(SEEDS)]
    cpu = time.process_time()
    for _ in range(STEPS):
        for model, (x, y) in zip(models, batches):
            model.zero_grad()
            masked_loss(model(x), y).backward()
    serial = time.process_time() - cpu
    params, buffers = stack_module_state(models)
    base = copy.deepcopy(models[0]).to("meta")

    def loss(p, b, x, y):
        return masked_loss(functional_call(base, (p, b), (x,)), y)

    xs = torch.stack([x for x, _ in batches])
    ys = torch.stack([y for _, y in batches])
    try:
        cpu = time.process_time()
        for _ in range(STEPS):
            vmap(grad(loss))(params, buffers, xs, ys)
        stacked = time.process_time() - cpu
        out = {"serial_cpu_s": serial, "vmap_cpu_s": stacked, "speedup": serial / stacked}
    except Exception as err:
        out = {"serial_cpu_s": serial, "vmap_error": f"{type(err).__name__}: {err}"[:300]}
    print(json.dumps({"seeds": SEEDS, "steps": STEPS, **out}))


if __name__ == "__main__":
    main()
