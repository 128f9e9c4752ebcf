"""Will it fit? Memory models of a training step, and their answer for a platform and a data set."""

from heptstudy.fitting.api import FitRequest, FitResult, fit, fit_warning

__all__ = ["FitRequest", "FitResult", "fit", "fit_warning"]
