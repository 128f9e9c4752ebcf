"""heptstudy: a reproducible study of activation checkpointing in the HEPTv2 backbone of an
MLPF-style particle-flow model. Its import layers: docs/layout.md (tests/test_import_order.py)."""
