"""heptstudy: a reproducible study of activation checkpointing in the HEPTv2 backbone of an
MLPF-style particle-flow model. Layers, each importing only from those before it: ``config``
(and the small shared modules), ``data``, ``model``, ``train`` (the one step), ``measure`` (the
resolved measurement, meters, reports, and the run-time estimate in ``measure.estimate``), the
apps ``scenario``, ``fitting`` and ``study``, ``plots``, and the command line in ``cli``."""
