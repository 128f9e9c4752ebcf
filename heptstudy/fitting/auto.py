"""What ``activation_checkpointing: auto`` does over a data set: the plan each step runs, the
expected step time (from measured reports only) and P(step exceeds the budget)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy as np

from heptstudy.data.batching import padded_sizes
from heptstudy.fitting import occupancy
from heptstudy.model.adaptive_checkpointing import NoPlanFits
from heptstudy.model.checkpoint_plan import AUTO


@dataclass
class AutoAnswer:
    per_device_batch: int
    budget_mib: float
    budget_source: str
    plan_fractions: dict[str, float]  # plan -> fraction of steps (batches) that run it
    checkpointing_fraction: float  # fraction of batches running any plan but off
    p_batch_exceeds_budget: float  # no plan fits the batch
    p_step_exceeds_budget: float  # any of the step's world_size batches
    seconds_per_padded_hit: dict[str, float]  # measured, per plan; only plans measured
    rate_sources: dict[str, int]  # plan -> counted steps the rate comes from
    mean_step_s: float | None  # expected, auto; None: a plan it runs was not measured
    mean_step_full_s: float | None  # expected, always-on (full) checkpointing
    not_available: str | None = None  # why the times are missing
    notes: list[str] = field(default_factory=list)


def measured_rates(reports) -> tuple[dict[str, float], dict[str, int]]:
    """Median seconds per padded batch hit of the counted steps, and their count, per plan."""
    per_plan: dict[str, list[float]] = {}
    for r in reports:
        if r.kind != "memory" or r.status != "ok":
            continue
        for st in r.steps:
            if not st.counted or not st.time_s or not st.padded_hits:
                continue
            plan = st.checkpoint_plan if r.plan is AUTO else r.plan.name
            if plan is None:
                continue
            hits = len(st.padded_hits) * max(st.padded_hits)
            per_plan.setdefault(plan, []).append(st.time_s / hits)
    return (
        {p: statistics.median(v) for p, v in per_plan.items()},
        {p: len(v) for p, v in per_plan.items()},
    )


def evaluate_auto(
    predictor,
    lengths,
    per_device_batch: int,
    *,
    world_size: int = 1,
    pad_to_multiple: int = 1,
    rates: dict[str, float] | None = None,
    rate_sources: dict[str, int] | None = None,
) -> AutoAnswer:
    plen = padded_sizes(lengths, pad_to_multiple)
    b = per_device_batch
    levels = np.unique(plen)
    cdf = occupancy.batch_longest_cdf(plen, b, levels)
    pmf = np.diff(np.concatenate([[0.0], cdf]))
    names = [p.name for p in predictor.plans]
    chosen = []  # plan index per level, len(names) when none fits
    for level in levels:
        try:
            chosen.append(names.index(predictor.choose(b, int(level)).plan.name))
        except NoPlanFits:
            chosen.append(len(names))
    chosen = np.asarray(chosen)
    fractions = {n: float(pmf[chosen == i].sum()) for i, n in enumerate(names)}
    p_batch = float(pmf[chosen == len(names)].sum())
    # events too long for every plan: a step fails when any of its batches holds one
    too_long = levels[chosen == len(names)]
    bad = int(np.isin(plen, too_long).sum())
    p_step = occupancy.p_step_fails(len(plen), bad, b, world_size)
    rates = rates or {}
    mean_auto = mean_full = None
    why = None
    runs = [n for n in names if fractions[n] > 0]
    if missing := [n for n in runs + ["full"] if n not in rates]:
        why = (
            "expected step times not available: no measured step time per padded hit for "
            f"plan(s) {', '.join(sorted(set(missing)))} (give bench reports of those plans in "
            "this configuration with --reports)"
        )
    else:
        hits = b * levels.astype(float)
        fitted = chosen < len(names)
        weights = pmf[fitted] / max(pmf[fitted].sum(), 1e-300)  # over the batches that run
        step = np.array([rates[names[i]] for i in chosen[fitted]]) * hits[fitted]
        mean_auto = float((weights * step).sum())
        mean_full = float((weights * rates["full"] * hits[fitted]).sum())
    return AutoAnswer(
        per_device_batch=b,
        budget_mib=float(predictor.budget_mib),
        budget_source=predictor.budget_source,
        plan_fractions=fractions,
        checkpointing_fraction=1.0 - fractions.get("off", 0.0) - p_batch,
        p_batch_exceeds_budget=p_batch,
        p_step_exceeds_budget=p_step,
        seconds_per_padded_hit=dict(rates),
        rate_sources=dict(rate_sources or {}),
        mean_step_s=mean_auto,
        mean_step_full_s=mean_full,
        not_available=why,
    )


def auto_words(a: AutoAnswer) -> list[str]:
    plans = ", ".join(f"{n} {f:.1%}" for n, f in a.plan_fractions.items())
    lines = [
        f"activation_checkpointing=auto, budget {a.budget_mib:,.0f} MiB ({a.budget_source}):",
        f"  batches of {a.per_device_batch}: {a.checkpointing_fraction:.1%} checkpoint; plans "
        f"{plans}; no plan fits {a.p_batch_exceeds_budget:.2%}",
        f"  P(step exceeds the budget) = {a.p_step_exceeds_budget:.3g}",
    ]
    if a.mean_step_s is None:
        lines.append(f"  {a.not_available}")
    else:
        used = ", ".join(f"{p} {n} steps" for p, n in sorted(a.rate_sources.items()))
        lines.append(
            f"  expected mean step {a.mean_step_s:.3g} s against {a.mean_step_full_s:.3g} s "
            f"with always-on (full) checkpointing ({a.mean_step_s / a.mean_step_full_s - 1:+.1%}"
            f"), from measured seconds per padded hit ({used}) scaled to each batch"
        )
    return lines
