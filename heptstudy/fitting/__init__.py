"""Will it fit? Memory models of a training step, and their answer for a platform and a data set.

A library with a typed API (:class:`FitRequest` -> :func:`fit` -> :class:`FitResult`);
``heptstudy fit``, the study's report and ``heptstudy scenario resolve`` call it.
"""

from heptstudy.fitting.api import FitRequest, FitResult, fit, fit_warning

__all__ = ["FitRequest", "FitResult", "fit", "fit_warning"]
