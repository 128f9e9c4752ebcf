"""Will it fit? Memory models of a training step, and their answer for a platform and a data set.

A library with a typed API; ``heptstudy fit`` (:mod:`~heptstudy.cli.fit`), the study's
report and ``heptstudy scenario resolve`` call it. One job per module:

* :mod:`~heptstudy.fitting.api`: :class:`FitRequest` -> :func:`fit` -> :class:`FitResult`;
  :func:`fit_warning` for ``scenario resolve``;
* :mod:`~heptstudy.estimate.memory_model`: :class:`MemoryModel` (allocated and reserved), fitting and
  leave-one-batch-size-out validation; :mod:`~heptstudy.estimate.keys`: what a model is specific to;
* :mod:`~heptstudy.fitting.reports`: bench reports -> measured models, and which reports cannot
  be used and why; :mod:`~heptstudy.fitting.select`: which model answers, and why not the others;
* :mod:`~heptstudy.fitting.occupancy` and :mod:`~heptstudy.fitting.predict`: the data set's
  length distribution -> per-batch peaks, P(step fails), P(run fails), largest safe batch;
* :mod:`~heptstudy.estimate.fake_step`: an estimated model from steps on fake tensors (no hardware);
* :mod:`~heptstudy.fitting.words` and :mod:`~heptstudy.fitting.plots`: text, figures, tables.
"""

from heptstudy.estimate.keys import key_label, mismatches, model_key
from heptstudy.estimate.memory_model import (
    FitError,
    LinearFit,
    MemoryModel,
    Point,
    ReservedFit,
    fit_allocated,
    fit_points,
    fit_reserved,
)
from heptstudy.fitting.api import (
    DEFAULT_SCENARIO,
    DEFAULT_VARIANT,
    FITS_DIR,
    FitRequest,
    FitResult,
    fit,
    fit_warning,
)
from heptstudy.fitting.predict import FitAnswer, Tail, evaluate
from heptstudy.fitting.reports import Rejected, fit_reports, read_groups
from heptstudy.fitting.select import Choice, choose_model
from heptstudy.fitting.words import answer_words, render

__all__ = [
    "DEFAULT_SCENARIO",
    "DEFAULT_VARIANT",
    "FITS_DIR",
    "Choice",
    "FitAnswer",
    "FitError",
    "FitRequest",
    "FitResult",
    "LinearFit",
    "MemoryModel",
    "Point",
    "Rejected",
    "ReservedFit",
    "Tail",
    "answer_words",
    "choose_model",
    "evaluate",
    "fit",
    "fit_allocated",
    "fit_points",
    "fit_reports",
    "fit_reserved",
    "fit_warning",
    "key_label",
    "mismatches",
    "model_key",
    "read_groups",
    "render",
]
