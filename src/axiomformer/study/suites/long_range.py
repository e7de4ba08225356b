"""The long-range suite (``axiomformer study --suite long-range``): accuracy against sequence length, 64 to 10,000.

Models: the standard Transformer and the recurrent baselines (tanh RNN, LSTM, GRU via ``torch.nn.RNN/LSTM/GRU``),
parameter-matched to the Transformer. Tasks:

* ``needle``: one key-value pair at a position uniform over the whole sequence, the key asked at the end
  (``axiomformer.tasks.needle`` with ``shared=False``): the model must keep one item for a distance uniform in
  ``2 .. T``, not just latch the first few tokens. Keys, values and filler use disjoint vocabularies **(our
  choice)**: with one shared vocabulary the standard Transformer did not learn the task at T = 64 within the CPU
  budget (measured: chance after 1,000 steps), which would leave the curve uninformative; memory *capacity* is
  the MQAR task's job.
* ``mqar``: multi-query associative recall with the number of pairs growing with the length (Zoology's capacity
  setting, Arora et al. 2023; ``pairs_per_token``): a fixed-size state must eventually run out of room.

Protocol **(our choice, stated in the report)**: a curriculum over lengths. Each (model, task) picks its learning
rate from ``lr_grid`` on the validation split at the shortest length (selection seed 0); then, length by length, each
model continues from its own weights at the previous length with that rate. Every model gets the same budget at
every length (steps, batch, evaluations), so the recurrent models get as much as the Transformer; early stopping on
validation (target accuracy or patience) may end any run sooner. A length is *solved* when the test accuracy
reaches ``SOLVED`` (0.9).
"""

from __future__ import annotations

from pathlib import Path

from axiomformer.study.registry import Suite, register

SOLVED = 0.9
"""Test accuracy at which the report counts a length as solved **(our choice)**."""

LENGTHS = [64, 256, 1024, 4096, 10000]

_NEEDLE = {"shared": False}

_MQAR = {"vocab": 32, "pairs_per_token": 1 / 640}
"""32 tokens (16 keys, Zoology's distinct-key setting scaled down for CPU); pairs max(4, T/640): 4 up to T = 2,560, 6
at 4,096, 15 at 10,000 (a 2-layer width-32 Transformer reached 0.54 test accuracy at T = 64 after 1,000 steps;
with 128 tokens, 0.27)."""


def _length_budgets(scale: float = 1.0) -> dict[str, dict]:
    """Per-length budgets of the default preset, sized so that the whole suite runs in about an hour of one CPU
    thread on a shared 2-core machine (measured: one training step at T = 10,000 and batch 4 takes about 4.5 s
    for the Transformer, 5 s for the GRU, 1.5 s for the tanh RNN and 0.3 s for the LSTM, single thread)."""
    def steps(n: int) -> int:
        return max(10, int(n * scale))

    return {
        "64": {"steps": steps(1500), "batch_size": 32, "warmup": 20, "eval_every": 100, "eval_batches": 4},
        "256": {"steps": steps(300), "batch_size": 16, "warmup": 20, "eval_every": 100, "eval_batches": 4},
        "1024": {"steps": steps(100), "batch_size": 8, "warmup": 10, "eval_every": 50, "eval_batches": 4},
        "4096": {"steps": steps(25), "batch_size": 4, "warmup": 5, "eval_every": 25, "eval_batches": 4},
        "10000": {"steps": steps(15), "batch_size": 4, "warmup": 3, "eval_every": 15, "eval_batches": 6},
    }


def _tasks(lengths: list[int], budgets: dict[str, dict]) -> list[dict]:
    chosen = {k: v for k, v in budgets.items() if int(k) in lengths}
    return [{"name": "needle", "seq_lens": lengths, "options": dict(_NEEDLE), "length_budgets": chosen},
            {"name": "mqar", "seq_lens": lengths, "options": dict(_MQAR), "length_budgets": chosen}]


DEFAULT = {
    "name": "axiomformer long-range study (default preset)",
    "seeds": 2,
    "curriculum": True,
    "variants": ["standard"],
    "baselines": ["rnn", "lstm", "gru"],
    "tasks": _tasks(LENGTHS, _length_budgets()),
    "budget": {"lr_grid": [1e-3, 3e-3, 1e-2], "patience": 4, "target_accuracy": 0.99, "weight_decay": 0.1},
    "model": {"dim": 32, "layers": 2, "heads": 2},
    "sections": {"audit": False, "derive": False, "flow": False},
    "workers": 1,
}

QUICK = DEFAULT | {
    "name": "axiomformer long-range study (quick preset)",
    "tasks": _tasks([64, 256], _length_budgets(0.2)),
}

FULL = DEFAULT | {
    "name": "axiomformer long-range study (full preset)",
    "seeds": 3,
    "tasks": _tasks([64, 128, 256, 512, 1024, 2048, 4096, 10000], {
        str(n): {"steps": 2000, "batch_size": max(2, 2048 // n) if n > 256 else 32, "warmup": 50,
                 "eval_every": 100, "eval_batches": 8, "patience": 5} for n in (64, 128, 256, 512, 1024, 2048, 4096,
                                                                               10000)}),
    "model": {"dim": 64, "layers": 2, "heads": 4},
    "workers": "auto",
}


def sections(d, figures_dir: Path) -> list:
    from axiomformer.study import long_range_report

    return long_range_report.sections(d, figures_dir, solved=SOLVED)


SUITE = register(Suite(name="long-range", summary="accuracy against sequence length, 64 to 10,000 tokens: Transformer vs "
                                         "RNN, LSTM, GRU on needle and capacity-scaled MQAR",
              presets={"quick": QUICK, "default": DEFAULT, "full": FULL}, sections=sections))
