"""``axiomformer bench --train``: runs per CPU-hour of the study's model on the plain training loop and on the fast
path (``TrainConfig(fast=True, compile=True)``, :mod:`axiomformer.fastpath`), side by side in one process.

Each task of :data:`TRAIN_BENCH_TASKS` (the study's size: width 32, 2 layers, 2 heads, batch 32, CPU) trains a fixed
number of steps (no early stopping, so both paths do the same work) on both paths, in pairs: pair ``i`` trains seed
``i`` plainly and on the fast path, the order alternating from pair to pair (A B, B A, ...) so that a drift in the
machine's load falls on both alike. The time of a run is the CPU seconds of this process and its reaped children
(``resource.getrusage``), with one torch thread. One warm-up pair comes first and is reported apart: it holds the fast
path's one-time ``torch.compile`` cost, which a process pays once per model structure (a study worker trains many runs
of one structure).

The speedup is the geometric mean of the pairs' ratios (plain CPU seconds / fast CPU seconds) with a 95 % t interval
on their logarithms (``scipy.stats.ttest_1samp``): paired, so the load the two runs of a pair share cancels.
"""

from __future__ import annotations

import math
import resource
from collections.abc import Callable
from typing import Any

TRAIN_BENCH_TASKS: dict[str, dict[str, Any]] = {
    "copy": {"task": "copy", "seq_len": 16, "task_options": {"vocab": 8}},
    "induction": {"task": "induction", "seq_len": 32},
}
"""The tasks the training bench runs, at the sizes the study trains them."""

STUDY_MODEL: dict[str, Any] = {"dim": 32, "layers": 2, "heads": 2, "batch_size": 32, "device": "cpu"}
"""The study's model and batch: about 26k parameters."""

_NO_EARLY_STOPPING: dict[str, Any] = {"target_accuracy": None, "patience": None}
"""Every run trains its ``steps`` (so the plain and the fast path do the same work)."""


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its children that have been waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def bench_config(task: str, steps: int, seed: int, fast: bool) -> Any:
    """The :class:`~axiomformer.train.TrainConfig` of one timed run: ``steps`` steps, no early stopping.

    Raises:
        ValueError: ``task`` is not one of :data:`TRAIN_BENCH_TASKS` (naming them).
    """
    from axiomformer.train import TrainConfig

    if task not in TRAIN_BENCH_TASKS:
        raise ValueError(f"unknown training-bench task {task!r}; choose from: {', '.join(TRAIN_BENCH_TASKS)}")
    return TrainConfig(
        **TRAIN_BENCH_TASKS[task], **STUDY_MODEL, **_NO_EARLY_STOPPING, steps=steps, seed=seed, fast=fast, compile=fast
    )


def _timed_run(task: str, steps: int, seed: int, fast: bool) -> tuple[float, Any]:
    """(CPU seconds, TrainResult) of one run."""
    from axiomformer.train import train

    config = bench_config(task, steps, seed, fast)
    start = cpu_seconds()
    result = train(config, progress=False)
    return cpu_seconds() - start, result


def paired_speedup(plain: list[float], fast: list[float]) -> dict[str, float | None]:
    """Geometric-mean ratio plain / fast over the pairs and its 95 % t interval on the log ratios (``None`` bounds
    with fewer than 2 pairs).

    Raises:
        ValueError: lists of different lengths, empty, or holding a non-positive time.
    """
    from scipy import stats

    if len(plain) != len(fast) or not plain:
        raise ValueError(f"need the same positive number of plain and fast times, got {len(plain)} and {len(fast)}")
    if min(plain + fast) <= 0:
        raise ValueError("CPU times must be positive")
    logs = [math.log(p / f) for p, f in zip(plain, fast, strict=True)]
    mean = sum(logs) / len(logs)
    if len(logs) < 2:
        return {"speedup": math.exp(mean), "ci_low": None, "ci_high": None}
    if max(logs) - min(logs) == 0:
        return {"speedup": math.exp(mean), "ci_low": math.exp(mean), "ci_high": math.exp(mean)}
    low, high = stats.ttest_1samp(logs, 0.0).confidence_interval(0.95)
    return {"speedup": math.exp(mean), "ci_low": math.exp(low), "ci_high": math.exp(high)}


def _path_summary(times: list[float], results: list[Any], steps: int) -> dict[str, Any]:
    mean = sum(times) / len(times)
    return {
        "cpu_s_per_run": mean,
        "runs_per_cpu_hour": 3600.0 / mean,
        "cpu_ms_per_step": 1000.0 * mean / steps,
        "cpu_s": times,
        "accuracy": [r.accuracy for r in results],
    }


def bench_task(task: str, *, steps: int, repeats: int, log: Callable[[str], None]) -> dict[str, Any]:
    """One task's entry of :func:`run_train_bench`: a warm-up pair, then ``repeats`` timed pairs."""
    warm_plain, _ = _timed_run(task, steps, 10_000, False)
    warm_fast, _ = _timed_run(task, steps, 10_000, True)
    times: dict[bool, list[float]] = {False: [], True: []}
    results: dict[bool, list[Any]] = {False: [], True: []}
    for pair in range(repeats):
        for on_fast_path in (False, True) if pair % 2 == 0 else (True, False):
            seconds, result = _timed_run(task, steps, pair, on_fast_path)
            times[on_fast_path].append(seconds)
            results[on_fast_path].append(result)
        log(f"{task} pair {pair + 1}/{repeats}: plain {times[False][-1]:.2f} CPU-s, fast {times[True][-1]:.2f} CPU-s")
    plain, fast = _path_summary(times[False], results[False], steps), _path_summary(times[True], results[True], steps)
    ratio = paired_speedup(times[False], times[True])
    return {
        "task": task,
        "config": {**TRAIN_BENCH_TASKS[task], **STUDY_MODEL, "steps": steps},
        "params": results[False][0].params if repeats else None,
        "plain": plain,
        "fast": fast,
        **ratio,
        "warmup": {
            "plain_cpu_s": warm_plain,
            "fast_cpu_s": warm_fast,
            "compile_cpu_s": warm_fast - fast["cpu_s_per_run"],
        },
    }


def run_train_bench(
    tasks: tuple[str, ...] = tuple(TRAIN_BENCH_TASKS),
    *,
    steps: int = 1500,
    repeats: int = 5,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Runs per CPU-hour on the plain loop and on the fast path, per task, with one torch thread.

    Returns:
        ``{"speedup", "ci_low", "ci_high", "plain", "fast", "tasks": [per-task entries], "threads": 1, "steps",
        "repeats"}``: the top-level figures pool every task's pairs (each pair's ratio counts once); ``plain`` and
        ``fast`` hold ``runs_per_cpu_hour`` and ``cpu_ms_per_step`` of the pooled runs. A task's entry has the same
        fields for its own pairs, its accuracies and its warm-up pair (``compile_cpu_s``: the first fast run's CPU
        seconds above the timed fast runs' mean).

    Raises:
        ValueError: an unknown task, ``steps < 1`` or ``repeats < 1``.
    """
    from axiomformer.runtime import torch_threads

    if steps < 1 or repeats < 1:
        raise ValueError(f"steps and repeats must be >= 1, got steps={steps}, repeats={repeats}")
    for task in tasks:
        bench_config(task, steps, 0, False)  # an unknown task fails before anything runs
    with torch_threads(1):
        entries = [bench_task(task, steps=steps, repeats=repeats, log=log) for task in tasks]
    plain = [t for e in entries for t in e["plain"]["cpu_s"]]
    fast = [t for e in entries for t in e["fast"]["cpu_s"]]
    pooled_steps = steps  # every run has the same number of steps
    return {
        **paired_speedup(plain, fast),
        "plain": {k: v for k, v in _path_summary(plain, [], pooled_steps).items() if k != "accuracy"},
        "fast": {k: v for k, v in _path_summary(fast, [], pooled_steps).items() if k != "accuracy"},
        "tasks": entries,
        "threads": 1,
        "steps": steps,
        "repeats": repeats,
    }


def describe(report: dict[str, Any]) -> list[str]:
    """Human-readable lines of a :func:`run_train_bench` report."""
    lines = []
    for entry in report["tasks"] + [dict(report, task="all tasks")]:
        interval = f" [95 % {entry['ci_low']:.2f}-{entry['ci_high']:.2f}]" if entry.get("ci_low") is not None else ""
        lines.append(
            f"{entry['task']}: plain {entry['plain']['runs_per_cpu_hour']:.0f} runs/CPU-h "
            f"({entry['plain']['cpu_ms_per_step']:.2f} CPU-ms/step), fast {entry['fast']['runs_per_cpu_hour']:.0f} "
            f"runs/CPU-h ({entry['fast']['cpu_ms_per_step']:.2f} CPU-ms/step): {entry['speedup']:.2f}x{interval}"
        )
        if "warmup" in entry:
            lines.append(f"  one-time compile cost of the fast path: {entry['warmup']['compile_cpu_s']:.1f} CPU-s")
    return lines


__all__ = [
    "STUDY_MODEL",
    "TRAIN_BENCH_TASKS",
    "bench_config",
    "bench_task",
    "cpu_seconds",
    "describe",
    "paired_speedup",
    "run_train_bench",
]
