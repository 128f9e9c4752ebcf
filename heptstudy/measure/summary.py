"""Plain-words summaries and tables of reports, shared by the CLI and the notebooks."""

from __future__ import annotations

from heptstudy.measure.report import BenchReport


def describe(report: BenchReport) -> str:
    """A few lines saying what a report found."""
    head = (
        f"{report.name}: {report.environment.device_name} ({report.environment.device_kind}), "
        f"{report.environment.dtype}, batch {report.batch_size}, "
        f"data {'synthetic' if report.data.synthetic else 'real'} {report.data.dataset}"
    )
    if report.status == "oom":
        return f"{head}\n  out of memory at step {report.oom.step} ({report.oom.phase}): padded hits {report.oom.padded_hits}"
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
    return (
        f"{head}\n  checkpointing {'on' if report.checkpointing.enabled else 'off'}: "
        f"peak allocated {s.max_peak_allocated_mib:,.0f} MiB, peak reserved "
        f"{'n/a' if s.max_peak_reserved_mib is None else f'{s.max_peak_reserved_mib:,.0f} MiB'}, "
        f"mean step {s.mean_step_time_s * 1000:,.0f} ms over {s.counted_steps} counted steps"
    )
