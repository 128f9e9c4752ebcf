"""The fit's answer in words: one headline and the report `heptstudy fit` prints."""

from __future__ import annotations

from heptstudy.fitting.auto import auto_words
from heptstudy.fitting.draws import SAMPLED_BATCHES
from heptstudy.fitting.predict import FitAnswer, Tail

DEVICE_WORDS = {"rocm": "GCD", "cuda": "GPU", "cpu": "CPU process"}
#: The criterion's peak in words (a batch row holds it as ``QUANTITY_gib``).
CRITERION_WORDS = {
    "allocated": "allocated",
    "reserved": "reserved",
    "reserved_expandable": "reserved (expandable segments)",
}


def _pct(p: float) -> str:
    if p == 0 or p == 1:
        return f"{p:.0%}"
    return f"{p:.3%}" if p >= 1e-4 else f"{p:.2e}"


def _tail_words(t: Tail, a: FitAnswer) -> str:
    safe = f"largest per-device batch that never fails on this data: {t.largest_safe_batch}"
    if t.packed:
        if t.longest_fitting_padded is None:
            return f"no batch of {a.per_device_batch} events fits, however short; {safe}"
        if t.never_fails:
            return (
                f"a batch of {a.per_device_batch} may hold up to {t.longest_fitting_padded:,} "
                f"slots, more than the data's fullest batch; {safe}"
            )
        fails = (
            f"batches of more than {t.longest_fitting_padded:,} slots overflow; P(a step fails) = "
            f"{_pct(t.p_step_fails)} (of {a.per_device_batch}-event batches drawn at random)"
        )
    elif t.events_too_long == 0:
        return f"no event of the data is too long for it; {safe}"
    else:
        limit = (
            f"longer than {t.longest_fitting_padded:,} padded hits"
            if t.longest_fitting_padded
            else "of any length"
        )
        overflow = (
            "overflows any batch holding it"
            if t.events_too_long == 1
            else "overflow any batch holding them"
        )
        fails = (
            f"{t.events_too_long:,} of {a.num_events:,} events ({limit}) {overflow}; "
            f"P(a step fails) = {_pct(t.p_step_fails)}"
        )
    return (
        f"{fails}; over the recipe's {a.scenario_steps:,} steps P(at least one failure) = "
        f"{_pct(t.p_run_fails)} ({t.expected_failing_steps:,.1f} failing steps expected); {safe}"
    )


def answer_words(result) -> str:
    a, plat = result.answer, result.platform
    unit = DEVICE_WORDS.get(plat.device, "device")
    head = f"{a.per_device_batch} events per {plat.name} {unit}"
    w, crit = a.worst_batch, a.criterion.quantity
    crit_words, peak = CRITERION_WORDS[crit], w[f"{crit}_gib"]
    holding = (
        f"the packed batch of the data's {a.per_device_batch} longest events "
        f"({w['padded_batch_hits']:,} slots)"
        if a.packed
        else f"the batch holding the data's longest event ({w['longest_padded']:,} padded hits)"
    )
    worst = f"{holding} needs {peak:.1f} GiB {crit_words} of {a.usable_gib:.1f} GiB usable"
    if crit != "allocated" and plat.device in ("cuda", "rocm"):
        # on a GPU the criterion is the allocator's pool plus the margin kept for the context
        worst += (
            f" ({a.device_memory_gib:g} GiB less the {a.safety_margin_gib:g} GiB safety margin: "
            f"peak {crit_words} + margin must stay within the device; "
        )
    else:
        worst += " ("
    worst += f"margin {w['margin_gib']:+.1f} GiB"
    err = result.model.held_out_error(crit) if result.model.source == "measured" else None
    worst += f"; the {crit} model's held-out error is up to {err:.0%})" if err is not None else ")"
    estimated = " by an ESTIMATED model (fake-tensor steps, not measured)"
    by = estimated if result.model.source != "measured" else ""
    if a.fits:
        text = f"{head}: fits on this data{by}: {worst}."
    else:
        text = f"{head}: does NOT fit on this data{by}: {worst}; {_tail_words(a.criterion, a)}."
        if crit != "allocated" and a.allocated_only.never_fails:
            text += (
                f" On peak allocated alone (no allocator overhead, a lower bound) it would fit "
                f"({w['allocated_gib']:.1f} GiB)."
            )
    if crit == "reserved" and w.get("reserved_expandable_gib") is not None:
        text += (
            f" With expandable segments the simulated allocator would reserve "
            f"{w['reserved_expandable_gib']:.1f} GiB for that batch (a prediction awaiting "
            "measurement)."
        )
    for c in [c for c in result.cross_checks if c["source"] == "measured"][:1]:
        if c.get("stale"):
            which = f"NOT USED: the MEASURED model, {c['stale']},"
        elif c["fits"] != a.fits:
            which = f"NOT SHOWN: the MEASURED model of the same network with {_settings(c)}"
        else:
            continue
        fits = "fit" if c["fits"] else "NOT fit"
        text += f" {which} gives this batch {_peaks(c)}, which would {fits}."
    return text


def _settings(c: dict) -> str:
    names = ", ".join(c["device_names"])
    return (
        f"{c['device_kind']}{f' ({names})' if names else ''} and attention {c['attention_backend']}"
    )


def _peaks(c: dict) -> str:
    res = c["worst_batch_reserved_gib"]
    return f"{c['worst_batch_allocated_gib']:.1f} GiB allocated" + (
        f", {res:.1f} GiB reserved" if res is not None else ""
    )


def _row(r: dict) -> str:
    reserved = "" if r["reserved_gib"] is None else f", {r['reserved_gib']:.1f} GiB reserved"
    if r.get("reserved_expandable_gib") is not None:
        reserved += f" ({r['reserved_expandable_gib']:.1f} with expandable segments)"
    size = (
        f"{r['padded_batch_hits']:>9,} slots packed"
        if r["longest_padded"] is None
        else f"longest {r['longest_padded']:>7,} padded hits"
    )
    return (
        f"  {r['batch']:<26} {size}: "
        f"{r['allocated_gib']:.1f} GiB allocated{reserved}; margin {r['margin_gib']:+.1f} GiB"
    )


def _validation_lines(mm) -> list[str]:
    out = []
    for q in ("allocated", "reserved"):
        v = mm.validation.get(q)
        if q == "reserved" and mm.reserved is None:
            out.append(
                "  reserved: not modelled (no reserved peaks, or a CPU's: a process's resident set "
                "is no multiple of its tensors, so it is not extrapolated)"
            )
        elif not v or v.get("max_abs_rel_error") is None:
            why = (v or {}).get("why", "no validation recorded")
            out.append(f"  {q}: NOT validated on held-out batch sizes ({why})")
        else:
            rows = ", ".join(
                f"B={r['held_out_batch_size']} {r['mean_rel_error']:+.1%}" for r in v["rows"]
            )
            out.append(
                f"  {q}: held-out error (leave one batch size out) max {v['max_abs_rel_error']:.1%} "
                f"({rows})"
            )
    return out


def render(result) -> str:
    """The full report of one fit (with auto's answer when the configuration is auto)."""
    a, mm, rv = result.answer, result.model, result.variant
    cfg = rv.config
    if result.auto is None:
        lines = [answer_words(result), ""]
    else:
        lines = [
            *auto_words(result.auto),
            "",
            f"Cross-check with full checkpointing (the plan auto falls back on): "
            f"{answer_words(result)}",
            "",
        ]
    lines.append(f"Memory model: {mm.source.upper()} ({result.model_origin}) — {mm.describe()}")
    prov = mm.provenance
    if prov.get("device_names"):
        lines.append(
            f"  measured on {', '.join(prov['device_names'])}, PyTorch "
            f"{', '.join(prov.get('torch_versions') or ['?'])}, commit "
            f"{', '.join(c[:9] for c in prov.get('git_commits') or ['?'])}"
        )
    lines += _validation_lines(mm)
    crit, pool = CRITERION_WORDS[a.criterion.quantity], a.criterion.quantity != "allocated"
    lines.append(
        f"  fit residuals: allocated max {mm.allocated.max_abs_rel_residual:.1%}"
        + (f", reserved max {mm.reserved.max_abs_rel_residual:.1%}" if mm.reserved else "")
    )
    lines += [
        f"Device: {a.device_memory_gib:g} GiB; safety margin {a.safety_margin_gib:g} GiB; usable "
        f"{a.usable_gib:.1f} GiB. Criterion: peak {crit}"
        + (" (the allocator's pool, fragmentation included) + the safety margin" if pool else ""),
        f"Batches of {a.per_device_batch} on this data ({a.world_size} ranks per step):",
        *(_row(r) for r in a.typical_batches),
        _row(a.worst_batch),
        f"Tail on peak {crit}: {_tail_words(a.criterion, a)}",
    ]
    if pool:
        lines.append(f"Tail on peak allocated alone: {_tail_words(a.allocated_only, a)}")
    for c in result.cross_checks:
        lines.append(
            f"Cross-check, not the answer ({'; '.join(c['differs'])}): the {c['source']} model "
            f"with {_settings(c)} ({c['origin']}) gives the worst batch {_peaks(c)}: it would "
            f"{'fit' if c['fits'] else 'NOT fit'} on peak {c['criterion']}"
        )
    if result.not_used:
        lines.append("Memory models and reports not used:")
        lines += [f"  {r}" for r in result.not_used]
    lines += [
        "",
        "Assumptions:",
        f"  recipe: {rv.name}, global batch {cfg.train.global_batch_size} over {a.world_size} "
        f"devices, {a.scenario_steps:,} steps, sampler {cfg.data.sampler}, "
        f"{cfg.data.batching} batches, events padded to "
        f"{cfg.data.pad_to_multiple}, dtype {cfg.train.dtype}, attention "
        f"{cfg.model.heptv2.attention_backend}, checkpointing "
        f"{cfg.model.heptv2.activation_checkpointing}",
        f"  data: {result.data}",
        (
            "  a step's peak = memory model at (batch size, slots of the batch / batch size); "
            f"slots per batch from {SAMPLED_BATCHES:,} random batches; "
            if a.packed
            else "  a step's peak = memory model at (batch size, longest padded event of the "
            "batch); "
        )
        + "a batch or step = a uniformly random set of events of an epoch; validation steps not "
        "modelled",
        *(f"  {n}" for n in result.notes + mm.notes),
    ]
    return "\n".join(lines)
