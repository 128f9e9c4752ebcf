"""Will it fit? The memory model, fake-device estimation and the fit prediction.

Public entry points (the notebooks and ``heptstudy fit`` call these):

* :func:`fit_reports` (bench reports -> measured :class:`MemoryModel` per configuration, with
  inputs, residuals and held-out validation), :meth:`MemoryModel.save` / :meth:`MemoryModel.load`;
* :func:`estimate_step` / :func:`estimate_memory_model` (peak allocated on a fake device,
  without the hardware);
* :func:`evaluate` (per-batch peaks over the sampler's batching, P(exceed), expected failures,
  largest safe batch) and :func:`run_fit` (all of it for a scenario on a platform);
* :func:`fit_figure` (fitted lines over measured points), :func:`peak_distribution_figure`;
* :func:`fit_warning` (one line for ``heptstudy scenario resolve``).

Implementation in :mod:`heptstudy.fitting`.
"""

from heptstudy.fitting.cli import answer_words, find_model, fit_warning, register_cli, run_fit
from heptstudy.fitting.fake import estimate_memory_model, estimate_step, fake_device_type
from heptstudy.fitting.memmodel import (
    FitError,
    LinearFit,
    MemoryModel,
    Point,
    fit_linear,
    fit_points,
    fit_reports,
    model_key,
    points_from_reports,
)
from heptstudy.fitting.plots import fit_figure, fit_table, peak_distribution_figure
from heptstudy.fitting.predict import FitAnswer, batch_longest, evaluate, largest_safe_batch

__all__ = [
    "FitAnswer",
    "FitError",
    "LinearFit",
    "MemoryModel",
    "Point",
    "answer_words",
    "batch_longest",
    "estimate_memory_model",
    "estimate_step",
    "evaluate",
    "fake_device_type",
    "find_model",
    "fit_figure",
    "fit_linear",
    "fit_points",
    "fit_reports",
    "fit_table",
    "fit_warning",
    "largest_safe_batch",
    "model_key",
    "peak_distribution_figure",
    "points_from_reports",
    "register_cli",
    "run_fit",
]
