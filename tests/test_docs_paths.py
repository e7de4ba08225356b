"""The newcomer's guides name only files that exist: every path in backticks in ``CONTRIBUTING.md`` and
``docs/ARCHITECTURE.md`` is a file or folder of the repository (relative to its root, to ``src/`` or to
``src/axiomformer/``; a ``<name>`` placeholder or a ``*`` needs its folder to exist)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUIDES = ("CONTRIBUTING.md", "docs/ARCHITECTURE.md")
BASES = (ROOT, ROOT / "src", ROOT / "src" / "axiomformer")
PATH = re.compile(r"^[\w.<>*/-]+(\.(py|md|toml|yml|yaml|json|sh|txt|sqlite)|/)$")
"""A code span that names a file (by its extension) or a folder (a trailing slash), with no spaces."""


def named_paths(text: str) -> list[str]:
    """The paths named in code spans of ``text`` (``engines/problem.py: window_mask`` names ``engines/problem.py``)."""
    spans = {span.split(":")[0].strip() for span in re.findall(r"`([^`\n]+)`", text)}
    return sorted(span for span in spans if PATH.match(span))


def exists(path: str) -> bool:
    """Whether ``path`` names something in the repository (see the module docstring)."""
    if path.startswith(("/", "..")):
        return False  # outside the repository: a clone would not have it
    pattern = re.sub(r"<[^>]+>", "*", path.rstrip("/"))
    for base in BASES:
        if "*" in pattern:
            parent = base / pattern.rsplit("/", 1)[0] if "/" in pattern else base
            if "*" not in str(parent.relative_to(base)) and parent.is_dir():
                return True
        elif (base / pattern).exists():
            return True
    return False


@pytest.mark.parametrize("guide", GUIDES)
def test_every_path_a_guide_names_exists(guide):
    paths = named_paths((ROOT / guide).read_text(encoding="utf-8"))
    assert len(paths) >= 10, paths  # the guides name files; a parser that finds none would check nothing
    assert [p for p in paths if not exists(p)] == []


def test_the_path_check_catches_a_missing_file_and_reads_placeholders():
    text = "see `engines/router.py`, `src/axiomformer/tasks/<name>.py`, `engines/gone.py` and `python -m x y.py`"
    assert named_paths(text) == ["engines/gone.py", "engines/router.py", "src/axiomformer/tasks/<name>.py"]
    assert [p for p in named_paths(text) if not exists(p)] == ["engines/gone.py"]
    assert not exists("src/axiomformer/no_such_folder/<name>.py")
    assert not exists("../shared/docs/DESIGN.md")


def test_architecture_opens_with_the_picture_and_the_six_files_to_read_first():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    opening = text.split("\n## ", 3)
    assert opening[1].startswith("The house on one screen")
    picture = opening[1]
    for layer in ("axes/", "Plan", "attend", "router", "engines/", "models/", "train.py", "study/"):
        assert layer in picture, layer
    first = re.findall(r"^\d\. `([^`]+)`", picture, re.M)
    assert len(first) == 6 and all(exists(p) for p in first), first
