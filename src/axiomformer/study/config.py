"""The study configuration: one validated pydantic model, loaded from TOML on top of a built-in sweep.

A study file overrides the built-in sweep (``--quick`` or the full one) key by key: tables are merged, every other value
(lists included) replaces the default. Every key is checked; an unknown key is rejected with its name, where it was found
and the keys allowed there, e.g.::

    unknown key 'stpes' in [budget]; allowed keys: steps, batch_size, lr, warmup, ...

Example (``study.toml``)::

    seeds = 2
    variants = ["standard", "A4=cosine", "A5=sigmoid"]
    baselines = ["gru"]

    [budget]
    steps = 200
    lr_grid = [1e-3, 3e-3, 1e-2]

    [[tasks]]
    name = "needle"
    seq_lens = [32, 64]
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from axiomformer.budget import Budget
from axiomformer.errors import UserInputError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[import-not-found]  # the 3.10 backport, not installed on 3.11+

BASELINES = ("rnn", "lstm", "gru")
"""Order-dependent aggregators (relaxing A0 itself): the recurrent baselines a sweep may include."""

CONTROLS = ("no_mixing", "uniform_mixing")
"""The validity controls of a task (``axiomformer.models.controls``): no token mixing, and uniform causal mixing."""

METRICS = ("accuracy", "solve_rate")
"""How a task's comparisons are measured: the paired mean test accuracy (graded tasks), or the share of runs that
solve the task (solve-or-stuck tasks; a run solves when its test accuracy reaches ``solve_threshold``)."""


def _stored(info: ValidationInfo) -> bool:
    """Whether this is a stored config read back (:func:`stored_config`): the rules for designing a new study (two
    selection seeds, disjoint from the reported ones) do not apply to a study that has already run under older
    rules; its report says what they mean for its verdicts."""
    return bool(info.context and info.context.get("stored"))


def _known(kind: str, names: list[str], choices: tuple[str, ...]) -> list[str]:
    """``names`` when each is one of ``choices``; else the error naming the first unknown one and the choices."""
    for name in names:
        if name not in choices:
            raise ValueError(f"unknown {kind} {name!r}; choose from: {', '.join(choices)}")
    return names


class StudyConfigError(UserInputError):
    """A study configuration that cannot be used; the message names the offending key and what is allowed."""


class _Strict(BaseModel):
    """A config table that rejects unknown keys, naming the key and the allowed ones."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _reject_unknown(cls, data: Any) -> Any:
        if isinstance(data, dict):
            allowed = list(cls.model_fields)
            for key in data:
                if key not in allowed:
                    raise ValueError(f"unknown key {key!r}; allowed keys: {', '.join(allowed)}")
        return data


class StudyBudget(_Strict, Budget):
    """The training budget of a study: :class:`axiomformer.budget.Budget` plus the learning-rate grid.

    Every model gets the same budget on a task. ``lr_grid``: each (model, task) cell trains once per learning rate
    at the selection seed, keeps the one with the best validation accuracy (ties: lower validation loss), and
    reports its test accuracy over the seeds at that rate (as MAD and Zoology do). ``lr`` is used only when
    ``lr_grid`` is empty. ``None`` fields take the trainer's task defaults. A task's ``budget`` table overrides
    these fields for that task (``None`` there: keep the study's value). ``fast``: train every run on the trainer's
    fast path (``TrainConfig.fast``: fused AdamW, the same update rule rounded differently; ``docs/training_speed.md``),
    for every arm alike.
    """

    lr_grid: list[float] | None = None
    fast: bool | None = None

    @field_validator("steps")
    @classmethod
    def _some_steps(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"steps must be >= 1 in a study, got {value}")
        return value

    @field_validator("lr_grid")
    @classmethod
    def _positive_lrs(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and any(not lr > 0 for lr in value):
            raise ValueError(f"lr_grid values must be positive, got {value}")
        return value


class ModelSettings(_Strict):
    """Shape of the reference model (the standard Transformer) and how the others are matched to it.

    ``dim`` is the standard Transformer's width; every other model gets the width (the hidden size for an RNN) whose
    trainable-parameter count is closest to the standard one on the same task, and must land within ``tolerance``
    (relative) of it, unless ``match_params`` is false.
    """

    dim: int = Field(32, gt=0)
    layers: int = Field(2, gt=0)
    heads: int = Field(2, gt=0)
    match_params: bool = True
    tolerance: float = Field(0.10, gt=0, lt=1)


class TaskSettings(_Strict):
    """One task of the sweep at one or more sequence lengths.

    ``options`` are passed to ``axiomformer.tasks.make_task`` (as ``TrainConfig.task_options``); ``metric`` says how
    its comparisons are measured (``METRICS``: ``accuracy`` for a graded task, ``solve_rate`` for a solve-or-stuck
    one); ``budget`` overrides
    the study budget for this task only (its ``None`` fields keep the study's value); ``length_budgets`` overrides
    it further at given lengths (keys: the length as a string, e.g. ``"10000"``).
    """

    name: str
    seq_lens: list[int] = Field(min_length=1)
    options: dict[str, Any] = Field(default_factory=dict)
    metric: Literal["accuracy", "solve_rate"] = "accuracy"
    budget: StudyBudget = Field(default_factory=lambda: StudyBudget.model_validate({}))
    length_budgets: dict[str, StudyBudget] = Field(default_factory=dict)

    @field_validator("seq_lens")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if any(n <= 0 for n in value):
            raise ValueError(f"seq_lens must be positive, got {value}")
        return value


class Sections(_Strict):
    """Report sections computed besides training; each is cached in the store and computed once."""

    audit: bool = True
    derive: bool = True
    flow: bool = True


class StudyConfig(_Strict):
    """A whole study: which models, which tasks, how many seeds, which budget.

    Attributes:
        suite: which study suite plans the runs and writes the report (``axiomformer.study.suites``; ``main``: the
            assumption sweep).
        name: a title for the report.
        seeds: seeds 0..seeds-1 are reported for every (model, task, length); at least 2 (a paired interval needs
            two).
        selection_seeds: the seeds whose mean validation accuracy picks each cell's learning rate from
            ``budget.lr_grid``; disjoint from the reported seeds and never reported (no winner's curse).
        margin: equivalence margin in accuracy (in (0, 1)): a relaxation is ``free`` when its whole interval lies inside
            ``±margin`` (``axiomformer.study.statistics``).
        solve_margin: the same margin for a difference of solve rates (tasks whose ``metric`` is ``solve_rate``).
        solve_threshold: a run solves its task when its test accuracy reaches this.
        controls: validity controls trained on every task like any other arm (``CONTROLS``): what a task gives away
            without token mixing, and with uniform mixing (no scores).
        aa_control: also train the standard model with another initialization stream (``init_stream = 1``) at the
            standard model's chosen rate, and compare the two (the A/A null control: it must never come out
            ``forced`` or ``better``).
        lr_check: train each relaxed arm's reported seeds again at its second-best rate and recompute each of its
            comparisons from those runs; where the verdict changes, the verdict is marked ``lr_sensitive``.
        alpha: family-wise error rate of each family of comparisons.
        min_seeds: the preset's minimum of reported seeds for a decision; a run with fewer claims nothing (every
            verdict ``pilot``).
        pilot: a pilot run (``--quick``): every verdict ``pilot``.
        lr_widen: at most this many rounds of widening per cell, each one grid step beyond the edge while the best
            rate so far is the smallest or largest tried, beyond both edges while every rate tied on validation
            accuracy (``study.stages.tried_lrs``); a cell still at the edge is flagged "lr at grid edge" in the
            report. 0 under ``curriculum`` (its default there; any other value is refused).
        primary: the labels (relax strings or baseline names, as in ``variants`` / ``baselines``) whose
            comparisons with the standard model on the first task form the primary family; every other comparison
            is secondary, corrected as its own family. Labels not in this study are ignored (a config that replaces
            ``variants`` keeps the preset's list); none left: every comparison is primary.
        curriculum: train the lengths of a task in increasing order, each run starting from the weights of the same
            model and seed at the previous length; the learning rate is chosen once, at the shortest length.
        base_spec: relax string applied to the standard spec before each variant (``"standard"``: none).
        variants: relax strings (``"A4=cosine"``, ``"position=rope"``, ``"standard"``), one Transformer each; a
            hybrid stack gives one relax string per layer, separated by ``/`` and repeated over the layers
            (``"transport=decay_householder/standard"``).
        baselines: recurrent baselines among ``rnn``, ``lstm``, ``gru``.
        tasks: the tasks and their sequence lengths.
        budget: the training budget shared by every model.
        model: reference width/depth and parameter matching.
        sections: which non-training report sections to compute (audit, derive, flow).
        threads: torch CPU threads per training run (``None``: torch's default in-process, 1 in worker processes).
        workers: local backend only: how many runs train at once (1: in this process; >1: worker processes);
            ``"auto"``: one per CPU core up to 4 on CPU, 1 with a GPU.
        device: passed to ``TrainConfig.device`` (``auto``: CUDA when available).
    """

    suite: str = "main"
    name: str = "axiomformer study"
    seeds: int = 2
    selection_seeds: list[int] = Field(default_factory=lambda: [1000, 1001])
    margin: float = 0.02
    solve_margin: float = 0.25
    solve_threshold: float = Field(0.9, gt=0, le=1)
    controls: list[str] = Field(default_factory=list)
    aa_control: bool = False
    lr_check: bool = False
    alpha: float = Field(0.05, gt=0, lt=0.5)
    min_seeds: int = Field(10, ge=2)
    pilot: bool = False
    lr_widen: int = Field(2, ge=0)
    primary: list[str] = Field(default_factory=list)
    curriculum: bool = False
    base_spec: str = "standard"
    variants: list[str] = Field(default_factory=lambda: ["standard"], min_length=1)
    baselines: list[str] = Field(default_factory=list)
    tasks: list[TaskSettings] = Field(min_length=1)
    budget: StudyBudget = Field(default_factory=lambda: StudyBudget.model_validate({}))
    model: ModelSettings = Field(default_factory=lambda: ModelSettings.model_validate({}))
    sections: Sections = Field(default_factory=Sections)
    threads: int | None = Field(None, gt=0)
    workers: int | Literal["auto"] = "auto"
    device: Literal["auto", "cpu", "cuda"] = "cpu"

    @field_validator("seeds")
    @classmethod
    def _two_seeds(cls, value: int) -> int:
        # One seed is accepted here so that library callers can smoke-test a setup (such a run is a pilot: every
        # verdict is `pilot`); the `axiomformer study` command refuses it (MIN_CLI_SEEDS), since it decides nothing.
        if value < 1:
            raise ValueError(f"seeds must be >= 1, got {value}")
        return value

    @field_validator("margin", "solve_margin")
    @classmethod
    def _positive_margin(cls, value: float) -> float:
        # A difference of two accuracies or solve rates lies in [-1, 1]: a margin of 1 or more calls every interval
        # free, so it decides nothing.
        if not 0 < value < 1:
            raise ValueError(
                f"a margin must be > 0 and < 1 (a difference of accuracies or solve rates, e.g. 0.02), got {value}"
            )
        return value

    @field_validator("selection_seeds")
    @classmethod
    def _non_negative(cls, value: list[int], info: ValidationInfo) -> list[int]:
        if len(set(value)) < 2 and not _stored(info):
            raise ValueError(
                f"need at least 2 distinct selection_seeds (a learning rate chosen on one seed rewards its luck), "
                f"got {value}; e.g. [1000, 1001]"
            )
        if any(s < 0 for s in value):
            raise ValueError(f"selection_seeds must be >= 0, got {value}")
        return value

    @field_validator("controls")
    @classmethod
    def _known_controls(cls, value: list[str]) -> list[str]:
        return _known("control", value, CONTROLS)

    @model_validator(mode="before")
    @classmethod
    def _curriculum_does_not_widen(cls, data: Any) -> Any:
        # The curriculum chooses its rate once, at the shortest length, and every later run of the arm starts from
        # that run's weights: a widened rate there would change them all, so it chooses from the grid as given.
        if isinstance(data, dict) and data.get("curriculum") and "lr_widen" not in data:
            return {**data, "lr_widen": 0}
        return data

    @model_validator(mode="after")
    def _no_widening_in_a_curriculum(self, info: ValidationInfo) -> StudyConfig:
        if self.curriculum and self.lr_widen and not _stored(info):
            raise ValueError(
                f"lr_widen = {self.lr_widen} with curriculum = true: a curriculum chooses its learning rate once, at "
                "the shortest length, from lr_grid as given (every later run starts from those weights); set "
                "lr_widen = 0, or list the rates to try in lr_grid"
            )
        return self

    @model_validator(mode="after")
    def _disjoint_seeds(self, info: ValidationInfo) -> StudyConfig:
        overlap = sorted(set(self.selection_seeds) & set(range(self.seeds)))
        if overlap and not _stored(info):
            raise ValueError(
                f"selection_seeds {overlap} overlap the reported seeds 0..{self.seeds - 1}; choose "
                f"selection seeds >= {self.seeds} (e.g. {max(1000, self.seeds)} and {max(1000, self.seeds) + 1})"
            )
        return self

    @field_validator("baselines")
    @classmethod
    def _known_baselines(cls, value: list[str]) -> list[str]:
        return _known("baseline", value, BASELINES)

    @field_validator("variants")
    @classmethod
    def _valid_variants(cls, value: list[str]) -> list[str]:
        from axiomformer.spec import LAYER_SEPARATOR, AttentionSpec, stack_specs

        for text in value:
            causal: bool | None
            base = AttentionSpec.standard(64, 4, causal=True)
            if LAYER_SEPARATOR in text:  # a hybrid stack: each layer's spec, with the fields its choices need
                causal = all(s.causal for s in stack_specs(base, text, len(text.split(LAYER_SEPARATOR))))
                if not causal:
                    raise ValueError(f"variant {text!r}: every layer of a hybrid stack needs a causal mask")
                continue
            try:
                causal = base.relax(text).causal
            except ValueError:
                causal = None
                try:
                    base.relax(causal=False).relax(text)  # defined only without a causal mask (sinkhorn)?
                except ValueError:
                    base.relax(text)  # no: the spec's own error, naming the valid choices
            if not causal:
                # Every task scores position t after inputs[:t + 1] (tasks/base.py): an arm that reads the whole
                # sequence would see what it is scored on, and its comparison would measure that, not the choice.
                raise ValueError(
                    f"variant {text!r} is not causal: the study's tasks score each position after reading its "
                    f"prefix, so a bidirectional arm would see the tokens it is scored on; a choice defined only "
                    f"without a causal mask (normalizer=sinkhorn) cannot be a study arm (train it with "
                    f"`axiomformer train --spec '<choice>,causal=false'`)"
                )
        return value

    @field_validator("suite")
    @classmethod
    def _known_suite(cls, value: str) -> str:
        from axiomformer.study.registry import get_suite

        get_suite(value)  # raises ValueError naming the registered suites
        return value

    @field_validator("workers")
    @classmethod
    def _positive_workers(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"workers must be >= 1 or 'auto', got {value}")
        return value

    def resolved_workers(self) -> int:
        """``workers`` with ``"auto"`` resolved for this machine."""
        if self.workers != "auto":
            return int(self.workers)
        import os

        import torch

        if self.device != "cpu" and torch.cuda.is_available():
            return 1
        return max(1, min(4, os.cpu_count() or 1))

    @model_validator(mode="after")
    def _valid_base(self) -> StudyConfig:
        from axiomformer.spec import AttentionSpec

        AttentionSpec.standard(self.model.dim, self.model.heads, causal=True).relax(self.base_spec)
        return self


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``override`` into a copy of ``base``: tables merge, every other value replaces."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key != "options":
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _explain(err: ValidationError, source: str) -> StudyConfigError:
    lines = []
    for item in err.errors():
        where = ".".join(str(p) for p in item["loc"])
        message = item["msg"].removeprefix("Value error, ")
        lines.append(f"[{where}] {message}" if where else message)
    return StudyConfigError(f"invalid study config ({source}): " + "; ".join(lines))


def validate_config(data: dict[str, Any], *, base: dict[str, Any] | None = None, source: str = "config") -> StudyConfig:
    """Validate a plain dict (merged over ``base`` when given) into a :class:`StudyConfig`.

    Raises:
        StudyConfigError: naming the key and, for an unknown key, the allowed ones.
    """
    merged = _merge(base or {}, data)
    try:
        return StudyConfig.model_validate(merged)
    except ValidationError as err:
        raise _explain(err, source) from None


def load_config(path: str | Path, *, base: dict[str, Any] | None = None) -> StudyConfig:
    """Read a TOML study file and validate it over ``base`` (a built-in sweep as a dict, see ``sweep.default_sweep``).

    Raises:
        StudyConfigError: unreadable file, TOML syntax error, unknown key or invalid value.
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise StudyConfigError(f"cannot read study config {path}: {err.strerror or err}") from None
    except tomllib.TOMLDecodeError as err:
        raise StudyConfigError(f"{path} is not valid TOML: {err}") from None
    data.setdefault("name", f"axiomformer study ({path.name})")
    return validate_config(data, base=base, source=str(path))


# ---------------------------------------------------------------------------------------------------- stored configs
def _selection_seed(data: dict[str, Any]) -> dict[str, Any] | None:
    """Before ``selection_seeds`` (a list), a store kept one ``selection_seed`` (default 0), also a reported seed."""
    if "selection_seeds" in data:
        return None
    out = {k: v for k, v in data.items() if k != "selection_seed"}
    out["selection_seeds"] = [int(data.get("selection_seed", 0))]
    return out


def _lr_widen(data: dict[str, Any]) -> dict[str, Any] | None:
    """Before ``lr_widen``, the learning-rate grid was never widened."""
    return None if "lr_widen" in data else {**data, "lr_widen": 0}


MIGRATIONS: tuple[tuple[str, Callable[[dict[str, Any]], dict[str, Any] | None]], ...] = (
    ("selection_seed", _selection_seed),
    ("lr_widen", _lr_widen),
)
"""Named steps that bring a config stored by an older version to the current fields, in order; each returns the
migrated dict, or ``None`` when the config does not need it."""


@dataclass(frozen=True)
class StoredConfig:
    """A study config read back from a results store: the :class:`StudyConfig` it was written as, and the names of
    the :data:`MIGRATIONS` that brought an older one to the current fields (``()`` for a current one)."""

    config: StudyConfig
    migrations: tuple[str, ...] = ()


def stored_config(data: dict[str, Any], *, source: str = "stored config") -> StoredConfig:
    """Read a config stored by ``run_study`` (``StudyConfig.model_dump()`` as JSON) back as a :class:`StudyConfig`.

    An older config is migrated first (:data:`MIGRATIONS`); the rules for designing a new study that a stored one
    may predate (two disjoint selection seeds) are not applied again.

    Raises:
        StudyConfigError: a stored config that is not a study config even after migration, naming the key.
    """
    applied = []
    for name, step in MIGRATIONS:
        migrated = step(data)
        if migrated is not None:
            data = migrated
            applied.append(name)
    try:
        config = StudyConfig.model_validate(data, context={"stored": True})
    except ValidationError as err:
        raise _explain(err, source) from None
    return StoredConfig(config=config, migrations=tuple(applied))
