"""The main job: ``axiomformer study`` — relax each assumption, train under a matched budget, measure, report.

>>> from axiomformer.study import default_config, run_study
>>> summary = run_study(default_config(quick=True), "runs/my-study")   # doctest: +SKIP

Modules: ``suites`` (the ``--suite`` registry: ``main``, ``long-range``; how to add one), ``config`` (the validated TOML
config), ``sweep`` (models, parameter matching, cells and run keys), ``stages`` (the staged plan: learning-rate
selection on validation, reported seeds, curriculum), ``store`` (SQLite results store), ``runner`` (local and Ray
backends, resume), ``statistics`` / ``summary`` (bootstrap intervals, paired tests, Holm; ``report --json``),
``report`` / ``figures`` / ``render`` / ``long_range_report`` (the reports).
"""

from axiomformer.study.config import StudyConfig, StudyConfigError, load_config, validate_config
from axiomformer.study.report import build_report
from axiomformer.study.runner import StudyError, StudySummary, run_study
from axiomformer.study.store import ResultsStore
from axiomformer.study.stages import plan, plan_all
from axiomformer.study.suites import get_suite
from axiomformer.study.sweep import DEFAULT_VARIANTS, default_config, default_sweep, models

__all__ = [
    "StudyConfig", "StudyConfigError", "load_config", "validate_config", "build_report", "StudyError",
    "StudySummary", "run_study", "ResultsStore", "DEFAULT_VARIANTS", "default_config", "default_sweep", "models",
    "plan", "plan_all", "get_suite",
]
