"""The frames of :mod:`heptstudy.study.frames` as the report shows them."""

from __future__ import annotations

from typing import Any

from heptstudy.paths import ROOT
from heptstudy.study.frames import COMPARISON_COLUMNS, OVERHEAD_COLUMNS, POLICY_COLUMNS

#: Columns that count something: shown as integers, never as ``2.0``.
_COUNTS = (
    "batch",
    "counted steps",
    "rounds",
    "max padded hits/event",
    "minor page faults/step",
    "events",
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
    "untrusted": "step time not to be trusted",
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
    """A table for the report, floats to ``precision`` decimals (significant digits with
    ``significant``: for differences spanning orders of magnitude)."""
    table = integer_counts(table)
    # a Styler writes cells into the page as they are: user and report text is escaped here
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
    rows["mean_step_s"] = rows["median_step_s"].fillna(rows["mean_step_s"])
    rows["sys_pct"] = 100 * pd.to_numeric(rows["sys_fraction"], errors="coerce")
    order = ["allocator_line", "kind", "batch_size", "checkpointing", "name"]
    rows = rows.sort_values(order).reset_index(drop=True)
    cols = [c for c in _RUN_COLUMNS if c in rows.columns]
    table = rows[cols].rename(columns=_RUN_COLUMNS)
    for col in ("error", "system time [% of step]", "minor page faults/step", "rounds"):
        if col in table.columns and not table[col].notna().any():
            table = table.drop(columns=col)
    flagged = "step time not to be trusted"
    if flagged in table.columns and not table[flagged].fillna("").astype(bool).any():
        table = table.drop(columns=flagged)
    if "allocator" in table.columns and set(table["allocator"].dropna()) <= {"platform"}:
        table = table.drop(columns="allocator")
    return integer_counts(table)


def comparison_table(comp) -> Any:
    return _shown(comp, COMPARISON_COLUMNS)


def overhead_table(over) -> Any:
    table = _shown(over, OVERHEAD_COLUMNS)
    table["allocator"] = table["allocator"].map(
        {"platform": "platform setting", "default": "default (as it comes)"}
    )
    return table


def policy_table(policies) -> Any:
    return _shown(policies, POLICY_COLUMNS)


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
