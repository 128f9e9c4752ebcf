"""Plain-words summaries and tables of reports, shared by the CLI and the notebooks."""

from __future__ import annotations

from typing import Any

from heptstudy.measure.report import BenchReport
from heptstudy.measure.report_checks import untrusted
from heptstudy.meters.allocator import allocator_label
from heptstudy.model.adaptive_checkpointing import AUTO_NOTE
from heptstudy.model.checkpoint_plan import AUTO, OFF


def describe(report: BenchReport) -> str:
    """A few lines saying what a report found."""
    head = (
        f"{report.name}: {report.environment.device_name} ({report.environment.device_kind}), "
        f"{report.environment.dtype}, batch {report.batch_size}, "
        f"data {'synthetic' if report.data.synthetic else 'real'} {report.data.dataset}"
    )
    if report.status == "oom":
        return f"{head}\n  out of memory at step {report.oom.step} ({report.oom.phase}): padded hits {report.oom.padded_hits}"
    if report.status == "error" or (report.summary is None and report.parity is None):
        return f"{head}\n  no measurement: {report.error}"
    if report.kind == "parity":
        p = report.parity
        c, r = p.checkpointed_vs_baseline, p.repeat_vs_baseline
        eq_out = sum(o.equal for o in c.outputs)
        eq_grad = sum(bool(g.equal) for g in c.gradients)
        within = sum(
            bool(g.equal) or g.max_abs_diff <= h.max_abs_diff
            for g, h in zip(c.gradients, r.gradients, strict=True)
        )
        return (
            f"{head}\n  outputs equal: {eq_out}/{c.num_outputs}; loss equal: {c.loss.equal} "
            f"(max |d| {c.loss.max_abs_diff:.3g}); gradients equal: {eq_grad}/{c.num_gradients}, "
            f"within the repeat's own difference: {within}/{c.num_gradients}; deterministic: {p.deterministic}"
        )
    s = report.summary
    c = report.checkpointing
    setting = c.plan or "off"
    if setting == "auto" and c.memory_budget_mib:
        setting += f" (budget {c.memory_budget_mib:,.0f} MiB; plans per step in the report)"
    text = (
        f"{head}\n  checkpointing {setting}: "
        f"peak allocated {_mib(s.max_peak_allocated_mib)}, "
        f"peak reserved {_mib(s.max_peak_reserved_mib)}, mean step "
        f"{'not timed' if s.mean_step_time_s is None else f'{s.mean_step_time_s * 1000:,.0f} ms'}"
        f" over {s.counted_steps} counted steps"
    )
    # which plans auto tried and why in that order (a cost table passed over says why here)
    text += "".join(f"\n  {n}" for n in report.notes if n.startswith(AUTO_NOTE))
    if s.mean_phase_time_s:
        parts = ", ".join(
            f"{PHASE_LABELS.get(k, k)} {v * 1000:,.0f} ms" for k, v in s.mean_phase_time_s.items()
        )
        text += f"\n  of which {parts}"
    text += "".join(f"\n  not to be trusted: {why}" for why in untrusted(report))
    # on a CPU, the allocator the process ran with, and what its defaults do to step times
    env = report.environment
    if env.device_kind == "cpu" and env.allocator and s.mean_step_time_s is not None:
        text += f"\n  allocator: {allocator_label(report)}"
        if not env.allocator_settings:
            text += (
                ": freed memory goes back to the kernel, so these step times include its page "
                "faults (a measurement with allocator: platform applies local_cpu's setting)"
            )
    return text


def _mib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f} MiB"


#: How the step phases are called in tables and figures.
PHASE_LABELS = {
    "backbone_forward": "backbone forward",
    "decoder_and_heads": "decoder and heads",
    "loss": "loss (incl. matching)",
    "backward": "backward",
    "optimizer": "optimizer",
}


def step_breakdown_frame(reports) -> Any:
    """Mean seconds per step phase of each successful memory report that has a breakdown:
    one row per report (name, batch size, checkpointing, device, synthetic, mean step time and
    a column per phase). ``reports``: reports or ``(path, report)`` pairs."""
    import pandas as pd

    rows = []
    for item in reports:
        r = item[1] if isinstance(item, tuple) else item
        s = r.summary
        if r.kind != "memory" or r.status != "ok" or s is None or not s.mean_phase_time_s:
            continue
        rows.append(
            {
                "name": r.name,
                "batch_size": r.batch_size,
                # on, off or auto: the column the phase table sorts by
                "checkpointing": "auto" if r.plan is AUTO else r.plan is not OFF,
                "device": r.environment.device_name,
                "synthetic": r.data.synthetic,
                "mean_step_s": s.mean_step_time_s,
                **{PHASE_LABELS.get(k, k): v for k, v in s.mean_phase_time_s.items()},
            }
        )
    phases = list(PHASE_LABELS.values())
    columns = ["name", "batch_size", "checkpointing", "device", "synthetic", "mean_step_s"]
    df = pd.DataFrame(rows, columns=columns + phases)
    return df.sort_values(["batch_size", "checkpointing", "name"], ignore_index=True)
