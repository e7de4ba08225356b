"""Trainer: determinism, defaults, schedule, evaluation, early stop, checkpoints and the ``train`` command."""

import json
import math

import pytest
import torch
from pydantic import ValidationError
from typer.testing import CliRunner

from axiomformer.checkpoint import load_checkpoint
from axiomformer.cli import app
from axiomformer.tasks import TASKS, make_task
from axiomformer.tasks.needle import NeedleTask
from axiomformer.train import MIN_LR_RATIO, TrainConfig, evaluate, lr_factor, train

TINY = dict(
    task="copy",
    seq_len=12,
    dim=16,
    layers=1,
    steps=6,
    batch_size=4,
    eval_batches=1,
    eval_every=3,
    task_options={"vocab": 4},
)


@pytest.mark.parametrize("model", ["transformer", "gru"])
def test_same_seed_gives_identical_losses(model):
    a = train(TrainConfig(**TINY, model=model, seed=1), progress=False)
    b = train(TrainConfig(**TINY, model=model, seed=1), progress=False)
    c = train(TrainConfig(**TINY, model=model, seed=2), progress=False)
    assert len(a.losses) == 6 and a.losses == b.losses and a.accuracy == b.accuracy
    assert a.losses != c.losses


def test_unset_fields_take_the_task_defaults_and_explicit_none_disables_early_stop():
    config = TrainConfig(task="needle", seq_len=256)
    for name, value in NeedleTask.budget_defaults.items():
        assert getattr(config, name) == value
    assert TrainConfig(task="needle", target_accuracy=None).target_accuracy is None
    assert TrainConfig(task="needle", steps=7).steps == 7
    assert TrainConfig(task="needle", seq_len=10_000).batch_size == 1  # long sequences, small batches
    assert TrainConfig(dim=30).heads == 1 and TrainConfig(dim=64).heads == 4


def test_bad_names_are_rejected_naming_the_choices():
    with pytest.raises(ValidationError, match=", ".join(TASKS)):
        TrainConfig(task="mqr")
    with pytest.raises(ValidationError, match="transformer, rnn, lstm, gru"):
        TrainConfig(model="mamba")
    with pytest.raises(ValidationError, match="unknown normalizer"):
        TrainConfig(spec="normalizer=sofmax")
    with pytest.raises(ValidationError, match="extra"):
        TrainConfig(stepz=3)


def test_schedule_warms_up_linearly_then_decays_by_cosine():
    warmup, total = 10, 110
    assert [lr_factor(s, warmup, total) for s in range(3)] == pytest.approx([0.1, 0.2, 0.3])
    assert lr_factor(warmup, warmup, total) == pytest.approx(1.0)
    mid = lr_factor(warmup + 50, warmup, total)  # half way: cos(pi/2) = 0
    assert mid == pytest.approx(MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5)
    assert lr_factor(total, warmup, total) == pytest.approx(MIN_LR_RATIO)


class Oracle(torch.nn.Module):
    """Logits that pick ``targets`` shifted by ``shift`` (mod vocab) at every position."""

    def __init__(self, targets, vocab, shift):
        super().__init__()
        self.targets, self.vocab, self.shift = targets, vocab, shift

    def forward(self, ids):
        picked = (self.targets.clamp(min=0) + self.shift) % self.vocab
        return torch.nn.functional.one_hot(picked, self.vocab).float() * 50.0


def test_evaluate_scores_only_the_scored_positions():
    task = make_task("mqar", seq_len=32, vocab=16)
    inputs, targets = task.batch(8, seed=0, split="eval")
    right = Oracle(targets, task.vocab_size, 0)
    wrong = Oracle(targets, task.vocab_size, 1)
    acc, loss = evaluate(right, [(inputs, targets)])
    assert acc == 1.0 and loss == pytest.approx(0.0, abs=1e-6)
    acc, loss = evaluate(wrong, [(inputs, targets)])
    assert acc == 0.0 and loss == pytest.approx(50.0, rel=1e-4)  # logit gap 50 -> cross-entropy ~ 50 nats


def test_early_stop_ends_training_at_the_first_evaluation_that_reaches_the_target():
    result = train(TrainConfig(**{**TINY, "steps": 9}, target_accuracy=0.0), progress=False)
    assert result.steps == 3 and len(result.losses) == 3 and result.history[0]["step"] == 3


def test_training_lowers_the_loss_on_copy():
    config = TrainConfig(**{**TINY, "steps": 60, "batch_size": 16, "lr": 1e-2, "warmup": 5, "eval_every": 60})
    result = train(config, progress=False)
    first, last = sum(result.losses[:5]) / 5, sum(result.losses[-5:]) / 5
    assert last < first - 0.2 and math.isfinite(result.loss)
    assert result.engine == "sdpa" and result.params > 0 and result.tokens_per_second > 0


def test_train_checkpoint_reloads_to_the_same_eval_accuracy(tmp_path):
    config = TrainConfig(**TINY, spec="position=rope")
    result = train(config, progress=False, checkpoint_dir=tmp_path)
    model, meta = load_checkpoint(tmp_path)
    assert meta["train"]["spec"] == "position=rope" and meta["result"]["accuracy"] == result.accuracy
    task = make_task("copy", seq_len=12, vocab=4)
    acc, _ = evaluate(model, [task.batch(config.batch_size, seed=i, split="test") for i in range(config.eval_batches)])
    assert acc == result.accuracy


def test_cli_json_last_line_has_the_summary_fields():
    out = CliRunner().invoke(
        app,
        [
            "train",
            "--task",
            "copy",
            "--seq-len",
            "12",
            "--dim",
            "16",
            "--layers",
            "1",
            "--steps",
            "2",
            "--batch-size",
            "2",
            "--eval-batches",
            "1",
            "--quiet",
            "--json",
            "-o",
            "vocab=4",
            "--model",
            "lstm",
        ],
    )
    assert out.exit_code == 0, out.output
    line = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(line) == {
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
    }
    assert line["model"] == "lstm" and line["steps"] == 2 and line["seq_len"] == 12


@pytest.mark.parametrize(
    "args, choices",
    [
        (["--task", "mqr"], ", ".join(TASKS)),
        (["--model", "mamba"], "transformer, rnn, lstm, gru"),
        (["--task", "mqar", "-o", "pairs=3"], "num_pairs"),
    ],
)
def test_cli_bad_names_exit_2_naming_the_choices(args, choices):
    out = CliRunner().invoke(app, ["train", *args, "--steps", "1", "--quiet"])
    assert out.exit_code == 2
    assert choices in out.output and "Traceback" not in out.output


def test_patience_stops_after_that_many_evaluations_without_a_better_validation_score(monkeypatch):
    import axiomformer.train as trainer

    script = iter([(0.5, 1.0), (0.6, 0.9), (0.6, 0.95), (0.55, 1.0), (0.9, 0.1), (0.42, 2.0)])
    monkeypatch.setattr(trainer, "evaluate", lambda *args: next(script))
    # the test set is scored through _test_counts (accuracy, loss, n_test): script it from the same sequence
    monkeypatch.setattr(trainer, "_test_counts", lambda *args: (*next(script), 24))
    config = TrainConfig(**{**TINY, "steps": 60, "eval_every": 2}, target_accuracy=None, patience=2)
    result = train(config, progress=False)
    # evaluations at steps 2, 4, 6, 8: the best is step 4 (0.6, loss 0.9); 6 and 8 do not beat it -> stop at 8
    assert result.stop_reason == "patience" and result.steps == 8 and result.converged
    assert (result.best_step, result.val_accuracy, result.val_loss) == (4, 0.6, 0.9)
    assert result.accuracy == 0.9  # the next scripted evaluation is the test one, after the stop
    script = iter([(0.5, 1.0), (0.6, 0.9), (0.6, 0.95), (0.55, 1.0), (0.9, 0.1), *[(0.5, 1.0)] * 3, (0.42, 2.0)])
    monkeypatch.setattr(trainer, "evaluate", lambda *args: next(script))
    longer = train(config.model_copy(update={"patience": 3}), progress=False)
    # one more evaluation of patience finds the better one at step 10, then three more without improvement
    assert (longer.steps, longer.best_step, longer.val_accuracy, longer.accuracy) == (16, 10, 0.9, 0.42)


def test_a_run_still_improving_when_its_steps_run_out_is_not_converged():
    # two evaluations, no patience: the best is necessarily among the last three, so the run cannot be called done
    result = train(TrainConfig(**{**TINY, "steps": 4, "eval_every": 2}, target_accuracy=None), progress=False)
    assert result.stop_reason == "steps" and not result.converged
    # reaching the target counts as converged whatever the step count
    done = train(TrainConfig(**TINY, target_accuracy=0.0), progress=False)
    assert done.stop_reason == "target" and done.converged
