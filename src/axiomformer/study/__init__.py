"""The main job: ``axiomformer study`` — relax each assumption, train under a matched budget, measure, report.

>>> from axiomformer.study import default_config, run_study
>>> summary = run_study(default_config(quick=True), "runs/my-study")   # doctest: +SKIP

The core, which imports no suite: ``registry`` (what a suite is, ``register``, ``get_suite``), ``config`` (the
validated TOML config, and ``stored_config``: a stored one read back), ``record`` (the typed run record a worker
writes, the store keeps and every reader gets: ``RunRecord``), ``sweep`` (models, parameter matching, cells and run
keys), ``stages`` (the staged plan: learning-rate selection on selection seeds with grid widening, reported seeds,
curriculum), ``store`` (SQLite results store), ``runner`` (local and Ray backends, resume), ``statistics`` (valid
intervals, TOST, power, verdict rules; its docstring is the API), ``summary`` (cells, comparisons, verdicts:
``report --json``), ``answer`` / ``report`` / ``figures`` / ``render`` / ``long_range_report`` (the reports). On
top: ``suites`` (``main``, ``long-range`` and the open-question suites), each registering itself; this package
imports them.
"""

from axiomformer.study import suites  # noqa: F401 - the built-in suites register themselves
from axiomformer.study.config import StudyConfig, StudyConfigError, load_config, stored_config, validate_config
from axiomformer.study.record import RunRecord
from axiomformer.study.registry import get_suite
from axiomformer.study.report import build_report
from axiomformer.study.runner import StudyError, StudySummary, run_study
from axiomformer.study.stages import plan, plan_all
from axiomformer.study.store import ResultsStore
from axiomformer.study.sweep import DEFAULT_VARIANTS, default_config, default_sweep, models

__all__ = [
    "DEFAULT_VARIANTS",
    "ResultsStore",
    "RunRecord",
    "StudyConfig",
    "StudyConfigError",
    "StudyError",
    "StudySummary",
    "build_report",
    "default_config",
    "default_sweep",
    "get_suite",
    "load_config",
    "models",
    "plan",
    "plan_all",
    "run_study",
    "stored_config",
    "validate_config",
]
