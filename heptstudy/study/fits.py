"""The memory model (:mod:`heptstudy.fitting`) in the report. Each part returns ``why`` instead
of its result when it cannot be computed, so the aggregate notebook skips it with a message."""

from __future__ import annotations

from typing import Any

from heptstudy.estimate.keys import checkpointing_words
from heptstudy.fitting import FitRequest, fit
from heptstudy.fitting.api import repo_path
from heptstudy.fitting.plots import fit_figure, fit_table, peak_vs_longest_figure
from heptstudy.fitting.reports import fit_reports
from heptstudy.study.common import MEMORY
from heptstudy.study.paired import PAIRED_TIMING, paired_rows

PLATFORMS = ("h100", "lumi_mi250x")


def _ok_paths(reports) -> list[str]:
    return [str(p) for p, r in reports if r.kind == MEMORY and r.status == "ok"]


def _models(reports) -> tuple[list, list[str]]:
    paths = _ok_paths(reports)
    if not paths:
        return [], ["no successful memory reports"]
    models, rejected = fit_reports(paths)
    return models, [str(r) for r in rejected]


def optional_fit_figure(reports, tag: str = "") -> tuple[Any, Any, str]:
    """``(figure, table, "")`` of the fitted memory lines, or ``(None, None, why)``."""
    import pandas as pd

    models, why = _models(reports)
    if not models:
        return None, None, "; ".join(why) or "no configuration could be fitted"
    fig = fit_figure(models, synthetic=any(r.data.synthetic for _, r in reports))
    if tag:
        ax = fig.axes[0]
        ax.text(
            0.02, 0.98, tag, transform=ax.transAxes, ha="left", va="top", fontsize=9, color="0.3"
        )
    return fig, pd.DataFrame(fit_table(models)), ""


def fit_validation(reports) -> tuple[Any, str]:
    """Leave one batch size out: ``(table, "")`` or ``(None, why)``."""
    import pandas as pd

    models, why = _models(reports)
    rows = []
    for m in models:
        ck = checkpointing_words(m.key)
        for quantity in ("allocated", "reserved"):
            for r in (m.validation.get(quantity) or {}).get("rows", []):
                rows.append(
                    {
                        "device": m.key.get("device_kind"),
                        "checkpointing": ck,
                        "peak": quantity,
                        "fit on batch sizes": ", ".join(map(str, r["fit_batch_sizes"])),
                        "held-out batch size": r["held_out_batch_size"],
                        "held-out steps": r["held_out_steps"],
                        "mean error [%]": 100 * r["mean_rel_error"],
                        "max |error| [%]": 100 * r["max_abs_rel_error"],
                    }
                )
    if not rows:
        return None, (
            "no configuration was measured at enough batch sizes to leave one out (needs a fit "
            "on the others: two padded sizes)" + (f"; {'; '.join(why)}" if why else "")
        )
    return pd.DataFrame(rows).round(1), ""


def _data_dir(runs) -> str | None:
    if runs.empty or "data_dir" not in runs.columns:
        return None
    dirs = [str(repo_path(d)) for d in runs["data_dir"].dropna().unique() if repo_path(d).is_dir()]
    return dirs[0] if dirs else None


def _study_fit(runs, reports, paired=(), **request) -> tuple[Any, str]:
    """``heptstudy fit`` on the study's data, reports and ``paired`` timings (their step times),
    measured or stored models only (estimating one takes too long for the report): ``(result,
    "")`` or ``(None, why)``."""
    try:
        return fit(
            FitRequest(
                data_dir=_data_dir(runs),
                reports=(*_ok_paths(reports), *(str(path) for path, _ in paired)),
                estimate_if_missing=False,
                stored_if_reports_unusable=True,
                **request,
            )
        ), ""
    except Exception as err:  # noqa: BLE001 - any failure is shown, not raised
        return None, f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"


def platform_predictions(runs, reports=()) -> tuple[Any, Any, list[str]]:
    """The fit's answer for the recipe's batch on each platform: ``(figure, table, skipped)``."""
    import pandas as pd

    results, rows, skipped = {}, [], []
    for name in PLATFORMS:
        result, why = _study_fit(runs, reports, platform=name)
        if why:
            skipped.append(f"{name}: {why}")
            continue
        if result is None:
            skipped.append(
                f"{name}: no measured or stored memory model holds for the recipe's "
                f"configuration; run `heptstudy fit --platform {name} --per-device-batch N` "
                "(estimates one on a fake device)"
            )
            continue
        results[name] = result
        a, w = result.answer, result.answer.worst_batch
        rows.append(
            {
                "platform": name,
                "per-device batch": a.per_device_batch,
                "memory model": f"{result.model.source} ({result.model_origin})",
                "criterion": a.criterion.quantity,
                "worst batch allocated [GiB]": w["allocated_gib"],
                "worst batch reserved [GiB]": w["reserved_gib"],
                "usable [GiB]": a.usable_gib,
                "margin at worst batch [GiB]": w["margin_gib"],
                "P(step fails)": a.criterion.p_step_fails,
                "P(run fails)": a.criterion.p_run_fails,
                "largest batch never failing": a.criterion.largest_safe_batch,
                "answer": result.words(),
            }
        )
    if not results:
        return None, None, skipped
    figure = peak_vs_longest_figure(results, synthetic=any(r.synthetic for r in results.values()))
    return figure, pd.DataFrame(rows).round(3), skipped


def auto_predictions(runs, reports, paired=()) -> tuple[Any, list[str]]:
    """``heptstudy fit --checkpointing auto`` for each ``auto`` run of the study, next to its
    measured step time and full's: ``(table, skipped)``. Calibrates on a fake device (about 30 s
    each)."""
    import pandas as pd

    measured = {plan: _measured_steps(reports, paired, plan) for plan in ("auto", "full")}
    rows, skipped = [], []
    for _, r in reports:
        c = r.checkpointing
        if r.kind != MEMORY or r.status != "ok" or c.plan != "auto" or not c.memory_budget_mib:
            continue
        platform = r.environment.platform or "local_cpu"
        overrides = [f"model.heptv2.memory_budget_gib={c.memory_budget_mib / 1024:g}"]
        # the plans the run chose among, when it named them (else the platform's or the default)
        order = r.config.get("model", {}).get("heptv2", {}).get("auto_plan_order")
        if order:
            overrides.append(f"model.heptv2.auto_plan_order=[{','.join(order)}]")
        request = dict(
            platform=platform,
            per_device_batch=r.batch_size,
            checkpointing="auto",
            batching=r.geometry.batching,
        )
        result, why = _study_fit(runs, reports, paired, **request, overrides=tuple(overrides))
        if why:
            skipped.append(f"{r.name}: {why}")
            continue
        if result is None or result.auto is None:
            skipped.append(f"{r.name}: no memory model holds for full checkpointing on {platform}")
            continue
        a = result.auto
        auto_s, auto_timed = measured["auto"].get((r.packed, r.batch_size), (None, None))
        full_s, full_timed = measured["full"].get((r.packed, r.batch_size), (None, None))
        rows.append(
            {
                "run": r.name,
                "platform": platform,
                "batch": r.batch_size,
                "batching": r.geometry.batching,
                "budget [MiB]": a.budget_mib,
                "steps checkpointing [%]": 100 * a.checkpointing_fraction,
                "plans [% of steps]": ", ".join(
                    f"{p} {100 * f:.1f}" for p, f in a.plan_fractions.items() if f > 0
                ),
                "P(step exceeds budget)": a.p_step_exceeds_budget,
                "expected step auto [s]": a.mean_step_s,
                "expected step full [s]": a.mean_step_full_s,
                "measured step auto [s]": auto_s,
                "auto timed": auto_timed,
                "measured step full [s]": full_s,
                "full timed": full_timed,
                "times": a.not_available or "seconds per slot of the study's reports",
            }
        )
    return (pd.DataFrame(rows).round(3) if rows else None), skipped


def _measured_steps(reports, paired, plan: str) -> dict[tuple[bool, int], tuple[float, str]]:
    """``plan``'s measured step and how it was timed, by (packed, batch size): its memory
    report's round 1, else its median step in a paired timing (a study that times its plans in
    pairs measures their memory alone)."""
    found = {
        (packed, row["batch_size"]): (row["on_step_s"], PAIRED_TIMING)
        for packed in (False, True)
        for row in paired_rows(paired, packed)
        if row["policy"] == plan
    }
    for _, r in reports:
        if r.kind == MEMORY and r.status == "ok" and r.summary.mean_step_time_s is not None:
            if r.plan.name == plan:
                found[(r.packed, r.batch_size)] = (r.summary.mean_step_time_s, "round 1")
    return found
