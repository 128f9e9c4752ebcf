"""The memory model (:mod:`heptstudy.fitting`) in the report: fitted lines over the measured
points, their held-out validation error, and the predicted per-batch peaks of the recipe on each
platform profile. Each part returns ``why`` instead of its result when it cannot be computed, so
the aggregate notebook skips it with a message."""

from __future__ import annotations

from typing import Any

from heptstudy.study.common import MEMORY

#: The platform profiles of the recipe's prediction in the report.
PLATFORMS = ("h100", "lumi_mi250x")


def _ok_paths(reports) -> list:
    return [p for p, r in reports if r.kind == MEMORY and r.status == "ok"]


def _groups(reports) -> list[tuple[dict, list]]:
    """(model key, measured points) of every configuration of the successful memory reports."""
    from heptstudy.fitting.memmodel import points_from_reports

    return list(points_from_reports(_ok_paths(reports)).values())


def _fit_groups(reports) -> tuple[list, list[str]]:
    """A measured memory model for every configuration that can be fitted, and why the others
    cannot (a single padded size: the trade-off policies measured at one batch size only)."""
    from heptstudy.fitting.memmodel import FitError, fit_points, key_label

    models, skipped = [], []
    for key, pts in _groups(reports):
        try:
            models.append(fit_points(key, pts))
        except FitError as err:
            skipped.append(f"{key_label(key)}: {str(err).splitlines()[0]}")
    return models, skipped


def optional_fit_figure(reports, tag: str = "") -> tuple[Any, Any, str]:
    """The fitted memory lines over the successful memory reports: ``(figure, table, "")``, or
    ``(None, None, why)`` when there is no fit to draw."""
    import pandas as pd

    if len({r.batch_size for p, r in reports if r.kind == MEMORY and r.status == "ok"}) < 2:
        return None, None, "fewer than two batch sizes with successful memory reports"
    try:
        from heptstudy.fitting.plots import fit_figure, fit_table

        models, _ = _fit_groups(reports)
    except Exception as err:  # noqa: BLE001 - a fit that fails is a result, not a crash
        return None, None, f"no memory model could be fitted: {str(err).splitlines()[0]}"
    if not models:
        return None, None, "no configuration was measured at two padded batch sizes"
    fig = fit_figure(models, synthetic=any(r.data.synthetic for _, r in reports))
    if tag:
        ax = fig.axes[0]
        ax.text(
            0.02, 0.98, tag, transform=ax.transAxes, ha="left", va="top", fontsize=9, color="0.3"
        )
    return fig, pd.DataFrame(fit_table(models)), ""


def fit_validation(reports) -> tuple[Any, str]:
    """Leave one batch size out: for every configuration measured at several batch sizes, the
    model fitted without one batch size predicts that batch size's steps; the table gives the
    relative error of peak allocated (``(table, "")`` or ``(None, why)``)."""
    import pandas as pd

    from heptstudy.fitting.memmodel import FitError, fit_points

    rows = []
    try:
        groups = _groups(reports)
    except Exception as err:  # noqa: BLE001
        return None, f"the reports cannot be read as fit points: {str(err).splitlines()[0]}"
    for key, pts in groups:
        sizes = sorted({p.batch_size for p in pts})
        for b in sizes if len(sizes) >= 2 else []:
            try:
                mm = fit_points(key, pts, held_out_batch_sizes=[b])
            except FitError:
                continue  # the other batch sizes alone do not determine a fit
            v = mm.validation
            rows.append(
                {
                    "device": key["device_kind"],
                    "checkpointing": key.get("checkpointing_policy") or "off",
                    "fit on batch sizes": ", ".join(map(str, v["fit_batch_sizes"])),
                    "held-out batch size": b,
                    "held-out steps": v["held_out_points"],
                    "mean error [%]": 100 * v["mean_rel_error"],
                    "max |error| [%]": 100 * v["max_abs_rel_error"],
                }
            )
    if not rows:
        return None, (
            "no configuration was measured at enough batch sizes to leave one out "
            "(needs a fit on the others: two padded sizes)"
        )
    return pd.DataFrame(rows).round(1), ""


def _data_dir(runs) -> str | None:
    from pathlib import Path

    if runs.empty or "data_dir" not in runs.columns:
        return None
    dirs = [d for d in runs["data_dir"].dropna().unique() if Path(d).is_dir()]
    return str(dirs[0]) if dirs else None


def platform_predictions(runs, reports=(), platforms=PLATFORMS) -> tuple[Any, Any, list[str]]:
    """``heptstudy fit`` for the recipe's per-device batch on each platform profile, on the data
    of the reports: ``(figure, table, skipped)``; figure and table ``None`` when no platform could
    be predicted. Only measured (from ``reports``) or stored (``configs/fit``) memory models are
    used: estimating one on a fake device takes too long for the report."""
    import argparse

    import pandas as pd

    try:
        from heptstudy.fitting.cli import (
            DEFAULT_SCENARIO,
            DEFAULT_VARIANT,
            FITS_DIR,
            answer_words,
            find_model,
            resolve_config,
            run_fit,
        )
        from heptstudy.fitting.plots import peak_distribution_figure
    except ImportError as err:
        return None, None, [f"the fit prediction is not available ({err})"]
    data_dir = _data_dir(runs)
    paths = [str(p) for p in _ok_paths(reports)]
    answers, rows, skipped = {}, [], []
    for name in platforms:
        try:
            res, rv, _ = resolve_config(DEFAULT_SCENARIO, name, DEFAULT_VARIANT, data_dir)
            try:
                found = find_model(rv.config, res.platform.device, paths)
            except Exception:  # noqa: BLE001 - reports that cannot be fitted: stored models only
                found, paths = find_model(rv.config, res.platform.device), []
            if found is None:
                skipped.append(
                    f"{name}: no measured or stored memory model matches the recipe's "
                    f"configuration; run `heptstudy fit --platform {name} --per-device-batch "
                    f"{rv.per_device_batch}` (estimates one on a fake device)"
                )
                continue
            args = argparse.Namespace(
                scenario=DEFAULT_SCENARIO,
                platform=name,
                variant=DEFAULT_VARIANT,
                data_dir=data_dir,
                reports=paths,
                fits_dir=str(FITS_DIR),
                safety_margin_gib=None,
                per_device_batch=rv.per_device_batch,
            )
            out = run_fit(args)
        except Exception as err:  # noqa: BLE001 - a prediction that fails is skipped, with why
            skipped.append(f"{name}: {type(err).__name__}: {str(err).splitlines()[0][:300]}")
            continue
        ans, mm, plat = out["answer"], out["model"], out["platform"]
        answers[name] = ans
        rows.append(
            {
                "platform": name,
                "per-device batch": ans.per_device_batch,
                "memory model": mm.source,
                "median peak [GiB]": ans.peaks_gib["p50"],
                "p99 peak [GiB]": ans.peaks_gib["p99"],
                "worst batch [GiB]": ans.worst_batch["peak_gib"],
                "usable [GiB]": ans.usable_gib,
                "P(batch exceeds)": ans.p_batch_exceeds,
                "expected failures": ans.expected_failures,
                "largest safe batch": ans.largest_safe_batch,
                "answer": answer_words(ans, plat.name, plat.device),
            }
        )
    if not answers:
        return None, None, skipped
    synthetic = bool(not runs.empty and runs["synthetic"].astype(bool).any())
    fig = peak_distribution_figure(answers, synthetic=synthetic)
    return fig, pd.DataFrame(rows).round(3), skipped
