"""The sweep: which runs a study trains, with matched parameter counts and one shared budget.

A *run* is one (model, task, sequence length, seed). Models are the Transformer variants (the standard spec and its
single-axis relaxations) and the recurrent baselines (relaxing A0, permutation invariance, itself). Every model trains
with the same budget; every model's width is chosen so that its trainable-parameter count is within
``model.tolerance`` (10 % by default) of the standard Transformer's on the same task.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from axiomformer.spec import ALIASES, AXES, LAYER_SEPARATOR, AttentionSpec, stack_specs
from axiomformer.study.config import StudyConfig, TaskSettings, validate_config

if TYPE_CHECKING:
    from axiomformer.tasks.base import Task

DEFAULT_VARIANTS: tuple[str, ...] = (
    "standard",
    "A1=mlp",
    "A2=joint",
    "A3=mlp",
    "A4=cosine",
    "A4=neg_l2",
    "A4=additive",
    "A5=sigmoid",
    "A5=sparsemax",
    "A5=gumbel_softmax",
    "A5=linear",
    "scale=none",
    "position=none",
    "position=sinusoidal",
    "position=rope",
    "position=alibi",
)
"""The built-in variants. The standard model adds Vaswani's sinusoidal encoding to its token embeddings (the trainer's
``input_position="auto"``); the variant ``position=none`` removes every position signal, input encoding included, so
that only the causal mask tells order (NoPE, Kazemnejad et al. 2023) **(our choice)**."""

DEFAULT_BASELINES: tuple[str, ...] = ("rnn", "lstm", "gru")

NO_POSITION_LABELS = ("position=none",)

AA_LABEL = "standard (A/A)"
"""The A/A control's label: the standard model with another initialization stream (``TrainConfig.init_stream``)."""


def default_sweep(quick: bool = False, *, suite: str = "main", preset: str | None = None) -> dict[str, Any]:
    """A suite's built-in config as a plain dict (the base a TOML study file is merged onto): ``preset`` (``quick``,
    ``default``, ``full``), or ``quick``/``default`` from the flag.

    Raises:
        ValueError: an unknown suite or preset, naming the choices.
    """
    from axiomformer.study.registry import get_suite

    return get_suite(suite).preset(preset or ("quick" if quick else "default"))


def default_config(quick: bool = False, *, suite: str = "main", preset: str | None = None) -> StudyConfig:
    """The built-in config, validated."""
    return validate_config(default_sweep(quick, suite=suite, preset=preset), source="built-in sweep")


# ---------------------------------------------------------------------------------------------------- models
@dataclass(frozen=True)
class ModelChoice:
    """One model of the sweep.

    Attributes:
        label: what the report calls it: ``standard``, a relax string relative to the base spec with the assumption
            aliases (``A4=cosine``, ``position=rope``), or a baseline name (``gru``).
        kind: ``transformer``, ``rnn``, ``lstm`` or ``gru``.
        spec: for a Transformer, the full relax string of the trained spec relative to the standard one
            (``TrainConfig.spec``); ``"standard"`` for the baselines (unused by them).
        options: more ``TrainConfig`` fields of this model, as ``(name, value)`` pairs (a suite's model options,
            e.g. ``(("causal", False), ("mlp_ratio", 0))``); list values as tuples.
    """

    label: str
    kind: str
    spec: str = "standard"
    input_position: str = "auto"
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def is_baseline(self) -> bool:
        return self.kind != "transformer"


_FIELD_ALIAS = {name: alias for alias, name in ALIASES.items()}


def _label(spec: AttentionSpec, base: AttentionSpec) -> str:
    diff = [(name, getattr(spec, name)) for name in AXES if getattr(spec, name) != getattr(base, name)]
    if spec.normalizer != "linear":
        diff = [(n, v) for n, v in diff if n != "feature_map"]
    return ",".join(f"{_FIELD_ALIAS.get(n, n)}={v}" for n, v in diff) or "standard"


def models(config: StudyConfig) -> list[ModelChoice]:
    """The sweep's models in report order: Transformer variants (duplicates merged) then baselines."""
    base = AttentionSpec.standard(config.model.dim, config.model.heads, causal=True).relax(config.base_spec)
    out: list[ModelChoice] = []
    seen: set[str] = set()
    for text in config.variants:
        compact = text.replace(" ", "")
        if LAYER_SEPARATOR in compact:  # a hybrid stack: one relax string per layer, checked now, named as given
            stack_specs(base, compact, config.model.layers)
            if compact not in seen:
                seen.add(compact)
                out.append(ModelChoice(label=compact, kind="transformer", spec=compact))
            continue
        no_position = compact in NO_POSITION_LABELS and base.position == "none"
        spec = base if no_position else base.relax(text)
        label = "position=none" if no_position else _label(spec, base)
        if label not in seen:
            seen.add(label)
            out.append(
                ModelChoice(
                    label=label, kind="transformer", spec=spec.variant, input_position="none" if no_position else "auto"
                )
            )
    out += [ModelChoice(label=name, kind=name) for name in config.baselines]
    out += [ModelChoice(label=name, kind=name) for name in config.controls]
    if config.aa_control:
        out.append(ModelChoice(label=AA_LABEL, kind="transformer", spec=base.variant, options=(("init_stream", 1),)))
    return out


def assumption_of(label: str, kind: str = "transformer") -> str:
    """The assumption a model relaxes, from its label: ``A4=cosine`` -> ``A4``, ``A5=sigmoid`` -> ``A5 (normalizer)``,
    ``scale=none`` -> ``A5 (scale)``,
    ``position=rope`` -> ``position``, a recurrent baseline -> ``A0``, a validity control -> ``control``, the A/A
    control -> ``A/A``, ``standard`` -> ``none``."""
    from axiomformer.study.config import CONTROLS

    if kind in CONTROLS:
        return "control"
    if kind != "transformer":
        return "A0"
    if label == AA_LABEL:
        return "A/A"
    if label == "standard":
        return "none"
    groups = []
    for item in label.split(","):
        key = item.split("=", 1)[0]
        groups.append({"scale": "A5 (scale)", "feature_map": "A5 (normalizer)", "A5": "A5 (normalizer)"}.get(key, key))
    return "+".join(dict.fromkeys(groups))


# ---------------------------------------------------------------------------------------------------- matching
CountFn = Callable[[ModelChoice, int, int, str, dict], int]
"""``count(model, width, seq_len, task, task_options) -> trainable parameters``."""


def count_params(
    model: ModelChoice, width: int, seq_len: int, task: str, options: dict, *, layers: int, heads: int
) -> int:
    """Trainable parameters of ``model`` at ``width``, built exactly as the trainer builds it.

    Raises:
        ValueError: the width is not valid for this model (e.g. not divisible by ``heads``, odd RoPE head_dim).
    """
    task_obj = _task(task, seq_len, options)
    spec = model.spec if model.kind == "transformer" else ""
    # Only a learned position table grows with the length; other counts are shared across lengths (cache hits).
    max_len = task_obj.seq_len if "learned" in spec else 0
    return _count(model.kind, spec, width, task_obj.vocab_size, max_len, layers, heads)


@functools.lru_cache(maxsize=4096)
def _count(kind: str, spec: str, width: int, vocab_size: int, max_len: int, layers: int, heads: int) -> int:
    from axiomformer.models import build_model, count_parameters

    max_len = max_len or 16
    base = AttentionSpec.standard(width, heads, causal=True, max_len=max_len)
    stack = stack_specs(base, spec, layers) if spec else None
    attention = stack[0] if stack else None
    hybrid = {"layer_specs": stack} if stack and LAYER_SEPARATOR in spec else {}
    net = build_model(
        kind,
        vocab_size=vocab_size,
        dim=width,
        num_layers=layers,
        max_len=max_len,
        spec=attention,
        causal=attention.causal if attention is not None else True,
        **hybrid,
    )
    return count_parameters(net)


_TASKS: dict[str, Any] = {}


def _task(name: str, seq_len: int, options: dict) -> Task:
    from axiomformer.tasks import make_task

    key = json.dumps([name, seq_len, options], sort_keys=True, default=str)
    if key not in _TASKS:
        _TASKS[key] = make_task(name, seq_len=seq_len, **options)
    return _TASKS[key]


def match_width(count: Callable[[int], int], target: int, candidates: list[int]) -> tuple[int, int]:
    """The candidate width whose parameter count is closest to ``target`` (``count`` is increasing in the width).

    Binary search over the sorted candidates, then the two neighbours of the crossing are compared; widths that
    ``count`` rejects with ``ValueError`` are skipped. Returns ``(width, count)``.

    Raises:
        ValueError: no candidate is valid.
    """
    cache: dict[int, int | None] = {}

    def value(i: int) -> int | None:
        w = candidates[i]
        if w not in cache:
            try:
                cache[w] = count(w)
            except ValueError:
                cache[w] = None
        return cache[w]

    def first_valid(i: int, stepdir: int) -> int | None:
        while 0 <= i < len(candidates):
            if value(i) is not None:
                return i
            i += stepdir
        return None

    lo, hi = 0, len(candidates)
    while lo < hi:  # first index whose next valid count (to the right) reaches the target; monotone in the index
        mid = (lo + hi) // 2
        j = first_valid(mid, +1)
        if j is None or value(j) >= target:  # type: ignore[operator]
            hi = mid
        else:
            lo = mid + 1
    best: tuple[int, int] | None = None
    for i in (first_valid(lo, +1), first_valid(lo - 1, -1)):
        if i is not None:
            c = value(i)
            if best is None or abs(c - target) < abs(best[1] - target):  # type: ignore[operator]
                best = (candidates[i], c)  # type: ignore[assignment]
    if best is None:
        raise ValueError("no valid width among the candidates")
    return best


def _safe(count: Callable[[int], int], width: int) -> float:
    try:
        return count(width)
    except ValueError:
        return -1.0


@dataclass
class Widths:
    """Chosen width and parameter count per (model label, task, seq_len); ``reference`` counts per (task, seq_len)."""

    width: dict[tuple[str, str, int], int] = field(default_factory=dict)
    params: dict[tuple[str, str, int], int] = field(default_factory=dict)
    reference: dict[tuple[str, int], int] = field(default_factory=dict)


def match_widths(config: StudyConfig, choices: list[ModelChoice], count: CountFn | None = None) -> Widths:
    """Choose each model's width so its parameter count matches the standard Transformer's on each task.

    The reference is the base spec (``standard`` unless ``base_spec`` says otherwise) at ``model.dim``. Transformer
    widths are multiples of ``model.heads``; recurrent hidden sizes any positive integer. **(our choice)**: match by
    width only, keeping depth and heads fixed.

    Raises:
        ValueError: a model cannot be brought within ``model.tolerance`` of the reference.
    """
    m = config.model
    if count is None:

        def count(model, width, seq_len, task, options):
            return count_params(model, width, seq_len, task, options, layers=m.layers, heads=m.heads)

    base = AttentionSpec.standard(m.dim, m.heads, causal=True).relax(config.base_spec)
    reference_model = ModelChoice("standard", "transformer", base.variant)
    out = Widths()
    for task in config.tasks:
        for seq_len in task.seq_lens:
            target = count(reference_model, m.dim, seq_len, task.name, task.options)
            out.reference[(task.name, seq_len)] = target
            for choice in choices:
                key = (choice.label, task.name, seq_len)
                if choice.kind == "transformer" and choice.spec == reference_model.spec:
                    width = m.dim
                    out.width[key], out.params[key] = width, count(choice, width, seq_len, task.name, task.options)
                    continue
                step = 1 if choice.is_baseline else m.heads
                same = _safe(lambda w: count(choice, w, seq_len, task.name, task.options), m.dim)  # noqa: B023
                if same == target:  # already exact at the reference width (most single-axis relaxations)
                    out.width[key], out.params[key] = m.dim, target
                    continue

                def at(w: int, choice: ModelChoice = choice, seq_len: int = seq_len, task: TaskSettings = task) -> int:
                    return count(choice, w, seq_len, task.name, task.options)

                top = 2 * max(m.dim, 8)
                while top < 64 * max(m.dim, 8) and _safe(at, top - top % step) < target:
                    top *= 2  # widen the search until the largest candidate overshoots the reference count
                width, params = match_width(at, target, list(range(step, top + 1, step)))
                if abs(params - target) > m.tolerance * target:
                    raise ValueError(
                        f"cannot match parameters of {choice.label} on {task.name}@{seq_len}: best width {width} "
                        f"gives {params} vs {target} for the standard model (tolerance {m.tolerance:.0%})"
                    )
                out.width[key], out.params[key] = width, params
    return out


# ---------------------------------------------------------------------------------------------------- runs
@dataclass(frozen=True)
class Cell:
    """One (model, task, length) of the sweep with its matched width and its budget (every field filled)."""

    model: ModelChoice
    task: str
    seq_len: int
    options: dict[str, Any]
    width: int
    budget: dict[str, Any]
    expected_params: int | None = None

    @property
    def ident(self) -> tuple[str, str, int]:
        return (self.model.label, self.task, self.seq_len)


@dataclass(frozen=True)
class Run:
    """One training run of the sweep.

    Attributes:
        key: unique and stable: the model label, task, length, seed and a hash of the full training config, so a
            changed budget, learning rate, width or warm start never reuses an old result.
        model: the :class:`ModelChoice`.
        task, seq_len, seed: what it trains on.
        train_config: the keyword arguments of ``axiomformer.train.TrainConfig`` (``init_from`` relative to the out
            dir).
        expected_params: the matched parameter count (``None`` when matching was skipped).
        save_state: keep the trained weights in the out dir (``state_path``) for a later run's ``init_from``.
    """

    key: str
    model: ModelChoice
    task: str
    seq_len: int
    seed: int
    train_config: dict[str, Any]
    expected_params: int | None = None
    save_state: bool = False

    @property
    def task_label(self) -> str:
        return f"{self.task}@{self.seq_len}"

    @property
    def lr(self) -> float:
        return self.train_config["lr"]

    @property
    def state_path(self) -> str:
        """Where this run's weights go, relative to the out dir."""
        return state_path(self.key)


def state_path(key: str) -> str:
    """``states/<hash of the run key>.safetensors`` (relative to the out dir)."""
    return f"states/{hashlib.sha256(key.encode()).hexdigest()[:20]}.safetensors"


def run_key(label: str, task: str, seq_len: int, seed: int, train_config: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(train_config, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return f"{label}|{task}@{seq_len}|seed={seed}|{digest}"


def cell_budget(config: StudyConfig, task: TaskSettings, seq_len: int) -> dict[str, Any]:
    """The study budget, overridden by the task's ``budget`` and then its ``length_budgets[str(seq_len)]``."""
    budget = config.budget.model_dump()
    for override in (task.budget, task.length_budgets.get(str(seq_len))):
        if override is not None:
            budget |= {k: v for k, v in override.model_dump(exclude_unset=True).items() if v is not None}
    grid = budget.pop("lr_grid", None)
    budget["lr_grid"] = sorted(set(grid)) if grid else [budget["lr"]] if budget.get("lr") else [None]
    return budget


def cells(config: StudyConfig, *, count: CountFn | None = None) -> list[Cell]:
    """Every (model, task, length) of the sweep in report order (task, length, model).

    Raises:
        ValueError: parameter matching fails (see :func:`match_widths`).
    """
    choices = models(config)
    widths = match_widths(config, choices, count) if config.model.match_params else None
    return task_cells(config, lambda task, seq_len: choices, widths)


def task_cells(
    config: StudyConfig, choices_of: Callable[[TaskSettings, int], list[ModelChoice]], widths: Any = None
) -> list[Cell]:
    """The cells (model, task, length) of ``config`` in report order, the models of each task and length from
    ``choices_of(task, seq_len)``, each at its matched width and parameter count from ``widths`` (the result of
    :func:`match_widths`) or, without it, at the config's width."""
    out = []
    for task in config.tasks:
        for seq_len in task.seq_lens:
            budget = cell_budget(config, task, seq_len)
            for choice in choices_of(task, seq_len):
                key3 = (choice.label, task.name, seq_len)
                out.append(
                    Cell(
                        model=choice,
                        task=task.name,
                        seq_len=seq_len,
                        options=dict(task.options),
                        width=widths.width[key3] if widths else config.model.dim,
                        budget=budget,
                        expected_params=widths.params[key3] if widths else None,
                    )
                )
    return out


def make_run(
    config: StudyConfig,
    cell: Cell,
    seed: int,
    lr: float | None,
    *,
    init_from: str | None = None,
    save_state: bool = False,
) -> Run:
    """The run of ``cell`` at ``seed`` and learning rate ``lr`` (``None``: the trainer's task default)."""
    budget = {k: v for k, v in cell.budget.items() if k != "lr_grid"} | {"lr": lr}
    budget = {k: v for k, v in budget.items() if v is not None or k in ("target_accuracy", "patience")}
    if not budget.get("fast"):  # the plain loop is the trainer's default: runs stored before ``fast`` keep their keys
        budget.pop("fast", None)
    tc = {
        "task": cell.task,
        "seq_len": cell.seq_len,
        "model": cell.model.kind,
        "spec": cell.model.spec,
        "layers": config.model.layers,
        "dim": cell.width,
        "heads": config.model.heads,
        "seed": seed,
        "device": config.device,
        "task_options": dict(cell.options),
        **budget,
    }
    if cell.model.input_position != "auto":
        tc["input_position"] = cell.model.input_position
    tc |= {name: list(value) if isinstance(value, tuple) else value for name, value in cell.model.options}
    if init_from is not None:
        tc["init_from"] = init_from
    return Run(
        key=run_key(cell.model.label, cell.task, cell.seq_len, seed, tc),
        model=cell.model,
        task=cell.task,
        seq_len=cell.seq_len,
        seed=seed,
        train_config=tc,
        expected_params=cell.expected_params,
        save_state=save_state,
    )
