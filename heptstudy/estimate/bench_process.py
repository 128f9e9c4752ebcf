"""Allocated and reserved per step of a whole bench process, from the storage traces of its
steps, through the caching-allocator simulator (native and expandable segments).

The process is replayed as :func:`heptstudy.measure.bench.run_bench` runs it on a GPU: every
batch moved to the device first; per pass (timed, then memory) a fresh model, and once per
process two cuBLAS workspaces (:data:`CUBLAS_WORKSPACES`); each step's trace between a peak reset
and a peak read, then its outputs freed, LAMB's state made after step 0 and the gradients freed;
between the passes the first model and its state freed, the cached segments kept.

The memory pass's peaks are returned. Frees of blocks resident when the meter started are counted
in ``ignored_frees``; storages a step adopted are allocated when its window opens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from heptstudy.errors import HeptstudyError
from heptstudy.estimate.caching_allocator import AllocatorPeaks, CachingAllocator
from heptstudy.meters.allocation_trace import StepTrace
from heptstudy.units import MIB

#: An assumption: cuBLAS's default on Hopper (``:4096:8``, 32 MiB) for each of the cuBLAS and
#: cuBLASLt handles, cached to the end of the process.
CUBLAS_WORKSPACES = (32 * MIB, 32 * MIB)


@dataclass(frozen=True)
class BenchProcessPeaks:
    """Per-step peaks of the memory pass, native and with expandable segments."""

    native: list[AllocatorPeaks]
    expandable: list[AllocatorPeaks]
    warmup: int
    ignored_frees: int

    def counted(self, mode: Literal["native", "expandable"]) -> list[AllocatorPeaks]:
        steps = self.native if mode == "native" else self.expandable
        return steps[self.warmup :] or steps

    def max_allocated(self, mode: Literal["native", "expandable"] = "native") -> int:
        """Maximum over the counted steps (all steps when none is counted), as the bench."""
        return max(s.peak_allocated for s in self.counted(mode))

    def max_reserved(self, mode: Literal["native", "expandable"] = "native") -> int:
        return max(s.peak_reserved for s in self.counted(mode))


def simulate_bench_process(
    steps: Sequence[StepTrace],
    *,
    warmup: int = 2,
    passes: Literal["both", "memory"] = "both",
    optimizer_state: Sequence[int] | None = None,
) -> BenchProcessPeaks:
    """Replay a bench process whose step ``i`` runs ``steps[i]``, in both allocator modes.
    ``optimizer_state`` (sizes) defaults to the first trace's resident optimizer state."""
    if not steps:
        raise HeptstudyError(
            "simulate_bench_process needs at least one step trace; got none. Trace the steps "
            "with heptstudy.meters.allocation_trace.TracingMemoryMeter first"
        )
    if optimizer_state is None:
        optimizer_state = steps[0].resident_bytes("optimizer_state")
    runs = {}
    for mode, expandable in (("native", False), ("expandable", True)):
        replayer = _Process(CachingAllocator(expandable_segments=expandable), optimizer_state)
        runs[mode] = replayer.run(steps, passes)
    return BenchProcessPeaks(
        native=runs["native"],
        expandable=runs["expandable"],
        warmup=min(warmup, len(steps) - 1),
        ignored_frees=replayer.ignored_frees,
    )


class _Process:
    def __init__(self, alloc: CachingAllocator, optimizer_state: Sequence[int]):
        self.alloc = alloc
        self.ignored_frees = 0
        self._next = 0
        self._state_sizes = list(optimizer_state)

    def _new(self, nbytes: int) -> int:
        self._next += 1
        self.alloc.malloc(self._next, nbytes)
        return self._next

    def _step(self, trace: StepTrace, state, first: bool):
        names: dict[int, int] = {}
        resident = {b for b, _, _ in trace.resident}
        for block, nbytes in trace.adopted:
            names[block] = self._new(nbytes)
        self.alloc.reset_peak()
        for kind, block, nbytes in trace.events:
            if kind == "alloc":
                names[block] = self._new(nbytes)
            elif block in names:
                self.alloc.free(names.pop(block))
            elif block in resident:
                self.ignored_frees += 1
            else:
                raise HeptstudyError(
                    f"a step trace frees block {block} ({nbytes} bytes) that it never "
                    "allocated and that was not resident at its start; the trace is incomplete"
                )
        peaks = self.alloc.peaks()  # what the meter reads at the step's end
        grads = [names.pop(b) for b in sorted(trace.gradient_ids) if b in names]
        for block in list(names):  # outputs, losses: gone before the update
            self.alloc.free(names.pop(block))
        if first:
            state.extend(self._new(n) for n in self._state_sizes)
        for g in grads:
            self.alloc.free(g)
        return peaks

    def run(self, steps: Sequence[StepTrace], passes: str) -> list[AllocatorPeaks]:
        for trace in steps:
            for nbytes in trace.resident_bytes("inputs"):
                self._new(nbytes)
        out: list[AllocatorPeaks] = []
        for n_pass in range(2 if passes == "both" else 1):
            params = [self._new(n) for n in steps[0].resident_bytes("parameters")]
            if n_pass == 0:
                for nbytes in CUBLAS_WORKSPACES:
                    self._new(nbytes)
            state: list[int] = []
            out = [self._step(trace, state, first=i == 0) for i, trace in enumerate(steps)]
            for block in params + state:
                self.alloc.free(block)
        return out
