"""The front of the checkpointing plans: at every batch size with ``off`` and at least two other
plans, padded and packed batches apart, each plan's peak allocated memory (first round) and its
step-time overhead over ``off`` of the same batching (the median over the rounds, of fresh
processes or paired in one process, with their range), and the plans that dominate it: no more
memory and no more overhead, less of one.
``auto`` is left out: its memory and time follow its budget, not a plan."""

from __future__ import annotations

from typing import Any

from heptstudy.data.layout import BATCHINGS
from heptstudy.study.frames import policy_frame
from heptstudy.study.tables import integer_counts

FRONT_COLUMNS = {
    "batch_size": "batch",
    "batching": "batching",
    "policy": "plan",
    "peak_allocated_mib": "peak allocated [MiB]",
    "allocated_cut_pct": "allocated cut vs off [%]",
    "mean_step_s": "step [s]",
    "step_time_overhead_pct": "overhead, median [%]",
    "overhead_min_pct": "min [%]",
    "overhead_max_pct": "max [%]",
    "rounds": "rounds",
    "timing": "timed in",
    "dominated_by": "dominated by",
}


def front_frame(df, paired=()) -> Any:
    """One row per plan, batching and batch size (:data:`FRONT_COLUMNS`); the plans of the
    ``paired`` timings (:func:`heptstudy.study.paired.load_paired`) timed by them."""
    import pandas as pd

    parts = []
    for packed in (False, True):
        policies = policy_frame(df, packed=packed, paired=paired)
        if not policies.empty:
            parts.append(policies[policies["policy"] != "auto"].assign(batching=BATCHINGS[packed]))
    if not parts:
        return pd.DataFrame(columns=list(FRONT_COLUMNS))
    front = pd.concat(parts, ignore_index=True)
    front["dominated_by"] = [dominators(front, row) for _, row in front.iterrows()]
    return front[list(FRONT_COLUMNS)]


def dominators(front, row) -> str:
    """The plans of ``row``'s batching and batch size that need no more memory and no more
    time than it, and less of one; empty for a plan on the front or one without a time."""
    peak, over = row["peak_allocated_mib"], row["step_time_overhead_pct"]
    if peak is None or over is None or peak != peak or over != over:
        return ""
    same = front[
        (front["batching"] == row["batching"]) & (front["batch_size"] == row["batch_size"])
    ]
    p, o = same["peak_allocated_mib"], same["step_time_overhead_pct"]
    better = same[(p <= peak) & (o <= over) & ((p < peak) | (o < over))]
    return ", ".join(better["policy"])


def front_table(front) -> Any:
    """The frame as the report shows it, rounded; a plan on the front says so."""
    table = front.rename(columns=FRONT_COLUMNS).round(1)
    table["dominated by"] = table["dominated by"].replace("", "none (on the front)")
    return integer_counts(table)
