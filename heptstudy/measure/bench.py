"""One :class:`~heptstudy.measure.request.Measurement`: peak memory and step time (or
checkpointing parity) on real events, written as a self-describing JSON report. The report's
folder and the data set's size are checked first, so a measurement is never run only to be lost.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from heptstudy.atomic import Output, folder_write_problem
from heptstudy.committed import refuse_committed
from heptstudy.data.batching import (
    dataset_for,
    event_indices,
    load_events,
    to_device,
    validation_batches,
)
from heptstudy.data.layout import geometry_of
from heptstudy.errors import HeptstudyError
from heptstudy.estimate.plans import predictor_for
from heptstudy.measure import report as rp
from heptstudy.measure.parity import run_parity
from heptstudy.measure.report_checks import untrusted
from heptstudy.measure.request import PARITY, Measurement
from heptstudy.meters.allocator import apply_allocator, populate_heap
from heptstudy.meters.host_usage import HostUsage
from heptstudy.meters.memory import make_meter
from heptstudy.meters.timing import (
    STEP_PHASES,
    PhaseClock,
    StepTimer,
    make_phase_clock,
    summarize,
)
from heptstudy.model.flex_kernel import attention_status
from heptstudy.train.model_size import check_model_fits
from heptstudy.train.plan_table import check_table_on
from heptstudy.train.precision import autocast_dtype
from heptstudy.train.step import fresh_state, run_step
from heptstudy.train.validate import validate
from heptstudy.units import MIB


class OutputNotWritable(HeptstudyError):
    """The report could not be written where it was asked to go."""


def check_writable(path: Path, kind: Output = rp.REPORT_FILE) -> None:
    """Create the report's folder and try a file in it; a committed results folder, and a file
    that is not a report, are refused."""
    refuse_committed(
        path,
        "report path (--output / output)",
        "Leave it out (the report goes to experiments/local/scratch/) or choose your own folder, "
        "e.g. experiments/local/NAME.json",
    )
    if path.is_dir():
        raise OutputNotWritable(
            f"report path {str(path)!r} is a directory; give a file name such as "
            f"{str(path / 'NAME.json')!r}"
        )
    if kind.check(path, "--output"):
        print(
            f"note: {path} holds an earlier {kind.what}, which this one replaces when it is "
            "written; copy it elsewhere now to keep it",
            file=sys.stderr,
        )
    problem = folder_write_problem(path.parent, create=True)
    if problem is not None:
        raise OutputNotWritable(
            f"cannot write the report {str(path)!r}: {problem}; nothing was measured. Choose a "
            "writable folder (--output / output) or fix its permissions"
        )


def _steps(request) -> int:
    return 1 if request.kind == PARITY else request.warmup + request.steps


def check_event_counts(m: Measurement) -> None:
    """The data set holds the events the measurement needs: a batch of its own for every step, and
    the test-split events its validation reads. Counts only, from the data set's metadata."""
    request, config = m.request, m.config
    train = dataset_for(config, "train")
    need = request.batch_size * _steps(request)
    if need > len(train):
        steps = (
            "one batch"
            if request.kind == PARITY
            else f"{request.warmup} warm-up + {request.steps} counted steps"
        )
        raise HeptstudyError(
            f"batch_size={request.batch_size} x {steps} needs {need} events of the train split, "
            f"but {train.name} in {config.data.data_dir} holds {len(train)}; lower the batch "
            "size or the steps, or generate more events (heptstudy data generate)"
        )
    if request.kind != PARITY:
        test = dataset_for(config, "test")
        need = config.data.nvalid + config.data.ntest
        if need > len(test):
            raise HeptstudyError(
                f"validation after the measurement needs {need} events of the test split "
                f"(data.nvalid={config.data.nvalid}, data.ntest={config.data.ntest}), but "
                f"{test.name} in {config.data.data_dir} holds {len(test)}; lower the batch size "
                "or data.nvalid, or generate more test events"
            )


def check_enough_events(m: Measurement) -> None:
    """Every step has its own events (none repeated, none empty); validation reads test-split
    events."""
    check_event_counts(m)
    config = m.config
    batches = event_indices(config, m.request.batch_size, _steps(m.request))
    empty = dataset_for(config, "train").empty_events([i for batch in batches for i in batch])
    if empty:
        raise HeptstudyError(
            f"{len(empty)} of the events this measurement would use hold no hits: "
            f"{'; '.join(empty[:5])}{'; ...' if empty[5:] else ''}. A batch counts them as "
            "events while they add no work, so nothing was measured. Draw other events with "
            "another seed (--set train.seed=N), or use a data set without empty events"
        )


def run_bench(
    m: Measurement, announce: Callable[[rp.BenchReport], None] | None = None
) -> rp.BenchReport:
    """Measure ``m`` and write its report. ``announce`` sees the report before it is written,
    so a failed write loses nothing (:class:`~heptstudy.atomic.WriteFailed` says where it is)."""
    fresh = rp.claim_fresh_process()
    allocator = apply_allocator(m.allocator)  # before the measurement allocates anything
    request, config, device, output = m.request, m.config, m.device, m.report_path
    check_writable(output)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise HeptstudyError(
            f"platform {request.platform!r} is a GPU profile but this PyTorch sees no GPU "
            f"(torch {torch.__version__}); run it on the target machine or use "
            "configs/training/platforms/local_cpu.yaml"
        )
    check_enough_events(m)
    check_model_fits(config, device)
    check_table_on(config, [m.plan], device.type)
    dtype = autocast_dtype(config, device)
    if request.deterministic:
        if device.type == "cuda":
            # cuBLAS needs a fixed workspace before its first call to be deterministic.
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    synthetic = bool(dataset_for(config, "train").metadata.get("synthetic", False))
    batches = [
        to_device(load_events(config, idx, "train"), device)
        for idx in event_indices(config, request.batch_size, _steps(request))
    ]
    header = report_header(m, fresh_process=fresh, synthetic=synthetic, allocator=allocator)
    if request.kind == PARITY:
        report = rp.BenchReport(
            kind="parity",
            status="ok",
            parity=run_parity(config, batches[0], device, dtype),
            **header,
        )
    else:
        report = _memory_report(m, dtype, batches, header)
    report.environment.load_average_1min = rp.load_average()
    report.notes += untrusted(report)
    # read after the run: the kernel compiles happen during it
    report.environment.attention = rp.AttentionInfo(**attention_status(config))
    if announce is not None:
        announce(report)
    rp.write_report(report, output, keep=True)
    return report


def report_header(
    m: Measurement,
    *,
    fresh_process: bool,
    synthetic: bool,
    allocator=None,
    notes: list[str] | tuple[str, ...] = (),
) -> dict[str, Any]:
    """The fields every report of ``m`` starts with, failure reports of a study included."""
    config = m.config
    return dict(
        name=m.name,
        environment=rp.environment_info(
            m.device,
            config.train.dtype,
            m.profile.name if m.profile else None,
            fresh_process=fresh_process,
            allocator=allocator,
        ),
        data=rp.DataInfo(
            dataset=config.data.dataset,
            data_dir=config.data.data_dir,
            synthetic=synthetic,
            split="train",
        ),
        config=config.to_dict(),
        batch_size=m.batch_size,
        checkpointing=rp.Checkpointing(
            plan=m.plan.name if m.request.kind != PARITY else None,
            keep={k: sorted(v) for k, v in m.plan.kind_keep} if m.plan.kind_keep else None,
        ),
        notes=[*notes, *(["data: synthetic (generated) events"] if synthetic else [])],
    )


def _step_records(batches, warmup: int) -> list[dict[str, Any]]:
    return [
        {
            "step": i,
            "counted": i >= warmup,
            "event_indices": b["event_index"].tolist(),
            "hits": b["length"].tolist(),
            "padded_hits": b["padded_length"].tolist(),
            "geometry": geometry_of(b),
            "time_s": None,
            "peak_allocated_mib": None,
            "peak_reserved_mib": None,
        }
        for i, b in enumerate(batches)
    ]


class _Steps:
    """The steps both passes run: the same batches under the same plans, a fresh model each."""

    def __init__(self, m: Measurement, dtype, batches, header) -> None:
        self.m, self.dtype, self.batches = m, dtype, batches
        self.records = _step_records(batches, m.request.warmup)
        # activation_checkpointing=auto: every step's plan chosen before any model exists
        plans = predictor_for(
            m.config,
            m.device,
            m.request.batch_size,
            m.profile,
            covering=[r["geometry"] for r in self.records],
            progress=m.request.progress,
        )
        self.plans = [plans.choose_for(b) if plans is not None else None for b in batches]
        for record, choice in zip(self.records, self.plans, strict=True):
            record.update(choice.fields() if choice is not None else {})
        if plans is not None:
            header["checkpointing"].memory_budget_mib = plans.budget_mib
            header["notes"].append(plans.describe())
        self.step, self.where, self.clock = 0, "timing pass", None

    def run(self, state, step: int, clock, meter=None):
        self.step, self.clock = step, clock
        model, optimizer, scheduler = state
        choice = self.plans[step]
        return run_step(
            model,
            self.batches[step],
            optimizer,
            scheduler,
            self.m.config,
            self.dtype,
            meter=meter,
            clock=clock,
            plan=None if choice is None else choice.plan,
        )


def _timed_pass(steps: _Steps, notes: list[str], bar) -> None:
    """Pass 1: time the steps and their phases, without any tracker."""
    device, records = steps.m.device, steps.records
    timer = StepTimer(device)
    state = fresh_state(steps.m.config, device)
    for step in range(len(steps.batches)):
        if step == steps.m.request.warmup and device.type == "cpu" and (mapped := populate_heap()):
            notes.append(
                f"the heap's free top grown to the pad and its {mapped / MIB:,.0f} MiB "
                "mapped after the warm-up (no counted step faults in a page the "
                "allocator already holds)"
            )
        clock = make_phase_clock(device)
        with timer.step(), HostUsage() as usage:
            result = steps.run(state, step, clock)
        records[step]["time_s"] = timer.seconds
        records[step]["phase_time_s"] = clock.seconds()
        records[step].update(asdict(usage))
        records[step]["loss"] = {k: float(v) for k, v in result.losses.items()}  # untimed
        bar.update(1)


def _memory_pass(steps: _Steps, bar):
    """Pass 2: memory, over the same batches from the same initial state; then validation.
    Returns the last step's memory, the categories at the highest counted peak, validation."""
    steps.where = "memory pass"
    device, records = steps.m.device, steps.records
    meter = make_meter(device, track_categories=True)
    state = fresh_state(steps.m.config, device)
    mem = categories = None
    for step in range(len(steps.batches)):
        # knows the phase (for an out-of-memory), times nothing
        mem = steps.run(state, step, PhaseClock(), meter).memory
        records[step]["peak_allocated_mib"] = mem.peak_allocated_mib
        records[step]["peak_reserved_mib"] = mem.peak_reserved_mib
        if records[step]["counted"] and mem.categories_at_peak is not None:
            if categories is None or mem.peak_allocated_bytes > categories.peak_bytes:
                categories = rp.MemoryCategories(
                    step=step,
                    peak_bytes=mem.peak_allocated_bytes,
                    at_peak_bytes=mem.categories_at_peak,
                    by_module_bytes=mem.by_module_at_peak,
                    note=_CATEGORY_NOTE,
                )
        bar.update(1)
    steps.where, steps.clock = "validation", None
    batch_size = steps.m.request.batch_size
    held_out = [to_device(b, device) for b in validation_batches(steps.m.config, batch_size)]
    validation, _ = validate(state[0], held_out, steps.m.config, device, steps.dtype)
    return mem, categories, validation


def _oom_report(steps: _Steps, err: torch.OutOfMemoryError, header) -> rp.BenchReport:
    batch, clock, device = steps.batches[steps.step], steps.clock, steps.m.device
    phase = steps.where if clock is None or clock.phase is None else f"{steps.where}: {clock.phase}"
    return rp.BenchReport(
        kind="memory",
        status="oom",
        steps=[rp.StepRecord(**r) for r in steps.records[: steps.step]],
        oom=rp.OomInfo(
            message=str(err).splitlines()[0],
            step=steps.step,
            phase=phase,
            batch_size=steps.m.request.batch_size,
            padded_hits=batch["padded_length"].tolist(),
            padded_batch_hits=int(batch["X"].shape[0] * batch["X"].shape[1]),
            device_memory_bytes=torch.cuda.get_device_properties(device).total_memory
            if device.type == "cuda"
            else None,
        ),
        **header,
    )


def _summary(steps: _Steps, mem) -> rp.Summary:
    counted = [r for r in steps.records if r["counted"]]
    mean_s, std_s, min_s = summarize([r["time_s"] for r in counted if r["time_s"] is not None])
    passes, device = steps.m.request.passes, steps.m.device
    return rp.Summary(
        counted_steps=len(counted),
        warmup_steps=steps.m.request.warmup,
        mean_step_time_s=mean_s,
        std_step_time_s=std_s,
        min_step_time_s=min_s,
        max_peak_allocated_mib=_max(r["peak_allocated_mib"] for r in counted),
        max_peak_reserved_mib=_max(r["peak_reserved_mib"] for r in counted),
        allocated_definition=mem.allocated_definition if mem else None,
        reserved_definition=mem.reserved_definition if mem else None,
        reserved_unavailable_reason=mem.reserved_unavailable_reason if mem else None,
        tracked_memory_note=_PASSES_NOTE[passes],
        mean_phase_time_s=mean_phases([r.get("phase_time_s") for r in counted]),
        phase_time_definition=make_phase_clock(device).definition,
    )


def _memory_report(m: Measurement, dtype, batches, header) -> rp.BenchReport:
    steps = _Steps(m, dtype, batches, header)
    timing, memory = m.request.passes in ("both", "timing"), m.request.passes in ("both", "memory")
    bar = tqdm(
        total=(timing + memory) * len(batches),
        disable=not m.request.progress,
        desc=header["name"],
        unit="step",
    )
    mem, categories, validation = None, None, {}
    try:
        if timing:
            _timed_pass(steps, header["notes"], bar)
        if memory:
            mem, categories, validation = _memory_pass(steps, bar)
    except torch.OutOfMemoryError as err:
        return _oom_report(steps, err, header)
    finally:
        bar.close()
    return rp.BenchReport(
        kind="memory",
        status="ok",
        steps=[rp.StepRecord(**r) for r in steps.records],
        summary=_summary(steps, mem),
        validation={k: float(v) for k, v in validation.items() if v is not None}
        if memory
        else None,
        memory_categories=[categories] if categories else None,
        **header,
    )


_PASSES_NOTE = {
    "both": "times from untracked steps (pass 1); memory from a second pass over the same "
    "batches from the same initial state with the meter on (pass 2)",
    "timing": "timing only (passes=timing): untracked steps, no memory pass and no validation",
    "memory": "memory only (passes=memory): steps under the meter, no timed pass",
}


def mean_phases(per_step: list[dict[str, float] | None]) -> dict[str, float] | None:
    """The mean time of each phase over steps that all have a breakdown; None otherwise."""
    if not per_step or any(p is None for p in per_step):
        return None
    names = [n for n in STEP_PHASES if any(n in p for p in per_step)]
    return {n: sum(p.get(n, 0.0) for p in per_step) / len(per_step) for n in names}


_CATEGORY_NOTE = (
    "live tensor-storage bytes by category at the step's peak (storage tracker): parameters and "
    "buffers, gradients, optimizer state, activations saved for backward, inputs (the batch), "
    "temporaries (the rest); by_module_bytes files the same bytes under the module that made "
    "each storage (a checkpointed layer's recomputation included; [int/bool]: its index and "
    "mask storages), else the phase (loss, backward), else the baseline category"
)


def _max(values) -> float | None:
    return max((v for v in values if v is not None), default=None)
