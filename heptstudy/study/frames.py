"""An experiments directory as pandas frames: runs, comparisons, policies, categories."""

from __future__ import annotations

import contextlib
import os
import re
import warnings
from pathlib import Path
from typing import Any

from heptstudy.config import load_config
from heptstudy.data.layout import BATCHINGS
from heptstudy.data.stats import hits_stats
from heptstudy.measure.report import ReportError
from heptstudy.measure.report_checks import checked_report, untrusted
from heptstudy.meters.allocator import allocator_label
from heptstudy.meters.memory import CATEGORIES
from heptstudy.model.checkpoint_plan import AUTO, NAMED, OFF
from heptstudy.study.common import MEMORY, PARITY, StudyError
from heptstudy.study.paired import FRESH_PROCESSES, PAIRED_TIMING, paired_rows
from heptstudy.study.schedule import locate, report_files
from heptstudy.units import MIB

POLICY_ORDER = tuple(plan.label for plan in NAMED.values())


def load_reports(experiments_dir: str | os.PathLike) -> list[tuple[Path, Any]]:
    """Every ``*.json`` report directly in ``experiments_dir``; a bad file is skipped, warned."""
    return _read_reports(sorted(Path(experiments_dir).glob("*.json")))


def load_study(experiments_dir: str | os.PathLike) -> list[tuple[Path, Any]]:
    """Every report of a study folder: every round and allocator line."""
    return _read_reports(report_files(Path(experiments_dir)))


def require_study(folder: Path) -> None:
    """Refuse a folder without a study's reports, before anything is written there."""
    with warnings.catch_warnings(record=True) as skipped:
        warnings.simplefilter("always")
        found = load_study(folder)
    if found:
        return
    why = "; ".join(str(w.message) for w in skipped[:3])
    raise StudyError(
        f"--out {str(folder)!r} holds no study: "
        + (f"none of its JSON files is a usable report ({why})" if why else "no report files")
        + "; nothing was written. Give the folder a `heptstudy study run` wrote (its reports "
        "are *.json files in it)"
    )


def _read_reports(paths) -> list[tuple[Path, Any]]:
    found = []
    for path in paths:
        try:
            found.append((path, checked_report(path)))
        except ReportError as err:
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            warnings.warn(f"skipped {path.name}: {'; '.join(lines[:5])}", stacklevel=3)
    return found


#: A run whose system (kernel) CPU time is more than this fraction of its step's wall time is
#: flagged: its step time measures the kernel mapping and zeroing pages, not the computation.
SYSTEM_TIME_DOMINATES = 0.3

#: Fresh processes whose ``off`` rounds differ by more than this factor are flagged: the machine's
#: speed moved between them by more than most plans' overheads.
OFF_ROUNDS_APART = 1.5


def host_usage_of(report) -> dict[str, float | None]:
    """System CPU seconds, minor page faults and system-time fraction per counted step."""
    counted = [st for st in report.steps if st.counted and st.time_s]
    sys_t = [st.system_time_s for st in counted]
    faults = [st.minor_page_faults for st in counted]
    if not counted or any(v is None for v in sys_t):
        return {"sys_fraction": None, "system_s_per_step": None, "minor_faults_per_step": None}
    wall = sum(st.time_s for st in counted)
    return {
        "sys_fraction": sum(sys_t) / wall if wall else None,
        "system_s_per_step": sum(sys_t) / len(counted),
        "minor_faults_per_step": (
            sum(faults) / len(counted) if all(f is not None for f in faults) else None
        ),
    }


def peak_batch(report) -> dict[str, int | None]:
    """Real hits and slots of the counted step with the highest peak allocated."""
    counted = [st for st in report.steps if st.counted and st.peak_allocated_mib is not None]
    if not counted:
        return {"peak_batch_hits": None, "peak_batch_slots": None}
    st = max(counted, key=lambda s: s.peak_allocated_mib)
    slots = None if st.geometry is None else st.geometry.slots
    return {"peak_batch_hits": sum(st.hits), "peak_batch_slots": slots}


def reports_frame(reports) -> Any:
    import pandas as pd

    rows = []
    for path, r in reports:
        s = r.summary
        counted = [st for st in r.steps if st.counted]
        line, _, round_ = locate(Path(*Path(path).parts[-3:]))
        plan = r.plan
        on = "auto" if plan is AUTO else plan is not OFF
        rows.append(
            {
                "file": path.name,
                "name": r.name or path.stem,
                "round": round_,
                "allocator_line": line,
                "kind": r.kind,
                "status": r.status,
                "batch_size": r.batch_size,
                "packed_batches": r.packed,
                "batching": BATCHINGS[r.packed],
                **peak_batch(r),
                "checkpointing": on,
                "policy": (None if plan is AUTO else plan.policy) if on else "none",
                "checkpoint_every": (plan.every or None) if on is True else None,
                "policy_label": plan.label,
                "peak_allocated_mib": s.max_peak_allocated_mib if s else None,
                "peak_reserved_mib": s.max_peak_reserved_mib if s else None,
                "mean_step_s": s.mean_step_time_s if s else None,
                "std_step_s": s.std_step_time_s if s else None,
                "counted_steps": s.counted_steps if s else None,
                "warmup_steps": s.warmup_steps if s else None,
                "max_padded_hits": max(
                    (max(st.padded_hits) for st in counted if st.padded_hits), default=None
                ),
                **host_usage_of(r),
                "allocator": allocator_label(r),
                "host": r.environment.hostname,
                "device": r.environment.device_name,
                "device_kind": r.environment.device_kind,
                "dtype": r.environment.dtype,
                "threads": r.environment.threads,
                "load_average_1min": r.environment.load_average_1min,
                "torch": r.environment.torch_version,
                "commit": r.environment.git_commit,
                "untrusted": "; ".join(untrusted(r)),
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
        "packed_batches",
        "batching",
        "checkpointing",
        "policy",
        "checkpoint_every",
        "policy_label",
        "round",
        "allocator_line",
    ]
    return pd.DataFrame(rows, columns=columns if not rows else None)


def memory_frame(df) -> Any:
    """Successful memory runs of the first round with the platform's allocator."""
    if df.empty:
        return df
    ok = df[
        (df["kind"] == MEMORY)
        & (df["status"] == "ok")
        & (df["round"] == 1)
        & (df["allocator_line"] == "platform")
    ]
    keys = [k for k in ("packed_batches", "batch_size", "checkpointing") if k in ok.columns]
    return ok.sort_values(keys).reset_index(drop=True)


def of_batching(df, packed: bool):
    """The runs of packed (else padded) batches; a frame without the column holds padded ones."""
    if "packed_batches" not in df.columns:
        return df.iloc[0:0] if packed else df
    chosen = df["packed_batches"].astype(bool)
    return df[chosen if packed else ~chosen]


def against_off(df, packed: bool = False, paired=()):
    """``(batch size, its runs by policy label, the off run, its overhead_frame rows by policy)``
    for every batch size with a successful first-round off run of padded (or packed) batches."""
    mem = memory_frame(of_batching(df, packed))
    if mem.empty:
        return
    over = overhead_frame(df, packed, paired)
    over = over[over["allocator_line"] == "platform"]
    for b, group in mem.groupby("batch_size"):
        runs = group.drop_duplicates("policy_label").set_index("policy_label")
        if "off" in runs.index:
            timed = over[over["batch_size"] == b].set_index("policy")
            yield b, runs, runs.loc["off"], timed


#: The columns of each frame and their names in the report's tables.
COMPARISON_COLUMNS = {
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
    "timing": "timed in",
    "flag": "flag",
}
OVERHEAD_COLUMNS = {
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
    "timing": "timed in",
}
_TIME_COLUMNS = {
    "baseline_step_s": "off_step_s",
    "checkpointed_step_s": "on_step_s",
    "step_time_overhead_pct": "overhead_median_pct",
    "overhead_min_pct": "overhead_min_pct",
    "overhead_max_pct": "overhead_max_pct",
    "rounds": "rounds",
    "timing": "timing",
    "flag": "flag",
}


def comparison_frame(df, paired=()) -> Any:
    """Off against full checkpointing (the original measurement) per batch size."""
    import pandas as pd

    rows = []
    for b, runs, off, timed in against_off(df, paired=paired):
        if "full" not in runs.index:
            continue
        full = runs.loc["full"]
        t = timed.loc["full"] if "full" in timed.index else None
        row = {"batch_size": int(b)}
        apart = setup_difference(off, full)
        for peak in ("allocated", "reserved"):
            row[f"baseline_{peak}_mib"] = off[f"peak_{peak}_mib"]
            row[f"checkpointed_{peak}_mib"] = full[f"peak_{peak}_mib"]
            row[f"{peak}_reduction_pct"] = _cut(off, full, peak, apart)
        times = {k: None if t is None else t[v] for k, v in _TIME_COLUMNS.items()}
        rows.append({**row, **times, "flag": _joined(apart, times["flag"] or "")})
    return pd.DataFrame(rows, columns=list(COMPARISON_COLUMNS))


def overhead_frame(df, packed: bool = False, paired=()) -> Any:
    """Step-time overhead of every policy against ``off`` on padded (or packed) batches: per
    round, since compared runs of a round ran one after the other, then the median and range
    over the rounds both have; a policy of a ``paired`` timing (:func:`heptstudy.study.paired.
    load_paired`) at the same batch size takes its paired rounds instead."""
    import pandas as pd

    columns = [*OVERHEAD_COLUMNS, "allocator"]
    timed = paired_rows(paired, packed)
    if df.empty or "mean_step_s" not in df.columns:
        return pd.DataFrame(timed, columns=columns)
    taken = {(r["batch_size"], r["policy"]) for r in timed}
    rows = [
        r
        for r in _round_rows(of_batching(df, packed))
        if r["allocator_line"] != "platform" or (r["batch_size"], r["policy"]) not in taken
    ]
    return pd.DataFrame(rows + timed, columns=columns)


def _round_rows(df) -> list[dict[str, Any]]:
    import statistics

    ok = df[(df["kind"] == MEMORY) & (df["status"] == "ok") & df["mean_step_s"].notna()]
    rows = []
    for (line, b), group in ok.groupby(["allocator_line", "batch_size"], sort=True):
        off = group[group["policy_label"] == "off"].drop_duplicates("round").set_index("round")
        if off.empty:
            continue
        others = sorted(set(group["policy_label"]) - {"off"}, key=lambda x: (policy_rank(x), x))
        for label in others:
            on = group[group["policy_label"] == label].drop_duplicates("round").set_index("round")
            paired = sorted(set(off.index) & set(on.index))
            if not paired:
                continue
            apart = {k: setup_difference(off.loc[k], on.loc[k]) for k in paired}
            paired = [k for k in paired if not apart[k]]
            row = dict(allocator_line=line, batch_size=int(b), policy=label, rounds=len(paired))
            if not paired:
                rows.append({**row, "flag": next(iter(apart.values())), "timing": FRESH_PROCESSES})
                continue
            pcts = [pct_more(off.at[k, "mean_step_s"], on.at[k, "mean_step_s"]) for k in paired]
            off_sys = _max_pct(off.loc[paired, "sys_fraction"])
            on_sys = _max_pct(on.loc[paired, "sys_fraction"])
            rows.append(
                {
                    **row,
                    "off_step_s": statistics.median(off.loc[paired, "mean_step_s"]),
                    "on_step_s": statistics.median(on.loc[paired, "mean_step_s"]),
                    "overhead_median_pct": statistics.median(pcts),
                    "overhead_min_pct": min(pcts),
                    "overhead_max_pct": max(pcts),
                    "off_sys_pct": off_sys,
                    "on_sys_pct": on_sys,
                    "flag": _joined(
                        _system_flag(off_sys, on_sys),
                        _drift_flag(off.loc[paired, "mean_step_s"]),
                        _untrusted_flag({"off": off.loc[paired], label: on.loc[paired]}),
                        *(f"round {k} {why}" for k, why in apart.items() if why),
                    ),
                    "allocator": next(
                        (v for v in on.get("allocator", ()) if isinstance(v, str)), None
                    ),
                    "timing": FRESH_PROCESSES,
                }
            )
    return rows


#: What two runs must share to be compared: a step time or a peak is a property of all three.
SAME_SETUP = {"host": "machines", "commit": "commits", "torch": "PyTorch versions"}


def setup_difference(a, b) -> str:
    """Empty when runs ``a`` and ``b`` (rows of :func:`reports_frame`) ran on one machine, commit
    and PyTorch version; else a flag naming each difference (the pair is then not compared)."""
    import pandas as pd

    def value(row, col):
        v = row.get(col) if hasattr(row, "get") else None
        return None if v is None or (not isinstance(v, str) and pd.isna(v)) else str(v)

    differ = [
        f"{words} ({value(a, col)} vs {value(b, col)})"
        for col, words in SAME_SETUP.items()
        if value(a, col) != value(b, col)
    ]
    return f"not compared: measured on different {', '.join(differ)}" if differ else ""


def _untrusted_flag(sides) -> str:
    """The runs of a comparison (side -> its runs) whose step times cannot be trusted, and why."""
    said = []
    for side, runs in sides.items():
        rows = runs.get("untrusted", ())
        reasons = sorted({w.split(":")[0] for r in rows for w in str(r or "").split("; ") if w})
        if reasons:
            said.append(f"{side}: {', '.join(reasons)}")
    return f"step times not to be trusted ({'; '.join(said)})" if said else ""


def _joined(*flags: str) -> str:
    return "; ".join(f for f in flags if f)


def policy_rank(label: str) -> tuple[int, int]:
    """Where a plan's label sorts: the named plans in their order, then the solver plans by the
    memory they keep (``keep 5%`` before ``keep 30%``), then the rest."""
    if label in POLICY_ORDER:
        return POLICY_ORDER.index(label), 0
    kept = re.fullmatch(r"keep (\d+)%", str(label))
    return (len(POLICY_ORDER), int(kept[1])) if kept else (len(POLICY_ORDER) + 1, 0)


def _max_pct(fractions) -> float | None:
    import pandas as pd

    values = [float(f) for f in fractions if f is not None and not pd.isna(f)]
    return 100.0 * max(values) if values else None


def _drift_flag(off_steps) -> str:
    fastest, slowest = min(off_steps), max(off_steps)
    if slowest <= OFF_ROUNDS_APART * fastest:
        return ""
    return (
        f"off's rounds took {fastest:.2f} to {slowest:.2f} s: the machine's speed moved between "
        "processes by more than a plan's overhead (heptstudy bench paired times plans in pairs)"
    )


def _system_flag(off_pct: float | None, on_pct: float | None) -> str:
    limit = 100 * SYSTEM_TIME_DOMINATES
    sides = [
        f"{side} {pct:.0f}%"
        for side, pct in (("off", off_pct), ("on", on_pct))
        if pct is not None and pct > limit
    ]
    why = "of the step): the kernel's page handling, not recomputation"
    return f"system time dominates ({', '.join(sides)} {why}" if sides else ""


def dominated_runs(df) -> Any:
    """Memory runs whose system CPU time exceeds :data:`SYSTEM_TIME_DOMINATES` of their step."""
    if df.empty or "sys_fraction" not in df.columns:
        return df.iloc[0:0]
    frac = df["sys_fraction"]
    return df[frac.notna() & (frac > SYSTEM_TIME_DOMINATES)].reset_index(drop=True)


def _cut(off, run, peak: str, apart: str) -> float | None:
    """Percent less peak ``peak`` memory than ``off``; none for runs not compared."""
    base, new = off[f"peak_{peak}_mib"], run[f"peak_{peak}_mib"]
    return None if apart or base is None or new is None or not base else 100.0 * (base - new) / base


def pct_more(base, new):
    return None if base is None or new is None or not base else 100.0 * (new - base) / base


def parity_frame(reports) -> Any:
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
    import pandas as pd

    return pd.DataFrame(
        [
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
            for st in report.steps
        ]
    )


def measured_hits(reports) -> list[int]:
    return [
        h for _, r in reports if r.kind == MEMORY for st in r.steps if st.counted for h in st.hits
    ]


def hits_stats_for(df) -> dict[str, Any] | None:
    """Hits-per-event statistics of the memory reports' data set; ``None`` if it cannot open."""
    mem = df[df["kind"] == MEMORY] if not df.empty else df
    if mem.empty:
        return None
    name, configs = mem.iloc[0]["dataset"], ["1"]
    with contextlib.suppress(Exception):
        configs = list(load_config(overrides=[]).data.configs)
    for _, r in mem.iterrows():
        if r.get("data_dir"):
            with contextlib.suppress(Exception):  # data moved or deleted since the run
                return hits_stats(r["data_dir"], name, configs, "train")
    return None


def policy_frame(df, min_policies: int = 2, packed: bool = False, paired=()) -> Any:
    """One row per policy for every batch size with ``off`` and ``min_policies`` others, on
    padded (or packed) batches."""
    import pandas as pd

    rows = []
    for b, runs, off, timed in against_off(df, packed, paired):
        if len(runs) - 1 < min_policies:
            continue
        off_step, off_timing = _off_step(timed, off)
        for label in sorted(runs.index, key=lambda x: (policy_rank(x), x)):
            r = runs.loc[label]
            t = timed.loc[label] if label in timed.index else None
            if t is not None:
                step, timing = t["on_step_s"], t["timing"]
            elif label == "off":
                step, timing = off_step, off_timing
            else:
                step, timing = r["mean_step_s"], None
            step = None if pd.isna(step) else step
            zero = 0.0 if label == "off" and step is not None else None
            apart = setup_difference(off, r)
            rows.append(
                {
                    "batch_size": int(b),
                    "policy": label,
                    "peak_allocated_mib": r["peak_allocated_mib"],
                    "peak_reserved_mib": r["peak_reserved_mib"],
                    "mean_step_s": step,
                    "allocated_cut_pct": _cut(off, r, "allocated", apart),
                    "reserved_cut_pct": _cut(off, r, "reserved", apart),
                    "step_time_overhead_pct": t["overhead_median_pct"] if t is not None else zero,
                    "overhead_min_pct": t["overhead_min_pct"] if t is not None else zero,
                    "overhead_max_pct": t["overhead_max_pct"] if t is not None else zero,
                    "rounds": int(t["rounds"]) if t is not None else None,
                    "timing": timing,
                    "flag": _joined(apart, t["flag"] if t is not None else ""),
                    "name": r["name"],
                }
            )
    return pd.DataFrame(rows, columns=_POLICY_FIELDS)


def _off_step(timed, off) -> tuple[float | None, str | None]:
    """``off``'s step and how it was timed: its fresh processes' median over the rounds, else its
    own report's (a fresh process too), else a paired timing's (whose off steps run between the
    plans')."""
    import pandas as pd

    fresh = timed[timed["timing"] == FRESH_PROCESSES]["off_step_s"].dropna()
    if len(fresh):
        return fresh.iloc[0], FRESH_PROCESSES
    if not pd.isna(off["mean_step_s"]):
        return off["mean_step_s"], FRESH_PROCESSES
    paired = timed[timed["timing"] == PAIRED_TIMING]["off_step_s"].dropna()
    return (paired.iloc[0], PAIRED_TIMING) if len(paired) else (None, None)


#: The columns of :func:`policy_frame` (the report shows them through the front's table).
_POLICY_FIELDS = (
    "batch_size policy peak_allocated_mib peak_reserved_mib mean_step_s allocated_cut_pct "
    "reserved_cut_pct step_time_overhead_pct overhead_min_pct overhead_max_pct rounds timing flag "
    "name"
).split()


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
    rows.sort(
        key=lambda r: (r["device_kind"], r["batch_size"], policy_rank(r["policy"]), r["policy"])
    )
    columns = ["name", "batch_size", "policy", "device_kind", "peak_mib", *CATEGORIES]
    return pd.DataFrame(rows, columns=columns)
