"""Study suites: ``axiomformer study --suite NAME``. Each suite is one experiment built on the shared machinery.

Dependencies point one way: the core (``study.config``, ``study.sweep`` / ``study.stages`` (the plan),
``study.runner``, ``study.store``, ``study.statistics``, ``study.summary``, ``study.answer``, ``study.report``,
``study.render``, ``study.figures``, and the registry ``study.registry``) imports no suite; each suite module here
registers itself (``SUITE = register(Suite(...))``) when this package imports it, and this package is imported by
``axiomformer.study`` (so any use of the study package sees every built-in suite).

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
  ``study.summary.verdicts(data)`` (paired differences to the standard model with family-corrected intervals and
  verdicts, ``study.statistics``).
  ``data.rows`` holds only the reported runs (chosen learning rate, reported seeds) and ``data.all_rows`` every stored
  run, each a :class:`axiomformer.study.record.RunRecord`; ``data.models`` the study's models
  (``record.ModelRecord``); ``data.config`` the stored config as the ``StudyConfig`` it was written from
  (``study.config.stored_config``: an older store's config is migrated first).

An open question (a few arms compared pairwise, as ``positions``, ``rho``, ``scale`` and ``gumbel``) is declared
instead on the base in ``study.suites.common``: ``SUITE = common.register_module(globals(), name=..., summary=...,
question=..., reference=..., families=...)`` registers the module's presets ``QUICK``, ``DEFAULT``, ``FULL``, its
``arms`` per task, its ``comparisons`` (``paired`` builds an a-vs-b contrast), ``_measured`` and ``_body`` (its own
tables and figures) as an :class:`~axiomformer.study.suites.common.OpenQuestion`. The base gives every such suite the
main study's footing: it trains the arms with the validity controls and the A/A control beside them (``arm_stages``,
``footing_arms``) and the learning-rate check after them; its validity block (``design.tasks``) drops every comparison
on a task that does not discriminate (``no_verdict``); each comparison is measured by its task's metric (accuracy or
solve rate) and checked at its second-best rate; and the report opens with the answer, the footing, then the body,
the diverged runs, failures and provenance.

Adding a suite (e.g. ``positions``):

1. Write ``src/axiomformer/study/suites/positions.py`` defining ``SUITE = register(Suite(name="positions",
   summary=..., presets={...}, sections=...))`` (``from axiomformer.study.registry import Suite, register``; never
   import this package from a suite module). Any option the suite needs goes in its presets' existing config keys
   (variants, baselines, tasks with options and per-length budgets, model, seeds, curriculum).
2. Import it below (and add its name to :data:`BUILTIN`).
3. Test: ``validate_config(get_suite("positions").presets["quick"])`` plans (``stages_for``) and a tiny run
   writes a report (see ``tests/test_study_suites.py``).
"""

from __future__ import annotations

from axiomformer.study.registry import PRESETS, Suite, get_suite, register, registered

# each registers itself on import; in this order, the order of --help and of the error naming the choices
# isort: off
from axiomformer.study.suites import main, long_range, positions, rho, scale, gumbel  # noqa: F401
# isort: on

BUILTIN: tuple[str, ...] = ("main", "long-range", "positions", "rho", "scale", "gumbel")
"""The suites shipped with axiomformer (each registered by its module above)."""

__all__ = ["BUILTIN", "PRESETS", "Suite", "get_suite", "register", "registered"]
