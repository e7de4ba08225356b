"""The study report: ``report.md``, ``report.html`` and ``figures/*.png``, rebuilt from ``results.sqlite`` alone.

Sections of the main suite: the answer (``study.answer``: assumption -> verdict, difference [interval], what a decision
would take; the differences figure; the secondary family); then the details: accuracy per cell (mean with a valid 95 %
interval); parameter counts; audit verdict per variant; throughput and peak memory; the derivation check; the flow
experiment; failed runs; provenance.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, TypedDict

from axiomformer.study.config import StudyConfig, stored_config
from axiomformer.study.record import ModelRecord, RunRecord
from axiomformer.study.render import Heading, Image, Paragraph, Table, to_html, to_markdown
from axiomformer.study.store import ResultsStore
from axiomformer.study.sweep import assumption_of

NOT_AVAILABLE = "not available"


class StudyData:
    """The runs of a study grouped for the report (the planned sweep from the store's meta, else every row)."""

    def __init__(self, store: ResultsStore):
        stored = stored_config(store.get_meta("config") or {}, source=f"{store.path} (meta 'config')")
        self.config: StudyConfig = stored.config
        self.config_migrations = stored.migrations  # what an older store's config needed to read as a current one
        planned = store.get_meta("planned") or []
        rows = store.runs()
        keys = {p["key"] for p in planned}
        self.all_rows = [r for r in rows if not keys or r.key in keys]
        self.extra_rows = len(rows) - len(self.all_rows)
        from axiomformer.study.stages import lr_at_edge, reported_rows, second_best_rows

        self.rows, self.lrs = reported_rows(self.config, self.all_rows)
        self.second_rows, self.second_lrs = second_best_rows(self.config, self.all_rows)
        self.lr_edges = lr_at_edge(self.config, self.all_rows, self.lrs)
        self.suite = self.config.suite
        self.models = [ModelRecord.model_validate(m) for m in store.get_meta("models") or []] or [
            ModelRecord(label=r.label, kind=r.model, spec=r.spec) for r in {r.label: r for r in rows}.values()
        ]
        self.kind = {m.label: m.kind for m in self.models}
        self.spec = {m.label: m.spec for m in self.models}
        source = [(p["task"], p["seq_len"]) for p in planned] or [(r.task, r.seq_len) for r in self.rows]
        self.tasks: list[tuple[str, int]] = list(dict.fromkeys(source))
        self.missing = len([p for p in planned if p["key"] not in {r.key for r in self.all_rows}])
        self.by_model: dict[str, list[RunRecord]] = defaultdict(list)
        for r in self.rows:
            self.by_model[r.label].append(r)
        self.failures = [f for f in store.failures() if not keys or f["key"] in keys]
        self.audits = store.audits()
        self.sections = store.sections()
        self.last_invocation = store.get_meta("last_invocation")


def _run_kinds(d: StudyData) -> str:
    """``110 reported, 60 learning-rate selection, 30 other``: what the finished runs are. Selection runs are the
    seeds past the reported ones; the others are reported seeds' runs outside the reported cells (the lr check's
    second-best rate, a suite's own runs such as the long-range zero-shot tests)."""
    selection = sum(r.seed >= d.config.seeds for r in d.all_rows)
    other = len(d.all_rows) - len(d.rows) - selection
    parts = [f"{len(d.rows)} reported", f"{selection} learning-rate selection"]
    if other:
        parts.append(f"{other} other: the lr check's or the suite's own runs")
    return ", ".join(parts)


def _task_name(task: tuple[str, int]) -> str:
    return f"{task[0]}@{task[1]}"


# ---------------------------------------------------------------------------------------------------- sections
def _ci(low: float | None, high: float | None) -> str:
    return "" if low is None else f" [{low:.3f}, {high:.3f}]"


def _headline(d: StudyData) -> list:
    from axiomformer.study.summary import cell_stats

    stats = {(c.model, c.task): c for c in cell_stats(d)}
    table = Table(["model", "relaxes", *map(_task_name, d.tasks)])
    flagged = edges = 0
    for m in d.models:
        cells = []
        for t in d.tasks:
            c = stats.get((m.label, _task_name(t)))
            if c is None:
                cells.append("—")
                continue
            flagged += not c.converged
            edges += c.lr_at_grid_edge
            lr = "" if c.lr is None else f" lr {c.lr:g}"
            cells.append(
                f"{c.mean:.3f}{_ci(c.ci_low, c.ci_high)}{lr}"
                + ("" if c.converged else " (not converged)")
                + (" (lr at grid edge)" if c.lr_at_grid_edge else "")
            )
        table.rows.append([m.label, assumption_of(m.label, m.kind), *cells])
    chance: dict[tuple[str, int], float | None] = {}
    for r in d.rows:
        chance.setdefault((r.task, r.seq_len), r.task_config.get("chance"))
    if any(v is not None for v in chance.values()):
        table.rows.append(
            ["(chance)", "", *(f"{chance[t]:.3f}" if chance.get(t) is not None else "—" for t in d.tasks)]
        )
    cfg = d.config
    seeds = cfg.seeds
    grid = cfg.budget.lr_grid

    methods = sorted({c.ci_method for c in stats.values()})
    items = sorted({c.n_test for c in stats.values() if c.n_test})
    widened = (
        f" (widened one step beyond an edge up to {cfg.lr_widen} times, both ways when every rate tried ties)"
        if cfg.lr_widen and grid and len(grid) > 1
        else ""
    )
    table.note = (
        f"Test accuracy on scored positions: mean over the reported seeds 0..{seeds - 1} with its 95 % "
        f"interval ({', '.join(methods) or '—'}), on the same {'/'.join(map(str, items)) or '?'} scored "
        f"test items for every model and seed, at the learning rate chosen for the cell (`lr`) from "
        f"{grid or 'one value'}{widened} by "
        f"mean validation accuracy at selection seeds {cfg.selection_seeds}, which are never reported. "
        f"`not converged`: a reported run used its whole budget while its training loss was still falling "
        f"(a significantly negative slope over the last quarter of its steps; {flagged} cell(s)). `lr at grid edge`: the chosen rate is the smallest or largest "
        f"tried ({edges} cell(s)). `—`: no finished run. Columns are `task@sequence length`."
    )
    return [Heading("Accuracy: model x task"), table]


def _selection(d: StudyData) -> list:
    """Validation accuracy of every selection run per model and learning rate (the chosen rate marked)."""
    from axiomformer.study.stages import choose_lr, selection_groups

    groups = selection_groups(d.config, d.all_rows)
    if not groups:
        return []
    lrs = sorted({lr for group in groups.values() for lr, _ in group if lr is not None})
    table = Table(["model", "task", *(f"lr {lr:g}" for lr in lrs)])
    for (label, task, seq_len), group in groups.items():
        by_lr, best = dict(group), choose_lr(group)
        cells = []
        for lr in lrs:
            rows = by_lr.get(lr) or []
            accs = [r.outcome.val_accuracy for r in rows]
            accs = [a for a in accs if a is not None]
            mark = " (best)" if best == lr else ""
            cells.append(f"{statistics.fmean(accs):.3f}{mark}" if accs else "—")
        table.rows.append([label, f"{task}@{seq_len}", *cells])
    table.note = (
        "Validation accuracy of the learning-rate selection runs (mean over the selection seeds, which are "
        "never reported); `—`: not tried; `(best)`: the rate the cell reports at. A best rate at the edge "
        "of those tried is widened (up to `lr_widen` times; both ways when every rate tried has the same "
        "mean, as stuck runs do) and, if still at the edge, flagged in the accuracy table."
    )
    return [Heading("Learning-rate selection"), table]


def _params(d: StudyData) -> list:
    tol = d.config.model.tolerance
    table = Table(["model", *map(_task_name, d.tasks), "max deviation"])
    worst_all = 0.0
    for m in d.models:
        cells, worst = [], 0.0
        for task in d.tasks:
            rows = [r for r in d.by_model[m.label] if (r.task, r.seq_len) == task]
            ref = [r for r in d.by_model["standard"] if (r.task, r.seq_len) == task]
            if not rows:
                cells.append("—")
                continue
            p, width, ref_p = rows[0].params, rows[0].dim, ref[0].params if ref else None
            if p is not None and ref_p:
                worst = max(worst, abs(p - ref_p) / ref_p)
            cells.append(f"{p:,} (w={width})" if p is not None else f"? (w={width})")
        worst_all = max(worst_all, worst)
        table.rows.append([m.label, *cells, f"{worst:.1%}" + (" (over tolerance)" if worst > tol else "")])
    table.note = (
        f"Trainable parameters (w = width: model dim for a Transformer, hidden size for an RNN), matched to the "
        f"standard Transformer within {tol:.0%}; largest deviation {worst_all:.1%}."
    )
    return [Heading("Parameter counts"), table]


def _audits(d: StudyData) -> list:
    out: list = [Heading("Audit verdict per variant")]
    if not d.config.sections.audit:
        return out + [Paragraph("Audit section disabled in this study's config.")]
    table = Table(["model", "spec", "passed", "failed", "not applicable", "failed checks"])
    for m in d.models:
        if m.kind != "transformer" or m.spec is None:  # a Transformer always has its relax string
            continue
        payload = d.audits.get(m.spec)
        if payload is None:
            table.rows.append([m.label, m.spec, NOT_AVAILABLE, "", "", ""])
        elif "error" in payload:
            table.rows.append([m.label, m.spec, "error", "", "", payload["error"]])
        else:
            checks = payload.get("checks", [])
            failed = [f"{c['name']} ({c.get('assumption')})" for c in checks if c.get("passed") is False]
            table.rows.append(
                [
                    m.label,
                    m.spec,
                    str(sum(c.get("passed") is True for c in checks)),
                    str(len(failed)),
                    str(sum(c.get("passed") is None for c in checks)),
                    ", ".join(failed) or "none",
                ]
            )
    table.note = "`axiomformer audit spec:<spec>`: property checks tied to the assumptions, run once per spec."
    return out + [table]


def _throughput(d: StudyData) -> list:
    table = Table(["model", "engine", "train tokens/s", "peak memory (MB)", "seconds per run", "runs"])
    for m in d.models:
        rows = d.by_model[m.label]
        if not rows:
            table.rows.append([m.label, "—", "—", "—", "—", "0"])
            continue

        def avg(name: str, rows: list[RunRecord] = rows) -> str:
            vals = [getattr(r, name) for r in rows if getattr(r, name) is not None]
            return f"{statistics.fmean(vals):,.1f}" if vals else "—"

        engines = ", ".join(sorted({str(r.engine) for r in rows}))
        table.rows.append(
            [m.label, engines, avg("tokens_per_second"), avg("peak_mem_mb"), avg("seconds"), str(len(rows))]
        )
    sources = sorted({str(r.memory_source) for r in d.rows})
    table.note = (
        "Means over every run of the model (all tasks and seeds). Tokens/s are training tokens per wall-clock "
        "second, so they reflect the machine's load. Peak memory: the run's own peak resident-set growth on "
        "CPU (`VmHWM`), `torch.cuda.max_memory_allocated` on GPU (sources here: "
        f"{', '.join(sources) or '—'})."
    )
    return [Heading("Throughput and peak memory"), table]


def _cached_section(d: StudyData, key: str, title: str) -> tuple[list, Any]:
    """(the section's opening blocks, its cached payload); the payload is None when the study has not computed it."""
    section = d.sections.get(key)
    if section is None:
        return [Heading(title), Paragraph(f"{title}: {NOT_AVAILABLE}.")], None
    return [Heading(title)], section["payload"]


def _derive(d: StudyData) -> list:
    out, payload = _cached_section(d, "derive", "Derivation check")
    if payload is None:
        return out
    steps = payload.get("steps", []) if isinstance(payload, dict) else []
    table = Table(["step", "label", "assumption", "violation before", "error after", "passed"])
    num = lambda v: f"{v:.2e}" if isinstance(v, (int, float)) else str(v)
    for step in steps:
        verdict = "vacuous" if step.get("vacuous") else str(step.get("passed"))
        table.rows.append(
            [
                str(step.get("id")),
                str(step.get("label", "")),
                str(step.get("assumption", "")).split(":")[0],
                num(step.get("violation_before")),
                num(step.get("error_after")),
                verdict,
            ]
        )
    final = payload.get("final_vs_sdpa_max_abs_err") if isinstance(payload, dict) else None
    table.note = (
        "`axiomformer derive`: each step measures its assumption's property on the module before the step "
        "(violated) and after it (holds). Final step against "
        "`torch.nn.functional.scaled_dot_product_attention`: "
        f"max abs error {final:.2e}."
        if isinstance(final, (int, float))
        else ""
    )
    return out + [table]


def _flow(d: StudyData) -> list:
    out, payload = _cached_section(d, "flow", "Flow experiment (quick)")
    if payload is None:
        return out
    arms = payload.get("arms") or []
    ks = sorted({r["K"] for r in arms})
    cells = {(r["theta"], r["arm"], r["noise"], r["K"]): r["acc_mean"] for r in arms}
    keys = list(dict.fromkeys((r["theta"], r["arm"], r["noise"]) for r in arms))
    table = Table(
        ["theta", "arm", "noise sigma", *(f"K={k}" for k in ks)],
        [
            [t, a, f"{n:g}", *(f"{cells[(t, a, n, k)]:.3f}" if (t, a, n, k) in cells else "—" for k in ks)]
            for t, a, n in keys
        ],
    )
    table.note = (
        f"Dataset {payload.get('data')}: mean test accuracy over {len(payload.get('seeds') or [])} seeds "
        "after K flow steps per arm (quick protocol; intervals and the full run: axiomformer flow)."
    )
    return out + [table]


def _failures(d: StudyData) -> list:
    if not d.failures and not d.missing:
        return []
    table = Table(
        ["model", "task", "seed", "error"],
        [
            [f["label"], f"{f['task']}@{f['seq_len']}", str(f["seed"]), f["error"].strip().splitlines()[-1]]
            for f in d.failures
        ],
    )
    return [
        Heading("Failed or missing runs"),
        Paragraph(f"{d.missing} planned run(s) have no result; rerun the study with the same out dir to retry."),
        table,
    ]


def _provenance(d: StudyData) -> list:
    rows = d.all_rows
    last = d.last_invocation or {}
    versions = sorted({str(r.package_version) for r in rows})
    commits = sorted({str(r.git_commit) for r in rows})
    budget = d.config.budget.model_dump()
    return [
        Heading("Provenance"),
        Table(
            ["item", "value"],
            [
                [
                    "runs",
                    f"{len(rows)} stored: {_run_kinds(d)}"
                    + (f" (+{d.extra_rows} from other sweeps, not shown)" if d.extra_rows else ""),
                ],
                [
                    "budget (every model, where no per-length budget is shown)",
                    ", ".join(f"{k}={v}" for k, v in budget.items() if v is not None),
                ],
                ["model", ", ".join(f"{k}={v}" for k, v in d.config.model.model_dump().items())],
                ["base spec", d.config.base_spec],
                ["package version", ", ".join(versions) or "—"],
                ["git commit", ", ".join(commits) or "—"],
                ["backends", ", ".join(sorted({str(r.backend) for r in rows})) or "—"],
                ["hosts", ", ".join(sorted({str(r.host) for r in rows})) or "—"],
                ["total training seconds (wall, summed over runs)", f"{sum(r.seconds or 0 for r in rows):,.1f}"],
                ["total training CPU seconds", f"{sum(r.cpu_seconds or 0 for r in rows):,.1f}"],
                [
                    "last `axiomformer study` call that trained",
                    (
                        f"{last.get('seconds')} s wall, {last.get('trained')} run(s) trained, "
                        f"backend {last.get('backend')}, workers {last.get('workers')}, "
                        f"{last.get('cpu_count')} CPUs, load average {last.get('load_average_start')}"
                        f" -> {last.get('load_average_end')}"
                    )
                    if last
                    else "—",
                ],
            ],
        ),
    ]


def main_sections(d: StudyData, figures_dir: Path, pilot_note: list | None = None) -> list:
    """The main suite's report body: the answer (verdicts, differences figure, secondary family; ``pilot_note``
    blocks after the figure), then the details: accuracy per cell, length curves, parameters, audits, throughput,
    derive, flow, failures, provenance."""
    from axiomformer.study.answer import answer_blocks
    from axiomformer.study.figures import draw_figures

    answer = answer_blocks(d, figures_dir, pilot_note)
    figures = draw_figures(d, figures_dir)
    curves = [
        Image(f"figures/{path.name}", f"accuracy against sequence length on {name.split(':')[1]}")
        for name, path in figures.items()
        if name.startswith("length:")
    ]
    return [
        *answer,
        Heading("Details"),
        *_headline(d),
        *curves,
        *_selection(d),
        *_params(d),
        *_audits(d),
        *_throughput(d),
        *_derive(d),
        *_flow(d),
        *_failures(d),
        *_provenance(d),
    ]


def failures_block(d: StudyData) -> list:
    """Failed or missing runs (empty when none)."""
    return _failures(d)


def provenance_block(d: StudyData) -> list:
    """Runs, budget, model, versions, commits, backends, hosts, times."""
    return _provenance(d)


def load_study(out_dir: str | Path) -> StudyData:
    """The :class:`StudyData` of a study out dir, read from its ``results.sqlite`` (opened read-only).

    Raises:
        FileNotFoundError: ``out_dir`` has no ``results.sqlite``.
    """
    out_dir = Path(out_dir)
    if not (out_dir / "results.sqlite").is_file():
        raise FileNotFoundError(f"no results.sqlite in {out_dir}: not a study out dir")
    with ResultsStore(out_dir, readonly=True) as store:
        return StudyData(store)


def study_json(out_dir: str | Path) -> dict[str, Any]:
    """The answer of a study out dir as a JSON-ready dict (``axiomformer.study.summary.to_json``: design, cells,
    comparisons, verdicts).

    Raises:
        FileNotFoundError: ``out_dir`` has no ``results.sqlite``.
    """
    from axiomformer.study.summary import to_json

    return to_json(load_study(out_dir))


class ReportPaths(TypedDict):
    """What :func:`build_report` wrote: the Markdown and HTML report and the figures by name."""

    markdown: Path
    html: Path
    figures: dict[str, Path]


def build_report(out_dir: str | Path) -> ReportPaths:
    """Write ``report.md``, ``report.html`` and ``figures/*.png`` in ``out_dir`` from its ``results.sqlite``.

    Returns:
        ``{"markdown": path, "html": path, "figures": {name: path}}``.

    Raises:
        FileNotFoundError: ``out_dir`` has no ``results.sqlite``.
    """
    out_dir = Path(out_dir)
    d = load_study(out_dir)
    from axiomformer.study.registry import get_suite

    figures_dir = out_dir / "figures"
    title = d.config.name
    blocks = [
        Heading(title, 1),
        Paragraph(
            f"{len(d.all_rows)} finished runs ({_run_kinds(d)}), "
            f"{len({r.label for r in d.rows}) or len(d.models)} models or arms, {len(d.tasks)} task "
            f"settings; suite `{d.suite}`. "
            "Rebuild with `axiomformer report <dir>`."
        ),
        *get_suite(d.suite).sections(d, figures_dir),
    ]
    figures = {p.stem: p for p in sorted(figures_dir.glob("*.png"))} if figures_dir.is_dir() else {}
    md, page = out_dir / "report.md", out_dir / "report.html"
    md.write_text(to_markdown(blocks), encoding="utf-8")
    page.write_text(to_html(blocks, title), encoding="utf-8")
    return {"markdown": md, "html": page, "figures": figures}
