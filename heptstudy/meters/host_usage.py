"""Page faults and system/user CPU time of the whole process around a step. A step with much
system time spends it mapping and zeroing pages its allocator returned; the study flags those.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass


@dataclass
class HostUsage:
    minor_page_faults: int | None = None
    major_page_faults: int | None = None
    system_time_s: float | None = None
    user_time_s: float | None = None

    def __enter__(self) -> HostUsage:
        self._start = resource.getrusage(resource.RUSAGE_SELF)
        return self

    def __exit__(self, *exc) -> None:
        end = resource.getrusage(resource.RUSAGE_SELF)
        self.minor_page_faults = end.ru_minflt - self._start.ru_minflt
        self.major_page_faults = end.ru_majflt - self._start.ru_majflt
        self.system_time_s = end.ru_stime - self._start.ru_stime
        self.user_time_s = end.ru_utime - self._start.ru_utime
