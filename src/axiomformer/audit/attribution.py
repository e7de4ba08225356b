"""Attribution: which assumptions' violation produces each failed check's departure at the audited interface.

Source: Somani, "A Minimal Route to Transformer Attention" (``docs/SOURCES.md``): each assumption is a property of a
function class. At the interface (q, k, v) -> out some violations produce the same departure, e.g. weights that do
not sum to one come from a normalizer that does not normalize (A5) or from a query-side scalar rho times normalized
weights (A1). :func:`attribute` lists every such assumption in ``AuditCheck.candidates`` and says why in the detail,
instead of picking one. Candidates are *single* violations: two violations at once can mimic almost any departure
and are never listed **(our choice: parsimony)**. See ``docs/audit.md``.
"""

from __future__ import annotations

from axiomformer.audit.probe import AuditCheck

ASSUMPTION_TAGS = ("A0", "A1", "A2", "A3", "A4", "A5", "causal")
"""Tags whose checks can carry candidates; ``design`` and ``numerics`` checks test no assumption."""

SAME_MAP = {
    ("A5", "A1"): "a normalizer whose rows do not sum to one (A5) and a query-side scalar rho times normalized "
    "weights (A1) are the same map at this interface",
    ("A5", "A4"): "a temperature that departs from 1/sqrt(d) or depends on the number of visible keys (the A5 scale) "
    "and a score scaled the same way (A4) are the same map at this interface",
    ("A4", "A5"): "the scores are bilinear only up to a factor per row (doubling q rescales each row's scores by one "
    "factor, or the factor follows the number of visible keys): a row-dependent temperature (the A5 "
    "scale) and a score that is not one bilinear form (A4) are the same map at this interface",
    ("A1", "A2"): "the per-coordinate weights factor through the query (J_ij = c_ij R_i): an output gate, i.e. a "
    "query-dependent linear rho (A1), and per-coordinate relevances of that form (A2) are the same map "
    "at this interface",
    ("A1", "A3"): "the local Jacobian factors through both the query and the key: a nonlinear rho (A1) and a "
    "nonlinear value map (A3) are not told apart",
    ("A2", "A3"): "the per-coordinate weights factor through the key (J_ij = c_ij H_j): per-coordinate relevances "
    "(A2) and a value map that reads more than the value (A3) are the same map at this interface",
    ("A4", "A1"): "a head's output reads the other heads' queries and keys: logits mixed across heads (A4, talking "
    "heads) and a rho that mixes the heads' outputs or reads the whole query (A1: an MLP, an output "
    "gate) are the same departure at this interface",
    ("A1", "A4"): "the local Jacobian factors through the key but the output is not additive over tokens: a "
    "nonlinear rho (A1) and a relevance that reads the values (A4) are not told apart",
}
"""Why two candidates cannot be told apart, by (first, second) candidate."""
ONE_FORM = (
    "the recovered scores of each query are a function of one bilinear form q_i.k_j: a score g(q.k) other than "
    "q.k (A4) and a normalizer f(s) / sum f(s) other than the softmax (A5, e.g. a power of s) are the same map at "
    "this interface"
)
QUERY_COUPLING = (
    "a query's output reads the other queries: scores that read them (A4) and a normalizer that normalizes over "
    "the queries too (A5, e.g. Sinkhorn's column sums) are the same departure at this interface"
)
KEY_ORDER = (
    "changing one key reorders the other keys' weights: a score that reads other keys (A4: iterated retrieval) "
    "and a normalizer that does not keep the order of the scores (A5; every nonnegative normalizer of the derivation and "
    "its relaxations keeps it) are the same departure at this interface"
)
RATIO_SCORE = (
    "bilinear_fit or the key order failed, so the score of a pair may read other keys (A4), which changes the ratios of the "
    "other weights as a normalizer other than the softmax does (A5)"
)
CONTEXT_GATE = (
    "the per-coordinate weights factor through both the query and the key of each input, but change with "
    "the context (a gate computed from all the tokens): a rho (A1), relevances (A2) or a value map (A3) "
    "that reads the context are the same map at this interface"
)

CONTRIBUTION_CAVEAT = (
    "the contribution map is not visible (homogeneity n/a): a contribution g(u) v with g not "
    "linear after a normalizer r is the same map as u v after the normalizer g(r) (A2)"
)
WEIGHT_SHAPE = ("nonnegative_weights", "weights_sum_to_one")
"""A5 checks that a non-proportional contribution g(u) v can fail while the others pass; rows that still sum to one
for every distribution force g to be linear, so the other A5 checks implicate A2 only when the sums fail too."""
OTHER_WEIGHTS = ("ratio_independence", "scale_entropy", "length_scale")

ORDER_CAVEAT = (
    "set_symmetry failed: the map is not of the form rho(sum_j phi(x_j, u_ij)), so this departure, which "
    "alone would break {first}, may come from the order dependence (A0)"
)


def _shape(st: dict[str, float] | None, tol: float) -> str | None:
    """'query', 'key', 'both' or 'neither': through what the Jacobian factors (None when it was not measured)."""
    if not st:
        return None
    by_query, by_key = st["per_query"] <= tol, st["per_key"] <= tol
    return {(True, True): "both", (True, False): "query", (False, True): "key", (False, False): "neither"}[
        (by_query, by_key)
    ]


def _structure(facts: dict[str, object], name: str) -> dict[str, float] | None:
    """The Jacobian structure ``facts[name]`` (``audit/structure.py``), or None when it was not measured."""
    value = facts.get(name)
    return value if isinstance(value, dict) else None


def _number(facts: dict[str, object], name: str) -> float:
    """The tolerance ``facts[name]`` (0 when absent).

    Raises:
        TypeError: it is not a number.
    """
    value = facts.get(name, 0.0)
    if not isinstance(value, (int, float)):
        raise TypeError(f"audit fact {name!r} must be a number, got {type(value).__name__}")
    return float(value)


def _nonlinear(shape: str | None, additive: bool) -> list[str]:
    """Candidates for a map that is not affine in the values, from the shape of its local Jacobian."""
    if shape is None:
        return ["A3"] if additive else ["A1"]
    if additive:
        return {"key": ["A3"], "neither": ["A2"], "query": ["A1"], "both": ["A1", "A3"]}[shape]
    return {"query": ["A1"], "neither": ["A4"], "key": ["A1", "A4"], "both": ["A1", "A3"]}[shape]


def _one_form(out: dict[str, AuditCheck]) -> bool:
    """The recovered scores depend on the keys through one bilinear form per query (``bilinear_scores``' fact), and
    order plays no part (set_symmetry passed: a position term would also be such a function)."""
    scores, order = out.get("bilinear_scores"), out.get("set_symmetry")
    return bool(scores is not None and scores.facts.get("one_form") and (order is None or order.passed is not False))


def _candidates(c: AuditCheck, out: dict[str, AuditCheck], facts: dict[str, object]) -> list[str]:
    def failed(name: str) -> bool:
        return name in out and out[name].passed is False

    additive = not failed("token_additivity")
    nonlinear = _shape(_structure(facts, "nonlinear"), _number(facts, "fd_tol"))
    linear = _shape(_structure(facts, "linear"), _number(facts, "tol"))
    row_scale = bool("bilinear_scores" in out and out["bilinear_scores"].facts.get("row_scale"))
    reorders = bool("bilinear_scores" in out and out["bilinear_scores"].facts.get("key_order"))
    one_form = _one_form(out)
    rules: dict[str, list[str]] = {
        "token_additivity": _nonlinear(nonlinear, False) if nonlinear else ["A1"],
        "linearity": _nonlinear(nonlinear, additive),
        "scalar_relevance": {"query": ["A1", "A2"], "key": ["A2", "A3"], "both": ["A1", "A2", "A3"]}.get(
            linear or "", ["A2"]
        ),
        "bilinear_scores": ["A4", "A5"] if row_scale or one_form or reorders else ["A4"],
        "bilinear_fit": ["A4", "A5"] if row_scale or one_form or failed("length_scale") else ["A4"],
        "parallel": ["A4", "A5"],
        "weights_sum_to_one": ["A5", "A1"],
        "ratio_independence": ["A5", "A4"] if failed("bilinear_fit") or reorders else ["A5"],
        "scale_entropy": ["A5", "A4"],
        "length_scale": ["A5", "A4"],
        "head_independence": ["A4", "A1"],
        "single_score": ["A4", "A5"],
    }
    found = list(rules.get(c.name, [c.assumption]))
    hidden_phi = c.name in WEIGHT_SHAPE or (c.name in OTHER_WEIGHTS and failed("weights_sum_to_one"))
    if hidden_phi and "homogeneity" in out and out["homogeneity"].passed is None:
        found.append("A2")
    if failed("set_symmetry") and c.name != "set_symmetry" and "A0" not in found:
        found.append("A0")
    return found


def attribute(checks: list[AuditCheck], facts: dict[str, object] | None = None) -> list[AuditCheck]:
    """Fill ``candidates`` of every failed assumption check, in place, and append why they cannot be told apart to
    its ``detail`` (and ``why``).

    ``facts``: ``"linear"`` / ``"nonlinear"``, the Jacobian structures of :mod:`axiomformer.audit.structure`
    (at v = 0 for a map affine in the values, at random values otherwise), with their tolerances ``"tol"`` and
    ``"fd_tol"``.
    """
    facts = facts or {}
    out = {c.name: c for c in checks}
    for c in checks:
        c.candidates, c.why = [], ""
        if c.passed is not False or c.assumption not in ASSUMPTION_TAGS:
            continue
        c.candidates = _candidates(c, out, facts)
        first = c.candidates[0]
        reasons = [SAME_MAP[(first, other)] for other in c.candidates[1:] if (first, other) in SAME_MAP]
        if c.name == "scalar_relevance" and c.candidates[:3] == ["A1", "A2", "A3"]:
            reasons = [CONTEXT_GATE]
        if c.name == "ratio_independence" and "A4" in c.candidates:
            reasons = [RATIO_SCORE]
        if c.name in ("bilinear_scores", "bilinear_fit") and _one_form(out) and "A5" in c.candidates:
            reasons = [ONE_FORM]
        if c.facts.get("key_order"):
            reasons = [KEY_ORDER]
        if c.name == "parallel":
            reasons = [QUERY_COUPLING] + reasons[1:]
        if "A2" in c.candidates[1:] and c.assumption == "A5":
            reasons.append(CONTRIBUTION_CAVEAT)
        if "A0" in c.candidates[1:]:
            reasons.append(ORDER_CAVEAT.format(first=first))
        if len(c.candidates) > 1:
            c.why = "; ".join(reasons) or "these assumptions produce the same departure at this interface"
            c.detail += f". Cannot be told apart from outside: {c.why}"
    return checks
