"""Packed against padded batches of the same events: memory of the first round, step time per
round (the compared runs follow one another in every round, or the paired timings of both took
the same batch in it), as ratios packed / padded."""

from __future__ import annotations

import statistics
from typing import Any

from heptstudy.study.common import MEMORY
from heptstudy.study.frames import memory_frame
from heptstudy.study.paired import FRESH_PROCESSES, PAIRED_TIMING, paired_round_steps
from heptstudy.study.tables import integer_counts

PACKING_COLUMNS = {
    "batch_size": "batch",
    "policy": "checkpointing",
    "padded_allocated_mib": "allocated padded [MiB]",
    "packed_allocated_mib": "allocated packed [MiB]",
    "allocated_ratio": "allocated packed / padded",
    "real_hit_share": "real hits / slots of padded's peak batch",
    "padded_reserved_mib": "reserved padded [MiB]",
    "packed_reserved_mib": "reserved packed [MiB]",
    "padded_step_s": "step padded, median [s]",
    "packed_step_s": "step packed, median [s]",
    "step_ratio_median": "step packed / padded, median",
    "step_ratio_min": "min",
    "step_ratio_max": "max",
    "rounds": "rounds",
    "timing": "timed in",
}


def _ratio(a, b) -> float | None:
    return None if a is None or b is None or not b else float(a) / float(b)


def packing_frame(df, paired=()) -> Any:
    """One row per (batch size, checkpointing plan) measured both padded and packed; its step
    times from its fresh rounds, else from the ``paired`` timings
    (:func:`heptstudy.study.paired.load_paired`) of both."""
    import pandas as pd

    rows = []
    mem = memory_frame(df)
    if mem.empty or "packed_batches" not in mem.columns:
        return pd.DataFrame(columns=list(PACKING_COLUMNS))
    timed = df[(df["kind"] == MEMORY) & (df["status"] == "ok") & df["mean_step_s"].notna()]
    timed = timed[timed["allocator_line"] == "platform"]
    in_pairs = {packed: paired_round_steps(paired, packed) for packed in (False, True)}
    for (b, label), group in mem.groupby(["batch_size", "policy_label"], sort=True):
        by = group.drop_duplicates("packed_batches").set_index("packed_batches")
        if not {False, True} <= set(by.index):
            continue
        pad, pack = by.loc[False], by.loc[True]
        runs = timed[(timed["batch_size"] == b) & (timed["policy_label"] == label)]
        steps = {
            k: g.drop_duplicates("round").set_index("round")["mean_step_s"]
            for k, g in runs.groupby("packed_batches")
        }
        rounds = sorted(set(steps.get(False, {}).keys()) & set(steps.get(True, {}).keys()))
        timing = FRESH_PROCESSES
        if not rounds:
            rounds, steps = _same_batch_rounds(
                *(in_pairs[p].get((int(b), label), {}) for p in (False, True))
            )
            timing = PAIRED_TIMING
        ratios = [steps[True][k] / steps[False][k] for k in rounds]
        median = {s: statistics.median(steps[s][k] for k in rounds) for s in steps if rounds}
        rows.append(
            {
                "batch_size": int(b),
                "policy": label,
                "padded_allocated_mib": pad["peak_allocated_mib"],
                "packed_allocated_mib": pack["peak_allocated_mib"],
                "allocated_ratio": _ratio(pack["peak_allocated_mib"], pad["peak_allocated_mib"]),
                "real_hit_share": _ratio(pad["peak_batch_hits"], pad["peak_batch_slots"]),
                "padded_reserved_mib": pad["peak_reserved_mib"],
                "packed_reserved_mib": pack["peak_reserved_mib"],
                "padded_step_s": median.get(False),
                "packed_step_s": median.get(True),
                "step_ratio_median": statistics.median(ratios) if ratios else None,
                "step_ratio_min": min(ratios, default=None),
                "step_ratio_max": max(ratios, default=None),
                "rounds": len(rounds),
                "timing": timing if rounds else None,
            }
        )
    return pd.DataFrame(rows, columns=list(PACKING_COLUMNS))


def _same_batch_rounds(padded, packed) -> tuple[list[int], dict[bool, dict[int, float]]]:
    """The rounds in which the padded and the packed paired timings took the same batch, and the
    plan's step in each: (rounds, {packed: {round: seconds}})."""
    rounds = sorted(k for k in padded.keys() & packed.keys() if padded[k][0] == packed[k][0])
    return rounds, {p: {k: of[k][1] for k in rounds} for p, of in ((False, padded), (True, packed))}


def packing_table(packing) -> Any:
    table = packing[list(PACKING_COLUMNS)].rename(columns=PACKING_COLUMNS)
    return integer_counts(table.round(3))
