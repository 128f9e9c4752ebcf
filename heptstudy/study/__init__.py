"""The notebook-driven study: notebook parameters, the matrix runner, aggregation, the HTML report.

* :mod:`~heptstudy.study.params`: the parameters of ``pipeline.ipynb`` (``memory.ipynb`` and
  ``parity.ipynb`` build a :class:`~heptstudy.measure.request.MeasurementRequest`).
* :mod:`~heptstudy.study.matrix`: :func:`load_matrix` (``configs/study/*.yaml``).
* :mod:`~heptstudy.study.runner`: :func:`run_study`, one Papermill execution per run and
  round, failure reports, ``aggregate.ipynb`` and ``report.html``;
  :mod:`~heptstudy.study.schedule` (rounds of fresh processes), :mod:`~heptstudy.study.outputs`
  (where a study writes, replacing without losing), :mod:`~heptstudy.study.resume` (when a
  report may be resumed).
* :mod:`~heptstudy.study.frames` and :mod:`~heptstudy.study.tables`: pandas frames and report
  tables of an experiments directory; :mod:`~heptstudy.study.policies`: checkpointing policies
  side by side and memory by category; :mod:`~heptstudy.study.text`: plain-words statements;
  :mod:`~heptstudy.study.fits`: the fitted memory model, its validation and the platform
  predictions in the report.
* :mod:`~heptstudy.study.pipeline`: helpers of ``pipeline.ipynb`` and ``explore.ipynb``.
* :mod:`~heptstudy.cli.study`: ``heptstudy study ...``.

Everything the notebooks and tests use is importable as ``heptstudy.study.X``.
"""

from heptstudy.study.common import (
    MEMORY,
    PARITY,
    StudyError,
    at_project_root,
)
from heptstudy.study.fits import (
    auto_predictions,
    fit_validation,
    optional_fit_figure,
    platform_predictions,
)
from heptstudy.study.frames import (
    SYSTEM_TIME_DOMINATES,
    comparison_frame,
    dominated_runs,
    hits_stats_for,
    host_usage_of,
    load_reports,
    load_study,
    measured_hits,
    memory_frame,
    overhead_frame,
    parity_frame,
    policy_label,
    reports_frame,
    step_frame,
)
from heptstudy.study.matrix import Matrix, Run, load_matrix
from heptstudy.study.pipeline import (
    compare_resume,
    fresh_output_dir,
    read_metrics,
    step_memory_timeline,
)
from heptstudy.study.policies import categories_frame, policy_frame
from heptstudy.study.runner import (
    RunResult,
    StudyRun,
    aggregate_study,
    render_html,
    run_study,
)
from heptstudy.study.schedule import Execution, schedule
from heptstudy.study.tables import (
    categories_table,
    comparison_table,
    overhead_table,
    policy_table,
    runs_table,
    show,
)
from heptstudy.study.text import (
    CATEGORIES_NOTE,
    esc,
    figure_tag,
    heading,
    hits_statement,
    memory_definitions,
    study_statement,
)

__all__ = [
    "esc",
    "heading",
    "SYSTEM_TIME_DOMINATES",
    "dominated_runs",
    "host_usage_of",
    "load_study",
    "overhead_frame",
    "StudyRun",
    "Execution",
    "schedule",
    "overhead_table",
    "show",
    "CATEGORIES_NOTE",
    "policy_table",
    "categories_table",
    "policy_frame",
    "categories_frame",
    "policy_label",
    "platform_predictions",
    "auto_predictions",
    "fit_validation",
    "MEMORY",
    "PARITY",
    "Matrix",
    "Run",
    "RunResult",
    "StudyError",
    "aggregate_study",
    "at_project_root",
    "compare_resume",
    "comparison_frame",
    "comparison_table",
    "figure_tag",
    "fresh_output_dir",
    "hits_statement",
    "hits_stats_for",
    "load_matrix",
    "load_reports",
    "measured_hits",
    "memory_definitions",
    "memory_frame",
    "optional_fit_figure",
    "parity_frame",
    "read_metrics",
    "render_html",
    "reports_frame",
    "run_study",
    "runs_table",
    "step_frame",
    "step_memory_timeline",
    "study_statement",
]
