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
   outputs are deleted before the update), the update's temporaries if a trace of them is given,
   LAMB's state allocated after step 0's window (and kept), the gradients freed
   (``zero_grad(set_to_none=True)``);
4. between the passes the first model, its gradients and its optimizer state freed (``del
   state``); the cached segments stay (no ``empty_cache``).

The peaks of the memory pass are returned. Blocks a trace frees that were resident when its
meter started (the batch, the parameters) are left to the process structure above and counted
in ``ignored_frees``; storages a step adopted (made before it, first seen during it) are
allocated when its window opens, the best the trace can say.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from heptstudy.errors import HeptstudyError
from heptstudy.estimate.caching_allocator import AllocatorPeaks, CachingAllocator
from heptstudy.meters.allocation_trace import StepTrace
from heptstudy.units import MIB

#: Two cuBLAS workspaces of 32 MiB each: an assumption (see the module docstring).
CUBLAS_WORKSPACES = (32 * MIB, 32 * MIB)

ASSUMPTIONS = (
    "caching allocator simulated (c10/cuda/CUDACachingAllocator.cpp rules, one stream, default "
    "settings, no empty_cache)",
    "two cuBLAS workspaces of 32 MiB each allocated after the parameters (assumed, not traced)",
    "kernel-internal scratch only as far as the step's trace contains it",
)


@dataclass(frozen=True)
class BenchProcessPeaks:
    """Per-step peaks of the memory pass, native and with expandable segments."""

    native: list[AllocatorPeaks]
    expandable: list[AllocatorPeaks]
    warmup: int
    ignored_frees: int
    assumptions: tuple[str, ...] = field(default=ASSUMPTIONS)

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
    batches: Sequence[Sequence[int]] | None = None,
    parameters: Sequence[int] | None = None,
    optimizer_state: Sequence[int] | None = None,
    update_traces: Sequence[StepTrace | None] | None = None,
    workspaces: Sequence[int] = CUBLAS_WORKSPACES,
) -> BenchProcessPeaks:
    """Replay a bench process of ``len(steps)`` steps (step ``i`` runs the trace ``steps[i]``)
    in both allocator modes.

    ``batches`` (storage sizes of each step's batch), ``parameters`` (parameters and buffers)
    and ``optimizer_state`` (LAMB's ``exp_avg``/``exp_avg_sq``) default to the traces' own
    resident storages: ``inputs`` of each step, ``parameters`` and ``optimizer_state`` of the
    first (a fake step whose optimizer was primed lists the state; when it was not, pass it).
    ``update_traces[i]``: the optimizer update's allocations of step ``i`` (temporaries), if
    traced."""
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
    if update_traces is not None and len(update_traces) != len(steps):
        raise HeptstudyError(
            f"{len(update_traces)} update traces for {len(steps)} steps; give one per step "
            "(None where a step's update was not traced) or none at all"
        )
    if batches is None:
        batches = [t.resident_bytes("inputs") for t in steps]
    if len(batches) != len(steps):
        raise HeptstudyError(
            f"{len(batches)} batches for {len(steps)} steps; the bench moves one batch per step"
        )
    parameters = steps[0].resident_bytes("parameters") if parameters is None else parameters
    if optimizer_state is None:
        optimizer_state = steps[0].resident_bytes("optimizer_state")
    runs = {}
    ignored = 0
    for mode, expandable in (("native", False), ("expandable", True)):
        replayer = _Process(CachingAllocator(expandable_segments=expandable))
        peaks = replayer.run(
            steps,
            passes=passes,
            batches=batches,
            parameters=parameters,
            optimizer_state=optimizer_state,
            update_traces=update_traces,
            workspaces=workspaces,
        )
        runs[mode] = peaks
        ignored = replayer.ignored_frees
    return BenchProcessPeaks(
        native=runs["native"],
        expandable=runs["expandable"],
        warmup=min(warmup, len(steps) - 1),
        ignored_frees=ignored,
    )


class _Process:
    def __init__(self, alloc: CachingAllocator):
        self.alloc = alloc
        self.ignored_frees = 0
        self._next = 0

    def _new(self, nbytes: int) -> int:
        self._next += 1
        self.alloc.malloc(self._next, nbytes)
        return self._next

    def _replay(self, events, resident: set[int], names: dict[int, int]) -> None:
        malloc, free = self.alloc.malloc, self.alloc.free
        for kind, block, nbytes in events:
            if kind == "alloc":
                self._next += 1
                names[block] = self._next
                malloc(self._next, nbytes)
            elif block in names:
                free(names.pop(block))
            elif block in resident:
                self.ignored_frees += 1
            else:
                raise HeptstudyError(
                    f"a step trace frees block {block} ({nbytes} bytes) that it never "
                    "allocated and that was not resident at its start; the trace is incomplete"
                )

    def _step(self, trace: StepTrace, update: StepTrace | None, state, first: bool):
        names: dict[int, int] = {}
        resident = {b for b, _, _ in trace.resident}
        for block, nbytes in trace.adopted:
            self._next += 1
            names[block] = self._next
            self.alloc.malloc(self._next, nbytes)
        self.alloc.reset_peak()
        self._replay(trace.events, resident, names)
        peaks = self.alloc.peaks()  # what the meter reads at the step's end
        grads = [names.pop(b) for b in sorted(trace.gradient_ids) if b in names]
        for block in list(names):  # outputs, losses: gone before the update
            self.alloc.free(names.pop(block))
        if update is not None:
            temp: dict[int, int] = {}
            self._replay(update.events, {b for b, _, _ in update.resident}, temp)
            for block in list(temp):
                self.alloc.free(temp.pop(block))
        if first:
            state.extend(self._new(n) for n in self._state_sizes)
        for g in grads:
            self.alloc.free(g)
        return peaks

    def run(
        self, steps, *, passes, batches, parameters, optimizer_state, update_traces, workspaces
    ):
        self._state_sizes = list(optimizer_state)
        for batch in batches:
            for nbytes in batch:
                self._new(nbytes)
        out: list[AllocatorPeaks] = []
        for n_pass in range(2 if passes == "both" else 1):
            params = [self._new(n) for n in parameters]
            if n_pass == 0:
                for nbytes in workspaces:
                    self._new(nbytes)
            state: list[int] = []
            out = []
            for i, trace in enumerate(steps):
                update = update_traces[i] if update_traces is not None else None
                out.append(self._step(trace, update, state, first=i == 0))
            for block in params + state:
                self.alloc.free(block)
        return out


def simulate_repeated_step(
    trace: StepTrace, *, warmup: int = 2, steps: int = 3, passes: Literal["both", "memory"] = "both"
) -> BenchProcessPeaks:
    """A bench process whose every step runs the batch of ``trace`` (the bench's defaults:
    2 warm-up and 3 counted steps, both passes): the peaks an estimated memory model is fitted
    on for that batch's shape."""
    return simulate_bench_process([trace] * (warmup + steps), warmup=warmup, passes=passes)


__all__ = [
    "ASSUMPTIONS",
    "CUBLAS_WORKSPACES",
    "BenchProcessPeaks",
    "simulate_bench_process",
    "simulate_repeated_step",
]
