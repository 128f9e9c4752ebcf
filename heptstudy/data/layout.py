"""Where a batch's events lie: each a run of slots in one row, real hits first; padded, an event
per row, each the longest; packed, one row, each run its own event's length. Everything reads
events through this, so both batchings share one path."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from heptstudy.errors import DataError


@dataclass(frozen=True)
class EventSpan:
    row: int
    start: int
    slots: int  # real hits first, then padding slots of this event
    hits: int

    @property
    def stop(self) -> int:
        return self.start + self.slots


@dataclass(frozen=True)
class EventLayout:
    """Host integers (no device sync; fake-tensor steps read them). :meth:`padded`, :meth:`packed`
    tile rows with events in order, hits within slots, rows rounding to equal bucket slots."""

    rows: int
    row_slots: int
    spans: tuple[EventSpan, ...]
    packed_events: bool = False  # built by :meth:`packed`

    @classmethod
    def padded(cls, hits: Sequence[int], row_slots: int) -> EventLayout:
        spans = tuple(EventSpan(b, 0, row_slots, int(n)) for b, n in enumerate(hits))
        return cls(len(spans), row_slots, spans)

    @classmethod
    def packed(cls, hits: Sequence[int], slots: Sequence[int]) -> EventLayout:
        starts = [0]
        for n in slots:
            starts.append(starts[-1] + int(n))
        spans = tuple(
            EventSpan(0, start, int(n), int(h))
            for start, n, h in zip(starts[:-1], slots, hits, strict=True)
        )
        return cls(1, starts[-1], spans, packed_events=True)

    @property
    def num_events(self) -> int:
        return len(self.spans)

    @property
    def geometry(self) -> BatchGeometry:
        slots = [s.slots for s in self.spans]
        return BatchGeometry(len(slots), self.rows * self.row_slots, max(slots), self.packed_events)

    @property
    def one_event_per_row(self) -> bool:
        return self.rows == len(self.spans)

    def slot_event(self, device) -> torch.Tensor:
        """[rows, row_slots] long: the event each slot belongs to."""
        # built on the host: a fake-tensor step cannot repeat by counts held in a tensor
        event = np.repeat(np.arange(len(self.spans)), [s.slots for s in self.spans])
        return torch.from_numpy(event).view(self.rows, self.row_slots).to(device)

    def slot_start(self, device) -> torch.Tensor:
        """[rows, row_slots] long: the first slot of each slot's event in its row."""
        start = np.repeat([s.start for s in self.spans], [s.slots for s in self.spans])
        return torch.from_numpy(start).view(self.rows, self.row_slots).to(device)

    def bucket_geometry(self, block_size: int, device):
        """Bucket space (events rounded up to whole buckets, rows of equal length): ``position
        [rows, row_slots]``, each sorted slot's bucket position; ``source [rows, Sp]``, the slot
        each position reads (fill: the event's last); ``valid [rows, Sp]``: a real hit."""
        rounded = [-(-s.slots // block_size) * block_size for s in self.spans]  # no straddling
        row_len = [0] * self.rows
        bucket_start = []
        for s, n in zip(self.spans, rounded, strict=True):
            bucket_start.append(row_len[s.row])
            row_len[s.row] += n
        Sp = max(row_len)
        event = self.slot_event(device)
        shift = torch.tensor(
            [b - s.start for b, s in zip(bucket_start, self.spans, strict=True)], device=device
        )
        slot = torch.arange(self.row_slots, device=device).expand(self.rows, -1)
        position = slot + shift[event]
        source = torch.empty(self.rows, Sp, dtype=torch.long, device=device)
        valid = torch.zeros(self.rows, Sp, dtype=torch.bool, device=device)
        for s, b, n in zip(self.spans, bucket_start, rounded, strict=True):
            within = torch.arange(n, device=device)
            source[s.row, b : b + n] = s.start + within.clamp(max=s.slots - 1)
            valid[s.row, b : b + s.hits] = True
        return position, source, valid


BATCHINGS = ("padded", "packed")


def is_packed(batching: str) -> bool:
    """Whether ``data.batching`` (or a report's) packs the batch's events in one stream."""
    return batching == BATCHINGS[1]


@dataclass(frozen=True)
class BatchGeometry:
    """What a batch's memory and time follow: its ``events``, the ``slots`` its layers compute
    over (padded: every event filled to the longest; packed: each rounded up alone) and its
    ``longest`` event's slots. The memory models read :attr:`length`, the slots per event."""

    events: int
    slots: int
    longest: int
    packed: bool = False

    @classmethod
    def of_events(cls, event_slots: Sequence[int], batching: str) -> BatchGeometry:
        """The geometry of a batch whose events take ``event_slots`` each, rounded up alone."""
        slots = [int(n) for n in event_slots]
        longest, packed = max(slots), is_packed(batching)
        return cls(len(slots), sum(slots) if packed else len(slots) * longest, longest, packed)

    @property
    def length(self) -> int:
        """Slots per event: padded, the longest event; packed, the mean (rounded)."""
        return round(self.slots / self.events)

    @property
    def batching(self) -> str:
        return BATCHINGS[self.packed]

    def words(self) -> str:
        if self.packed:
            return f"{self.events} events packed in {self.slots:,} slots"
        return f"{self.events} events, longest padded event {self.longest:,} hits"


def geometry_of(batch) -> BatchGeometry:
    return layout_of(batch).geometry


def layout_of(batch) -> EventLayout:
    """The batch's layout; without one, padded (an event per row, its real hits first)."""
    layout = batch.get("layout")
    if isinstance(layout, EventLayout):
        return layout
    mask = batch["mask"].bool().cpu()
    hits = mask.sum(dim=1)
    if not torch.equal(mask, torch.arange(mask.shape[1]) < hits[:, None]):
        raise DataError(
            "the batch carries no event layout ('layout') and its mask does not put each row's "
            "hits first, so its events cannot be found; build batches with "
            "heptstudy.data.batching.collate or heptstudy.model.example_batch"
        )
    return EventLayout.padded(hits.tolist(), mask.shape[1])
