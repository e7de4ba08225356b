"""The report's opening: the answer (assumption -> verdict, difference [interval], what a decision would take), the
figure of differences with their intervals and the ±margin band, and the secondary family, all generated from the
verdicts of ``study.summary`` (the prose never says more than the intervals do).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from axiomformer.study.render import Heading, Image, Paragraph, Table
from axiomformer.study.statistics import Verdict, fmt_signed

if TYPE_CHECKING:
    from axiomformer.study.report import StudyData

MEANING = {
    "forced": "forced: relaxing it costs accuracy",
    "better": "relaxing it gains accuracy",
    "free": "free choice (equivalent within the margin)",
    "inconclusive": "not yet known",
    "pilot": "pilot (claims nothing)",
}


def interval_text(v: Verdict) -> str:
    """``-0.123 [-0.200, -0.046]``, or the difference alone when there is no interval."""
    if v.ci_low is None or v.ci_high is None:
        return f"{v.diff:+.3f} (no interval: fewer than two paired seeds)"
    return f"{fmt_signed(v.diff)} [{fmt_signed(v.ci_low)}, {fmt_signed(v.ci_high)}]"


def _need(v: Verdict) -> str:
    if v.verdict in ("forced", "better", "free"):
        return f"decided with {v.n_seeds} seeds"
    mde = "—" if v.mde is None else f"{v.mde:.3f}"
    seeds = "more than 10,000" if v.seeds_needed is None else f"about {v.seeds_needed}"
    return f"detects {mde} at 80 % power with {v.n_seeds} seeds; a decision needs {seeds} seeds"


def sentence(v: Verdict, margin: float) -> str:
    """One sentence per verdict, generated from it and its interval."""
    what = f"{v.assumption} (`{v.model}`) on {v.task}"
    ci = interval_text(v)
    if v.verdict == "forced":
        return f"{what} is forced: relaxing it costs accuracy, difference {ci}, the whole interval below 0."
    if v.verdict == "better":
        return f"{what}: relaxing it gains accuracy, difference {ci}, the whole interval above 0."
    if v.verdict == "free":
        return f"{what} is a free choice: difference {ci} lies inside ±{margin:g}."
    tail = "" if v.converged else " A cell did not converge, so it cannot be called free."
    if v.verdict == "pilot":
        return f"{what}: pilot, claims nothing (difference {ci}).{tail}"
    side = ("the interval includes 0 and reaches beyond ±" + f"{margin:g}") if v.ci_low is not None else "no interval"
    if v.ci_low is not None and -margin < v.ci_low and v.ci_high < margin:
        side = f"the interval lies inside ±{margin:g} but a cell did not converge"
    return f"{what} is not yet known: difference {ci}, {side}; {_need(v)}.{'' if 'converge' in side else tail}"


def verdict_table(found: list[tuple[Verdict, int, str]], family: str) -> Table:
    table = Table(
        [
            "assumption",
            "relaxation",
            "task",
            "verdict",
            "difference [interval]",
            "p (diff.)",
            "p (equiv.)",
            "converged",
            "what a decision would take",
        ]
    )
    for v, _, fam in found:
        if fam != family:
            continue
        table.rows.append(
            [
                v.assumption,
                v.model,
                v.task,
                v.verdict,
                interval_text(v),
                f"{v.p_difference:.3g}",
                f"{v.p_equivalence:.3g}",
                "yes" if v.converged else "no",
                _need(v),
            ]
        )
    return table


def _method_note(info: dict[str, Any], found: list[tuple[Verdict, int, str]], family: str) -> str:
    members = [v for v, _, f in found if f == family]
    level = members[0].ci_level if members else 1 - info["alpha"]
    return (
        f"Difference: test accuracy of the relaxation minus the standard model's, mean over the seeds both have, "
        f"paired by seed (same seeds, same data order, the same test items). Interval: paired t, Bonferroni over "
        f"the {len(members)} comparisons of this family, each at level {level:.4g}, so that all hold jointly with "
        f"probability >= {1 - info['alpha']:.0%}. Verdicts: forced if the interval lies below 0, better if above "
        f"0, free if it lies inside ±{info['margin']:g} (the equivalence margin; TOST at the same level) and "
        f"both cells converged, otherwise not yet known, with the minimal detectable difference at 80 % power "
        f"from the observed seed variance and the seeds a decision would need if the observed difference and "
        f"variance are the true ones. p (diff.): two-sided paired t, Bonferroni-adjusted; p (equiv.): TOST, "
        f"adjusted to the interval's level; each is below {info['alpha']:g} exactly when the interval says so."
    )


def _counts(found: list[tuple[Verdict, int, str]], family: str) -> str:
    members = [v.verdict for v, _, f in found if f == family]
    parts = [
        f"{members.count(k)} {k}" for k in ("forced", "better", "free", "inconclusive", "pilot") if members.count(k)
    ]
    return ", ".join(parts) or "none"


def answer_blocks(d: StudyData, figures_dir: Path, pilot_note: list | None = None) -> list:
    """The answer, the differences figure, the secondary family (empty when there is no standard model)."""
    from axiomformer.study.summary import design, verdicts

    info = design(d)
    found = verdicts(d)
    if not found:
        text = "No `standard` model with paired reported runs in this store yet: nothing to compare to."
        if info["pilot_reason"]:
            text += f" Every verdict would be `pilot`: {info['pilot_reason']}."
        return [Heading("The answer"), Paragraph(text), *(pilot_note or [])]
    out: list = [Heading("The answer")]
    seeds = info["reported_seeds"]
    where = f"on {info['primary_task']}" if info["primary_task"] else "(every comparison of this study)"
    lead = (
        f"Question: which assumptions of attention are forced and which are free choices? Primary comparisons "
        f"{where}: {_counts(found, 'primary')}; reported seeds {seeds[0]}..{seeds[-1]} "
        f"({len(seeds)}), learning rates chosen on selection seeds {info['selection_seeds']} (never reported), "
        f"equivalence margin ±{info['margin']:g} accuracy, family-wise alpha {info['alpha']:g}."
    )
    if info["pilot"]:
        lead += f" Every verdict is `pilot`: {info['pilot_reason']}."
    out += [Paragraph(lead), verdict_table(found, "primary")]
    out[-1].note = _method_note(info, found, "primary")
    out.append(Paragraph(" ".join(sentence(v, info["margin"]) for v, _, f in found if f == "primary")))
    from axiomformer.study.figures import draw_differences

    path = draw_differences(found, info["margin"], figures_dir / "differences.png")
    out.append(Image(f"figures/{path.name}", "difference to the standard model with its interval and the margin band"))
    out += pilot_note or []
    if any(f == "secondary" for _, _, f in found):
        table = verdict_table(found, "secondary")
        table.note = _method_note(info, found, "secondary")
        out += [
            Heading("Secondary comparisons (their own family)"),
            Paragraph(f"Other relaxations and tasks, corrected as a separate family: {_counts(found, 'secondary')}."),
            table,
            Paragraph(" ".join(sentence(v, info["margin"]) for v, _, f in found if f == "secondary")),
        ]
    return out


__all__ = ["MEANING", "answer_blocks", "interval_text", "sentence", "verdict_table"]
