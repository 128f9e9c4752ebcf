"""heptstudy: a reproducible study of activation checkpointing in the HEPTv2 backbone of an
MLPF-style particle-flow model. Its layers, each importing only from those above it, are listed
in docs/layout.md (tests/test_import_order.py checks them)."""
