"""What ``activation_checkpointing: auto`` does over a data set: the plan each step runs, the
expected step time (from measured reports only) and P(step exceeds the budget)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from heptstudy.data.batching import padded_sizes
from heptstudy.data.layout import BATCHINGS, BatchGeometry
from heptstudy.fitting.draws import draws_for
from heptstudy.model.adaptive_checkpointing import NoPlanFits
from heptstudy.model.checkpoint_plan import AUTO


@dataclass
class AutoAnswer:
    per_device_batch: int
    budget_mib: float
    budget_source: str
    packed: bool
    plan_fractions: dict[str, float]  # plan -> fraction of steps (batches) that run it
    checkpointing_fraction: float  # fraction of batches running any plan but off
    p_batch_exceeds_budget: float  # no plan fits the batch
    p_step_exceeds_budget: float  # any of the step's world_size batches
    worst_batch: str  # the data's fullest batch, in words
    worst_batch_plan: str | None  # the plan it runs; None: none fits
    worst_batch_peak_mib: float  # that plan's predicted peak (the lowest, when none fits)
    seconds_per_slot: dict[str, float]  # measured, per plan; only plans measured
    rate_sources: dict[str, int]  # plan -> counted steps the rate comes from
    mean_step_s: float | None  # expected, auto; None: a plan it runs was not measured
    mean_step_full_s: float | None  # expected, always-on (full) checkpointing
    not_available: str | None = None  # why the times are missing
    order: str = ""  # the plans auto tries, cheapest first, and where that order comes from
    notes: list[str] = field(default_factory=list)


def measured_rates(
    reports, packed: bool = False, paired: Iterable[dict] = ()
) -> tuple[dict[str, float], dict[str, int]]:
    """Median seconds per slot of the steps of batches of this batching, per plan, and their
    count: the counted steps of bench reports and every timed step of ``paired`` timings."""
    per_plan: dict[str, list[float]] = {}
    for plan, seconds, g in [*_bench_steps(reports), *_paired_steps(paired)]:
        if g.packed == packed:
            per_plan.setdefault(plan, []).append(seconds / g.slots)
    return (
        {p: statistics.median(v) for p, v in per_plan.items()},
        {p: len(v) for p, v in per_plan.items()},
    )


def _bench_steps(reports) -> Iterator[tuple[str, float, BatchGeometry]]:
    for r in reports:
        if r.kind != "memory" or r.status != "ok":
            continue
        for st in r.steps:
            plan = st.checkpoint_plan if r.plan is AUTO else r.plan.name
            if st.counted and st.time_s and st.geometry is not None and plan is not None:
                yield plan, st.time_s, st.geometry


def _paired_steps(reports: Iterable[dict]) -> Iterator[tuple[str, float, BatchGeometry]]:
    """A paired timing's steps (``off`` and each plan on the round's batch; an ``auto`` step as
    the plan it ran)."""
    for r in reports:
        geometries = [BatchGeometry(**b["geometry"]) for b in r["batches"]]
        for st in r["steps"]:
            yield st.get("ran") or st["plan"], st["time_s"], geometries[st["batch"]]


def _choices(predictor, geometries) -> np.ndarray:
    """The plan index each geometry runs; ``len(plans)`` where none fits."""
    names = [p.name for p in predictor.plans]
    chosen = []
    for g in geometries:
        try:
            chosen.append(names.index(predictor.choose(g).plan.name))
        except NoPlanFits:
            chosen.append(len(names))
    return np.asarray(chosen)


def evaluate_auto(
    predictor,
    lengths,
    per_device_batch: int,
    *,
    world_size: int = 1,
    pad_to_multiple: int = 1,
    packed: bool = False,
    rates: dict[str, float] | None = None,
    rate_sources: dict[str, int] | None = None,
) -> AutoAnswer:
    draws = draws_for(packed, padded_sizes(lengths, pad_to_multiple), per_device_batch)
    geometries, pmf = draws.distribution()
    names = [p.name for p in predictor.plans]
    chosen = _choices(predictor, geometries)
    fractions = {n: float(pmf[chosen == i].sum()) for i, n in enumerate(names)}
    p_batch = float(pmf[chosen == len(names)].sum())
    worst = predictor.predictions(draws.worst)
    fitting = [n for n in names if worst[n] <= predictor.budget_mib]
    rates = rates or {}
    mean_auto = mean_full = why = None
    runs = [n for n in names if fractions[n] > 0]
    if missing := [n for n in runs + ["full"] if n not in rates]:
        why = (
            "expected step times not available: no measured step time per slot for "
            f"plan(s) {', '.join(sorted(set(missing)))} (give bench reports of those plans in "
            "this configuration and batching with --reports)"
        )
    else:
        slots = np.array([g.slots for g in geometries], dtype=float)
        fitted = chosen < len(names)
        weights = pmf[fitted] / max(pmf[fitted].sum(), 1e-300)  # over the batches that run
        step = np.array([rates[names[i]] for i in chosen[fitted]]) * slots[fitted]
        mean_auto = float((weights * step).sum())
        mean_full = float((weights * rates["full"] * slots[fitted]).sum())
    return AutoAnswer(
        per_device_batch=per_device_batch,
        budget_mib=float(predictor.budget_mib),
        budget_source=predictor.budget_source,
        packed=draws.packed,
        plan_fractions=fractions,
        checkpointing_fraction=1.0 - fractions.get("off", 0.0) - p_batch,
        p_batch_exceeds_budget=p_batch,
        p_step_exceeds_budget=draws.p_step_fails(chosen == len(names), world_size),
        worst_batch=f"the data's fullest batch ({draws.worst.words()})",
        worst_batch_plan=fitting[0] if fitting else None,
        worst_batch_peak_mib=worst[fitting[0]] if fitting else min(worst.values()),
        seconds_per_slot=dict(rates),
        rate_sources=dict(rate_sources or {}),
        mean_step_s=mean_auto,
        mean_step_full_s=mean_full,
        not_available=why,
        order=", ".join(names) + (f" ({predictor.order_source})" if predictor.order_source else ""),
    )


def auto_words(a: AutoAnswer) -> list[str]:
    plans = ", ".join(f"{n} {f:.1%}" for n, f in a.plan_fractions.items() if f > 0) or "none"
    kind = BATCHINGS[a.packed]
    runs = (
        f"runs {a.worst_batch_plan}, predicted peak {a.worst_batch_peak_mib:,.0f} MiB allocated"
        if a.worst_batch_plan
        else f"fits NO plan (lowest predicted peak {a.worst_batch_peak_mib:,.0f} MiB allocated)"
    )
    lines = [
        f"activation_checkpointing=auto runs, on {kind} batches of {a.per_device_batch}: "
        f"{plans}; no plan fits {a.p_batch_exceeds_budget:.2%} of batches "
        f"(budget {a.budget_mib:,.0f} MiB: {a.budget_source})",
        f"  {a.worst_batch} {runs}",
        f"  {a.checkpointing_fraction:.1%} of batches checkpoint; P(step exceeds the budget) = "
        f"{a.p_step_exceeds_budget:.3g}",
        f"  plans, cheapest first: {a.order}",
    ]
    if a.mean_step_s is None:
        lines.append(f"  {a.not_available}")
    else:
        used = ", ".join(f"{p} {n} steps" for p, n in sorted(a.rate_sources.items()))
        lines.append(
            f"  expected mean step {a.mean_step_s:.3g} s against {a.mean_step_full_s:.3g} s "
            f"with always-on (full) checkpointing ({a.mean_step_s / a.mean_step_full_s - 1:+.1%}"
            f"), from measured seconds per slot ({used}) scaled to each batch"
        )
    return lines + [f"  {n}" for n in a.notes]
