"""The frames of :mod:`heptstudy.study.frames` as the report shows them: named columns, rounded."""

from __future__ import annotations

from typing import Any

_RUN_COLUMNS = {
    "name": "run",
    "status": "status",
    "batch_size": "batch",
    "checkpointing": "checkpointing",
    "peak_allocated_mib": "peak allocated [MiB]",
    "peak_reserved_mib": "peak reserved [MiB]",
    "mean_step_s": "mean step [s]",
    "counted_steps": "counted steps",
    "max_padded_hits": "max padded hits/event",
    "error": "error",
}


def runs_table(df) -> Any:
    """The runs of an experiments directory, as shown in the report."""
    if df.empty:
        return df
    cols = [c for c in _RUN_COLUMNS if c in df.columns]
    df = df.sort_values(["kind", "batch_size", "checkpointing", "name"]).reset_index(drop=True)
    table = df[cols].rename(columns=_RUN_COLUMNS)
    if not table["error"].notna().any():
        table = table.drop(columns="error")
    return table.round(2)


def comparison_table(comp) -> Any:
    names = {
        "batch_size": "batch",
        "baseline_allocated_mib": "allocated off [MiB]",
        "checkpointed_allocated_mib": "allocated on [MiB]",
        "allocated_reduction_pct": "allocated reduction [%]",
        "baseline_reserved_mib": "reserved off [MiB]",
        "checkpointed_reserved_mib": "reserved on [MiB]",
        "reserved_reduction_pct": "reserved reduction [%]",
        "baseline_step_s": "step off [s]",
        "checkpointed_step_s": "step on [s]",
        "step_time_overhead_pct": "step-time overhead [%]",
    }
    return comp.rename(columns=names).round(1)


def policy_table(policies) -> Any:
    """:func:`~heptstudy.study.policies.policy_frame` with named columns."""
    names = {
        "batch_size": "batch",
        "policy": "policy",
        "peak_allocated_mib": "peak allocated [MiB]",
        "peak_reserved_mib": "peak reserved [MiB]",
        "mean_step_s": "mean step [s]",
        "allocated_cut_pct": "allocated cut vs off [%]",
        "reserved_cut_pct": "reserved cut vs off [%]",
        "step_time_overhead_pct": "step-time overhead vs off [%]",
    }
    return policies[list(names)].rename(columns=names).round(1)


def categories_table(categories) -> Any:
    """:func:`~heptstudy.study.policies.categories_frame` with named columns (MiB)."""
    table = categories.drop(columns=["device_kind"]).rename(
        columns={"batch_size": "batch", "peak_mib": "peak [MiB]"}
    )
    return table.round(1)
