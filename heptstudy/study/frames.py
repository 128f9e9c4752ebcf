"""An experiments directory as pandas frames: one row per report, the baseline/checkpointed
comparison, parity, the steps of one report, the events measured."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from heptstudy.study.common import MEMORY, PARITY

#: The checkpointing policies of the study in the order the report shows them.
POLICY_ORDER = ("off", "full", "selective", "every 2", "every 3")


def policy_label(enabled: bool, policy: str | None, every: int | None) -> str:
    """``off``, ``full`` (every layer), ``selective``, ``every 2`` (full policy on every second
    layer), ``selective every 3``; reports from before the policies count as ``full``."""
    if not enabled:
        return "off"
    policy = policy or "full"
    if not every or int(every) == 1:
        return policy
    return f"every {int(every)}" if policy == "full" else f"{policy} every {int(every)}"


def policy_labels(df) -> Any:
    """:func:`policy_label` of every row (``policy_label`` column, else from the policy columns)."""
    import pandas as pd

    if "policy_label" in df.columns:
        return df["policy_label"]
    none = pd.Series([None] * len(df), index=df.index, dtype=object)
    policy = df["policy"] if "policy" in df.columns else none
    every = df["checkpoint_every"] if "checkpoint_every" in df.columns else none
    labels = [
        policy_label(bool(c), None if pd.isna(p) or p == "none" else p, None if pd.isna(e) else e)
        for c, p, e in zip(df["checkpointing"], policy, every, strict=True)
    ]
    return pd.Series(labels, index=df.index, dtype=object)


def load_reports(experiments_dir: str | os.PathLike) -> list[tuple[Path, Any]]:
    """Every ``*.json`` report directly in ``experiments_dir`` (sorted by name). Files that are
    not valid reports are skipped with a warning, so one bad file does not hide the others."""
    import warnings

    from heptstudy.measure.report import ReportError, read_report

    found = []
    for path in sorted(Path(experiments_dir).glob("*.json")):
        try:
            found.append((path, read_report(path)))
        except ReportError as err:
            warnings.warn(f"skipped {path.name}: {str(err).splitlines()[0]}", stacklevel=2)
    return found


def reports_frame(reports) -> Any:
    """One row per report: what ran, where, its status and its summary numbers."""
    import pandas as pd

    rows = []
    for path, r in reports:
        s = r.summary
        counted = [st for st in r.steps if st.counted]
        rows.append(
            {
                "file": path.name,
                "name": r.name or path.stem,
                "kind": r.kind,
                "status": r.status,
                "batch_size": r.batch_size,
                "checkpointing": r.checkpointing.enabled,
                "policy": r.checkpointing.policy if r.checkpointing.enabled else "none",
                "checkpoint_every": r.checkpointing.checkpoint_every,
                "policy_label": policy_label(
                    r.checkpointing.enabled,
                    r.checkpointing.policy,
                    r.checkpointing.checkpoint_every,
                ),
                "peak_allocated_mib": s.max_peak_allocated_mib if s else None,
                "peak_reserved_mib": s.max_peak_reserved_mib if s else None,
                "mean_step_s": s.mean_step_time_s if s else None,
                "std_step_s": s.std_step_time_s if s else None,
                "counted_steps": s.counted_steps if s else None,
                "warmup_steps": s.warmup_steps if s else None,
                "max_padded_hits": max(
                    (max(st.padded_hits) for st in counted if st.padded_hits), default=None
                ),
                "device": r.environment.device_name,
                "device_kind": r.environment.device_kind,
                "dtype": r.environment.dtype,
                "threads": r.environment.threads,
                "load_average_1min": r.environment.load_average_1min,
                "torch": r.environment.torch_version,
                "dataset": r.data.dataset,
                "data_dir": r.data.data_dir,
                "synthetic": r.data.synthetic,
                "variant": r.config.get("model", {}).get("variant"),
                "error": r.error or (r.oom.message if r.oom else None),
                "created_at": r.created_at,
            }
        )
    columns = [
        "file",
        "name",
        "kind",
        "status",
        "batch_size",
        "checkpointing",
        "policy",
        "checkpoint_every",
        "policy_label",
    ]
    return pd.DataFrame(rows, columns=columns if not rows else None)


def memory_frame(df) -> Any:
    """Successful memory runs, sorted by batch size then checkpointing."""
    if df.empty:
        return df
    ok = df[(df["kind"] == MEMORY) & (df["status"] == "ok")]
    return ok.sort_values(["batch_size", "checkpointing"]).reset_index(drop=True)


def comparison_frame(df) -> Any:
    """Per batch size with both a baseline and a checkpointed run of the full policy on every
    layer (the original measurement; other policies are in :func:`~heptstudy.study.policies.
    policy_frame`): the memory reduction and the step-time overhead of checkpointing, in percent."""
    import pandas as pd

    mem = memory_frame(df)
    rows = []
    if not mem.empty:
        for b, group in mem.groupby("batch_size"):
            base = group[~group["checkpointing"]]
            ckpt = group[policy_labels(group) == "full"]
            if base.empty or ckpt.empty:
                continue
            b0, c0 = base.iloc[0], ckpt.iloc[0]
            rows.append(
                {
                    "batch_size": int(b),
                    "baseline_allocated_mib": b0["peak_allocated_mib"],
                    "checkpointed_allocated_mib": c0["peak_allocated_mib"],
                    "allocated_reduction_pct": pct_less(
                        b0["peak_allocated_mib"], c0["peak_allocated_mib"]
                    ),
                    "baseline_reserved_mib": b0["peak_reserved_mib"],
                    "checkpointed_reserved_mib": c0["peak_reserved_mib"],
                    "reserved_reduction_pct": pct_less(
                        b0["peak_reserved_mib"], c0["peak_reserved_mib"]
                    ),
                    "baseline_step_s": b0["mean_step_s"],
                    "checkpointed_step_s": c0["mean_step_s"],
                    "step_time_overhead_pct": pct_more(b0["mean_step_s"], c0["mean_step_s"]),
                }
            )
    return pd.DataFrame(
        rows,
        columns=[
            "batch_size",
            "baseline_allocated_mib",
            "checkpointed_allocated_mib",
            "allocated_reduction_pct",
            "baseline_reserved_mib",
            "checkpointed_reserved_mib",
            "reserved_reduction_pct",
            "baseline_step_s",
            "checkpointed_step_s",
            "step_time_overhead_pct",
        ],
    )


def pct_less(base, new):
    return None if base is None or new is None or not base else 100.0 * (base - new) / base


def pct_more(base, new):
    return None if base is None or new is None or not base else 100.0 * (new - base) / base


def parity_frame(reports) -> Any:
    """One row per parity report and comparison (checkpointed vs baseline, repeat vs baseline)."""
    import pandas as pd

    rows = []
    for _, r in reports:
        if r.kind != PARITY or r.status != "ok" or r.parity is None:
            continue
        for which, c in (
            ("checkpointed vs baseline", r.parity.checkpointed_vs_baseline),
            ("repeat vs baseline", r.parity.repeat_vs_baseline),
        ):
            rel = [g.rel_l2 for g in c.gradients]
            rows.append(
                {
                    "report": r.name,
                    "deterministic": r.parity.deterministic,
                    "comparison": which,
                    "outputs_equal": f"{sum(o.equal for o in c.outputs)}/{c.num_outputs}",
                    "outputs_max_abs_diff": max((o.max_abs_diff for o in c.outputs), default=0.0),
                    "loss_equal": c.loss.equal,
                    "loss_abs_diff": c.loss.max_abs_diff,
                    "gradients_equal": f"{sum(bool(g.equal) for g in c.gradients)}/{c.num_gradients}",
                    "grad_rel_l2_max": max(rel, default=0.0),
                    "grad_rel_l2_median": float(sorted(rel)[len(rel) // 2]) if rel else 0.0,
                    "grad_max_abs_diff": max((g.max_abs_diff for g in c.gradients), default=0.0),
                }
            )
    return pd.DataFrame(rows)


def step_frame(report) -> Any:
    """The per-step table of one memory report."""
    import pandas as pd

    rows = []
    for st in report.steps:
        rows.append(
            {
                "step": st.step,
                "counted": st.counted,
                "events": len(st.event_indices),
                "max_hits": max(st.hits) if st.hits else None,
                "max_padded_hits": max(st.padded_hits) if st.padded_hits else None,
                "time_s": st.time_s,
                "peak_allocated_mib": st.peak_allocated_mib,
                "peak_reserved_mib": st.peak_reserved_mib,
                "loss_total": st.loss.get("total"),
            }
        )
    return pd.DataFrame(rows)


def measured_hits(reports) -> list[int]:
    """Hits of every event used in a counted step of a memory report (repeats included)."""
    hits: list[int] = []
    for _, r in reports:
        if r.kind == MEMORY:
            for st in r.steps:
                if st.counted:
                    hits.extend(st.hits)
    return hits


def hits_stats_for(df, split: str = "train") -> dict[str, Any] | None:
    """Hits-per-event statistics (:func:`heptstudy.data.stats.hits_stats`) of the data set the
    memory reports used; ``None`` when it cannot be opened (the reports still say what it was)."""
    from heptstudy.data.stats import hits_stats

    mem = df[df["kind"] == MEMORY] if not df.empty else df
    if mem.empty:
        return None
    row = mem.iloc[0]
    name, configs = row["dataset"], ["1"]
    try:
        from heptstudy.config import load_config

        configs = list(load_config(overrides=[]).data.configs)
    except Exception:  # noqa: BLE001
        pass
    for _, r in mem.iterrows():
        if r.get("data_dir"):
            try:
                return hits_stats(r["data_dir"], name, configs, split)
            except Exception:  # noqa: BLE001 - data moved or deleted since the run
                continue
    return None
