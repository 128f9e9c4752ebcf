"""Allocated and reserved per step of a whole bench process, from the storage traces of its
steps, through the caching-allocator simulator (native and expandable segments).

The process is replayed as :func:`heptstudy.measure.bench.run_bench` runs it on a GPU:

1. every batch of the run moved to the device first (in step order, its tensors in key order);
2. per pass (``passes="both"``: the timed pass, then the memory pass; ``"memory"``: only the
   latter), a fresh model: its parameters and buffers; then, once per process, two cuBLAS
   workspaces (:data:`CUBLAS_WORKSPACES`, an assumption: cuBLAS's default on Hopper is
   ``CUBLAS_WORKSPACE_CONFIG=:4096:8``, 32 MiB, and the cuBLAS and cuBLASLt handles each hold
   one; they are cached per handle, so they live to the end of the process);
3. each step: the peaks reset, the step's trace (forward, loss, backward: the meter's window)
   replayed, the peaks read; then what the step still holds apart from the gradients freed (the
   outputs are deleted before the update), LAMB's state allocated after step 0's window (and
   kept), the gradients freed (``zero_grad(set_to_none=True)``);
4. between the passes the first model, its gradients and its optimizer state freed (``del
   state``); the cached segments stay (no ``empty_cache``).

The peaks of the memory pass are returned. Blocks a trace frees that were resident when its
meter started (the batch, the parameters) are left to the process structure above and counted
in ``ignored_frees``; storages a step adopted (made before it, first seen during it) are
allocated when its window opens, the best the trace can say.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from heptstudy.errors import HeptstudyError
from heptstudy.estimate.caching_allocator import AllocatorPeaks, CachingAllocator
from heptstudy.meters.allocation_trace import StepTrace
from heptstudy.units import MIB

#: Two cuBLAS workspaces of 32 MiB each: an assumption (see the module docstring).
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
    """Replay a bench process of ``len(steps)`` steps (step ``i`` runs the trace ``steps[i]``)
    in both allocator modes. Each step's batch and the parameters are the traces' resident
    storages (``inputs`` of each step, ``parameters`` of the first); ``optimizer_state`` (LAMB's
    ``exp_avg``/``exp_avg_sq``) defaults to the first trace's (a fake step whose optimizer was
    primed lists the state; when it was not, pass it)."""
    if not steps:
        raise HeptstudyError(
            "simulate_bench_process needs at least one step trace; got none. Trace the steps "
            "with heptstudy.meters.allocation_trace.TracingMemoryMeter first"
        )
    if passes not in ("both", "memory"):
        raise HeptstudyError(
            f"passes={passes!r} for the simulated bench process; allowed: 'both' (timed pass, "
            "then memory pass, as the bench runs by default) or 'memory'"
        )
    if warmup < 0:
        raise HeptstudyError(f"warmup={warmup}; it must be >= 0 (the bench's default is 2)")
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
