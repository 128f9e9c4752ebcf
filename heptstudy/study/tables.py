"""The frames of :mod:`heptstudy.study.frames` as the report shows them."""

from __future__ import annotations

from typing import Any

from heptstudy.paths import ROOT
from heptstudy.study.frames import (
    COMPARISON_COLUMNS,
    OVERHEAD_COLUMNS,
    policy_rank,
)

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
    "batching": "batching",
    "policy_label": "plan",
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
    if "policy_label" in rows.columns:
        rows["plan_rank"] = rows["policy_label"].map(policy_rank)
    order = ["allocator_line", "kind", "batch_size", "packed_batches", "plan_rank", "name"]
    rows = rows.sort_values([c for c in order if c in rows.columns]).reset_index(drop=True)
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
    return _on_padded_batches(_shown(comp, COMPARISON_COLUMNS))


def overhead_table(over) -> Any:
    table = _on_padded_batches(_shown(over, OVERHEAD_COLUMNS))
    table["allocator"] = table["allocator"].map(
        {"platform": "platform setting", "default": "default (as it comes)"}
    )
    return table


def _on_padded_batches(table) -> Any:
    """A batching column next to the batch size: the frames that compare plans with ``off``
    take padded batches only (:func:`heptstudy.study.frames.of_batching`), packed ones are
    compared in the packing table."""
    at = list(table.columns).index("batch") + 1 if "batch" in table.columns else 0
    table.insert(at, "batching", "padded")
    return table


def _shown(frame, names: dict[str, str]) -> Any:
    """The flag column only where some row carries a flag."""
    table = frame[[c for c in names if c in frame.columns]].rename(columns=names)
    if "flag" in table.columns and not table["flag"].fillna("").astype(bool).any():
        table = table.drop(columns="flag")
    return integer_counts(table.round(1))


def categories_table(categories, runs=None) -> Any:
    """With ``runs`` (:func:`~heptstudy.study.frames.reports_frame`), each run's batching next to
    its batch size: padded and packed runs of one batch size and plan are told apart."""
    table = categories.drop(columns=["device_kind"])
    if runs is not None and "batching" in runs.columns:
        batching = runs.drop_duplicates("name").set_index("name")["batching"]
        table.insert(
            list(table.columns).index("batch_size") + 1, "batching", table["name"].map(batching)
        )
    table = table.rename(
        columns={"name": "run", "batch_size": "batch", "policy": "plan", "peak_mib": "peak [MiB]"}
    )
    table = table.rename(columns=lambda c: c.replace("_", " "))  # optimizer_state
    return integer_counts(table.round(1))


_PARITY_COLUMNS = {
    "report": "run",
    "batch_size": "batch",
    "batching": "batching",
    "deterministic": "deterministic",
    "comparison": "comparison",
    "outputs_equal": "outputs equal",
    "outputs_max_abs_diff": "outputs max |diff|",
    "loss_equal": "loss equal",
    "loss_abs_diff": "loss |diff|",
    "gradients_equal": "gradients equal",
    "grad_rel_l2_max": "gradient rel. L2, max",
    "grad_rel_l2_median": "gradient rel. L2, median",
    "grad_max_abs_diff": "gradient max |diff|",
}


def parity_table(parity, runs) -> Any:
    """:func:`~heptstudy.study.frames.parity_frame` in words, each run's batch size and batching
    from ``runs`` (:func:`~heptstudy.study.frames.reports_frame`)."""
    geometry = runs.drop_duplicates("name").set_index("name")
    table = parity.copy()
    for col in ("batch_size", "batching"):
        if col in geometry.columns:
            table[col] = table["report"].map(geometry[col])
    return table[[c for c in _PARITY_COLUMNS if c in table.columns]].rename(columns=_PARITY_COLUMNS)


_FIT_COLUMNS = {
    "fixed_mib": "fixed [MiB]",
    "per_padded_hit_kib": "per padded hit [KiB]",
    "per_event_mib": "per event [MiB]",
    "reserved_ratio": "reserved / allocated",
    "allocated_held_out_max_error": "allocated: held-out max error",
    "reserved_held_out_max_error": "reserved: held-out max error",
}


def fit_lines_table(table) -> Any:
    """The fitted memory lines (:func:`heptstudy.fitting.plots.fit_table`) with worded column
    names that wrap, so the table stays within the page."""
    return show(table.rename(columns=_FIT_COLUMNS), precision=3)


def predictions_table(predictions) -> Any:
    """No absolute path of the producing machine: paths inside the repository made relative.
    The answer in words is a paragraph, no cell: :func:`heptstudy.study.text.fit_answers`."""
    return show(_relative(predictions.drop(columns="answer", errors="ignore")), precision=3)


def auto_predictions_table(auto) -> Any:
    """The auto section's table; where its step times come from is said under it
    (:func:`heptstudy.study.text.auto_times`), not in a cell per run."""
    return show(auto.drop(columns="times", errors="ignore"), precision=3)


def _relative(frame) -> Any:
    root = str(ROOT) + "/"
    return frame.map(lambda v: v.replace(root, "") if isinstance(v, str) else v)
