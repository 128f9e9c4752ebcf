"""Whether a report can be trusted. Read as an input, a report is checked against itself: its
summary against its steps, its peaks against its memory categories; a report failing a check is
refused, naming the file, the field and the values. A measurement that ran on a busy host, or
whose counted steps waited far longer than they computed, is flagged (:func:`untrusted`) in the
bench's printed summary, the report's notes and the study's tables: one judgement, made here."""

from __future__ import annotations

import math
import os
from pathlib import Path
from statistics import fmean

from heptstudy.measure.report import BenchReport, ReportError, read_report
from heptstudy.units import MIB

#: A host is busy when its 1-minute load average exceeds the measurement's own threads by more
#: than this: other work competed for the cores.
LOAD_MARGIN = 1.0
#: A counted step stalled when its wall time exceeds its CPU time (user + system) by more than
#: this share of the wall time and :data:`STALL_MIN_S`: it waited (stopped, or starved of cores)
#: rather than computed. CPU measurements only: a GPU step's host waits for the device.
STALL_SHARE = 0.25
STALL_MIN_S = 0.05


def checked_report(path: str | os.PathLike) -> BenchReport:
    report = read_report(path)
    check_consistent(report, Path(path))
    return report


def check_consistent(report: BenchReport, path: Path) -> None:
    """Refuse a memory report whose summary or peaks contradict its own steps."""
    s = report.summary
    if report.kind != "memory" or report.status != "ok" or s is None:
        return

    def refuse(field: str, problem: str) -> ReportError:
        return ReportError(
            f"{path}: {field} {problem}; the report contradicts itself (edited, or written by a "
            "broken measurement), so it is not used. Measure it again with `heptstudy bench` or "
            "the study"
        )

    counted = [st for st in report.steps if st.counted]
    if s.counted_steps < 1:
        raise refuse("summary.counted_steps", f"is {s.counted_steps}: nothing was measured")
    if s.counted_steps != len(counted):
        raise refuse(
            "summary.counted_steps",
            f"is {s.counted_steps}, but steps holds {len(counted)} counted steps",
        )
    for st in counted:
        if st.time_s is not None and st.time_s <= 0:
            raise refuse(f"steps.{st.step}.time_s", f"is {st.time_s}: a step takes time")
    times = [st.time_s for st in counted if st.time_s is not None]
    if s.mean_step_time_s is not None and not times:
        raise refuse(
            "summary.mean_step_time_s", f"is {s.mean_step_time_s}, but no counted step is timed"
        )
    if times and not _same(s.mean_step_time_s, fmean(times)):
        raise refuse(
            "summary.mean_step_time_s",
            f"is {s.mean_step_time_s}, but the mean of the counted steps' time_s is {fmean(times)}",
        )
    for peak in ("allocated", "reserved"):
        values = [getattr(st, f"peak_{peak}_mib") for st in counted]
        largest = max((v for v in values if v is not None), default=None)
        stated = getattr(s, f"max_peak_{peak}_mib")
        if not _same(stated, largest):
            raise refuse(
                f"summary.max_peak_{peak}_mib",
                f"is {stated}, but the largest counted step's peak_{peak}_mib is {largest}",
            )
    for i, cat in enumerate(report.memory_categories or ()):
        where = f"memory_categories.{i}"
        step = next((st for st in counted if st.step == cat.step), None)
        if step is None:
            raise refuse(f"{where}.step", f"is {cat.step}, which is no counted step")
        if not _same(step.peak_allocated_mib, cat.peak_bytes / MIB):
            raise refuse(
                f"steps.{cat.step}.peak_allocated_mib",
                f"is {step.peak_allocated_mib}, but {where}.peak_bytes of that step is "
                f"{cat.peak_bytes} bytes ({cat.peak_bytes / MIB:.6g} MiB)",
            )
        held = sum(cat.at_peak_bytes.values())
        if held > cat.peak_bytes:
            raise refuse(
                f"{where}.at_peak_bytes",
                f"adds up to {held} bytes, more than the step's peak ({cat.peak_bytes} bytes)",
            )


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def untrusted(report: BenchReport) -> list[str]:
    """Why the step times of ``report`` cannot be trusted, in words; empty when nothing says so."""
    if report.kind != "memory" or report.summary is None or report.summary.mean_step_time_s is None:
        return []
    why, env = [], report.environment
    load = env.load_average_1min
    if load is not None and load > env.threads + LOAD_MARGIN:
        why.append(
            f"busy host: the 1-minute load average was {load:.1f} at the end, more than "
            f"{LOAD_MARGIN:.0f} above the {env.threads} threads the measurement used, so other "
            "work competed for the cores and the step times overstate the cost (measure again "
            "on a quiet machine)"
        )
    stalled = []
    for st in report.steps if env.device_kind == "cpu" else ():
        if not st.counted or st.time_s is None or st.user_time_s is None:
            continue
        cpu = st.user_time_s + (st.system_time_s or 0.0)
        if st.time_s - cpu > max(STALL_SHARE * st.time_s, STALL_MIN_S):
            stalled.append((st.step, st.time_s, cpu))
    if stalled:
        shown = ", ".join(
            f"step {i}: {wall:.2f} s wall, {cpu:.2f} s CPU" for i, wall, cpu in stalled
        )
        counted = sum(st.counted for st in report.steps)
        why.append(
            f"stalled steps: {len(stalled)} of {counted} counted steps waited more than they "
            f"computed ({shown[:300]}): the process was stopped or starved of cores, so the mean "
            "step time overstates the cost (measure again on a quiet machine)"
        )
    return why
