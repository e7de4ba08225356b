"""``axiomformer train``: train one model on one task and report eval accuracy (``--json``: one JSON line)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer

from axiomformer.errors import UserInputError, expect_folder

if TYPE_CHECKING:
    from axiomformer.train import TrainConfig, TrainResult


def parse_task_options(items: list[str]) -> dict:
    """``["num_pairs=4", "path=a.txt"]`` -> ``{"num_pairs": 4, "path": "a.txt"}`` (values parsed as JSON if they
    can be).

    Raises:
        ValueError: an item without ``=``.
    """
    options = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"malformed --task-option {item!r}: expected key=value, e.g. num_pairs=4")
        key, value = (part.strip() for part in item.split("=", 1))
        try:
            options[key] = json.loads(value)
        except json.JSONDecodeError:
            options[key] = value
    return options


ONE_THREAD_MAX_DIM = 128
"""``train``'s default threads: one up to this model width. Measured on 2 shared cores (issue 36): a study-size model
(width 32) trained 5-14x slower with torch's default threads than with 1 while other jobs ran, and as fast idle
(5.0 s vs 4.7 s): the per-op work is too small to split."""


def _fail(message: str) -> NoReturn:
    """Bad input: the command line prints ``error: <message>`` and exits 2 (``axiomformer.cli``)."""
    raise UserInputError(message)


def register(app: typer.Typer) -> None:
    app.command("train")(train_command)


def train_command(
    *,
    task: str = typer.Option("mqar", help="task name, e.g. mqar, copy, needle, digits; a wrong one lists all"),
    seq_len: int = typer.Option(64, "--seq-len", help="sequence length"),
    model: str = typer.Option("transformer", help="transformer | rnn | lstm | gru"),
    spec: str = typer.Option("standard", help="attention relax string, e.g. 'normalizer=sigmoid'"),
    layers: int = typer.Option(2, help="number of layers"),
    dim: int = typer.Option(64, help="model width (hidden size for rnn/lstm/gru)"),
    heads: int | None = typer.Option(None, help="attention heads (default: 4 when they divide dim)"),
    steps: int | None = typer.Option(None, help="optimizer steps (default: the task's)"),
    batch_size: int | None = typer.Option(None, "--batch-size", help="sequences per step (default: the task's)"),
    lr: float | None = typer.Option(None, help="peak learning rate (default: the task's)"),
    weight_decay: float | None = typer.Option(None, "--weight-decay", help="AdamW weight decay (0.1)"),
    warmup: int | None = typer.Option(None, help="linear warmup steps (default: the task's)"),
    seed: int = typer.Option(0, help="seed of the model and the training data"),
    target_accuracy: float | None = typer.Option(
        None, "--target-accuracy", help="stop once eval accuracy reaches it (default: the task's)"
    ),
    no_early_stop: bool = typer.Option(False, "--no-early-stop", help="train all steps"),
    eval_every: int | None = typer.Option(None, "--eval-every", help="steps between evaluations"),
    eval_batches: int | None = typer.Option(
        None, "--eval-batches", help="batches in the validation set and in the test set"
    ),
    test_batches: int | None = typer.Option(
        None, "--test-batches", help="batches in the test set (default: --eval-batches)"
    ),
    grad_clip: float | None = typer.Option(None, "--grad-clip", help="global gradient-norm clip (1.0)"),
    patience: int | None = typer.Option(
        None, "--patience", help="stop after this many evaluations without a better validation score (default: never)"
    ),
    device: str = typer.Option("auto", help="auto (CUDA when present) | cpu | cuda | cuda:N"),
    task_option: list[str] = typer.Option(
        [], "--task-option", "-o", help="task option key=value, repeatable (e.g. -o path=book.txt)"
    ),
    threads: int | None = typer.Option(
        None,
        help=f"torch CPU threads (default: 1 for a model of width <= {ONE_THREAD_MAX_DIM}, whose matmuls are too "
        "small for more threads to pay and which ran 5-14x slower with torch's default beside other jobs; else "
        "torch's default)",
    ),
    checkpoint: Path | None = typer.Option(
        None, "--checkpoint", help="a folder to save the model in (model.safetensors + config.json)"
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no progress bar or eval log"),
    as_json: bool = typer.Option(False, "--json", help="last stdout line: the result as JSON"),
) -> None:
    """Train a Transformer (any attention spec) or a recurrent baseline on a long-range task.

    Under torchrun (``torchrun --nproc-per-node N -m axiomformer train ...``) it trains data parallel;
    ``--batch-size`` is the global batch and only rank 0 prints and writes the checkpoint.
    """
    options = locals()  # the parameters, by name
    expect_folder(checkpoint, "--checkpoint")
    _refuse_file_suffix(checkpoint)
    config = _config(_config_fields(options))
    _train(config, threads, quiet, as_json, checkpoint)


FILE_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt", ".json")
"""Names that say "one file", refused by ``--checkpoint`` (a checkpoint is a folder of two files)."""


def _refuse_file_suffix(checkpoint: Path | None) -> None:
    """A ``--checkpoint tiny.safetensors`` once became a folder of that name: say what a checkpoint is instead."""
    if checkpoint is not None and checkpoint.suffix.lower() in FILE_SUFFIXES and not checkpoint.is_dir():
        raise UserInputError(
            f"--checkpoint {checkpoint}: a checkpoint is a folder (model.safetensors + config.json, read by "
            f"axiomformer.checkpoint.load_checkpoint); give a folder name, e.g. --checkpoint {checkpoint.with_suffix('')}"
        )


def _config_fields(options: dict) -> dict:
    """The ``TrainConfig`` fields of ``train``'s options (a budget field left ``None`` takes the task's default)."""
    from axiomformer.budget import BUDGET_FIELDS

    given = {"heads": options["heads"], **{name: options[name] for name in BUDGET_FIELDS}}  # the Budget's fields
    fields = {k: v for k, v in given.items() if v is not None}
    if options["no_early_stop"]:
        fields["target_accuracy"] = None
    return dict(
        task=options["task"],
        seq_len=options["seq_len"],
        model=options["model"],
        spec=options["spec"],
        layers=options["layers"],
        dim=options["dim"],
        seed=options["seed"],
        device=options["device"],
        task_options=parse_task_options(options["task_option"]),
        **fields,
    )


def _train(config: TrainConfig, threads: int | None, quiet: bool, as_json: bool, checkpoint: Path | None) -> None:
    """Train (data parallel under torchrun) and print the result on the main process."""
    import torch

    from axiomformer.distributed import DataParallel, process_group
    from axiomformer.train import train

    if threads is None and config.dim <= ONE_THREAD_MAX_DIM and not str(config.device).startswith("cuda"):
        threads = 1
    if threads is not None:
        torch.set_num_threads(threads)
    log = None if quiet or as_json else (lambda line: typer.echo(line, err=True))
    with process_group(config.device):
        try:
            result = train(config, progress=not quiet, checkpoint_dir=checkpoint, log=log)
        except ValueError as err:
            _fail(str(err))
        main = DataParallel.current(config.device).main
    if main:
        _print_result(result, as_json, checkpoint)


def _config(fields: dict) -> TrainConfig:
    """The validated ``TrainConfig`` (its task built once to check the task options); bad input is one error line."""
    from pydantic import ValidationError

    from axiomformer.tasks import make_task
    from axiomformer.train import TrainConfig

    try:
        config = TrainConfig(**fields)
        make_task(config.task, seq_len=config.seq_len, **config.task_options)
    except ValidationError as err:
        _fail(
            "; ".join(
                e["msg"].removeprefix("Value error, ") + (f" ({'.'.join(map(str, e['loc']))})" if e["loc"] else "")
                for e in err.errors()
            )
        )
    except ValueError as err:
        _fail(str(err))
    return config


def _print_result(result: TrainResult, as_json: bool, checkpoint: Path | None) -> None:
    """The result on stdout: one JSON line, or two readable lines (and where the checkpoint went)."""
    if as_json:
        typer.echo(json.dumps(result.summary()))
        return
    typer.echo(
        f"{result.task} seq_len={result.seq_len} {result.model} spec={result.spec} "
        f"engine={result.engine} params={result.params}"
    )
    typer.echo(
        f"test accuracy {result.accuracy:.4f} (chance {result.chance:.4f}; validation "
        f"{result.val_accuracy:.4f} at step {result.best_step})  test loss {result.loss:.4f}  "
        f"steps {result.steps}  {result.seconds:.1f}s  {result.tokens_per_second:,.0f} tokens/s"
    )
    if checkpoint is not None:
        typer.echo(f"checkpoint: {checkpoint}")
