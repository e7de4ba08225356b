"""The report's opening, generated from the verdicts of ``study.summary`` (the prose never says more than the intervals
do): the answer table (assumption rows, one column per task that discriminates) and one sentence per assumption
across the tasks; then whether each task can answer at all (ceiling, controls, the standard model); the A/A null
control; the differences figure; and each family's full table (primary, control tasks, secondary).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from axiomformer.study.render import Heading, Image, Paragraph, Table
from axiomformer.study.statistics import VERDICTS, Verdict, fmt_signed

if TYPE_CHECKING:
    from axiomformer.study.report import StudyData

MEANING = {
    "forced": "forced: relaxing it costs",
    "better": "relaxing it gains",
    "free": "free choice (equivalent within the margin)",
    "inconclusive": "not yet known",
    "pilot": "pilot (claims nothing)",
}
FAMILY_TITLES = {
    "primary": "Primary comparisons (the answer)",
    "control_task": "Comparisons on tasks that do not discriminate (reported apart, never the answer)",
    "secondary": "Secondary comparisons (their own family)",
}


def interval_text(v: Verdict) -> str:
    """``-0.123 [-0.200, -0.046]``, or the difference alone when there is no interval."""
    if v.ci_low is None or v.ci_high is None:
        return f"{v.diff:+.3f} (no interval: fewer than two paired seeds)"
    return f"{fmt_signed(v.diff)} [{fmt_signed(v.ci_low)}, {fmt_signed(v.ci_high)}]"


def _unit(v: Verdict) -> str:
    return "solve rate" if v.metric == "solve_rate" else "accuracy"


def _need(v: Verdict) -> str:
    if v.verdict in ("forced", "better", "free"):
        return f"decided with {v.n_seeds} seeds"
    mde = "—" if v.mde is None else f"{v.mde:.3f}"
    seeds = "more than 10,000" if v.seeds_needed is None else f"about {v.seeds_needed}"
    text = f"detects {mde} at 80 % power with {v.n_seeds} seeds; a decision needs {seeds} seeds"
    if v.seeds_needed is not None and v.n_seeds is not None and v.seeds_needed <= v.n_seeds:
        # the power analysis is an expectation: at 80 % power one run in five of that size stays undecided
        text += " (no more than ran: this run is one of the undecided ones a power of 0.8 leaves)"
    return text


def _flags(v: Verdict) -> str:
    out = []
    if v.lr_sensitive:
        out.append("lr-sensitive")
    if not v.converged:
        out.append("loss still falling")
    return f" ({', '.join(out)})" if out else ""


def sentence(v: Verdict, margin: float) -> str:
    """One sentence per verdict, generated from it and its interval."""
    what = f"{v.assumption} (`{v.model}`) on {v.task}"
    ci = f"{_unit(v)} difference {interval_text(v)}"
    if v.verdict == "forced":
        text = f"{what} is forced: relaxing it costs, {ci}, the whole interval below 0."
    elif v.verdict == "better":
        text = f"{what}: relaxing it gains, {ci}, the whole interval above 0."
    elif v.verdict == "free":
        text = f"{what} is a free choice: {ci} lies inside ±{margin:g}."
    elif v.verdict == "pilot":
        text = f"{what}: pilot, claims nothing ({ci})."
    else:
        text = f"{what} is not yet known: {ci} includes 0 and reaches beyond ±{margin:g}; {_need(v)}."
    if v.lr_sensitive:
        text += " At the arm's second-best learning rate the verdict changes (lr-sensitive)."
    return text


_VERDICT_COLUMNS: tuple[tuple[str, Callable[[Verdict], str]], ...] = (
    ("assumption", lambda v: v.assumption),
    ("relaxation", lambda v: v.model),
    ("task", lambda v: v.task),
    ("metric", lambda v: v.metric),
    ("verdict", lambda v: v.verdict),
    ("difference [interval]", interval_text),
    ("p (diff.)", lambda v: f"{v.p_difference:.3g}"),
    ("p (equiv.)", lambda v: f"{v.p_equivalence:.3g}"),
    ("converged", lambda v: "yes" if v.converged else "no"),
    ("lr-sensitive", lambda v: "—" if v.lr_sensitive is None else "yes" if v.lr_sensitive else "no"),
    ("what a decision would take", _need),
)
"""A family's full table: each column's header and its cell of one verdict."""


def verdict_table(found: list[tuple[Verdict, int, str]], family: str) -> Table:
    table = Table([header for header, _ in _VERDICT_COLUMNS])
    table.rows.extend([cell(v) for _, cell in _VERDICT_COLUMNS] for v, _, fam in found if fam == family)
    return table


def _method_note(info: dict[str, Any], found: list[tuple[Verdict, int, str]], family: str) -> str:
    members = [v for v, _, f in found if f == family]
    level = members[0].ci_level if members else 1 - info["alpha"]
    margins = info.get("margins") or {"accuracy": info["margin"]}
    return (
        f"Difference: the relaxation minus the standard model, over the seeds both have (same seeds, data order and "
        f"test items). Accuracy tasks: paired t interval of the mean test accuracy; solve-rate tasks: the Newcombe "
        f"hybrid score interval of the difference of the shares of runs whose test accuracy reaches "
        f"{info.get('solve_threshold', 0.9):g} (a diverged run counts as not solved; in an accuracy comparison it is "
        f"left out). Bonferroni over the {len(members)} comparisons of this family, each at level {level:.4g}, so "
        f"that all hold jointly with probability >= {1 - info['alpha']:.0%}. One symmetric rule: free if the interval "
        f"lies inside ±margin (accuracy {margins['accuracy']:g}, solve rate {margins.get('solve_rate', 0.25):g}); "
        f"otherwise forced below 0, better above 0, else not yet known. `converged`: no run's training loss was "
        f"still falling when its budget ran out (reported, never deciding). `lr-sensitive`: the verdict changes "
        f"when the relaxed arm's reported seeds are retrained at its second-best learning rate."
    )


def _counts(found: list[tuple[Verdict, int, str]], family: str) -> str:
    members = [v.verdict for v, _, f in found if f == family]
    parts = [f"{members.count(k)} {k}" for k in VERDICTS if members.count(k)]
    return ", ".join(parts) or "none"


def answer_table(found: list[tuple[Verdict, int, str]], tasks: list[str]) -> Table:
    """Assumption rows, one column per task (the primary family): verdict, difference [interval] and flags."""
    rows: dict[tuple[str, str], dict[str, Verdict]] = {}
    for v, _, family in found:
        if family == "primary":
            rows.setdefault((v.assumption, v.model), {})[v.task] = v
    table = Table(["assumption", "relaxation", *tasks])
    for (assumption, model), by_task in rows.items():
        cells = [
            f"**{by_task[t].verdict}** {interval_text(by_task[t])}{_flags(by_task[t])}" if t in by_task else "—"
            for t in tasks
        ]
        table.rows.append([assumption, model, *cells])
    return table


def across_tasks(found: list[tuple[Verdict, int, str]], tasks: list[str]) -> list[str]:
    """One sentence per assumption: its verdicts across the tasks that discriminate, and what they add up to."""
    by: dict[str, list[Verdict]] = {}
    for v, _, family in found:
        if family == "primary":
            by.setdefault(v.assumption, []).append(v)
    out = []
    for assumption, items in by.items():
        kinds = {v.verdict for v in items}
        parts = ", ".join(f"{v.verdict} on {v.task}{_flags(v)}" for v in items)
        if kinds == {"forced"}:
            tail = "forced on every task of the battery"
        elif kinds == {"free"}:
            tail = "a free choice on every task of the battery"
        elif len(kinds - {"inconclusive", "pilot"}) > 1:
            tail = "the answer depends on the task"
        elif kinds <= {"inconclusive", "pilot"}:
            tail = "not yet known on any task"
        else:
            known = sorted(kinds - {"inconclusive", "pilot"})[0]
            tail = f"{known} where decided, not yet known elsewhere"
        out.append(f"{assumption} (`{items[0].model}`): {parts} — {tail}.")
    return out


def validity_table(tasks: list[dict[str, Any]]) -> Table:
    """Can each task answer? Ceiling, controls, the standard model, steps to solve, and the call."""
    table = Table(
        [
            "task",
            "metric",
            "chance",
            "ceiling",
            "no mixing",
            "uniform mixing",
            "standard",
            "steps / median to solve",
            "discriminates",
            "why",
        ]
    )

    def num(x: Any) -> str:
        return "—" if x is None else f"{x:.3f}"

    for t in tasks:
        ceiling = "—" if t["ceiling"] is None else f"{t['ceiling']:.3f} ({t['ceiling_method']})"
        median = t.get("standard_median_steps_to_solve")
        table.rows.append(
            [
                t["task"],
                t["metric"],
                num(t["chance"]),
                ceiling,
                num(t["controls"].get("no_mixing")),
                num(t["controls"].get("uniform_mixing")),
                num(t["standard"]),
                f"{t.get('steps') or '—'} / {median if median is not None else '—'}",
                "yes" if t["discriminates"] else "no",
                t["why"],
            ]
        )
    return table


def _aa_blocks(aa: dict[str, Any] | None) -> list:
    if aa is None:
        return []
    parts = "; ".join(
        f"{v['task']}: {v['verdict']} {fmt_signed(v['diff'])}"
        + ("" if v["ci_low"] is None else f" [{fmt_signed(v['ci_low'])}, {fmt_signed(v['ci_high'])}]")
        for v in aa["tasks"]
    )
    return [
        Heading("The A/A control", 3),
        Paragraph(
            f"The standard model against itself with another initialization stream (same data and order), as one "
            f"family over the tasks: {aa['verdict']} ({parts}). It must never come out forced or better"
            + (": **it did, so the design is broken** and no verdict above can be trusted." if aa["broken"] else ".")
        ),
    ]


def answer_blocks(d: StudyData, figures_dir: Path, pilot_note: list | None = None) -> list:
    """The report's opening (see the module docstring)."""
    from axiomformer.study.summary import aa_control, design, verdicts

    info = design(d)
    found = verdicts(d)
    tasks = info.get("tasks") or []
    good = info.get("primary_tasks") or []
    aa = aa_control(d)
    out: list = [Heading("The answer")]
    if aa is not None and aa["broken"]:
        out.append(
            Paragraph("**The A/A control came out " + aa["verdict"] + ": the design is broken.** " + aa["model"])
        )
    if not found:
        text = "No `standard` model with paired reported runs in this store yet: nothing to compare to."
        if info["pilot_reason"]:
            text += f" Every verdict would be `pilot`: {info['pilot_reason']}."
        return [*out, Paragraph(text), *(pilot_note or [])]
    seeds = info["reported_seeds"]
    lead = (
        f"Question: which assumptions of attention are forced and which are free choices, on tasks that can tell? "
        f"{len(good)} of {len(tasks)} tasks discriminate ({', '.join(good) or 'none'}); primary comparisons: "
        f"{_counts(found, 'primary')}. Reported seeds {seeds[0]}..{seeds[-1]} ({len(seeds)}), learning rates chosen on "
        f"selection seeds {info['selection_seeds']} (never reported); margins ±{info['margins']['accuracy']:g} accuracy, "
        f"±{info['margins']['solve_rate']:g} solve rate; family-wise alpha {info['alpha']:g}."
    )
    if info["pilot"]:
        lead += f" Every verdict is `pilot`: {info['pilot_reason']}."
    out += [Paragraph(lead)]
    if good:
        table = answer_table(found, good)
        table.note = _method_note(info, found, "primary")
        out += [table, Paragraph(" ".join(across_tasks(found, good)))]
    else:
        out.append(Paragraph("No task of this store discriminates, so it gives no answer about the assumptions."))
    if tasks:
        out += [Heading("Can each task answer?", 3), validity_table(tasks)]
    out += _aa_blocks(aa)
    from axiomformer.study.figures import draw_differences

    path = draw_differences(found, info["margin"], figures_dir / "differences.png")
    out.append(Image(f"figures/{path.name}", "difference to the standard model with its interval and the margin band"))
    out += pilot_note or []
    for family in ("primary", "control_task", "secondary"):
        if any(f == family for _, _, f in found):
            table = verdict_table(found, family)
            table.note = _method_note(info, found, family)
            out += [
                Heading(FAMILY_TITLES[family], 3),
                Paragraph(f"{_counts(found, family)}."),
                table,
                Paragraph(" ".join(sentence(v, v.margin) for v, _, f in found if f == family)),
            ]
    return out


__all__ = [
    "MEANING",
    "across_tasks",
    "answer_blocks",
    "answer_table",
    "interval_text",
    "sentence",
    "validity_table",
    "verdict_table",
]
