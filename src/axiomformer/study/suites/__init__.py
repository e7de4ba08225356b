"""Study suites: ``axiomformer study --suite NAME``. Each suite is one experiment built on the shared machinery.

What every suite shares (do not reimplement it in a suite): the validated config (``study.config.StudyConfig``), the
sweep of models with matched parameter counts (``study.sweep``), the staged plan with learning-rate selection on the
validation split (``study.stages``), the SQLite store and resume (``study.store``, ``study.runner``), the statistics
(``study.statistics``) and the report renderer (``study.report``, ``study.render``).

What a suite defines (:class:`Suite`):

* ``presets``: ``{"quick": dict, "default": dict, "full": dict}`` — the built-in configs as plain dicts (the base a
  ``--config`` TOML file is merged onto), each setting ``suite = <name>``. ``quick``: about 3 minutes on 2 cores;
  ``default``: about 20; ``full``: the complete protocol (more seeds and lengths; for Ray or a GPU).
* ``stages`` (optional): ``stages(config) -> list[Stage]``; default :func:`axiomformer.study.stages.stages_for`
  (lr selection then seeds; a curriculum over lengths when the config says ``curriculum = true``).
* ``sections``: ``sections(data, figures_dir) -> list[block]``: the report body after the title, from a
  ``study.report.StudyData`` (the stored rows, the reported cells with their statistics, the config). Blocks are
  ``study.render`` objects (``Heading``, ``Paragraph``, ``Table``, ``Image``); figures are drawn into
  ``figures_dir`` with ``matplotlib.figure.Figure`` (never ``pyplot`` state, never ``matplotlib.use``). Reuse
  what fits: ``study.report.main_sections(data, figures_dir)`` (the whole main report body),
  ``study.report.failures_block(data)``, ``study.report.provenance_block(data)``, and the numbers behind the
  tables, ``study.summary.cell_stats(data)`` (mean, 95 % interval, lr, converged per cell) and
  ``study.summary.comparisons(data)`` (paired differences to the standard model, Holm-corrected).
  ``data.rows`` holds only the reported runs (chosen learning rate, reported seeds); ``data.all_rows`` every stored
  run; ``data.config`` the stored config as a dict.

Adding a suite (e.g. ``positions``):

1. Write ``src/axiomformer/study/suites/positions.py`` defining ``SUITE = Suite(name="positions", summary=...,
   presets={...}, sections=...)``. Any option the suite needs goes in its presets' existing config keys (variants,
   baselines, tasks with options and per-length budgets, model, seeds, curriculum).
2. Add ``"positions"`` to :data:`BUILTIN` below (modules are imported on first use, so a suite costs nothing until
   it is asked for).
3. Test: ``validate_config(get_suite("positions").presets["quick"])`` plans (``stages_for``) and a tiny run
   writes a report (see ``tests/test_study_suites.py``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from axiomformer.study.config import StudyConfig
    from axiomformer.study.report import StudyData
    from axiomformer.study.stages import Stage

PRESETS = ("quick", "default", "full")
"""Preset names every suite provides (``--quick``, the default, ``--preset full``)."""

BUILTIN: tuple[str, ...] = ("main", "long-range", "positions", "rho", "scale", "gumbel")
"""The suites shipped with axiomformer; the module of suite ``a-b`` is ``axiomformer.study.suites.a_b``."""


@dataclass(frozen=True)
class Suite:
    """One study suite.

    Attributes:
        name: the ``--suite`` name (and the config's ``suite`` value).
        summary: one line for ``--help`` and the report.
        presets: ``{"quick" | "default" | "full": config dict}``.
        sections: ``(StudyData, figures_dir) -> list of render blocks`` (the report body).
        stages: ``(StudyConfig) -> list of stages``; ``None`` (default): ``study.stages.stages_for`` (lr selection,
            or a curriculum when configured).
    """

    name: str
    summary: str
    presets: dict[str, dict[str, Any]]
    sections: Callable[["StudyData", Path], list]
    stages: Callable[["StudyConfig"], list["Stage"]] | None = None

    def preset(self, name: str) -> dict[str, Any]:
        """A deep copy of preset ``name`` as a plain dict.

        Raises:
            ValueError: an unknown preset, naming the choices.
        """
        import json

        if name not in self.presets:
            raise ValueError(f"suite {self.name!r} has no preset {name!r}; choose one of: {', '.join(self.presets)}")
        return json.loads(json.dumps(self.presets[name])) | {"suite": self.name}


_LOADED: dict[str, Suite] = {}


def get_suite(name: str) -> Suite:
    """The registered suite ``name``.

    Raises:
        ValueError: an unknown name, naming the registered suites.
    """
    if name not in BUILTIN:
        raise ValueError(f"unknown suite {name!r}; choose one of: {', '.join(BUILTIN)}")
    if name not in _LOADED:
        module = importlib.import_module(f"axiomformer.study.suites.{name.replace('-', '_')}")
        _LOADED[name] = module.SUITE
    return _LOADED[name]


__all__ = ["BUILTIN", "PRESETS", "Suite", "get_suite"]
