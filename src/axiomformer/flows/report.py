"""``flow_results.md``: the Markdown report of one ``axiomformer flow`` result (accuracy per arm, the Holm-corrected
paired comparisons with their verdicts, the learning rates, the test-time flow).

Verdicts follow one symmetric rule (``flows.comparisons``): "no difference" where the Bonferroni interval of the
paired difference lies inside (-margin, margin), "higher" / "lower" where it lies above / below 0, otherwise
"inconclusive" with the minimal detectable difference. The A/A control is its own family.
"""

from __future__ import annotations


def _cell(mean: float, low: float | None, high: float | None) -> str:
    return f"{mean:.3f}" if low is None else f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def _diff(mean: float, low: float | None, high: float | None) -> str:
    return f"{mean:+.3f}" if low is None else f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]"


def _accuracy_tables(result: dict) -> list[str]:
    ks, noise = result["K"], result["noise"]
    cell = {(r["theta"], r["arm"], r["noise"], r["K"]): r for r in result["arms"]}
    lines = []
    for theta in dict.fromkeys(r["theta"] for r in result["arms"]):
        lines += [
            (
                f"**Test accuracy, theta {theta}** (mean [95% t-interval] over seeds; flow_params = parameters "
                "of the flow step at K >= 1)"
            ),
            "",
            "| arm | flow_params | noise | " + " | ".join(f"K={k}" for k in ks) + " |",
            "|---|---|---|" + "---|" * len(ks),
        ]
        for arm in dict.fromkeys(r["arm"] for r in result["arms"] if r["theta"] == theta):
            params = max(r["flow_params"] for r in result["arms"] if (r["theta"], r["arm"]) == (theta, arm))
            for sigma in noise:
                rows = [cell.get((theta, arm, sigma, k)) for k in ks]
                lines.append(
                    f"| {arm} | {params} | {sigma:g} | "
                    + " | ".join(
                        "not run" if r is None else _cell(r["acc_mean"], r["ci_low"], r["ci_high"]) for r in rows
                    )
                    + " |"
                )
        lines.append("")
    return lines


def _comparison_table(result: dict) -> list[str]:
    comps, eq = result["comparisons"], result["equivalence"]
    if not comps:
        return ["No paired comparison: the run lacks the arms of every pair.", ""]
    verdicts = [e["verdict"] for e in eq["rows"]]
    effects = sum(v.startswith(("higher", "lower")) for v in verdicts)
    same = sum(v.startswith("no difference") for v in verdicts)
    sizes = ", ".join(f"{f}: {m}" for f, m in eq.get("families", {}).items())
    lines = [
        (
            f"**Paired comparisons** (arm a minus arm b, same seeds; {len(comps)} comparisons in families of "
            f"{sizes}). diff [95% t-interval, unadjusted]; adj: the paired t-interval at the Bonferroni level "
            f"1 - {eq['alpha']:g}/m of its family; p: paired t-test; p_holm: Holm-adjusted within the family; p_eq: "
            f"Holm-adjusted equivalence test (TOST) at +-{eq['margin']:g}. Verdict: {eq.get('rule', '')}; an "
            f"inconclusive verdict gives the difference a paired t-test of these seeds detects with power "
            f"{eq['power']:g} at level {eq['alpha']:g}/m."
        ),
        "",
        f"Summary: {effects} effects, {same} no difference, {len(comps) - effects - same} inconclusive.",
        "",
        "| a - b | theta | K | noise | diff [95% CI] | adj | p | p_holm | p_eq | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c, e in zip(comps, eq["rows"]):
        adj = "" if e.get("ci_low_adj") is None else f"[{e['ci_low_adj']:+.3f}, {e['ci_high_adj']:+.3f}]"
        lines.append(
            f"| {c['a']} - {c['b']} | {c['theta']} | {c['K']} | {c['noise']:g} | "
            f"{_diff(c['diff'], c['ci_low'], c['ci_high'])} | {adj} | {c['p']:.2g} | {c['p_holm']:.2g} | "
            f"{e['p_tost_holm']:.2g} | {e['verdict']} |"
        )
    questions = dict.fromkeys((e["a"], e["b"], e["question"]) for e in eq["rows"])
    lines += ["", "What each pair asks:", ""] + [f"- {a} - {b}: {q}" for a, b, q in questions] + [""]
    return lines


def markdown(result: dict) -> str:
    """The whole report as Markdown text (one string ending in a newline)."""
    ks, noise = result["K"], result["noise"]
    lines = [
        (
            f"Data: {result['data']} ({result['n_train']} train / {result['n_test']} test), model "
            f"{result['model']}, patch {result['patch']}, readout {result['readout']}; seeds {result['seeds']}; "
            f"{result['interval']}."
        )
    ]
    if result.get("quick"):
        lines.append("**Quick run: a pilot, it claims nothing.**")
    if result.get("partial"):
        missing = result.get("missing", [])
        lines.append(
            f'**Partial: {len(missing)} cells of the protocol are not finished** ("not run" below; listed under '
            "`missing` in the store); the comparisons cover the finished cells only."
        )
    lines += ["", *_accuracy_tables(result), *_comparison_table(result)]
    lines += [
        (
            f"**Learning rates** (best mean validation accuracy per theta, arm and K; selection seeds "
            f"{result.get('lr_selection_seeds', [])}, never reported)"
        ),
        "",
        "| theta:arm:K | lr |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v:g} |" for k, v in result["lr"].items()]
    lines += [
        "",
        "**Test-time flow (theta fixed, test features flowed without labels)**",
        "",
        "| method | noise | " + " | ".join(f"K={k}" for k in ks) + " |",
        "|---|---|" + "---|" * len(ks),
    ]
    tt = {(r["method"], r["noise"], r["K"]): r for r in result["test_time_flow"]}
    for method in dict.fromkeys(r["method"] for r in result["test_time_flow"]):
        for sigma in noise:
            lines.append(
                f"| {method} | {sigma:g} | "
                + " | ".join(
                    _cell(
                        tt[(method, sigma, k)]["acc_mean"],
                        tt[(method, sigma, k)]["ci_low"],
                        tt[(method, sigma, k)]["ci_high"],
                    )
                    for k in ks
                )
                + " |"
            )
    return "\n".join(lines) + "\n"


__all__ = ["markdown"]
