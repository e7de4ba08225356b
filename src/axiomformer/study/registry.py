"""The registry of study suites (core): what a suite is (:class:`Suite`), :func:`register`, :func:`get_suite`.

The core never imports a suite: suites (``axiomformer.study.suites``) import this module and register themselves;
``axiomformer.study`` imports the built-in suites, so every use of the study package sees them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from axiomformer.study.config import StudyConfig
    from axiomformer.study.report import StudyData
    from axiomformer.study.stages import Stage

PRESETS = ("quick", "default", "full")
"""Preset names every suite provides (``--quick``, the default, ``--preset full``)."""


@dataclass(frozen=True)
class Suite:
    """One study suite.

    Attributes:
        name: the ``--suite`` name (and the config's ``suite`` value).
        summary: one line for ``--help`` and the report.
        presets: ``{"quick" | "default" | "full": config dict}``; the quick preset is a pilot (``pilot = true`` is
            added to it: every verdict ``pilot``).
        sections: ``(StudyData, figures_dir) -> list of render blocks`` (the report body).
        stages: ``(StudyConfig) -> list of stages``; ``None`` (default): ``study.stages.stages_for`` (lr selection,
            or a curriculum when configured).
        comparisons: ``(StudyData) -> list of study.contrasts.Contrast``: what the suite compares, turned into its
            verdicts (``report --json``); ``None`` (default): every model against the standard one
            (``study.summary``).
        extra_json: ``(StudyData) -> dict``: more top-level keys for ``report --json`` (e.g. the long-range suite's
            per-run exact intervals); ``None`` (default): none.
        validity: ``(StudyData) -> list of task entries``: the task validity block (``battery.task_validity``'s
            entries) printed as ``design.tasks``: of a suite with ``comparisons``, or of one without that decides
            by a rule of its own (the long-range suite); ``None`` (default): none, or the battery's rule.
        families: the verdict families of a suite with ``comparisons``, in report order (``design.families``).
    """

    name: str
    summary: str
    presets: dict[str, dict[str, Any]]
    sections: Callable[[StudyData, Path], list]
    stages: Callable[[StudyConfig], list[Stage]] | None = None
    comparisons: Callable[[StudyData], list] | None = None
    extra_json: Callable[[StudyData], dict] | None = None
    validity: Callable[[StudyData], list[dict[str, Any]]] | None = None
    families: tuple[str, ...] = ("primary", "secondary")

    def preset(self, name: str) -> dict[str, Any]:
        """A deep copy of preset ``name`` as a plain dict (``pilot = true`` added to ``quick``).

        Raises:
            ValueError: an unknown preset, naming the choices.
        """
        import json

        if name not in self.presets:
            raise ValueError(f"suite {self.name!r} has no preset {name!r}; choose one of: {', '.join(self.presets)}")
        out = json.loads(json.dumps(self.presets[name])) | {"suite": self.name}
        if name == "quick":
            out.setdefault("pilot", True)
        return out


_SUITES: dict[str, Suite] = {}


def register(suite: Suite) -> Suite:
    """Add ``suite`` to the registry (a later one of the same name replaces it) and return it."""
    _SUITES[suite.name] = suite
    return suite


def registered() -> tuple[str, ...]:
    """The registered suite names, in registration order."""
    return tuple(_SUITES)


def get_suite(name: str) -> Suite:
    """The registered suite ``name``.

    Raises:
        ValueError: an unknown name, naming the registered suites.
    """
    if name not in _SUITES:
        raise ValueError(f"unknown suite {name!r}; choose one of: {', '.join(_SUITES) or '(none registered)'}")
    return _SUITES[name]


__all__ = ["PRESETS", "Suite", "get_suite", "register", "registered"]
