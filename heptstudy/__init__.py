"""heptstudy: a reproducible study of activation checkpointing in the HEPTv2 backbone of an
MLPF-style particle-flow model. Layers, each importing only from those before it: ``config``
(and the small shared modules), ``data``, ``scenario``, ``model``, ``train`` (the one step),
``meters`` (measure a step, decide nothing), ``estimate`` (GPU memory without the hardware),
``measure`` (the resolved measurement, bench, reports), the apps ``fitting`` and ``study``,
``plots``, and the command line in ``cli``."""
