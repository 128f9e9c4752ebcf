"""heptstudy: a reproducible study of activation checkpointing in the HEPTv2 backbone of an
MLPF-style particle-flow model. Configuration in ``config``, data in ``data``, models in
``model``, training in ``train``, measurements in ``measure``, the notebook-driven study in
``study``, the training recipe in ``scenario`` and the fit prediction in ``fit``."""
