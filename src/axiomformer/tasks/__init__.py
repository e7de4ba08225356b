"""Tasks that probe long-range dependence: seeded generators of (inputs, targets) batches.

>>> task = make_task("mqar", seq_len=64)
>>> inputs, targets = task.batch(8, seed=0, split="train")   # int64 (8, 64) each; targets -100 where unscored
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from axiomformer.tasks.base import IGNORE, SPLITS, SyntheticTask, Task, in_eval_split, row_hash
from axiomformer.tasks.copy import CopyTask
from axiomformer.tasks.digits import DigitsTask
from axiomformer.tasks.induction import InductionTask
from axiomformer.tasks.mqar import MQARTask
from axiomformer.tasks.multiset import DistinctTask, MajorityTask
from axiomformer.tasks.needle import KeyValueNeedleTask, NeedleTask
from axiomformer.tasks.order import ReverseTask, SortCausalTask, SortTask
from axiomformer.tasks.selective_copy import SelectiveCopyTask
from axiomformer.tasks.text import TextTask

TASKS: dict[str, type[Task]] = {
    cls.name: cls
    for cls in (
        CopyTask,
        MQARTask,
        SelectiveCopyTask,
        NeedleTask,
        InductionTask,
        DigitsTask,
        TextTask,
        MajorityTask,
        DistinctTask,
        SortTask,
        SortCausalTask,
        ReverseTask,
        KeyValueNeedleTask,
    )
}
"""Every task by name."""


def task_options(name: str) -> tuple[str, ...]:
    """The keyword options of task ``name`` (besides seq_len)."""
    params = inspect.signature(TASKS[name].__init__).parameters
    return tuple(p for p in params if p not in ("self", "seq_len"))


def make_task(name: str, *, seq_len: int, **options: Any) -> Task:
    """Build task ``name`` for sequences of ``seq_len`` tokens.

    Raises:
        ValueError: an unknown task or option (naming the valid ones), or options the task rejects.
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of: {', '.join(TASKS)}")
    valid = task_options(name)
    unknown = [key for key in options if key not in valid]
    if unknown:
        raise ValueError(
            f"unknown option(s) {', '.join(map(repr, unknown))} for task {name!r}; "
            f"choose from: {', '.join(valid) or '(none)'}"
        )
    build: Callable[..., Task] = TASKS[name]  # every task class takes seq_len and its own options
    return build(seq_len=seq_len, **options)


__all__ = [
    "IGNORE",
    "SPLITS",
    "TASKS",
    "SyntheticTask",
    "Task",
    "in_eval_split",
    "make_task",
    "row_hash",
    "task_options",
]
