"""Wall-clock time of training steps, with the device synchronised around the clock.

::

    timer = StepTimer(device, warmup=2)
    for batch in batches:            # batches already on the device: loading is not timed
        with timer.step():
            train_step(batch)
    timer.summary().mean_s           # over counted steps only

The first ``warmup`` steps are timed but not counted (kernel selection, allocator growth, lazy
initialisation). The clock is ``time.perf_counter``; the device is synchronised before the clock
starts (so queued work from before the step is not charged to it) and before it stops (so the
step's asynchronous kernels are).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch


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
    warmup: int
    counted: int
    mean_s: float | None
    std_s: float | None  # sample standard deviation (n - 1); 0.0 for one counted step
    min_s: float | None
    max_s: float | None
    times_s: tuple[float, ...]  # counted steps only


@dataclass(frozen=True)
class StepTime:
    step: int  # 0-based index over all steps, warm-up included
    counted: bool
    seconds: float


class StepTimer:
    def __init__(self, device: torch.device | str = "cpu", warmup: int = 2):
        if warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {warmup}")
        self.device = torch.device(device)
        self.warmup = warmup
        self.records: list[StepTime] = []
        self._t0: float | None = None

    def start(self) -> None:
        if self._t0 is not None:
            raise RuntimeError("StepTimer.start called twice without stop")
        synchronize(self.device)
        self._t0 = time.perf_counter()

    def stop(self) -> StepTime:
        if self._t0 is None:
            raise RuntimeError("StepTimer.stop called without start")
        synchronize(self.device)
        seconds = time.perf_counter() - self._t0
        self._t0 = None
        index = len(self.records)
        record = StepTime(step=index, counted=index >= self.warmup, seconds=seconds)
        self.records.append(record)
        return record

    def cancel(self) -> None:
        """Forget a started step (e.g. one that ran out of memory)."""
        self._t0 = None

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        self.start()
        try:
            yield
        except BaseException:
            self.cancel()
            raise
        self.stop()

    @property
    def counted_times(self) -> list[float]:
        return [r.seconds for r in self.records if r.counted]

    def summary(self) -> TimingSummary:
        return summarize(self.counted_times, warmup=min(self.warmup, len(self.records)))


def summarize(times: list[float], warmup: int = 0) -> TimingSummary:
    n = len(times)
    if n == 0:
        return TimingSummary(warmup, 0, None, None, None, None, ())
    mean = sum(times) / n
    std = math.sqrt(sum((t - mean) ** 2 for t in times) / (n - 1)) if n > 1 else 0.0
    return TimingSummary(warmup, n, mean, std, min(times), max(times), tuple(times))
