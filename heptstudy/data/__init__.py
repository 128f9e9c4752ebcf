"""Data: synthetic CLD-like events as TFDS ArrayRecord data sets, the reader (also of the real
data sets), interleaved-shard sampling, padding and tracker-neighbourhood features.

The batching names below are imported on first use: TFDS and torch are heavy.
"""

from __future__ import annotations

from typing import Any

_BATCHING = ("BatchLoader", "collate", "load_events", "validation_batches")


def __getattr__(name: str) -> Any:
    if name in _BATCHING:
        from heptstudy.data import batching

        return getattr(batching, name)
    raise AttributeError(f"module 'heptstudy.data' has no attribute {name!r}")
