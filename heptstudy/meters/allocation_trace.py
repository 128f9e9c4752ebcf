"""The storage tracker's allocations and frees, in the order they happened: the input of the
caching-allocator simulator (:mod:`heptstudy.estimate.caching_allocator`).

Every storage gets its own block id (Python reuses ``id`` values). Storages first seen as an
op's *input* ("adopted") cannot be ordered and are listed apart.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from heptstudy.meters.memory import StorageTracker, TrackedMemoryMeter, _storage_of

Event = tuple[str, int, int]  # ("alloc" | "free", block_id, nbytes)


@dataclass
class StepTrace:
    """One measured step's storages; ``resident`` were alive at its start."""

    resident: list[tuple[int, int, str]] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    adopted: list[tuple[int, int]] = field(default_factory=list)
    live_at_end: dict[int, int] = field(default_factory=dict)
    gradient_ids: frozenset[int] = frozenset()

    def resident_bytes(self, category: str) -> list[int]:
        return [n for _, n, c in self.resident if c == category]


class TracingStorageTracker(StorageTracker):
    """A :class:`StorageTracker` that also writes the :class:`StepTrace` of its step."""

    def _reset(self) -> None:
        super()._reset()
        self.trace = StepTrace()
        self._block_of: dict[int, int] = {}
        self._blocks = itertools.count()
        self._tracing = False
        self._adopting = False

    def _register(self, storage, category: str, owner: str = ""):
        key = id(storage)
        known = self._live.get(key)
        old_nbytes = None if known is None else known.nbytes
        entry = super()._register(storage, category, owner)
        if known is None:
            self._block_of[key] = block = next(self._blocks)
            if not self._tracing:
                self.trace.resident.append((block, entry.nbytes, category))
            elif self._adopting:
                self.trace.adopted.append((block, entry.nbytes))
            else:
                self.trace.events.append(("alloc", block, entry.nbytes))
        elif old_nbytes != entry.nbytes and self._tracing:
            # resize_ (or an out= that grew): a new block, the data copied, the old one freed
            old = self._block_of[key]
            self._block_of[key] = block = next(self._blocks)
            self.trace.events.append(("alloc", block, entry.nbytes))
            self.trace.events.append(("free", old, old_nbytes))
        return entry

    def _transient(self, func, nbytes: int) -> None:
        super()._transient(func, nbytes)
        if nbytes > 0 and self._tracing:
            block = next(self._blocks)
            self.trace.events.append(("alloc", block, nbytes))
            self.trace.events.append(("free", block, nbytes))

    def _on_free(self, key: int) -> None:
        with self._lock:
            entry = self._live.get(key)
            super()._on_free(key)
            block = self._block_of.pop(key, None)
            if entry is not None and block is not None and self._tracing:
                self.trace.events.append(("free", block, entry.nbytes))

    def _adopt(self, storage, t: torch.Tensor) -> None:
        # listed apart, not recorded as this op's allocations
        with self._lock:
            self._adopting = True
            try:
                super()._adopt(storage, t)
            finally:
                self._adopting = False

    def begin(self, *, baseline_tensors=(), model=None, optimizer=None) -> None:
        super().begin(baseline_tensors=baseline_tensors, model=model, optimizer=optimizer)
        self._tracing = True

    def end(self) -> None:
        with self._lock:
            self._tracing = False
            resident = {b for b, _, _ in self.trace.resident}
            live = {
                self._block_of[k]: e.nbytes
                for k, e in self._live.items()
                if k in self._block_of and self._block_of[k] not in resident
            }
            grads = set()
            for p in self._params:
                storage = _storage_of(p.grad) if p.grad is not None else None
                if storage is not None and id(storage) in self._block_of:
                    grads.add(self._block_of[id(storage)])
            self.trace.live_at_end = live
            self.trace.gradient_ids = frozenset(grads & set(live))
        super().end()


class TracingMemoryMeter(TrackedMemoryMeter):
    tracker_class = TracingStorageTracker
    last_trace: StepTrace | None = None

    def stop_step(self):
        result = super().stop_step()
        self.last_trace = self.tracker.trace  # the meter keeps its tracker after the step
        return result
