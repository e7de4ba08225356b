"""The trainer: AdamW, linear warmup + cosine decay, gradient clipping, eval accuracy, early stop, determinism.

>>> result = train(TrainConfig(task="mqar", seq_len=64, steps=150, dim=32), progress=False)
>>> result.accuracy, result.steps, result.tokens_per_second

Determinism: PyTorch's generators seeded with ``config.seed`` before the model is built (scoped by
:func:`axiomformer.runtime.seeded`: the caller's random stream is left as it was; under torchrun, ranks > 0 then
continue from their own seed, ``distributed.rank_seed``, so each draws its own dropout masks), and every batch is a
pure function of (seed, step): training batch ``s`` is
``task.batch(batch_size, seed=(config.seed << 32) + s, split="train")``,
validation batch ``i`` is ``task.batch(batch_size, seed=i, split="val")`` and test batch ``i`` the same with
``split="test"`` — the same validation and test sets for every training seed, disjoint from each other and from every
training example (see ``axiomformer.tasks.base``). Same config, same threads -> same losses.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from pydantic import ConfigDict, Field, model_validator

from axiomformer.budget import Budget
from axiomformer.distributed import DataParallel, resolve_device
from axiomformer.evaluation import MAX_BATCH_TOKENS, eval_counts, eval_counts_as_is, evaluate_as_is, masked_loss
from axiomformer.memory import PeakMemory
from axiomformer.models import CONTROL_KINDS, MODEL_KINDS, build_model, count_parameters, default_heads
from axiomformer.runtime import seeded
from axiomformer.spec import LAYER_SEPARATOR, AttentionSpec, stack_specs
from axiomformer.tasks import TASKS, make_task

if TYPE_CHECKING:
    from rich.progress import Progress

GENERIC_DEFAULTS: dict[str, Any] = {
    "steps": 1000,
    "batch_size": 32,
    "lr": 3e-3,
    "warmup": 50,
    "eval_every": 100,
    "eval_batches": 4,
    "target_accuracy": None,
    "patience": None,
}
"""Defaults of the tunable fields where the task's ``budget_defaults`` (``tasks/base.py``: tuned per task class) give
none."""

MIN_LR_RATIO = 0.1
"""Cosine decay ends at this fraction of the peak learning rate **(our choice)**."""


class TrainConfig(Budget):
    """One training run, validated at the door (unknown keys rejected): the budget (:class:`axiomformer.budget.Budget`)
    plus what is trained on what.

    Fields left unset among ``steps, batch_size, lr, warmup, eval_every, eval_batches, target_accuracy`` take the
    task's defaults (its class's ``budget_defaults``, else ``GENERIC_DEFAULTS``); ``target_accuracy=None`` given
    explicitly disables early stopping on it.
    ``init_from``: a safetensors state dict (saved by an earlier run, same model and width) to start from instead of
    a fresh initialization (the long-range suite's curriculum warm start). ``init_stream``: 0 initializes the model
    from ``seed``; any other value draws the initial weights from another stream (``init_seed``) while the training
    batches, dropout masks and Gumbel draws still follow ``seed`` (the study's A/A control: the same model, data and
    order, another initialization).

    Model options (Transformer only; ``causal``, ``mlp_ratio`` and ``input_position="none"`` also for the validity
    controls): ``causal=False`` builds a bidirectional encoder, ``mlp_ratio=0`` attention-only blocks, ``max_len``
    the longest sequence the model accepts (default ``seq_len``; set it to evaluate longer sequences after training).
    ``gumbel_tau_final`` anneals the Gumbel-softmax temperature of a ``normalizer=gumbel_softmax`` spec from its
    ``gumbel_tau`` to this value (:func:`gumbel_tau_at`).

    Measurements that never change training (``axiomformer.probes``, stored in ``TrainResult.extra``):
    ``eval_lengths`` evaluates the trained model at other sequence lengths (the model accepts up to the longest),
    ``probes`` names others (``init_entropy``, ``sampled_eval``).

    The fast path (:mod:`axiomformer.fastpath`; ``docs/training_speed.md``, ``axiomformer bench --train``):
    ``fast=True`` steps with fused AdamW and clips on a prebuilt parameter list, ``compile=True`` runs the training
    forward under ``torch.compile`` (a one-time compile per process and model structure). The same step, rounded
    differently: results agree with the plain loop's in distribution, not bit for bit.

    Raises:
        pydantic.ValidationError (a ValueError): unknown task/model (naming the choices), a bad spec string, or
            non-positive sizes.
    """

    model_config = ConfigDict(extra="forbid")

    task: str = "mqar"
    seq_len: int = Field(64, ge=1)
    model: str = "transformer"
    spec: str = "standard"
    layers: int = Field(2, ge=1)
    dim: int = Field(64, ge=1)
    heads: int | None = Field(None, ge=1)
    seed: int = Field(0, ge=0)
    device: str = "auto"
    input_position: str = "auto"
    task_options: dict[str, Any] = Field(default_factory=dict)
    causal: bool = True
    mlp_ratio: int = Field(4, ge=0)
    max_len: int | None = Field(None, ge=1)
    gumbel_tau_final: float | None = Field(None, gt=0)
    eval_lengths: list[int] = Field(default_factory=list)
    probes: list[str] = Field(default_factory=list)
    init_from: str | None = None
    init_stream: int = Field(0, ge=0)
    fast: bool = False
    compile: bool = False

    if TYPE_CHECKING:
        # What the type checker may rely on after validation: ``_fill_and_check`` fills these budget fields (and
        # ``heads``) from the task's defaults, so a validated config never holds None there.
        steps: int
        batch_size: int
        lr: float
        warmup: int
        eval_every: int
        eval_batches: int

    @model_validator(mode="after")
    def _fill_and_check(self) -> TrainConfig:
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; choose one of: {', '.join(TASKS)}")
        if self.model not in MODEL_KINDS:
            raise ValueError(f"unknown model {self.model!r}; choose one of: {', '.join(MODEL_KINDS)}")
        defaults = {**GENERIC_DEFAULTS, **TASKS[self.task].budget_defaults}
        explicit = set(self.model_fields_set)
        for name, value in defaults.items():
            if getattr(self, name) is None and (name not in ("target_accuracy", "patience") or name not in explicit):
                if name == "batch_size":
                    value = max(1, min(value, MAX_BATCH_TOKENS // self.seq_len))
                object.__setattr__(self, name, value)
        if self.heads is None:
            object.__setattr__(self, "heads", default_heads(self.dim))
        from axiomformer.probes import PROBES

        unknown = [p for p in self.probes if p not in PROBES]
        if unknown:
            raise ValueError(f"unknown probe(s) {unknown}; choose from: {', '.join(PROBES)}")
        if any(n < 1 for n in self.eval_lengths):
            raise ValueError(f"eval_lengths must be positive, got {self.eval_lengths}")
        if self.model == "transformer":
            spec = self.attention_spec()  # raises ValueError on a bad spec string or dim/heads mismatch
            if spec.causal != self.causal:  # the spec string's causal=... decides (false: a bidirectional encoder)
                object.__setattr__(self, "causal", spec.causal)
        return self

    def attention_spec(self) -> AttentionSpec:
        """``AttentionSpec.standard(dim, heads, causal=causal, max_len=max_len or seq_len).relax(spec)`` (the first
        layer's for a hybrid stack, ``spec`` with ``/`` between the layers' relax strings: :meth:`layer_specs`)."""
        return self.layer_specs()[0]

    def layer_specs(self) -> list[AttentionSpec]:
        """Each layer's spec (:func:`axiomformer.spec.stack_specs`): all the same unless ``spec`` has ``/``."""
        heads = self.heads if self.heads is not None else default_heads(self.dim)
        base = AttentionSpec.standard(self.dim, heads, causal=self.causal, max_len=self.model_max_len)
        return stack_specs(base, self.spec, self.layers)

    @property
    def init_seed(self) -> int:
        """The seed the initial weights are drawn from: ``seed`` for stream 0, else a seed of its own per stream (in
        32 bits: PyTorch's CPU generator keeps only the low 32 bits of a seed)."""
        if self.init_stream == 0:
            return self.seed
        return (self.seed ^ (0x9E3779B9 * self.init_stream)) & 0xFFFFFFFF

    @property
    def model_max_len(self) -> int:
        """The longest sequence the model accepts: at least ``seq_len``, ``max_len`` and every ``eval_lengths``."""
        return max(self.seq_len, self.max_len or self.seq_len, *self.eval_lengths)


@dataclass
class TrainResult:
    """The outcome of :func:`train`.

    Attributes:
        accuracy: **test** accuracy over scored positions (targets != -100) of the test split, with the weights of
            the best validation evaluation.
        loss: mean test cross-entropy over those positions (nats).
        val_accuracy, val_loss: the best validation evaluation (the one whose weights were tested).
        best_step: the step of that evaluation.
        converged: False when the run used all ``steps`` while its validation score was still improving (its best
            evaluation among the last ``patience`` ones, 3 when ``patience`` is None).
        stop_reason: ``"target"``, ``"patience"``, ``"steps"`` or ``"nonfinite"``.
        n_test: scored test positions behind ``accuracy`` (one per sequence on needle): the n of a binomial
            interval over the test items.
        steps: optimizer steps taken (early stop may cut them short).
        seconds: wall time of training plus evaluation; a run resumed from its progress file adds the wall time its
            earlier processes spent up to the last evaluation they saved.
        earlier_cpu_seconds: CPU seconds the earlier processes of a resumed run spent up to that evaluation (0 for a
            run in one process): the study adds it to this process's CPU time, so a resumed run's cost is whole.
        params: trainable parameters.
        tokens_per_second: training tokens (batch_size * seq_len per step) / training seconds (eval excluded).
        peak_mem_mb: peak memory of the run above its start, in MiB (:class:`axiomformer.memory.PeakMemory`:
            the CUDA allocator's peak, or Linux's peak resident set size reset at the start).
        memory_method: how ``peak_mem_mb`` was measured (``PeakMemory.method``).
        engine: attention engine(s) that ran (comma-joined when layers differ); ``"recurrent"`` for rnn/lstm/gru.
        losses: training loss per step.
        history: ``[{"step", "accuracy", "loss"}]`` at every evaluation.
        extra: what the ``on_init`` / ``on_end`` callbacks of :func:`train` returned, under ``"init"`` / ``"end"``.
        chance: accuracy of uniform guessing among the task's possible answers.
        config: the full (defaults filled) TrainConfig as a dict.
    """

    task: str
    model: str
    spec: str
    seq_len: int
    accuracy: float
    loss: float
    steps: int
    seconds: float
    params: int
    tokens_per_second: float
    peak_mem_mb: float
    engine: str
    losses: list[float]
    history: list[dict] = field(default_factory=list)
    chance: float = 0.0
    config: dict = field(default_factory=dict)
    memory_method: str = ""
    extra: dict = field(default_factory=dict)
    val_accuracy: float = 0.0
    val_loss: float = float("nan")
    best_step: int = 0
    converged: bool = True
    stop_reason: str = "steps"
    n_test: int = 0
    earlier_cpu_seconds: float = 0.0

    SUMMARY_KEYS = (
        "task",
        "model",
        "spec",
        "seq_len",
        "accuracy",
        "loss",
        "steps",
        "seconds",
        "params",
        "tokens_per_second",
    )

    def to_dict(self) -> dict:
        """JSON-ready dict of every field (non-finite floats become None)."""
        return _finite(asdict(self))

    def summary(self) -> dict:
        """The CLI's ``--json`` line: task, model, spec, seq_len, accuracy, loss, steps, seconds, params,
        tokens_per_second."""
        data = self.to_dict()
        return {key: data[key] for key in self.SUMMARY_KEYS}


def _spec_label(spec: AttentionSpec) -> str:
    """The spec's relax string, with ``causal=false`` for a bidirectional encoder (no variant says it otherwise)."""
    if spec.causal:
        return spec.variant
    return "causal=false" if spec.variant == "standard" else f"{spec.variant},causal=false"


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Multiplier of the peak lr at ``step``: linear warmup over ``warmup`` steps, then cosine decay to
    ``MIN_LR_RATIO`` at ``total`` (Loshchilov & Hutter 2017, SGDR eq. 5, without restarts)."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return MIN_LR_RATIO + (1.0 - MIN_LR_RATIO) * 0.5 * (1.0 + math.cos(math.pi * progress))


def gumbel_tau_at(step: int, total: int, start: float, final: float) -> float:
    """Temperature of step ``step`` of ``total``: exponential decay from ``start`` to ``final``,
    tau_s = start * (final / start)^(s / (total - 1)) (the exp(-r t) family of Jang et al. 2017, sec. 4)."""
    if total <= 1:
        return final
    return start * (final / start) ** (min(step, total - 1) / (total - 1))


def set_gumbel_tau(model: torch.nn.Module, tau: float) -> int:
    """Set the temperature of every ``gumbel_softmax`` attention layer of ``model``; returns how many were set."""
    from axiomformer.attention import Attention

    changed = 0
    for module in model.modules():
        if isinstance(module, Attention) and module.spec.normalizer == "gumbel_softmax":
            module.spec = dataclasses.replace(module.spec, gumbel_tau=float(tau))
            module.normalizer.options["tau"] = float(tau)
            changed += 1
    return changed


def make_optimizer(model: torch.nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter 2019); weight decay only on matrices (not biases, norms) **(as nanoGPT)**."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    if config.fast:
        from axiomformer.fastpath import fused_available

        if fused_available(params):  # one kernel for every parameter (the fast path); same update, other rounding
            return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.98), fused=True)
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.98))


def evaluate(
    model: torch.nn.Module, batches: Sequence[tuple[torch.Tensor, ...]], parallel: DataParallel | None = None
) -> tuple[float, float]:
    """(accuracy, mean loss) over the scored positions of ``batches``, the model in eval mode; with ``parallel`` (a
    :class:`axiomformer.distributed.DataParallel`), ``batches`` is this rank's share and the counts are summed over
    every rank first, so all ranks get the figures of the whole eval set."""
    correct, total, loss_sum = eval_counts(model, batches)
    if parallel is not None:
        return _ratios(*parallel.reduce_counts(correct, total, loss_sum))
    return _ratios(correct, total, loss_sum)


def _ratios(correct: float, total: float, loss_sum: float) -> tuple[float, float]:
    return correct / max(1, total), loss_sum / max(1, total)


def train(
    config: TrainConfig,
    *,
    progress: bool = True,
    checkpoint_dir: str | Path | None = None,
    log: Callable[[str], None] | None = None,
    save_state: str | Path | None = None,
    on_init: Callable[[torch.nn.Module, Any], dict] | None = None,
    on_end: Callable[[torch.nn.Module, Any], dict] | None = None,
    progress_file: str | Path | None = None,
) -> TrainResult:
    """Train ``config.model`` on ``config.task``, select on validation, report test.

    Evaluates on the validation split every ``eval_every`` steps and after the last one, keeps the weights of the
    best evaluation (higher accuracy, ties broken by lower loss), stops early once the validation accuracy reaches
    ``target_accuracy``, after ``patience`` evaluations without improvement, or when the training loss is not
    finite; then evaluates those weights once on the test split. CPU threads are the caller's business.

    Inside an initialized ``torch.distributed`` process group (``torchrun``), trains data parallel: ``batch_size`` is
    the global batch, each rank takes its slice, and only rank 0 logs and writes the checkpoint
    (:mod:`axiomformer.distributed`). Every rank returns the same losses and eval figures.

    Args:
        progress: show a rich progress bar (on stderr).
        checkpoint_dir: if given, save the tested model there (safetensors + config.json with config and result).
        log: called with one line per evaluation.
        save_state: if given, write the tested model's state dict there (safetensors; ``init_from`` reads it).
        on_init, on_end: called as ``fn(model, task)`` before the first step and after the last evaluation (the model
            in eval mode, gradients off); what they return is stored in ``result.extra["init"]`` / ``["end"]``.
            They measure; training never depends on them.
        progress_file: if given, the run's progress is written there after every validation evaluation (weights,
            optimizer, schedule, random state and history; written whole or not at all), a run that finds the file
            of the same config continues from it, and the file is removed once the run is done: an interrupted run
            resumes at its last evaluation and ends exactly as an uninterrupted one. A file of another config is
            ignored (the run starts over); one that cannot be written is skipped with a warning. Single process
            only (ignored inside a process group).

    Raises:
        ValueError: task options the task rejects; a global batch that does not split evenly over the ranks; an
            ``init_from`` that does not fit the model.
        FileNotFoundError: a missing ``init_from`` file.
    """
    parallel = DataParallel.current(config.device)
    parallel.check_batch(config.batch_size)
    keep = None if progress_file is None or parallel.world_size > 1 else Path(progress_file)
    with seeded(config.init_seed, [parallel.device]):
        model, result = _train_and_test(
            config, parallel, progress=progress, log=log, on_init=on_init, on_end=on_end, keep=keep
        )
    if parallel.main:
        _save(model, config, result, save_state, checkpoint_dir)
    if keep is not None:
        for leftover in (keep, keep.with_name(keep.name + ".tmp")):
            with contextlib.suppress(OSError):  # never written (the warning said so), or not ours to remove
                leftover.unlink(missing_ok=True)
    return result


def _train_and_test(
    config: TrainConfig,
    parallel: DataParallel,
    *,
    progress: bool,
    log: Callable[[str], None] | None,
    on_init: Callable[[torch.nn.Module, Any], dict] | None,
    on_end: Callable[[torch.nn.Module, Any], dict] | None,
    keep: Path | None = None,
) -> tuple[torch.nn.Module, TrainResult]:
    """The body of :func:`train` inside its seeded block: build, train, restore the best weights, test; the model
    and its result."""
    built = _build(config, parallel.device)
    task, model = built.task, built.model
    val_set, test_set = (_eval_set(task, config, parallel, split) for split in ("val", "test"))
    extra: dict[str, Any] = {}
    on_init = _with_probes(config, val_set, on_init, "init")
    on_end = _with_probes(config, test_set, on_end, "end")
    if on_init is not None:
        extra["init"] = _callback(on_init, model, task)
    meter = PeakMemory(parallel.device)
    meter.start()
    run = _Run()  # its clock starts here: the run's wall and CPU seconds (run.spent())
    _loop(
        run,
        built,
        parallel,
        val_set,
        progress=progress and parallel.main,
        log=log if parallel.main else None,
        keep=keep,
    )
    run.best.restore(model)
    test_accuracy, test_loss, n_test = _test_counts(model, test_set, parallel)
    seconds = run.spent()[0]
    peak = meter.stop()
    if on_end is not None:
        extra["end"] = _callback(on_end, model, task)
    result = _result(
        built, run, extra=extra, test=(test_accuracy, test_loss, n_test), seconds=seconds, peak=peak, meter=meter
    )
    return model, result


def _result(
    built: _Built,
    run: _Run,
    *,
    extra: dict[str, Any],
    test: tuple[float, float, int],
    seconds: float,
    peak: float,
    meter: PeakMemory,
) -> TrainResult:
    """The :class:`TrainResult` of a finished run: ``test`` is (accuracy, loss, n_test) on the test split."""
    config, spec = built.config, built.spec
    test_accuracy, test_loss, n_test = test
    window = config.patience or 3
    converged = run.stop_reason in ("target", "patience") or (
        run.stop_reason == "steps" and len(run.history) - run.best.index >= window
    )
    return TrainResult(
        task=config.task,
        model=config.model,
        spec=_spec_label(spec) if spec is not None and LAYER_SEPARATOR not in config.spec else config.spec,
        seq_len=config.seq_len,
        accuracy=test_accuracy,
        loss=test_loss,
        steps=run.steps_done,
        seconds=seconds,
        params=count_parameters(built.model),
        tokens_per_second=run.steps_done * config.batch_size * config.seq_len / max(run.train_seconds, 1e-9),
        peak_mem_mb=peak,
        memory_method=meter.method,
        engine=",".join(dict.fromkeys(run.engines)),
        losses=torch.stack(run.losses).cpu().tolist() if run.losses else [],
        history=run.history,
        chance=built.task.chance,
        config=config.model_dump(),
        val_accuracy=run.best.accuracy,
        val_loss=run.best.loss,
        best_step=run.best.step,
        converged=converged,
        stop_reason=run.stop_reason,
        extra=extra,
        n_test=n_test,
        earlier_cpu_seconds=run.earlier_cpu_seconds,
    )


@dataclass(frozen=True)
class _Built:
    """What one run trains: its ``config``, the ``task``, the attention ``spec`` (None for a recurrent model) and
    the ``model``."""

    config: TrainConfig
    task: Any
    spec: AttentionSpec | None
    model: torch.nn.Module


def _control_position(input_position: str) -> str:
    """A validity control's input encoding: the standard model's (``auto``, ``sinusoidal``) or ``none``.

    Raises:
        ValueError: any other encoding (a control has no learned table or rotation), naming the choices.
    """
    if input_position not in ("auto", "sinusoidal", "none"):
        raise ValueError(f"a validity control takes input_position auto, sinusoidal or none, not {input_position!r}")
    return "none" if input_position == "none" else "sinusoidal"


def _build(config: TrainConfig, device: torch.device) -> _Built:
    """The task, the attention spec and the model on ``device``, initialized from the global generators (seeded by
    the caller) or from ``config.init_from``."""
    task = make_task(config.task, seq_len=config.seq_len, **config.task_options)
    spec = config.attention_spec() if config.model == "transformer" else None
    options: dict[str, Any] = (
        {"input_position": config.input_position, "causal": config.causal, "mlp_ratio": config.mlp_ratio}
        if spec is not None
        else {
            "causal": config.causal,
            "mlp_ratio": config.mlp_ratio,
            "input_position": _control_position(config.input_position),
        }
        if config.model in CONTROL_KINDS
        else {}
    )
    if spec is not None and LAYER_SEPARATOR in config.spec:  # a hybrid stack: one spec per layer
        options["layer_specs"] = config.layer_specs()
    model = build_model(
        config.model,
        vocab_size=task.vocab_size,
        dim=config.dim,
        num_layers=config.layers,
        max_len=config.model_max_len,
        spec=spec,
        **options,
    ).to(device)
    if config.init_from is not None:
        _load_state(model, config.init_from)
    return _Built(config, task, spec, model)


def _eval_set(task: Any, config: TrainConfig, parallel: DataParallel, split: str) -> list[tuple[torch.Tensor, ...]]:
    """This rank's share of the ``split`` set: batches ``task.batch(batch_size, seed=i, split=split)``, ``i`` below
    ``eval_batches`` (validation) or ``test_batches`` (test; ``eval_batches`` when unset)."""
    count = (config.test_batches or config.eval_batches) if split == "test" else config.eval_batches
    return [
        tuple(t.to(parallel.device) for t in task.batch(config.batch_size, seed=i, split=split))
        for i in parallel.eval_indices(count)
    ]


def _test_counts(
    model: torch.nn.Module, batches: Sequence[tuple[torch.Tensor, ...]], parallel: DataParallel
) -> tuple[float, float, int]:
    """(accuracy, mean loss, scored positions) of the test set (:func:`evaluate`), the positions summed over every
    rank."""
    from axiomformer.tasks import IGNORE

    accuracy, loss = evaluate(model, batches, parallel)
    _, scored, _ = parallel.reduce_counts(0, sum(int((b[1] != IGNORE).sum()) for b in batches), 0.0)
    return accuracy, loss, int(scored)


@dataclass
class _Run:
    """What the training loop leaves behind."""

    losses: list[torch.Tensor] = field(default_factory=list)
    history: list[dict] = field(default_factory=list)
    engines: list[str] = field(default_factory=list)
    steps_done: int = 0
    stop_reason: str = "steps"
    train_seconds: float = 0.0
    best: _Best = field(default_factory=lambda: _Best())
    # wall and CPU seconds of this process's part of the run start here; the earlier processes' come from the
    # progress file, so that a resumed run reports what the whole run cost
    clock: tuple[float, float] = field(default_factory=lambda: (time.perf_counter(), time.process_time()))
    earlier_seconds: float = 0.0
    earlier_cpu_seconds: float = 0.0

    def spent(self) -> tuple[float, float]:
        """Wall and CPU seconds of the whole run so far, earlier processes included."""
        return (
            self.earlier_seconds + time.perf_counter() - self.clock[0],
            self.earlier_cpu_seconds + time.process_time() - self.clock[1],
        )


def _loop(
    run: _Run,
    built: _Built,
    parallel: DataParallel,
    val_set: list,
    *,
    progress: bool,
    log: Callable[[str], None] | None,
    keep: Path | None = None,
) -> None:
    """Train until the budget is spent or a stop rule fires, evaluating on ``val_set``; fills ``run`` (``keep``)."""
    config, task, spec, model = built.config, built.task, built.spec, built.model
    anneal = spec is not None and spec.normalizer == "gumbel_softmax" and config.gumbel_tau_final is not None
    model.train()
    net = parallel.wrap(model)
    parallel.seed_random_draws(config.seed)  # each rank its own dropout masks and Gumbel noise
    optimizer = make_optimizer(model, config)
    step_fn = _step_parts(config, model, net, anneal)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, config.warmup, config.steps))
    (parts := _Progress(keep, config, model, optimizer, schedule)).resume(run, log)  # a progress file continues
    bar = _progress_bar(progress)
    job = bar.add_task(f"{config.task} {config.model}", total=config.steps, completed=run.steps_done, info="")
    with bar:
        for step in range(run.steps_done, config.steps):
            tick = time.perf_counter()
            inputs, targets, scored = parallel.shard(*task.batch(config.batch_size, seed=(config.seed << 32) + step))
            if anneal and spec is not None and config.gumbel_tau_final is not None:
                set_gumbel_tau(model, gumbel_tau_at(step, config.steps, spec.gumbel_tau, config.gumbel_tau_final))
            loss = parallel.loss(step_fn.forward(inputs), targets, scored)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            loss = parallel.global_loss(loss)
            step_fn.clip(config.grad_clip)
            optimizer.step()
            schedule.step()
            run.losses.append(loss.detach())
            if step == 0:
                run.engines = _engines(model)  # the training-mode routing (eval may route differently)
            run.steps_done = step + 1
            finite = bool(torch.isfinite(loss))
            run.train_seconds += time.perf_counter() - tick
            bar.update(job, advance=1)
            if run.steps_done % config.eval_every == 0 or run.steps_done == config.steps or not finite:
                run.stop_reason = _evaluate_and_decide(
                    run,
                    built,
                    parallel,
                    val_set,
                    loss=float(loss.detach()),
                    finite=finite,
                    log=log,
                    show=lambda info: bar.update(job, info=info),
                )
                if run.stop_reason != "steps":
                    break
                parts.save(run)
    if run.steps_done == 0:
        accuracy, eval_loss = evaluate(model, val_set, parallel)
        run.best.offer(model, 0, accuracy, eval_loss, 1)
        run.engines = _engines(model)


@dataclass
class _StepParts:
    """How one training step runs the model and clips its gradients: the plain loop's calls, or the fast path's."""

    forward: Callable[[torch.Tensor], torch.Tensor]
    clip: Callable[[float], Any]


def _step_parts(config: TrainConfig, model: torch.nn.Module, net: torch.nn.Module, anneal: bool) -> _StepParts:
    """The plain step (``net`` and ``clip_grad_norm_(model.parameters())``), with the fast path's parts where the
    config asks (:mod:`axiomformer.fastpath`; no compile while the Gumbel temperature anneals: it changes the model
    every step)."""
    from axiomformer import fastpath

    forward = fastpath.training_forward(net, compile_model=config.compile and not anneal)
    if not config.fast:
        return _StepParts(forward, lambda max_norm: torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))
    params = [p for p in model.parameters() if p.requires_grad]
    return _StepParts(forward, lambda max_norm: fastpath.clip_gradients(params, max_norm))


def _evaluate_and_decide(
    run: _Run,
    built: _Built,
    parallel: DataParallel,
    val_set: list,
    *,
    loss: float,
    finite: bool,
    log: Callable[[str], None] | None,
    show: Callable[[str], None],
) -> str:
    """One validation evaluation: record it, offer the weights to ``run.best``, log, and return the stop reason
    (``"steps"`` to go on)."""
    config, model = built.config, built.model
    accuracy, eval_loss = evaluate(model, val_set, parallel)
    run.history.append({"step": run.steps_done, "accuracy": accuracy, "loss": eval_loss})
    run.best.offer(model, run.steps_done, accuracy, eval_loss, len(run.history))
    show(f"loss {loss:.3f} acc {accuracy:.3f}")
    if log is not None:
        log(f"step {run.steps_done}: loss {loss:.4f} val accuracy {accuracy:.3f} val loss {eval_loss:.4f}")
    if not finite:
        if log is not None:
            log(f"step {run.steps_done}: training loss is not finite; stopping")
        return "nonfinite"
    if config.target_accuracy is not None and accuracy >= config.target_accuracy:
        return "target"
    if config.patience is not None and len(run.history) - run.best.index >= config.patience:
        return "patience"
    return "steps"


def _save(
    model: torch.nn.Module,
    config: TrainConfig,
    result: TrainResult,
    save_state: str | Path | None,
    checkpoint_dir: str | Path | None,
) -> None:
    """Write the tested model's state dict (``save_state``) and checkpoint (``checkpoint_dir``) where asked."""
    if save_state is not None:
        from safetensors.torch import save_file

        Path(save_state).parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, str(save_state))
    if checkpoint_dir is not None:
        from axiomformer.checkpoint import save_checkpoint

        save_checkpoint(
            checkpoint_dir,
            model,
            train=config.model_dump(),
            result=_finite({k: v for k, v in result.to_dict().items() if k not in ("losses",)}),
        )


def _engines(model: torch.nn.Module) -> list[str]:
    """The attention engines of the last forward, one per layer (``["recurrent"]`` style names for baselines)."""
    return list(getattr(model, "engines", []))


def _with_probes(config: TrainConfig, eval_set: list, user: Callable | None, phase: str) -> Callable | None:
    """The callback of ``phase`` that runs the config's probes (``axiomformer.probes``) and then ``user``."""
    from axiomformer import probes

    wanted = []
    if phase == "init" and "init_entropy" in config.probes and config.model == "transformer":
        wanted.append(lambda model, task: probes.init_entropy(model, eval_set))
    if phase == "end" and config.eval_lengths:
        wanted.append(
            lambda model, task: probes.length_accuracy(
                model, config.task, config.task_options, config.eval_lengths, config.batch_size, config.eval_batches
            )
        )
    if phase == "end" and "sampled_eval" in config.probes:
        wanted.append(lambda model, task: probes.sampled_accuracy(model, eval_set))
    if user is not None:
        wanted.append(user)
    if not wanted:
        return None

    def run(model: torch.nn.Module, task: Any) -> dict:
        out: dict[str, Any] = {}
        for fn in wanted:
            out.update(fn(model, task))
        return out

    return run


def _callback(fn: Callable[[torch.nn.Module, Any], dict], model: torch.nn.Module, task: Any) -> dict:
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return dict(fn(model, task))
    finally:
        model.train(was_training)


PROGRESS_VERSION = 1
"""Layout version of a progress file (:class:`_Progress`); a file of another version is ignored."""


@dataclass
class _Progress:
    """A run's progress file (``train(progress_file=...)``): what the loop needs to continue exactly where its last
    evaluation left it. The batches are a function of (seed, step) already; the global random state (dropout, Gumbel
    noise) is saved with the weights, the optimizer and the schedule."""

    path: Path | None
    config: TrainConfig
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    schedule: Any

    def comparable(self, dump: dict[str, Any] | None = None) -> dict[str, Any]:
        """The config (or a recorded ``dump`` of one) as progress files compare it: ``init_from`` by its file
        name, so that a store moved to another folder (its states with it) still resumes its runs; the file's
        content is compared apart (:meth:`init_digest`)."""
        dump = dict(self.config.model_dump(mode="json") if dump is None else dump)
        if dump.get("init_from"):
            dump["init_from"] = Path(dump["init_from"]).name
        return dump

    @functools.cached_property
    def init_digest(self) -> str | None:
        """SHA-256 of the ``init_from`` file (None without one), read once per run: two runs warm-started from
        different weights under the same file name never share a progress file."""
        if not self.config.init_from:
            return None
        import hashlib

        return hashlib.sha256(Path(self.config.init_from).read_bytes()).hexdigest()

    def save(self, run: _Run) -> None:
        """Write the progress after an evaluation, whole or not at all (a temporary file, synced, then a rename);
        a failure warns, removes the temporary file and the run goes on."""
        if self.path is None or run.steps_done >= self.config.steps:  # after the last step a resume would only test
            return
        best = run.best
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            payload = {
                "version": PROGRESS_VERSION,
                "config": self.comparable(),
                "init_sha256": self.init_digest,
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "schedule": self.schedule.state_dict(),
                "rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
                "losses": torch.stack([loss.cpu() for loss in run.losses]) if run.losses else torch.empty(0),
                "history": run.history,
                "engines": run.engines,
                "steps_done": run.steps_done,
                "train_seconds": run.train_seconds,
                "spent": run.spent(),
                "best": {"accuracy": best.accuracy, "loss": best.loss, "step": best.step, "index": best.index},
                "best_state": best.state,
            }
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                torch.save(payload, f)
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(self.path)
        except Exception as err:  # a full disk, a read-only store, a config torch cannot store: the run goes on
            import warnings

            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            warnings.warn(f"progress file {str(self.path)!r} not written ({err}); the run goes on", stacklevel=2)

    def resume(self, run: _Run, log: Callable[[str], None] | None) -> None:
        """Fill ``run``, the model, the optimizer, the schedule and the random state from the file, where it holds
        this config's progress; a file of another config is ignored, one that cannot be read or loaded is ignored
        with a warning (either way the run starts over and overwrites it)."""
        if self.path is None or not self.path.is_file():
            return
        fresh = (copy.deepcopy(self.model.state_dict()), self.optimizer.state_dict(), self.schedule.state_dict())
        try:
            saved = torch.load(self.path, map_location="cpu", weights_only=True)
            if (
                saved.get("version") != PROGRESS_VERSION
                or self.comparable(saved.get("config") or {}) != self.comparable()
                or saved.get("init_sha256", self.init_digest) != self.init_digest  # files before it: by name
            ):
                return  # another run's progress: this run starts over and overwrites it
            self.model.load_state_dict(saved["model"])
            self.optimizer.load_state_dict(saved["optimizer"])
            self.schedule.load_state_dict(saved["schedule"])
        except Exception as err:  # an empty or foreign file, weights that no longer fit the model
            import warnings

            self.model.load_state_dict(fresh[0])
            self.optimizer.load_state_dict(fresh[1])
            self.schedule.load_state_dict(fresh[2])
            warnings.warn(f"progress file {str(self.path)!r} not read ({err}); the run starts over", stacklevel=2)
            return
        self._fill(run, saved)
        if log is not None:
            log(f"step {run.steps_done}: resumed from {self.path}")

    def _fill(self, run: _Run, saved: dict[str, Any]) -> None:
        """The random state and ``run``'s record from a progress file that loaded."""
        torch.set_rng_state(saved["rng"])
        if saved["cuda_rng"]:
            torch.cuda.set_rng_state_all(saved["cuda_rng"])
        device = next(self.model.parameters()).device  # new losses are appended on the model's device
        run.losses = list(saved["losses"].to(device).unbind()) if saved["losses"].numel() else []
        run.history, run.engines = saved["history"], saved["engines"]
        run.steps_done, run.train_seconds = saved["steps_done"], saved["train_seconds"]
        run.earlier_seconds, run.earlier_cpu_seconds = saved.get("spent", (0.0, 0.0))  # files before it: unknown
        for name, value in saved["best"].items():
            setattr(run.best, name, value)
        run.best.state = saved["best_state"]


class _Best:
    """The best validation evaluation so far and a CPU copy of its weights."""

    def __init__(self):
        self.accuracy, self.loss, self.step, self.index, self.state = -1.0, float("inf"), 0, 0, None

    def offer(self, model: torch.nn.Module, step: int, accuracy: float, loss: float, index: int) -> None:
        better = accuracy > self.accuracy or (accuracy == self.accuracy and loss < self.loss)
        if better or self.state is None:
            self.accuracy, self.loss, self.step, self.index = accuracy, loss, step, index
            self.state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}

    def restore(self, model: torch.nn.Module) -> None:
        if self.state is not None:
            model.load_state_dict(self.state)


def _load_state(model: torch.nn.Module, path: str | Path) -> None:
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"init_from: no such state file {str(path)!r}")
    state = load_file(str(path))
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ValueError(f"init_from {str(path)!r} does not fit this model: {err}") from None


def _progress_bar(enabled: bool) -> Progress:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
        console=Console(stderr=True),
        disable=not enabled,
        transient=False,
    )


__all__ = [
    "GENERIC_DEFAULTS",
    "TrainConfig",
    "TrainResult",
    "eval_counts",
    "eval_counts_as_is",
    "evaluate",
    "evaluate_as_is",
    "gumbel_tau_at",
    "lr_factor",
    "masked_loss",
    "resolve_device",
    "set_gumbel_tau",
    "train",
]
