"""The README is an introduction a newcomer can trust: short, its example runs, its links lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_stays_an_introduction():
    assert len(README) <= 16_000 and len(README.splitlines()) <= 300


def test_readme_python_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("attention (score=cosine, normalizer=sigmoid)") and "relaxes A4, A5" in printed[0]
    assert printed[1] == "{'A0': True, 'A1': True, 'A2': True, 'A3': True, 'A4': False, 'A5': False}"


def test_readme_links_to_files_that_exist():
    targets = re.findall(r"\]\(((?!https?:)[^)#]+)", README)
    assert targets and [t for t in targets if not (ROOT / t).exists()] == []


def test_readme_test_and_study_commands_are_the_documented_ones():
    assert "```bash\naxiomformer study\n```" in README and "```bash\npython -m pytest -q\n```" in README
    assert "torch==" not in README  # no pin claimed to choose the CPU or CUDA build
