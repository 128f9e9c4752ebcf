"""The study as the notebooks call it (``heptstudy.study.X``): runner, frames, tables, text."""

# ruff: noqa: F401 - re-exports for the notebooks

from heptstudy.study.common import StudyError, at_project_root
from heptstudy.study.fits import (
    auto_predictions,
    fit_validation,
    optional_fit_figure,
    platform_predictions,
)
from heptstudy.study.frames import (
    categories_frame,
    comparison_frame,
    hits_stats_for,
    host_usage_of,
    load_reports,
    load_study,
    measured_hits,
    memory_frame,
    overhead_frame,
    parity_frame,
    policy_frame,
    reports_frame,
    step_frame,
)
from heptstudy.study.front import front_frame, front_table
from heptstudy.study.matrix import Run, load_matrix
from heptstudy.study.packing import packing_frame, packing_table
from heptstudy.study.paired import load_paired
from heptstudy.study.pipeline import (
    compare_resume,
    fresh_output_dir,
    read_metrics,
    step_memory_timeline,
)
from heptstudy.study.runner import run_study
from heptstudy.study.tables import (
    categories_table,
    comparison_table,
    overhead_table,
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
