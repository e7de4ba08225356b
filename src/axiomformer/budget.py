"""The training budget: one pydantic model shared by the trainer (``TrainConfig``), the study config and the CLI.

A field left ``None`` takes the task's default (its class's ``budget_defaults``, ``axiomformer.tasks.base``) when the
trainer runs; a study
file fills them explicitly. Early stopping is on the **validation** split (see ``axiomformer.tasks.base``): the run
stops once the validation accuracy reaches ``target_accuracy`` or after ``patience`` evaluations without
improvement, and the weights of the best validation evaluation are the ones tested (Prechelt 1998, "Early stopping
— but when?", the GL/patience family; as MAD and Zoology select on validation and report test).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

BUDGET_FIELDS = (
    "steps",
    "batch_size",
    "lr",
    "warmup",
    "weight_decay",
    "grad_clip",
    "eval_every",
    "eval_batches",
    "test_batches",
    "target_accuracy",
    "patience",
)
"""Every field of :class:`Budget`, in the order the CLI and the docs list them."""


class Budget(BaseModel):
    """How long and how fast one model trains.

    Attributes:
        steps: optimizer steps at most (early stopping may end sooner).
        batch_size: sequences per step.
        lr: peak learning rate (AdamW), reached after ``warmup`` linear steps, then cosine decay to 10 %.
        warmup: linear warmup steps.
        weight_decay: AdamW decoupled weight decay on matrices.
        grad_clip: global gradient-norm clip.
        eval_every: steps between validation evaluations (the last step is always evaluated).
        eval_batches: batches in the validation set and, separately, in the test set.
        test_batches: batches in the test set when it should be larger than the validation set (``None``: as
            ``eval_batches``); the test set is scored once, the validation set at every evaluation, so a large test
            set (>= 100 sequences for a binomial interval that can clear a threshold) costs little.
        target_accuracy: stop once the validation accuracy reaches it (``None``: never for this reason).
        patience: stop after this many evaluations without a better validation score (``None``: never for this
            reason). A run that ends at ``steps`` with its best evaluation among the last ``patience`` (3 when
            ``None``) is reported **not converged**.
    """

    model_config = ConfigDict(extra="forbid")

    steps: int | None = Field(None, ge=0)
    batch_size: int | None = Field(None, ge=1)
    lr: float | None = Field(None, gt=0)
    warmup: int | None = Field(None, ge=0)
    weight_decay: float = Field(0.1, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    eval_every: int | None = Field(None, ge=1)
    eval_batches: int | None = Field(None, ge=1)
    test_batches: int | None = Field(None, ge=1)
    target_accuracy: float | None = Field(None, ge=0, le=1)
    patience: int | None = Field(None, ge=1)


__all__ = ["BUDGET_FIELDS", "Budget"]
