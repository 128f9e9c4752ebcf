"""Wall-clock time of training steps, the device synchronised before the clock starts and
before it stops, so the step is charged its own asynchronous kernels only. Phase clocks add no
synchronisation.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator

import torch

from heptstudy.train.step import PhaseClock


class StepTimer:
    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.seconds: float | None = None

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        cuda = self.device.type == "cuda"  # CPU ops have finished when they return
        if cuda:
            torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        yield
        if cuda:
            torch.cuda.synchronize(self.device)
        self.seconds = time.perf_counter() - start


def summarize(times: list[float]) -> tuple[float | None, float | None, float | None]:
    """Mean, sample standard deviation (n - 1; 0.0 for one step) and minimum."""
    n = len(times)
    if n == 0:
        return None, None, None
    mean = sum(times) / n
    std = math.sqrt(sum((t - mean) ** 2 for t in times) / (n - 1)) if n > 1 else 0.0
    return mean, std, min(times)


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

    def mark(self, phase: str | None) -> None:
        self._stamps.append((phase, self._stamp()))
        self.phase = phase

    def stop(self) -> None:
        self.mark(None)  # the step's end

    @staticmethod
    def _elapsed(start, end) -> float:
        return end - start

    def seconds(self) -> dict[str, float] | None:
        stamps = self._stamps
        if len(stamps) < 2 or stamps[-1][0] is not None:
            return None
        out: dict[str, float] = {}
        for (phase, start), (_, end) in zip(stamps, stamps[1:], strict=False):
            out[phase] = out.get(phase, 0.0) + float(self._elapsed(start, end))
        return out


class CudaPhaseClock(WallPhaseClock):
    """CUDA/ROCm: an event recorded on the current stream at each boundary."""

    definition = (
        "CUDA events recorded on the stream at the phase boundaries of each timed step, read "
        "after the step's closing synchronisation; host work that holds the device up (the "
        "Hungarian matching on the host) counts in the phase that waits for it"
    )

    def _stamp(self):
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    @staticmethod
    def _elapsed(start, end) -> float:
        return start.elapsed_time(end) / 1000.0

    def seconds(self) -> dict[str, float] | None:
        if self._stamps:
            self._stamps[-1][1].synchronize()  # already complete after the step timer's sync
        return super().seconds()


def make_phase_clock(device: torch.device) -> WallPhaseClock:
    """A measurement runs on cpu or cuda (:attr:`MeasurementRequest.device`)."""
    return CudaPhaseClock() if device.type == "cuda" else WallPhaseClock()
