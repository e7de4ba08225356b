"""One typed shape for a study's run: the record a worker writes, the store keeps and every reader gets back.

A :class:`RunRecord` is validated where it is made (``study.runner``), again when the store writes it
(``ResultsStore.add_run``: a malformed row is refused, naming the field, and nothing is written) and when the store
reads it back (``ResultsStore.runs``), so the report and the suites always see the same fields with the same types.
The columns of the store's ``runs`` table are exactly the fields here (``tests/test_battery.py`` checks it).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class RunOutcome(BaseModel):
    """What training said besides the test score: the learning rate, the best validation evaluation, why it stopped,
    the validation curve (``history``: ``[{"step", "accuracy", "loss"}]``), the probes' extras and the number of
    scored test items. Fields a previous version did not write are ``None``."""

    model_config = ConfigDict(extra="allow")

    lr: float | None = None
    val_accuracy: float | None = None
    val_loss: float | None = None
    best_step: int | None = None
    converged: bool | None = None
    stop_reason: str | None = None
    history: list[dict[str, Any]] = Field(default_factory=list)
    extra: dict[str, Any] = Field(default_factory=dict)
    n_test: int | None = None


class ModelRecord(BaseModel):
    """One model of a study as the store keeps it (meta ``models``): the ``label`` the report calls it, its ``kind``
    (``transformer``, a recurrent baseline or a validity control) and ``spec`` (its relax string; ``None`` for a
    model without scores)."""

    model_config = ConfigDict(extra="forbid")

    label: str
    kind: str
    spec: str | None = None


class RunRecord(BaseModel):
    """One finished run of a study (one row of the store's ``runs`` table).

    Attributes: the run's ``key`` and ``label`` (what the report calls the model), ``model`` (its kind), ``spec``
    (the relax string of a Transformer, ``None`` otherwise), ``assumptions`` (which of A0-A5 it keeps), the ``task``,
    ``seq_len`` and ``task_config``, the ``seed``, its size (``dim``, ``layers``, ``heads``, ``params``), the test
    ``accuracy`` and ``loss``, ``steps`` trained, wall ``seconds`` and ``cpu_seconds``, throughput and peak memory,
    the ``engine`` that ran, the per-step training ``losses``, the full ``train_config``, the ``outcome`` and where
    and when it ran (``package_version``, ``git_commit``, ``backend``, ``host``, ``finished_at``).
    """

    model_config = ConfigDict(extra="forbid")

    key: str
    label: str
    model: str
    spec: str | None = None
    assumptions: dict[str, bool] = Field(default_factory=dict)
    task: str
    seq_len: int
    task_config: dict[str, Any] = Field(default_factory=dict)
    seed: int
    dim: int
    layers: int
    heads: int | None = None
    params: int | None = None
    accuracy: float | None = None
    loss: float | None = None
    steps: int | None = None
    seconds: float | None = None
    cpu_seconds: float | None = None
    tokens_per_second: float | None = None
    peak_mem_mb: float | None = None
    memory_source: str | None = None
    engine: str | None = None
    losses: list[float | None] | None = None  # None where a diverged run's loss was not finite (JSON has no NaN)
    train_config: dict[str, Any]
    outcome: RunOutcome = Field(default_factory=RunOutcome)
    package_version: str | None = None
    git_commit: str | None = None
    backend: str | None = None
    host: str | None = None
    finished_at: str | None = None

    def row(self) -> dict[str, Any]:
        """The record as the plain dict of the store's columns (``outcome`` as a dict, unset extras kept): what
        ``ResultsStore.add_run`` writes; every reader gets the record itself from ``ResultsStore.runs``."""
        return self.model_dump()


__all__ = ["ModelRecord", "RunOutcome", "RunRecord"]
