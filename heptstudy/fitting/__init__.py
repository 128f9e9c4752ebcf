"""Will it fit? Memory models of a training step, and their answer for a platform and a data set.

A library with a typed API (:class:`FitRequest` -> :func:`fit` -> :class:`FitResult`);
``heptstudy fit``, the study's report and ``heptstudy scenario resolve`` call it.
"""

# ruff: noqa: F401 - re-exports for the callers of heptstudy.fitting

from heptstudy.estimate.keys import mismatches, model_key
from heptstudy.estimate.memory_model import (
    FitError,
    LinearFit,
    MemoryModel,
    Point,
    ReservedFit,
    fit_allocated,
    fit_points,
)
from heptstudy.fitting.api import FitRequest, FitResult, fit, fit_warning
from heptstudy.fitting.predict import evaluate
from heptstudy.fitting.reports import fit_reports
from heptstudy.fitting.select import choose_model
