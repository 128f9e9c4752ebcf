"""The frames of :mod:`heptstudy.study.frames` as the report shows them."""

from __future__ import annotations

from typing import Any

from heptstudy.paths import ROOT

#: Columns that count something: shown as integers, never as ``2.0``.
_COUNTS = (
    "batch",
    "counted steps",
    "rounds",
    "max padded hits/event",
    "minor page faults/step",
    "events",
    "max hits",
    "max padded hits",
    "step",
)

_RUN_COLUMNS = {
    "name": "run",
    "allocator_line": "allocator",
    "status": "status",
    "batch_size": "batch",
    "checkpointing": "checkpointing",
    "peak_allocated_mib": "peak allocated [MiB]",
    "peak_reserved_mib": "peak reserved [MiB]",
    "mean_step_s": "step [s]",
    "rounds": "rounds",
    "counted_steps": "counted steps",
    "max_padded_hits": "max padded hits/event",
    "sys_pct": "system time [% of step]",
    "minor_faults_per_step": "minor page faults/step",
    "host": "measured on",
    "error": "error",
}


def integer_counts(table) -> Any:
    import pandas as pd

    table = table.copy()
    for col in table.columns:
        if col in _COUNTS:
            table[col] = pd.to_numeric(table[col], errors="coerce").round().astype("Int64")
    return table


def show(table, precision: int = 1, significant: bool = False) -> Any:
    """A table for the report: no index column, counts as integers, floats rounded to
    ``precision`` decimals (or to ``precision`` significant digits, for differences spanning
    orders of magnitude), missing values as a dash."""
    table = integer_counts(table)
    # a Styler writes its cells into the page as they are: text is escaped here (run, host and
    # platform names come from the user and from reports); headers too
    style = table.style.hide(axis="index").format_index(escape="html", axis=1)
    if significant:
        floats = [c for c in table.columns if table[c].dtype.kind == "f"]
        style = style.format(escape="html", na_rep="–")
        return style.format(f"{{:.{precision}g}}", subset=floats, na_rep="–")
    return style.format(precision=precision, thousands=",", na_rep="–", escape="html")


def runs_table(df) -> Any:
    """One row per configuration of the study, its step time the median over its rounds."""
    import pandas as pd

    if df.empty:
        return df
    key = ["allocator_line", "name"]
    timed = df[df["mean_step_s"].notna()].groupby(key)
    rows = (
        df[df["round"] == 1]
        .merge(timed["mean_step_s"].median().rename("median_step_s"), on=key, how="left")
        .merge(timed["round"].nunique().rename("rounds"), on=key, how="left")
    )
    rows["mean_step_s"] = rows["median_step_s"].where(
        rows["median_step_s"].notna(), rows["mean_step_s"]
    )
    rows["sys_pct"] = 100 * pd.to_numeric(rows["sys_fraction"], errors="coerce")
    order = ["allocator_line", "kind", "batch_size", "checkpointing", "name"]
    rows = rows.sort_values(order).reset_index(drop=True)
    cols = [c for c in _RUN_COLUMNS if c in rows.columns]
    table = rows[cols].rename(columns=_RUN_COLUMNS)
    for col in ("error", "system time [% of step]", "minor page faults/step", "rounds"):
        if col in table.columns and not table[col].notna().any():
            table = table.drop(columns=col)
    if "allocator" in table.columns and set(table["allocator"].dropna()) <= {"platform"}:
        table = table.drop(columns="allocator")
    return integer_counts(table)


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
        "step_time_overhead_pct": "step-time overhead, median [%]",
        "overhead_min_pct": "overhead min [%]",
        "overhead_max_pct": "overhead max [%]",
        "rounds": "rounds",
        "flag": "flag",
    }
    return _shown(comp, names)


def overhead_table(over) -> Any:
    names = {
        "allocator_line": "allocator",
        "batch_size": "batch",
        "policy": "policy",
        "rounds": "rounds",
        "off_step_s": "step off [s]",
        "on_step_s": "step on [s]",
        "overhead_median_pct": "overhead, median [%]",
        "overhead_min_pct": "min [%]",
        "overhead_max_pct": "max [%]",
        "off_sys_pct": "system time off [% of step]",
        "on_sys_pct": "system time on [% of step]",
        "flag": "flag",
    }
    table = _shown(over, names)
    table["allocator"] = table["allocator"].map(
        {"platform": "platform setting", "default": "default (as it comes)"}
    )
    return table


def policy_table(policies) -> Any:
    names = {
        "batch_size": "batch",
        "policy": "policy",
        "peak_allocated_mib": "peak allocated [MiB]",
        "peak_reserved_mib": "peak reserved [MiB]",
        "mean_step_s": "step [s]",
        "allocated_cut_pct": "allocated cut vs off [%]",
        "reserved_cut_pct": "reserved cut vs off [%]",
        "step_time_overhead_pct": "step-time overhead vs off, median [%]",
        "overhead_min_pct": "overhead min [%]",
        "overhead_max_pct": "overhead max [%]",
        "rounds": "rounds",
        "flag": "flag",
    }
    return _shown(policies, names)


def _shown(frame, names: dict[str, str]) -> Any:
    """The flag column only where some row carries a flag."""
    table = frame[[c for c in names if c in frame.columns]].rename(columns=names)
    if "flag" in table.columns and not table["flag"].fillna("").astype(bool).any():
        table = table.drop(columns="flag")
    return integer_counts(table.round(1))


def categories_table(categories) -> Any:
    table = categories.drop(columns=["device_kind"]).rename(
        columns={"batch_size": "batch", "peak_mib": "peak [MiB]"}
    )
    return integer_counts(table.round(1))


def predictions_table(predictions) -> Any:
    """No absolute path of the producing machine: paths inside the repository made relative."""
    root = str(ROOT) + "/"
    return show(
        predictions.map(lambda v: v.replace(root, "") if isinstance(v, str) else v), precision=3
    )
