"""Choices from other packages (entry-point group ``axiomformer.choices``): the example package in
``tests/plugin_example`` adds ``normalizer=relu2``, which then works in ``axiomformer spec``, ``train --spec`` and
``audit`` with no change to axiomformer; two packages registering one name fail naming both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from axiomformer.axes.plugins import GROUP, load_choices
from axiomformer.axes.registry import Choice, Registry

HERE = Path(__file__).parent
SRC = HERE.parent / "src"


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


def test_two_packages_registering_one_name_fail_naming_both():
    failed = _run(["spec", "normalizer=relu2"], HERE / "plugin_example", HERE / "plugin_clash")
    assert failed.returncode == 2
    assert failed.stderr == (  # one line, as every bad input on the command line
        "error: normalizer choice 'relu2' is registered twice: by axiomformer-relu2 and by axiomformer-relu2-clash\n"
    )


def test_load_choices_refuses_a_clash_with_a_built_in_choice_and_a_malformed_entry_point():
    registries = {"normalizer": Registry("normalizer", [Choice("softmax", "u", "s")])}
    clash = metadata.EntryPoint("normalizer.softmax", "axiomformer_relu2:RELU2", GROUP)
    with pytest.raises(ValueError, match="registered twice: by axiomformer and by axiomformer_relu2"):
        load_choices(registries, [clash])
    with pytest.raises(ValueError, match="expected '<axis>.<choice>' with an axis of: normalizer"):
        load_choices(registries, [metadata.EntryPoint("positions.x", "axiomformer_relu2:RELU2", GROUP)])


def test_load_choices_refuses_an_object_that_is_not_a_choice_or_is_misnamed(monkeypatch):
    monkeypatch.syspath_prepend(str(HERE / "plugin_example"))
    registries = {"normalizer": Registry("normalizer", [Choice("softmax", "u", "s")], {"elementwise": "x"})}
    with pytest.raises(ValueError, match="names the normalizer choice 'other', but its Choice is named 'relu2'"):
        load_choices(registries, [metadata.EntryPoint("normalizer.other", "axiomformer_relu2:RELU2", GROUP)])
    with pytest.raises(ValueError, match="gives module, not an axiomformer.axes.registry.Choice"):
        load_choices(registries, [metadata.EntryPoint("normalizer.x", "axiomformer_relu2", GROUP)])
    assert load_choices(registries, [metadata.EntryPoint("normalizer.relu2", "axiomformer_relu2:RELU2", GROUP)]) == [
        "normalizer.relu2"
    ]
    assert registries["normalizer"].origin("relu2") == "axiomformer_relu2"
