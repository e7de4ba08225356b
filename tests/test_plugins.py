"""Choices from other packages (entry-point group ``axiomformer.choices``): the example package in
``tests/plugin_example`` adds ``normalizer=relu2``, which then works in ``axiomformer spec``, ``train --spec`` and
``audit`` with no change to axiomformer; two packages registering one name fail naming both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from importlib import metadata
from pathlib import Path

import pytest

from axiomformer.axes.plugins import GROUP, PluginWarning, load_choices
from axiomformer.axes.registry import Choice, Registry
from axiomformer.spec import REGISTRIES

HERE = Path(__file__).parent
SRC = HERE.parent / "src"
CHOICE = textwrap.dedent("""
    import torch
    from axiomformer.axes.registry import Choice
    RELU3 = Choice("relu3", "u = relu(s)^3 / n_i", "test", lambda s, n: torch.relu(s) ** 3 / n, frozenset({"elementwise"}))
""")


def make_dist(root: Path, dist: str, module: str, body: str, entry: str, target: str) -> None:
    """A package folder and its ``.dist-info``, as ``pip install`` would leave them."""
    (root / module).mkdir(parents=True)
    (root / module / "__init__.py").write_text(body)
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{GROUP}]\n{entry} = {module}:{target}\n")


def _run(args: list[str], *paths: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), *map(str, paths)]))
    return subprocess.run(
        [sys.executable, "-m", "axiomformer", *args], capture_output=True, text=True, env=env, timeout=600
    )


def test_the_example_package_s_choice_is_used_by_train_spec_and_audit():
    plugin = HERE / "plugin_example"
    shown = _run(["spec", "normalizer=relu2"], plugin)
    assert shown.returncode == 0 and "normalizer=relu2" in shown.stdout, shown.stderr
    trained = _run(
        [
            "train",
            "--task",
            "copy",
            "--seq-len",
            "12",
            "--dim",
            "16",
            "--layers",
            "1",
            "--steps",
            "3",
            "--spec",
            "normalizer=relu2",
            "--json",
        ],
        plugin,
    )
    assert trained.returncode == 0, trained.stderr
    result = json.loads(trained.stdout.strip().splitlines()[-1])
    assert "relu2" in json.dumps(result)
    audited = _run(["audit", "spec:normalizer=relu2", "--json"], plugin)
    assert audited.returncode == 0, audited.stderr
    checks = {c["name"]: c["passed"] for c in json.loads(audited.stdout)["checks"]}
    assert checks["weights_sum_to_one"] is False  # relu(s)^2 / n does not normalise: A5 blamed
    # Without the package the name is unknown, and the error names the valid choices.
    missing = _run(["spec", "normalizer=relu2"])
    assert missing.returncode == 2 and "unknown normalizer 'relu2'; choose one of: softmax" in missing.stderr


def test_two_packages_registering_one_name_keep_neither_and_the_library_works():
    """Which of two distributions a spec means by one name is undecidable: neither is kept, one warning names both,
    and everything else works (a spec naming the clashed choice is refused like any unknown choice)."""
    works = _run(["spec", "standard"], HERE / "plugin_example", HERE / "plugin_clash")
    assert works.returncode == 0, works.stderr
    warned = [line for line in works.stderr.splitlines() if "PluginWarning" in line]
    assert len(warned) == 1 and "axiomformer-relu2 and by axiomformer-relu2-clash; neither is kept" in warned[0]
    refused = _run(["spec", "normalizer=relu2"], HERE / "plugin_example", HERE / "plugin_clash")
    assert refused.returncode == 2 and "relu2" in refused.stderr and "Traceback" not in refused.stderr


def test_a_plug_in_named_like_a_built_in_choice_is_skipped_and_the_built_in_kept():
    softmax = Choice("softmax", "u", "s")
    registries = {"normalizer": Registry("normalizer", [softmax])}
    clash = metadata.EntryPoint("normalizer.softmax", "axiomformer_relu2:RELU2", GROUP)
    caught = _skipped(registries, [clash])
    assert len(caught) == 1 and "'softmax' is a built-in normalizer choice of axiomformer, which is kept" in str(
        caught[0].message
    )
    assert registries["normalizer"]["softmax"] is softmax


def test_a_choice_whose_attribute_raises_when_read_is_skipped(tmp_path, monkeypatch):
    body = CHOICE + textwrap.dedent("""
        class Odd(type(RELU3)):
            def __getattribute__(self, key):
                if key == "formula":
                    raise RuntimeError("boom from formula")
                return super().__getattribute__(key)
        ODD = Odd("relu3", "u", "s", RELU3.impl, RELU3.traits)
    """)
    make_dist(tmp_path, "pkg_odd", "pkg_odd_choices", body, "normalizer.relu3", "ODD")
    monkeypatch.syspath_prepend(str(tmp_path))
    entries = [e for d in metadata.distributions(path=[str(tmp_path)]) for e in d.entry_points]
    registries = {"normalizer": Registry("normalizer", [Choice("softmax", "u", "s")], {"elementwise": "x"})}
    caught = _skipped(registries, entries)
    assert len(caught) == 1 and "boom from formula" in str(caught[0].message)


def _skipped(registries: dict, entries: list) -> list:
    """The warnings of loading ``entries``, none of which may register."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert load_choices(registries, entries) == []
    return caught


def _relu3(body: str, why: str) -> tuple[str, str, str, str]:
    """A broken case of the entry point ``normalizer.relu3`` -> ``RELU3``."""
    return body, "normalizer.relu3", "RELU3", why


BROKEN = {  # module body, entry-point name, target, what the warning says
    "import_error": ("import this_module_does_not_exist_xyz\n", "normalizer.broken", "RELU3", "ModuleNotFoundError"),
    "missing_attribute": (CHOICE, "normalizer.relu3", "NOT_THERE", "AttributeError"),
    "wrong_type": ("RELU3 = 3\n", "normalizer.relu3", "RELU3", "gives int, not an axiomformer"),
    "misnamed": (CHOICE, "normalizer.other", "RELU3", "Choice is named 'relu3'"),
    "factory_raises": ("def RELU3():\n    raise RuntimeError('boom')\n", "normalizer.relu3", "RELU3", "boom"),
    "exits_at_import": ("import sys\nsys.exit(3)\n", "normalizer.relu3", "RELU3", "SystemExit"),
    "syntax_error": ("def (:\n", "normalizer.relu3", "RELU3", "SyntaxError"),
    "undeclared_trait": (CHOICE.replace('"elementwise"', '"no_such_trait"'), "normalizer.relu3", "RELU3", "trait"),
    "malformed_name": (CHOICE, "relu3", "RELU3", "expected a name '<axis>.<choice>'"),
    "unknown_axis": (CHOICE, "positions.relu3", "RELU3", "an axis of: normalizer"),
    # A Choice whose fields have the wrong types registers fine and would fail only at a forward or in a table.
    "impl_not_callable": _relu3(CHOICE.replace("lambda s, n: torch.relu(s) ** 3 / n", '"relu"'), "impl of type str"),
    "traits_a_string": _relu3(CHOICE.replace('frozenset({"elementwise"})', '"elementwise"'), "traits of type str"),
    "traits_not_names": _relu3(
        CHOICE.replace('frozenset({"elementwise"})', "frozenset({3})"), "traits that are not all strings"
    ),
    "formula_not_text": _relu3(CHOICE.replace('"u = relu(s)^3 / n_i"', "None"), "formula of type NoneType"),
    "extra_not_a_dict": _relu3(
        CHOICE.replace('frozenset({"elementwise"}))', 'frozenset({"elementwise"}), extra=[1])'), "extra of type list"
    ),
    "promised_extra_missing": _relu3(
        CHOICE.replace('frozenset({"elementwise"})', 'frozenset({"elementwise", "parametric"})'),
        "parametric: parameters, parametric: params",
    ),
    "name_not_an_identifier": (
        CHOICE.replace('Choice("relu3"', 'Choice("re-lu"'),
        "normalizer.re-lu",
        "RELU3",
        "not an identifier",
    ),
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_a_broken_plug_in_is_skipped_with_one_warning_naming_it_and_its_distribution(kind, tmp_path, monkeypatch):
    body, name, target, why = BROKEN[kind]
    make_dist(tmp_path, f"pkg_{kind}", f"pkg_{kind}_choices", body, name, target)
    monkeypatch.syspath_prepend(str(tmp_path))
    entries = [e for d in metadata.distributions(path=[str(tmp_path)]) for e in d.entry_points]
    traits = {"elementwise": "x", "parametric": "y"}
    registries = {"normalizer": Registry("normalizer", [Choice("softmax", "u", "s")], traits)}
    caught = _skipped(registries, entries)
    assert len(caught) == 1 and caught[0].category is PluginWarning
    message = str(caught[0].message)
    assert f"{name!r}" in message and f"pkg_{kind}" in message and why in message, message
    assert registries["normalizer"].names() == ("softmax",)


def test_the_cli_and_the_library_work_beside_a_broken_plug_in_with_one_warning(tmp_path):
    make_dist(tmp_path, "pkg_broken", "pkg_broken_choices", "import nope_xyz\n", "normalizer.broken", "B")
    shown = _run(["spec", "normalizer=relu2"], tmp_path, HERE / "plugin_example")
    assert shown.returncode == 0 and "normalizer=relu2" in shown.stdout, shown.stderr
    warned = [line for line in shown.stderr.splitlines() if "PluginWarning" in line]
    assert len(warned) == 1 and "'normalizer.broken'" in warned[0] and "pkg_broken" in warned[0], shown.stderr


def test_one_distribution_found_twice_on_the_path_is_one_plug_in(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE / "plugin_example"))
    entries = [e for d in metadata.distributions(path=[str(HERE / "plugin_example")]) for e in d.entry_points]
    registries = {"normalizer": Registry("normalizer", [Choice("softmax", "u", "s")], {"elementwise": "x"})}
    assert load_choices(registries, entries * 2) == ["normalizer.relu2"]
    assert registries["normalizer"].origin("relu2") == "axiomformer-relu2"


def test_a_registry_that_raises_anything_at_registration_skips_the_plug_in(tmp_path, monkeypatch):
    """Not only ValueError: whatever ``register`` raises (a TypeError of a registry subclass here) is the plug-in's
    skip, with the warning naming the error."""

    class Picky(Registry):
        def register(self, choice, *, origin="axiomformer"):
            raise TypeError("picky registry")

    make_dist(tmp_path, "pkg_picky", "pkg_picky_choices", CHOICE, "normalizer.relu3", "RELU3")
    monkeypatch.syspath_prepend(str(tmp_path))
    entries = [e for d in metadata.distributions(path=[str(tmp_path)]) for e in d.entry_points]
    registries = {"normalizer": Picky("normalizer", [Choice("softmax", "u", "s")], {"elementwise": "x"})}
    caught = _skipped(registries, entries)
    assert len(caught) == 1 and "TypeError: picky registry" in str(caught[0].message)


def test_every_built_in_choice_has_the_extras_its_traits_promise():
    """The table the plug-in check reads (``TRAIT_EXTRAS``) against the built-in choices, which the code runs: a key
    the table names that a working choice lacks would mean the table is wrong."""
    from axiomformer.axes.plugins import TRAIT_EXTRAS, missing_extras

    assert {axis for axis, _ in TRAIT_EXTRAS} - {None} <= set(REGISTRIES)
    assert {
        (axis, choice.name): missing_extras(axis, choice)
        for axis, registry in REGISTRIES.items()
        for choice in registry
        if missing_extras(axis, choice)
    } == {}
