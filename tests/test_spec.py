"""AttentionSpec: choices, relax strings, aliases, assumptions and errors."""

import pytest

from axiomformer import AXES, AttentionSpec
from axiomformer.spec import REGISTRIES, required_fields


def test_standard_spec_holds_every_assumption():
    spec = AttentionSpec.standard(32, 4, causal=True)
    assert spec.assumptions() == {"A0": True, "A1": True, "A2": True, "A3": True, "A4": True, "A5": True}
    assert spec.is_standard and spec.variant == "standard" and spec.head_dim == 8 and spec.causal


def test_every_axis_starts_with_its_standard_choice_and_keeps_the_published_ones():
    # The registries may grow (tests/test_registries.py checks each choice); none of these may disappear.
    published = {
        "aggregator": ("identity", "mlp"),
        "contribution": ("proportional", "joint"),
        "value": ("linear", "identity", "mlp"),
        "score": ("dot", "bilinear", "additive", "cosine", "neg_l2", "mlp"),
        "normalizer": ("softmax", "sigmoid", "relu", "sparsemax", "entmax15", "gumbel_softmax", "linear"),
        "scale": ("inv_sqrt_d", "none", "learned"),
        "position": ("none", "sinusoidal", "learned", "rope", "alibi"),
    }
    for axis, choices in published.items():
        assert AXES[axis][0] == choices[0] and set(choices) <= set(AXES[axis]), axis


def test_relax_accepts_field_names_and_assumption_aliases():
    base = AttentionSpec.standard(32, 4)
    a = base.relax("A4=cosine,A5=sigmoid")
    b = base.relax("score=cosine,normalizer=sigmoid")
    assert a == b and a.score == "cosine" and a.normalizer == "sigmoid"
    assert base.relax("A1=mlp").aggregator == "mlp"
    assert base.relax("A2=joint").contribution == "joint"
    assert base.relax("A3=identity").value == "identity"
    assert base.relax("standard") == base and base.relax("") == base
    assert base.score == "dot"  # frozen: relax returns a new spec


def test_relax_parses_typed_fields():
    spec = AttentionSpec.standard(32, 4).relax("causal=true,num_heads=2,dropout=0.25")
    assert spec.causal is True and spec.num_heads == 2 and spec.dropout == 0.25


@pytest.mark.parametrize(
    "axis, expected",
    [
        ("aggregator", "A1"),
        ("contribution", "A2"),
        ("value", "A3"),
        ("score", "A4"),
        ("normalizer", "A5"),
        ("scale", "A5"),
    ],
)
def test_each_relaxation_breaks_only_its_own_assumption(axis, expected):
    for choice in AXES[axis][1:]:
        held = AttentionSpec.standard(32, 4).relax({axis: choice, **required_fields(axis, choice)}).assumptions()
        ordered = ["A0"] if REGISTRIES[axis].has(choice, "ordered") else []  # stick-breaking reads key order
        values = ["A3"] if REGISTRIES[axis].has(choice, "log_values") else []  # laser: exp(v) before the sum
        assert [a for a, ok in held.items() if not ok] == ordered + [expected] + values, (axis, choice)


def test_every_position_choice_relaxes_a0_and_only_a0():
    """A0 (order) is relaxed exactly where the audit's set_symmetry check fails: by any position information."""
    for choice in AXES["position"][1:]:
        spec = AttentionSpec.standard(32, 4).relax({"position": choice, **required_fields("position", choice)})
        assert [a for a, ok in spec.assumptions().items() if not ok] == ["A0"], choice
        assert "relaxes A0" in spec.describe()


def test_unknown_value_names_the_valid_choices():
    with pytest.raises(ValueError, match="unknown normalizer 'sofmax'; choose one of: softmax, sigmoid"):
        AttentionSpec.standard(32, 4).relax("normalizer=sofmax")


def test_unknown_field_names_the_valid_fields():
    with pytest.raises(ValueError, match="unknown field 'scor'.*score"):
        AttentionSpec.standard(32, 4).relax("scor=dot")


def test_malformed_relax_item_and_bad_sizes_raise():
    with pytest.raises(ValueError, match="key=value"):
        AttentionSpec.standard(32, 4).relax("cosine")
    with pytest.raises(ValueError, match="not divisible"):
        AttentionSpec(dim=30, num_heads=4)
    with pytest.raises(ValueError, match="even head_dim"):
        AttentionSpec(dim=12, num_heads=4, position="rope")
    with pytest.raises(ValueError, match="score='dot'"):
        AttentionSpec(normalizer="linear", score="cosine")


def test_describe_is_one_line_naming_the_relaxed_assumptions():
    line = AttentionSpec.standard(32, 4).relax("A4=cosine").describe()
    assert "\n" not in line and "score=cosine" in line and "A4" in line
    assert "standard" in AttentionSpec.standard(32, 4).describe()
    # a normalizer's own option is part of what is relaxed
    assert "(normalizer=topk, topk=3)" in AttentionSpec.standard(32, 4).relax("normalizer=topk,topk=3").describe()


def test_dict_round_trip_and_unknown_keys():
    spec = AttentionSpec.standard(32, 4).relax("position=rope")
    assert AttentionSpec.from_dict(spec.to_dict()) == spec
    with pytest.raises(ValueError, match="unknown field"):
        AttentionSpec.from_dict({**spec.to_dict(), "colour": "red"})


def test_spec_a0_agrees_with_the_audit_for_every_position_choice():
    """`axiomformer spec` and `axiomformer audit` tell the same story about order: A0 holds iff set symmetry passes."""
    from axiomformer.audit import run_audit

    cases = [("position", c) for c in AXES["position"]] + [("normalizer", "stick_breaking")]
    for axis, choice in cases:
        report = run_audit(f"spec:{axis}={choice}")
        a0_checks = [c.passed for c in report.checks if c.assumption == "A0"]
        held = AttentionSpec.standard(32, 4).relax({axis: choice, **required_fields(axis, choice)}).assumptions()["A0"]
        assert a0_checks and all(passed is held for passed in a0_checks), (choice, a0_checks, held)
