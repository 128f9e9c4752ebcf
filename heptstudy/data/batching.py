"""Events into batches (dicts of tensors, zeros on padding, ``mask`` True on real hits),
the training batch loader, and fixed evaluation events (from the **test** split)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from heptstudy.data.features import tracker_neighbourhood
from heptstudy.data.layout import EventLayout, is_packed
from heptstudy.data.sampler import InterleavedShardSampler
from heptstudy.data.tfds import ShardedDataset, open_dataset
from heptstudy.errors import DataError


def padded_sizes(lengths, multiple: int) -> np.ndarray:
    """Event lengths rounded up to a multiple of ``multiple``, at least one (an empty event too)."""
    n = np.asarray(lengths, dtype=np.int64)
    return np.maximum(-(-n // multiple) * multiple, multiple)


def to_device(
    batch: dict[str, torch.Tensor], device, non_blocking: bool = False
) -> dict[str, torch.Tensor]:
    """Every tensor of ``batch`` on ``device`` (the layout stays on the host)."""
    return map_tensors(batch, lambda t: t.to(device, non_blocking=non_blocking))


def map_tensors(batch: dict[str, Any], fn) -> dict[str, Any]:
    """``batch`` with ``fn`` applied to each tensor; other entries (the layout) as they are."""
    return {k: fn(v) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def collate(
    events: Sequence[dict[str, Any]], pad_to_multiple: int, batching: str = "padded"
) -> dict[str, torch.Tensor]:
    """``events`` as one batch: ``padded``, a row per event, each filled to the batch's longest
    (rounded up to ``pad_to_multiple``); ``packed``, one row of every event, each rounded up on
    its own. Zeros on padding, ``mask`` True on real hits, ``layout`` says where events lie."""
    if not events:
        raise DataError("cannot build a batch from zero events; ask for at least one event")
    lengths = np.array([len(ev["X"]) for ev in events], dtype=np.int64)
    padded = padded_sizes(lengths, pad_to_multiple)
    if is_packed(batching):
        layout = EventLayout.packed(lengths.tolist(), padded.tolist())
    else:
        layout = EventLayout.padded(lengths.tolist(), int(padded.max()))
    R, S = layout.rows, layout.row_slots
    per_hit = {  # neighbourhood: on all events or none
        key: np.zeros((R, S, events[0][key].shape[1]), dtype=np.float32)
        for key in ("X", "ytarget", "neighbourhood")
        if key in events[0]
    }
    mask = np.zeros((R, S), dtype=bool)
    for ev, span in zip(events, layout.spans, strict=True):
        hits = slice(span.start, span.start + span.hits)
        mask[span.row, hits] = True
        for key, block in per_hit.items():
            block[span.row, hits] = ev[key]
    out = {
        "X": torch.from_numpy(per_hit["X"]),
        "mask": torch.from_numpy(mask),
        "ytarget": torch.from_numpy(per_hit["ytarget"]),
        "event_index": torch.tensor(
            [int(ev.get("event_index", i)) for i, ev in enumerate(events)], dtype=torch.int64
        ),
        "length": torch.from_numpy(lengths),
        "padded_length": torch.from_numpy(padded),
        "layout": layout,
    }
    if "neighbourhood" in per_hit:
        out["neighbourhood"] = torch.from_numpy(per_hit["neighbourhood"])
    return out


_open_cached = functools.lru_cache(maxsize=8)(open_dataset)


def dataset_for(config, split: str) -> ShardedDataset:
    """The data set of ``config.data`` for ``split`` (opened once per process)."""
    d = config.data
    return _open_cached(str(d.data_dir), d.dataset, tuple(str(c) for c in d.configs), split)


def _batch(config, ds: ShardedDataset, indices: Sequence[int]) -> dict[str, torch.Tensor]:
    """Events ``indices`` of ``ds`` collated, with tracker features when on (hits data sets)."""
    tf = config.model.tracker_features
    radii = list(tf.radii) if tf.enabled and ds.is_hits else None

    # computed in the reader threads: the k-d tree searches release the GIL
    def read(index: int) -> dict[str, Any]:
        ev = ds[index]
        if radii is not None:
            ev["neighbourhood"] = tracker_neighbourhood(ev["X"], radii)
        return ev

    d = config.data
    if d.num_workers > 0 and len(indices) > 1:
        with ThreadPoolExecutor(max_workers=d.num_workers) as pool:
            events = list(pool.map(read, indices))
    else:
        events = [read(i) for i in indices]
    if events and not any(len(ev["X"]) for ev in events):
        # a step on no hits has loss 0.0 and no gradient: a run of them trains nothing, unsaid
        folders = ", ".join(repr(p) for p in ds.metadata["paths"])
        raise DataError(
            f"{ds.name} configs {ds.shard_names} {ds.split} split: every event of the batch "
            f"(event indices {list(indices)[:8]}{' ...' if len(indices) > 8 else ''}) has 0 "
            f"hits, so a step on it learns nothing (loss 0.0); the data set in {folders} is "
            "empty or damaged: regenerate it (`heptstudy data generate`) or point "
            "data.data_dir at one whose events have hits"
        )
    return collate(events, d.pad_to_multiple, d.batching)


def load_events(config, indices: Sequence[int], split: str = "train") -> dict[str, torch.Tensor]:
    """One collated batch of exactly the events ``indices`` of ``split`` (global indices)."""
    return _batch(config, dataset_for(config, split), [int(i) for i in indices])


def validation_batches(config, batch_size: int) -> list[dict[str, torch.Tensor]]:
    """Batches of the fixed validation events: test-split events ``0..nvalid-1``."""
    ds = dataset_for(config, "test")
    need = config.data.nvalid + config.data.ntest
    if need > len(ds):
        raise DataError(
            f"data.nvalid + data.ntest = {config.data.nvalid} + {config.data.ntest} = {need} "
            f"events are needed from the test split, but {ds.name} configs {ds.shard_names} "
            f"hold only {len(ds)}; lower data.nvalid/data.ntest or generate more test events"
        )
    n = config.data.nvalid
    return [
        load_events(config, range(i, min(i + batch_size, n)), "test")
        for i in range(0, n, batch_size)
    ]


class BatchLoader:
    """Endless iterator of batches for one rank, exactly resumable."""

    def __init__(
        self,
        config,
        split: str = "train",
        rank: int = 0,
        world_size: int = 1,
        *,
        per_device_batch: int,
    ) -> None:
        self.config = config
        self.dataset = dataset_for(config, split)
        self.batch_size = int(per_device_batch)
        self.sampler = _sampler(config, self.dataset, rank, world_size)

    def __next__(self) -> dict[str, torch.Tensor]:
        return _batch(self.config, self.dataset, self.sampler.take(self.batch_size))

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])


def event_indices(config, batch_size: int, num_batches: int) -> list[list[int]]:
    """The events of each measured step: the first batches of the seeded training sampler."""
    sampler = _sampler(config, dataset_for(config, "train"))
    return [sampler.take(batch_size) for _ in range(num_batches)]


def _sampler(config, ds: ShardedDataset, rank: int = 0, world_size: int = 1):
    """The seeded training sampler of ``ds`` for one rank."""
    mode = config.data.sampler
    return InterleavedShardSampler(ds.shard_sizes, config.train.seed, rank, world_size, mode)
