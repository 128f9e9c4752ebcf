"""Data: synthetic CLD-like events as TFDS ArrayRecord data sets, the reader (also of the real
data sets), interleaved-shard sampling, padding and tracker-neighbourhood features.

Heavy imports (TFDS, torch) happen on first use of the names below.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BatchLoader",
    "ShardedDataset",
    "collate",
    "generate_datasets",
    "load_events",
    "ntest_batches",
    "open_dataset",
    "tracker_neighbourhood",
    "validation_batches",
]

_WHERE = {
    "BatchLoader": "heptstudy.data.batching",
    "collate": "heptstudy.data.batching",
    "load_events": "heptstudy.data.batching",
    "ntest_batches": "heptstudy.data.batching",
    "validation_batches": "heptstudy.data.batching",
    "ShardedDataset": "heptstudy.data.tfds",
    "open_dataset": "heptstudy.data.tfds",
    "generate_datasets": "heptstudy.data.generate",
    "tracker_neighbourhood": "heptstudy.data.features",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'heptstudy.data' has no attribute {name!r}")
