"""The default safety margin, on its own so that the fit (:mod:`heptstudy.fitting.api`) and the
auto plans' budget (:mod:`heptstudy.measure.estimate.plans`) share it without importing each other."""

#: Default safety margin, as a fraction of the device memory (context, kernels' workspaces).
DEFAULT_MARGIN_FRACTION = 0.1
