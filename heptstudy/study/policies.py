"""Checkpointing policies side by side (the memory/time trade-off) and memory by category."""

from __future__ import annotations

from typing import Any

from heptstudy.study.common import MEMORY
from heptstudy.study.frames import (
    POLICY_ORDER,
    memory_frame,
    pct_less,
    pct_more,
    policy_label,
    policy_labels,
)

MIB = 1024**2
#: The categories of ``report.memory_categories[].at_peak_bytes``, in stacking order.
CATEGORIES = (
    "parameters",
    "gradients",
    "optimizer_state",
    "inputs",
    "activations",
    "temporaries",
)


def _rank(label: str) -> int:
    return POLICY_ORDER.index(label) if label in POLICY_ORDER else len(POLICY_ORDER)


def policy_frame(df, min_policies: int = 2) -> Any:
    """One row per policy for every batch size with a baseline (``off``) and successful memory
    runs of at least ``min_policies`` checkpointing policies: peaks, mean step time, and the
    memory cut and step-time overhead of each policy against ``off`` of the same batch size."""
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
        "name",
    ]
    mem = memory_frame(df)
    rows = []
    if not mem.empty:
        mem = mem.assign(policy_label=policy_labels(mem))
        for b, group in mem.groupby("batch_size"):
            group = group.drop_duplicates("policy_label")
            base = group[group["policy_label"] == "off"]
            if base.empty or len(group) - 1 < min_policies:
                continue
            off = base.iloc[0]
            for _, r in sorted(
                group.iterrows(),
                key=lambda ir: (_rank(ir[1]["policy_label"]), ir[1]["policy_label"]),
            ):
                rows.append(
                    {
                        "batch_size": int(b),
                        "policy": r["policy_label"],
                        "peak_allocated_mib": r["peak_allocated_mib"],
                        "peak_reserved_mib": r["peak_reserved_mib"],
                        "mean_step_s": r["mean_step_s"],
                        "allocated_cut_pct": pct_less(
                            off["peak_allocated_mib"], r["peak_allocated_mib"]
                        ),
                        "reserved_cut_pct": pct_less(
                            off["peak_reserved_mib"], r["peak_reserved_mib"]
                        ),
                        "step_time_overhead_pct": pct_more(off["mean_step_s"], r["mean_step_s"]),
                        "name": r["name"],
                    }
                )
    return pd.DataFrame(rows, columns=columns)


def categories_frame(reports) -> Any:
    """One row per successful memory report with a category breakdown: MiB of each category at
    the peak of its largest counted step, the peak itself, batch size and policy."""
    import pandas as pd

    rows = []
    for path, r in reports:
        if r.kind != MEMORY or r.status != "ok" or not r.memory_categories:
            continue
        worst = max(r.memory_categories, key=lambda c: c.peak_bytes)
        ck = r.checkpointing
        rows.append(
            {
                "name": r.name or path.stem,
                "batch_size": r.batch_size,
                "policy": policy_label(ck.enabled, ck.policy, ck.checkpoint_every),
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
        frame.assign(_o=frame["policy"].map(_rank))
        .sort_values(["device_kind", "batch_size", "_o", "policy"])
        .drop(columns="_o")
        .reset_index(drop=True)
    )
