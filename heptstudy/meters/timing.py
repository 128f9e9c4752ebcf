"""Wall-clock time of training steps, with the device synchronised around the clock.

::

    timer, times = StepTimer(device), []
    for batch in batches:            # batches already on the device: loading is not timed
        with timer.step():
            train_step(batch)
        times.append(timer.seconds)
    summarize(times[warmup:]).mean_s # the first steps (kernel selection, allocator growth, lazy
                                     # initialisation) are timed but not counted

The clock is ``time.perf_counter``; the device is synchronised before the clock
starts (so queued work from before the step is not charged to it) and before it stops (so the
step's asynchronous kernels are).

Inside a timed step a :class:`PhaseClock` splits the time into the phases of
:data:`STEP_PHASES` without adding any synchronisation: on CPU, where every op has finished when
it returns, the wall clock at each phase boundary; on CUDA/ROCm, events recorded on the stream at
each boundary and read once the step timer has synchronised.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from heptstudy.train.step import PhaseClock


def synchronize(device: torch.device | str) -> None:
    """Wait for all queued work on ``device`` (a no-op on CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
    elif device.type == "xpu":
        torch.xpu.synchronize(device)


@dataclass(frozen=True)
class TimingSummary:
    mean_s: float | None
    std_s: float | None  # sample standard deviation (n - 1); 0.0 for one step
    min_s: float | None


class StepTimer:
    """Times one step at a time; ``seconds`` is the last step's time. Which steps count is the
    caller's record (the warm-up steps are timed too)."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.seconds: float | None = None

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        synchronize(self.device)
        start = time.perf_counter()
        yield
        synchronize(self.device)
        self.seconds = time.perf_counter() - start


def summarize(times: list[float]) -> TimingSummary:
    n = len(times)
    if n == 0:
        return TimingSummary(None, None, None)
    mean = sum(times) / n
    std = math.sqrt(sum((t - mean) ** 2 for t in times) / (n - 1)) if n > 1 else 0.0
    return TimingSummary(mean, std, min(times))


#: The phases of one training step, in order (see :mod:`heptstudy.train.step`).
STEP_PHASES = ("backbone_forward", "decoder_and_heads", "loss", "backward", "optimizer")


class WallPhaseClock(PhaseClock):
    """CPU: ``time.perf_counter`` at each boundary (CPU ops are synchronous)."""

    definition = (
        "wall clock (time.perf_counter) at the phase boundaries inside each timed step; CPU ops "
        "have finished when they return, so no synchronisation is added"
    )

    def __init__(self) -> None:
        super().__init__()
        self._stamps: list[tuple[str | None, object]] = []

    def _stamp(self):
        return time.perf_counter()

    def mark(self, phase: str) -> None:
        self._stamps.append((phase, self._stamp()))
        self.phase = phase

    def stop(self) -> None:
        self._stamps.append((None, self._stamp()))
        self.phase = None

    def seconds(self) -> dict[str, float] | None:
        return _between(self._stamps, lambda a, b: b - a)


class CudaPhaseClock(WallPhaseClock):
    """CUDA/ROCm: an event recorded on the current stream at each boundary; the times are the
    device's elapsed time between them, read after the step timer's synchronisation."""

    definition = (
        "CUDA events recorded on the stream at the phase boundaries of each timed step, read "
        "after the step's closing synchronisation; host work that holds the device up (the "
        "Hungarian matching on the host) counts in the phase that waits for it"
    )

    def _stamp(self):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self) -> dict[str, float] | None:
        if not self._stamps:
            return None
        self._stamps[-1][1].synchronize()  # already complete after the step timer's sync
        return _between(self._stamps, lambda a, b: a.elapsed_time(b) / 1000.0)


def _between(stamps, elapsed) -> dict[str, float] | None:
    """Time from each phase's mark to the next mark, summed per phase name."""
    if len(stamps) < 2 or stamps[-1][0] is not None:
        return None
    out: dict[str, float] = {}
    for (phase, start), (_, end) in zip(stamps, stamps[1:], strict=False):
        out[phase] = out.get(phase, 0.0) + float(elapsed(start, end))
    return out


def make_phase_clock(device: torch.device | str) -> PhaseClock:
    """The phase clock of ``device``: wall clock on CPU, CUDA events on CUDA/ROCm; on other
    devices (asynchronous, no events here) a clock that times nothing."""
    device = torch.device(device)
    if device.type == "cpu":
        return WallPhaseClock()
    if device.type == "cuda":
        return CudaPhaseClock()
    return PhaseClock()
