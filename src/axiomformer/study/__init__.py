"""The main job: ``axiomformer study`` — relax each assumption, train under a matched budget, measure, report.

>>> from axiomformer.study import default_config, run_study
>>> summary = run_study(default_config(quick=True), "runs/my-study")   # doctest: +SKIP

Modules: ``config`` (the validated TOML config), ``sweep`` (built-in sweep, parameter matching, run keys), ``store``
(SQLite results store), ``runner`` (local and Ray backends, resume), ``report`` / ``figures`` / ``render`` (the report).
"""

from axiomformer.study.config import StudyConfig, StudyConfigError, load_config, validate_config
from axiomformer.study.report import build_report
from axiomformer.study.runner import StudyError, StudySummary, run_study
from axiomformer.study.store import ResultsStore
from axiomformer.study.sweep import DEFAULT_VARIANTS, default_config, default_sweep, models, plan

__all__ = [
    "StudyConfig", "StudyConfigError", "load_config", "validate_config", "build_report", "StudyError",
    "StudySummary", "run_study", "ResultsStore", "DEFAULT_VARIANTS", "default_config", "default_sweep", "models",
    "plan",
]
