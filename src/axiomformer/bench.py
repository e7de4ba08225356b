"""Benchmarks: forward + backward time and peak memory of each variant's attention core, against SDPA.

For every variant (a relax string) and sequence length, the attention core -- what ``Attention.forward`` runs between
the projections and the output projection: RoPE, the engine ``attend`` routes to, masks and biases -- runs
forward and backward on random (batch, heads, seq, head_dim) queries, keys and values, and so does
``torch.nn.functional.scaled_dot_product_attention`` on the same tensors. The two are timed interleaved (A B A B ...),
the medians reported, so that load from other processes hits both alike. The reference engine is timed the same way
where its (seq x seq) matrices fit (``reference_max_len``), and x-transformers' ``Attend`` when it is installed.

Peak memory: :class:`axiomformer.memory.PeakMemory` (its method is reported with the results); it counts everything
allocated during the call: outputs, saved activations, workspace and the input gradients.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from axiomformer.attention import Attention
from axiomformer.engines import ENGINE_ORDER, ENGINES, problem_kind
from axiomformer.engines.router import engine_accepts, layer_problem
from axiomformer.memory import PeakMemory
from axiomformer.runtime import seeded
from axiomformer.spec import AttentionSpec, spec_requirements

QUICK_VARIANTS = (
    "standard",
    "score=cosine",
    "score=neg_l2",
    "position=rope",
    "position=alibi",
    "normalizer=sigmoid",
    "normalizer=relu",
    "normalizer=sparsemax",
    "normalizer=entmax15",
    "normalizer=linear",
    "normalizer=softmax1",
    "window=256",
    "normalizer=stick_breaking",
    "normalizer=softpick",
    "scale=log_n",
    "normalizer=topk",
    "softcap=30",
    "transport=decay,normalizer=none",
    "transport=householder",
    "transport=decay_householder,normalizer=none",
    "transport=diag_decay_householder,normalizer=none",
    "select=block_mean",
    "select=indexer",
    "select=nsa",
    "position=short_conv",
    "kv_latent=128",
)
"""The variants with a speed goal (see benchmarks/RESULTS.md): each transport on the engine it is routed to (the
recurrent state form, or PaTH's chunked form), each selection, the short convolution and MLA's latent (its core is
the standard one: the latent lives in the projections, so its row checks that nothing else changed)."""

FULL_VARIANTS = QUICK_VARIANTS + (
    "score=bilinear",
    "score=additive",
    "score=mlp",
    "contribution=joint",
    "normalizer=entmax_alpha",
    "normalizer=linear,feature_map=taylor",
    "normalizer=diff",
    "normalizer=softmax_sink",
    "score=talking_heads",
    "normalizer=sinkhorn",
    "normalizer=power",
    "aggregator=laser",
    "position=cope",
    "normalizer=none",
)
"""Every variant whose attention core differs (``aggregator=gate`` acts after the core, ``position=forget`` reads the
layer's inputs: both need the whole layer, which ``Attention.core`` is not; ``aggregator=laser`` wraps the weighted
sum, inside the core; a transport's gates read the merged keys in the core, in place of the layer's key input)."""

GOALS = {
    "standard": 1.05,
    "score=cosine": 1.3,
    "score=neg_l2": 1.3,
    "position=rope": 1.3,
    "position=alibi": 1.3,
    "normalizer=softmax1": 1.3,
    "normalizer=sigmoid": 1.5,
    "normalizer=relu": 1.5,
    "normalizer=sparsemax": 1.5,
    "normalizer=entmax15": 1.5,
    "scale=log_n": 1.3,
    "normalizer=softpick": 1.5,
    "softcap=30": 1.5,
    "normalizer=topk": 1.5,
    "normalizer=stick_breaking": 1.5,
    "position=short_conv": 1.5,
    "kv_latent=128": 1.05,
}
"""Time goals at every length as a multiple of SDPA's (issues 25, 26 and 34: every row <= 1.5x, stricter ones kept);
:data:`LONG_GOALS` hold from L = :data:`LONG` on, :data:`FASTER_THAN_SDPA` there too, and every goal variant's peak
memory stays within :data:`MEMORY_GOAL` x SDPA's there."""

LONG = 4096
"""The length from which :data:`LONG_GOALS`, :data:`FASTER_THAN_SDPA` and :data:`MEMORY_GOAL` hold."""

LONG_GOALS = {"select=block_mean": 1.5, "select=indexer": 1.5, "select=nsa": 1.5}
"""Time goals from L = :data:`LONG` on (issue 34: the selection forms <= 1.5x SDPA at 4096)."""

TRANSPORT_ROWS = (
    "transport=decay,normalizer=none",
    "transport=householder",
    "transport=decay_householder,normalizer=none",
    "transport=diag_decay_householder,normalizer=none",
)
"""The transports' rows (issue 34: their recurrent or chunked forms no slower than SDPA at 4096, O(L) memory)."""

FASTER_THAN_SDPA = {
    "normalizer=linear": "causal SDPA",
    "window=256": "full causal SDPA",
    **dict.fromkeys(TRANSPORT_ROWS, "causal SDPA"),
}
"""The variants whose goal is to be no slower than SDPA (the baseline named) at L >= :data:`LONG`."""

MEMORY_GOAL = 2.0
"""Every goal variant's peak memory at L >= :data:`LONG`, as a multiple of SDPA's."""


def canonical(variant: str) -> str:
    """``variant``'s relax items in one order (``normalizer=none,transport=decay`` for
    ``transport=decay,normalizer=none``): a row's label and a goal's key name the same variant whatever order each
    spells its items in."""
    return ",".join(sorted(item.strip() for item in variant.split(",") if item.strip()))


def _goal_of(table: dict[str, Any], variant: str) -> Any:
    key = canonical(variant)
    return next((value for name, value in table.items() if canonical(name) == key), None)


def time_goal(variant: str, seq_len: int) -> float | None:
    """The largest time ratio to SDPA a row of ``variant`` at ``seq_len`` may have (None: no time goal there)."""
    if seq_len >= LONG:
        if _goal_of(FASTER_THAN_SDPA, variant) is not None:
            return 1.0
        if (long := _goal_of(LONG_GOALS, variant)) is not None:
            return float(long)
    return _goal_of(GOALS, variant)


def memory_goal(variant: str, seq_len: int) -> float | None:
    """The largest peak-memory ratio to SDPA a row of ``variant`` at ``seq_len`` may have (None: none there)."""
    has_goal = any(_goal_of(table, variant) is not None for table in (GOALS, LONG_GOALS, FASTER_THAN_SDPA))
    return MEMORY_GOAL if has_goal and seq_len >= LONG else None


@dataclass
class Row:
    variant: str
    engine: str
    seq_len: int
    causal: bool
    ms: float
    sdpa_ms: float
    ratio_vs_sdpa: float
    peak_mem_mb: float
    sdpa_peak_mem_mb: float
    ratio_ci: tuple[float, float] = (math.nan, math.nan)
    """The 95 % interval of the ratio from the paired repeats (:func:`ratio_interval`)."""
    warmup_dropped: int = 0
    """First timed pairs the warm-up check dropped (:data:`WARMUP_OUTLIER`)."""
    time_goal: float | None = None
    """The largest ratio_vs_sdpa the row's goal allows (:func:`time_goal`; None: no time goal)."""
    memory_goal: float | None = None
    """The largest peak_mem_mb / sdpa_peak_mem_mb the row's goal allows (:func:`memory_goal`; None: none)."""
    goal_met: bool | None = None
    """Both goals met by the medians (None: the row has no goal; reference and x-transformers rows never do)."""

    def __post_init__(self) -> None:
        if self.engine in ("reference", *XT_ROWS):
            return
        self.time_goal = time_goal(self.variant, self.seq_len)
        self.memory_goal = memory_goal(self.variant, self.seq_len)
        if self.time_goal is None and self.memory_goal is None:
            return
        # "no slower than SDPA" (a goal of 1.0) is met by ms <= sdpa_ms
        time_ok = self.time_goal is None or self.ratio_vs_sdpa <= self.time_goal
        memory_ok = self.memory_goal is None or self.peak_mem_mb <= self.memory_goal * self.sdpa_peak_mem_mb
        self.goal_met = time_ok and memory_ok


# ---------------------------------------------------------------------------------------------- the timed calls
def attention_core(module: Attention, q: Tensor, k: Tensor, v: Tensor, engine: str = "auto") -> tuple[Tensor, str]:
    """What ``Attention.forward`` does between the projections and the output projection (self-attention):
    :meth:`Attention.core`."""
    result = module.core(q, k, v, engine=engine)
    return result.out, result.engine


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Step:
    """Forward + backward; ``clear()`` drops the gradients of the last call (before measuring memory, so that the
    freed old gradients do not offset the new ones)."""

    def __init__(self, forward: Callable[[], Tensor], inputs: list[Tensor], grad: Tensor) -> None:
        self.forward, self.inputs, self.grad = forward, inputs, grad

    def clear(self) -> None:
        for t in self.inputs:
            t.grad = None

    def __call__(self) -> None:
        self.clear()
        self.forward().backward(self.grad)


Timed = Callable[[], object]
"""A call the bench times (its result is ignored)."""


def _timed(call: Timed, device: torch.device) -> float:
    _sync(device)
    start = time.perf_counter()
    call()
    _sync(device)
    return (time.perf_counter() - start) * 1000


WARMUP_OUTLIER = 1.5
"""A first timed pair whose time (of either call) exceeds this many times the median of its call is a warm-up that
did not finish: it is dropped and another pair is timed (at most MAX_WARMUP_DROPS times) **(our choice: a quiet run
measured standard at 0.53x SDPA at L = 1024 from a warm-up outlier of a 3-repeat median)**."""

MAX_WARMUP_DROPS = 3
WARMUP_FLOOR_MS = 0.05
"""Times below this (ms) are never called outliers: timer resolution, not warm-up."""

MIN_CI_REPEATS = 7
"""Paired repeats of the default bench: the 95 % interval of a ratio needs enough pairs to mean something."""


def interleaved_times(
    a: Timed, b: Timed, device: torch.device, repeats: int, warmup: bool = True
) -> tuple[list[float], list[float], int]:
    """Milliseconds of ``repeats`` pairs of ``a`` and ``b`` run alternately (A B A B ...) after one warm-up each
    (unless the caller has just run them), and how many first pairs the warm-up check dropped (WARMUP_OUTLIER)."""
    if warmup:
        a(), b()
    times_a: list[float] = []
    times_b: list[float] = []
    dropped = 0
    while len(times_a) < repeats:
        times_a.append(_timed(a, device))
        times_b.append(_timed(b, device))
        if len(times_a) == repeats and repeats > 2 and dropped < MAX_WARMUP_DROPS:
            slow = any(
                t[0] > WARMUP_OUTLIER * statistics.median(t[1:]) and t[0] > WARMUP_FLOOR_MS for t in (times_a, times_b)
            )
            if slow:
                del times_a[0], times_b[0]
                dropped += 1
    return times_a, times_b, dropped


def interleaved_ms(a: Timed, b: Timed, device: torch.device, repeats: int, warmup: bool = True) -> tuple[float, float]:
    """Median milliseconds of ``a`` and ``b`` (:func:`interleaved_times`)."""
    times_a, times_b, _ = interleaved_times(a, b, device, repeats, warmup)
    return statistics.median(times_a), statistics.median(times_b)


def ratio_interval(times_a: list[float], times_b: list[float], level: float = 0.95) -> tuple[float, float]:
    """The ``level`` confidence interval of the ratio a / b from paired times: a t interval of the mean of the
    pairs' log ratios, exponentiated (scipy.stats.t); (nan, nan) with fewer than two pairs.

    Pairs run back to back share the machine's load, so their ratio is steadier than either time."""
    from scipy import stats

    logs = [math.log(x / y) for x, y in zip(times_a, times_b) if x > 0 and y > 0]
    if len(logs) < 2:
        return (math.nan, math.nan)
    mean, sem = statistics.fmean(logs), statistics.stdev(logs) / math.sqrt(len(logs))
    half = float(stats.t.ppf(0.5 + level / 2, len(logs) - 1)) * sem
    return (round(math.exp(mean - half), 4), round(math.exp(mean + half), 4))


XT_ROWS = {"x-transformers": False, "x-transformers-flash": True}
"""x-transformers' ``Attend`` rows: its math path (``flash=False``, the full score matrix) and its flash path
(``flash=True``, which calls ``F.scaled_dot_product_attention``), so the comparison is fair to it."""


def _x_transformers_attend(causal: bool, flash: bool = False) -> Callable[[Tensor, Tensor, Tensor], Tensor] | None:
    try:
        from x_transformers.attend import Attend
    except ImportError:
        return None
    attend = Attend(causal=causal, flash=flash)
    return lambda q, k, v: attend(q, k, v)[0]


# ---------------------------------------------------------------------------------------------- the benchmark
def _inputs(length: int, batch: int, heads: int, head_dim: int, dev: torch.device) -> tuple[list[Tensor], Tensor]:
    """Queries, keys, values (leaf tensors) and an output gradient of one length, the same on every call."""
    g = torch.Generator(device="cpu").manual_seed(length)
    shape = (batch, heads, length, head_dim)
    qkv = [torch.randn(shape, generator=g).to(dev).requires_grad_() for _ in range(3)]
    return qkv, torch.randn(shape, generator=g).to(dev)


def variant_spec(dim: int, heads: int, relax: str) -> AttentionSpec:
    """The spec of ``relax`` with or without a causal mask, whichever it is defined with (the error of the causal one
    when neither)."""
    try:
        return AttentionSpec.standard(dim, heads, causal=False).relax(relax)
    except ValueError:
        return AttentionSpec.standard(dim, heads, causal=True).relax(relax)


def _cases(
    variants: tuple[str, ...],
    length: int,
    is_causal: bool,
    heads: int,
    head_dim: int,
    reference_max_len: int,
    dev: torch.device,
) -> Iterator[tuple[AttentionSpec, Attention, str]]:
    """(spec, module, engine) for each variant: ``auto`` and, up to ``reference_max_len``, ``reference``."""
    for relax in variants:
        if spec_requirements(variant_spec(heads * head_dim, heads, relax)).get("causal", is_causal) != is_causal:
            continue  # defined only under (stick_breaking) or only without (sinkhorn) a causal mask
        spec = AttentionSpec.standard(heads * head_dim, heads, causal=is_causal).relax(relax)
        with seeded(0):
            module = Attention(spec).to(dev)
        for engine in ["auto"] + (["reference"] if length <= reference_max_len else []):
            yield spec, module, engine


StepKey = tuple[str, str] | None
"""A timed step's key: (variant, engine), None for the SDPA baseline."""

Steps = Callable[[bool, int], Iterator[tuple[StepKey, _Step]]]
"""The steps of one (is_causal, length) setting: SDPA's first, then each case's."""


def _measure_memory(
    settings: list[tuple[bool, int]], steps: Steps, meter: PeakMemory, log: Callable[[str], Any]
) -> dict[tuple[bool, int, StepKey], float]:
    """The first pass of :func:`run_bench`: each step's peak memory in MiB, keyed ``(is_causal, length, key)``."""
    memory: dict[tuple[bool, int, StepKey], float] = {}
    for is_causal, length in settings:
        for key, step in steps(is_causal, length):
            step.clear()
            meter.measure(step)  # warm-up (lazy initialization, first-call caches)
            step.clear()
            memory[(is_causal, length, key)] = meter.measure(step)
            name = "baseline F.scaled_dot_product_attention" if key is None else "/".join(key)
            log(
                f"memory  L={length} {'causal' if is_causal else 'full'}  {name}: "
                f"{memory[(is_causal, length, key)]:.1f} MiB"
            )
    return memory


def run_bench(
    variants: tuple[str, ...] = QUICK_VARIANTS,
    lengths: tuple[int, ...] = (1024, 4096),
    causal: tuple[bool, ...] = (True,),
    *,
    batch: int = 1,
    heads: int = 8,
    head_dim: int = 64,
    repeats: int = MIN_CI_REPEATS,
    reference_max_len: int = 1024,
    device: str | None = None,
    log: Callable[[str], Any] = print,
) -> tuple[list[Row], str]:
    """Benchmark rows (one per variant, engine, length and mask) and the memory method used.

    The engine of each variant's row is the first that accepts it (what ``auto`` routing picks for long sequences,
    see :func:`_route`), forced at every length; rows with ``engine="reference"`` time the reference engine
    (lengths <= ``reference_max_len``), ``engine="x-transformers"`` and ``"x-transformers-flash"`` its ``Attend``
    without and with its flash (SDPA) path (standard only).

    Two passes: first every peak-memory measurement (each after one measured warm-up call), then every timing. On
    CPU the meter puts glibc in a strict allocation mode while it measures; a timed run between two measurements
    would leave a heap behind that inflates the next one (by up to 5x in our runs), so the passes are kept apart.
    """
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    meter = PeakMemory(dev, allocator_modes=True)
    settings = [(is_causal, length) for is_causal in causal for length in lengths]
    steps = _steps_of(variants, batch, heads, head_dim, reference_max_len, causal, dev)
    memory = _measure_memory(settings, steps, meter, log)
    rows: list[Row] = []
    for is_causal, length in settings:
        rows += _time_rows(steps, is_causal, length, memory, dev, repeats, log)
    return rows, meter.method


def _steps_of(
    variants: tuple[str, ...],
    batch: int,
    heads: int,
    head_dim: int,
    reference_max_len: int,
    causal: tuple[bool, ...],
    dev: torch.device,
) -> Steps:
    """The steps of each (is_causal, length) setting of :func:`run_bench`; x-transformers' ``Attend`` is built once
    per mask and flash path."""
    xt_attend = {
        (is_causal, row): _x_transformers_attend(is_causal, flash)
        for is_causal in causal
        for row, flash in XT_ROWS.items()
    }

    def steps(is_causal: bool, length: int) -> Iterator[tuple[StepKey, _Step]]:
        """(key, step) pairs: SDPA's first (key None), then each case's, then x-transformers'."""
        (q, k, v), grad = _inputs(length, batch, heads, head_dim, dev)
        yield None, _Step(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=is_causal), [q, k, v], grad)
        for spec, module, engine in _cases(variants, length, is_causal, heads, head_dim, reference_max_len, dev):
            name = "reference" if engine == "reference" else _route(module, q, k, v)
            call = _core_call(module, q, k, v, name)
            yield (spec.variant, name), _Step(call, [q, k, v] + list(module.parameters()), grad)
        for row in XT_ROWS:
            xt = xt_attend[(is_causal, row)]
            if xt is not None:
                yield ("standard", row), _Step(_bound(xt, q, k, v), [q, k, v], grad)

    return steps


def _core_call(module: Attention, q: Tensor, k: Tensor, v: Tensor, engine: str) -> Callable[[], Tensor]:
    """The attention core's output on ``engine`` as a call of no arguments (one per case, bound now)."""
    return lambda: attention_core(module, q, k, v, engine)[0]


def _bound(fn: Callable[[Tensor, Tensor, Tensor], Tensor], q: Tensor, k: Tensor, v: Tensor) -> Callable[[], Tensor]:
    """``fn(q, k, v)`` as a call of no arguments."""
    return lambda: fn(q, k, v)


def _time_rows(
    steps: Steps,
    is_causal: bool,
    length: int,
    memory: dict[tuple[bool, int, StepKey], float],
    dev: torch.device,
    repeats: int,
    log: Callable[[str], Any],
) -> list[Row]:
    """The second pass of :func:`run_bench` for one setting: each step timed against SDPA, interleaved."""
    sdpa_mem = memory[(is_causal, length, None)]
    rows: list[Row] = []
    sdpa: _Step | None = None
    for key, step in steps(is_causal, length):
        if key is None:
            sdpa = step
            continue
        assert sdpa is not None  # steps() yields SDPA's step first
        times, sdpa_times, dropped = interleaved_times(step, sdpa, dev, repeats)
        ms, sdpa_ms = statistics.median(times), statistics.median(sdpa_times)
        rows.append(
            Row(
                key[0],
                key[1],
                length,
                is_causal,
                round(ms, 3),
                round(sdpa_ms, 3),
                round(ms / sdpa_ms, 3),
                round(memory[(is_causal, length, key)], 1),
                round(sdpa_mem, 1),
                ratio_interval(times, sdpa_times),
                dropped,
            )
        )
        log(_describe(rows[-1]))
    return rows


def _route(module: Attention, q: Tensor, k: Tensor, v: Tensor) -> str:
    """The fast engine for this self-attention problem: the first that accepts it, as ``auto`` routes long sequences.

    (``auto`` leaves problems small enough for one chunk to the reference engine; the bench measures the memory-lean
    engine at every length so that its rows are comparable across lengths.)
    """
    spec = module.spec
    slopes = module.position.slopes if spec.position == "alibi" else None
    assert slopes is None or isinstance(slopes, Tensor)  # a buffer, registered for ALiBi only
    problem = layer_problem(module.plan, q, k, v, alibi_slopes=slopes, training=module.training)
    kind = problem_kind(module.plan, problem)
    for name in ENGINE_ORDER:
        if engine_accepts(ENGINES[name], module.plan, kind):
            return name
    return "reference"


def _describe(row: Row) -> str:
    return (
        f"{row.variant:<22} {row.engine:<14} L={row.seq_len:<6} causal={row.causal!s:<5} "
        f"{row.ms:9.1f} ms ({row.ratio_vs_sdpa:5.2f}x SDPA {row.sdpa_ms:.1f} ms)  "
        f"peak {row.peak_mem_mb:8.1f} MiB (SDPA {row.sdpa_peak_mem_mb:.1f})  "
        f"95% [{row.ratio_ci[0]:.2f}, {row.ratio_ci[1]:.2f}]x"
        + (f" ({row.warmup_dropped} warm-up pairs dropped)" if row.warmup_dropped else "")
    )


# ---------------------------------------------------------------------------------------------- reports
def goal_report(rows: list[Row]) -> list[str]:
    """One line per goal: met or not, from the auto-routed rows (each row's ``time_goal`` and ``memory_goal``)."""
    auto = [r for r in rows if r.goal_met is not None]
    lines = []
    for variant, limit in GOALS.items():
        mine = [r for r in auto if canonical(r.variant) == canonical(variant) and r.time_goal == limit]
        if mine:
            worst = max(mine, key=lambda r: r.ratio_vs_sdpa)
            verdict = "met" if worst.ratio_vs_sdpa <= limit else "NOT met"
            lines.append(
                f"{variant}: time <= {limit}x SDPA: {verdict} (worst {worst.ratio_vs_sdpa:.2f}x at "
                f"L={worst.seq_len}, causal={worst.causal}; 95% [{worst.ratio_ci[0]:.2f}, {worst.ratio_ci[1]:.2f}])"
            )
    for variant, limit in LONG_GOALS.items():
        long = [r for r in auto if canonical(r.variant) == canonical(variant) and r.seq_len >= LONG]
        if long:
            verdict = "met" if all(r.ratio_vs_sdpa <= limit for r in long) else "NOT met"
            lines.append(
                f"{variant}: time <= {limit}x SDPA at L>={LONG}: {verdict} "
                f"({', '.join(f'L={r.seq_len}: {r.ratio_vs_sdpa:.2f}x' for r in long)})"
            )
    for variant, baseline in FASTER_THAN_SDPA.items():
        long = [r for r in auto if canonical(r.variant) == canonical(variant) and r.causal and r.seq_len >= LONG]
        if long:
            verdict = "met" if all(r.ms <= r.sdpa_ms for r in long) else "NOT met"
            lines.append(
                f"{variant}: no slower than {baseline} at L>={LONG}: {verdict} "
                f"({', '.join(f'L={r.seq_len}: {r.ratio_vs_sdpa:.2f}x' for r in long)})"
            )
    memory = [r for r in auto if r.memory_goal is not None]
    for variant in dict.fromkeys(r.variant for r in memory):
        mine = [r for r in memory if r.variant == variant]
        ratios = [r.peak_mem_mb / r.sdpa_peak_mem_mb if r.sdpa_peak_mem_mb > 0 else math.inf for r in mine]
        bound = mine[0].memory_goal
        verdict = "met" if all(x <= (bound or math.inf) for x in ratios) else "NOT met"
        lines.append(
            f"{variant}: peak memory <= {bound}x SDPA at L>={LONG}: {verdict} "
            f"({', '.join(f'L={r.seq_len}: {x:.2f}x' for r, x in zip(mine, ratios))})"
        )
    return lines


def markdown(rows: list[Row], device: str, method: str) -> str:
    """A Markdown report: the machine, the memory method, the goals and every row."""
    lines = [
        f"device: {device}; torch {torch.__version__}; threads {torch.get_num_threads()}",
        f"peak memory: {method}",
        "",
        "## Goals",
        "",
    ]
    lines += [f"- {line}" for line in goal_report(rows)]
    lines += [
        "",
        "## Rows",
        "",
        "| variant | engine | L | causal | ms | SDPA ms | x SDPA | 95 % interval | peak MiB | SDPA peak MiB | goal |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.variant} | {r.engine} | {r.seq_len} | {r.causal} | {r.ms} | {r.sdpa_ms} | "
            f"{r.ratio_vs_sdpa} | [{r.ratio_ci[0]}, {r.ratio_ci[1]}] | {r.peak_mem_mb} | {r.sdpa_peak_mem_mb} | "
            f"{_goal_cell(r)} |"
        )
    return "\n".join(lines) + "\n"


def _goal_cell(row: Row) -> str:
    """The row's goals and whether the medians meet them, for the Markdown table."""
    if row.goal_met is None:
        return ""
    parts = [f"time <= {row.time_goal}x"] if row.time_goal is not None else []
    parts += [f"memory <= {row.memory_goal}x"] if row.memory_goal is not None else []
    return f"{', '.join(parts)}: {'met' if row.goal_met else 'NOT met'}"


def plot(rows: list[Row], path: str | Path) -> None:
    """Time and peak memory against sequence length, one line per variant, SDPA dashed (PNG)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 5))
    ax_t, ax_m = fig.subplots(1, 2)
    auto = [r for r in rows if r.engine not in ("reference",)]
    for key in sorted({(r.variant, r.engine, r.causal) for r in auto}):
        mine = sorted((r for r in auto if (r.variant, r.engine, r.causal) == key), key=lambda r: r.seq_len)
        label = f"{key[0]} [{key[1]}]" + (" causal" if key[2] else "")
        ax_t.plot([r.seq_len for r in mine], [r.ms for r in mine], marker="o", label=label)
        ax_m.plot([r.seq_len for r in mine], [r.peak_mem_mb for r in mine], marker="o", label=label)
    for causal in sorted({r.causal for r in rows}):
        by_len = {r.seq_len: r for r in rows if r.causal == causal}
        xs = sorted(by_len)
        tag = "SDPA" + (" causal" if causal else "")
        ax_t.plot(xs, [by_len[x].sdpa_ms for x in xs], "k--", linewidth=2, label=tag)
        ax_m.plot(xs, [by_len[x].sdpa_peak_mem_mb for x in xs], "k--", linewidth=2, label=tag)
    for ax, title in ((ax_t, "forward + backward time (ms)"), (ax_m, "peak memory (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
    ax_m.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def rows_as_dicts(rows: list[Row]) -> list[dict[str, Any]]:
    """The rows as plain dicts (for JSON)."""
    return [asdict(r) for r in rows]
