"""The design-space table is generated from the registries (the docs page builds it); replace_table keeps a copy current."""

from pathlib import Path

import pytest

from axiomformer.axes.registry import Choice
from axiomformer.axes.scale import SCALES
from axiomformer.design_space import BEGIN, END, design_space_table, replace_table
from axiomformer.spec import REGISTRIES

README = Path(__file__).parent.parent / "README.md"


def test_the_readme_points_to_the_generated_table_instead_of_keeping_a_copy():
    text = README.read_text(encoding="utf-8")
    assert BEGIN not in text and "docs/design_space.md" in text
    copy = f"intro\n{BEGIN}\nstale\n{END}\n"
    assert replace_table(copy) != copy and replace_table(replace_table(copy)) == replace_table(copy)


def test_every_choice_has_a_row_with_how_it_relaxes_and_its_source():
    table = design_space_table()
    assert "| field | choice | formula | assumption relaxed, how | source |" in table
    for axis, registry in REGISTRIES.items():
        for i, choice in enumerate(registry):
            row = next(line for line in table.splitlines() if line.startswith(f"| `{axis}` | `{choice.name}` |"))
            assert choice.source.split(",")[0].replace("|", "\\|") in row
            assert i == 0 or choice.relaxes, f"{axis}={choice.name} says nothing of what it relaxes"
    assert "| `softcap` | (a number) |" in table and "| `diff_authors` | (true/false) |" in table
    for economy in ("num_kv_heads", "window", "kv_latent", "kv_rope_dim"):  # MLA's among them, with its source
        assert f"| `{economy}` | (an int, 0 = off) |" in table
    assert "DeepSeek-V2" in next(line for line in table.splitlines() if line.startswith("| `kv_latent` |"))


def test_a_new_choice_makes_a_generated_copy_stale_and_missing_markers_are_refused():
    text = replace_table(f"intro\n{BEGIN}\n{END}\n")
    assert replace_table(text) == text
    SCALES.register(
        Choice("planted", "scale = 3", "a planted choice", lambda module, n: 3.0, relaxes="A5's temperature: planted"),
        origin="planted-package",
    )
    try:
        assert replace_table(text) != text
        assert (
            "| `scale` | `planted` | scale = 3 | A5's temperature: planted | a planted choice (package "
            "planted-package) |" in design_space_table()
        )
    finally:
        SCALES.unregister("planted")
    with pytest.raises(ValueError, match="markers"):
        replace_table("no table here")
    assert BEGIN in text and END in text
