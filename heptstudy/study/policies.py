"""Checkpointing policies side by side (the memory/time trade-off) and memory by category."""

from __future__ import annotations

from typing import Any

from heptstudy.meters.memory import CATEGORIES
from heptstudy.model.adaptive_checkpointing import order_by_cost
from heptstudy.study.common import MEMORY
from heptstudy.study.frames import against_off, pct_less, policy_rank
from heptstudy.units import MIB


def policy_frame(df, min_policies: int = 2) -> Any:
    """One row per policy for every batch size with an ``off`` run and at least
    ``min_policies`` other policies: peaks, step time, and the memory cut and step-time
    overhead against ``off``."""
    import pandas as pd

    columns = [
        "batch_size",
        "policy",
        "peak_allocated_mib",
        "peak_reserved_mib",
        "mean_step_s",
        "allocated_cut_pct",
        "reserved_cut_pct",
        "step_time_overhead_pct",
        "overhead_min_pct",
        "overhead_max_pct",
        "rounds",
        "flag",
        "name",
    ]
    rows = []
    for b, runs, off, timed in against_off(df):
        if len(runs) - 1 < min_policies:
            continue
        for label in sorted(runs.index, key=lambda x: (policy_rank(x), x)):
            r = runs.loc[label]
            t = timed.loc[label] if label in timed.index else None
            step = (
                t["on_step_s"]
                if t is not None
                else (timed["off_step_s"].iloc[0] if label == "off" and len(timed) else None)
            )
            zero = 0.0 if label == "off" and step is not None else None
            rows.append(
                {
                    "batch_size": int(b),
                    "policy": label,
                    "peak_allocated_mib": r["peak_allocated_mib"],
                    "peak_reserved_mib": r["peak_reserved_mib"],
                    "mean_step_s": step if step is not None else r["mean_step_s"],
                    "allocated_cut_pct": pct_less(
                        off["peak_allocated_mib"], r["peak_allocated_mib"]
                    ),
                    "reserved_cut_pct": pct_less(off["peak_reserved_mib"], r["peak_reserved_mib"]),
                    "step_time_overhead_pct": t["overhead_median_pct"] if t is not None else zero,
                    "overhead_min_pct": t["overhead_min_pct"] if t is not None else zero,
                    "overhead_max_pct": t["overhead_max_pct"] if t is not None else zero,
                    "rounds": int(t["rounds"]) if t is not None else None,
                    "flag": t["flag"] if t is not None else "",
                    "name": r["name"],
                }
            )
    return pd.DataFrame(rows, columns=columns)


def categories_frame(reports) -> Any:
    """MiB of each category at the peak of the largest counted step of every memory report."""
    import pandas as pd

    rows = []
    for path, r in reports:
        if r.kind != MEMORY or r.status != "ok" or not r.memory_categories:
            continue
        worst = max(r.memory_categories, key=lambda c: c.peak_bytes)
        rows.append(
            {
                "name": r.name or path.stem,
                "batch_size": r.batch_size,
                "policy": r.plan.label,
                "device_kind": r.environment.device_kind,
                "peak_mib": worst.peak_bytes / MIB,
                **{c: worst.at_peak_bytes.get(c, 0) / MIB for c in CATEGORIES},
            }
        )
    columns = ["name", "batch_size", "policy", "device_kind", "peak_mib", *CATEGORIES]
    frame = pd.DataFrame(rows, columns=columns)
    if frame.empty:
        return frame
    return (
        frame.assign(_o=frame["policy"].map(policy_rank))
        .sort_values(["device_kind", "batch_size", "_o", "policy"])
        .drop(columns="_o")
        .reset_index(drop=True)
    )


def auto_order(policies, batch_size: int) -> list[str]:
    """The order ``auto`` would try this study's plans in at ``batch_size``, from their
    measured overhead and peak."""
    rows = policies[(policies["batch_size"] == batch_size) & (policies["policy"] != "auto")]
    rows = rows.dropna(subset=["step_time_overhead_pct", "peak_allocated_mib"])
    measured = {
        r["policy"]: (float(r["step_time_overhead_pct"]), float(r["peak_allocated_mib"]))
        for _, r in rows.iterrows()
    }
    return order_by_cost(measured)
