"""The fitted memory model (:mod:`heptstudy.fitting`) in the report, skipped when it cannot be drawn."""

from __future__ import annotations

from typing import Any

from heptstudy.study.common import MEMORY


def optional_fit_figure(reports, tag: str = "") -> tuple[Any, Any, str]:
    """The fitted memory lines of :mod:`heptstudy.fitting` over the successful memory reports:
    ``(figure, table, "")``, or ``(None, None, why)`` when there is no fit to draw (module
    missing, too few reports, a fit that fails): the aggregate section is then skipped."""
    import pandas as pd

    paths = [p for p, r in reports if r.kind == MEMORY and r.status == "ok"]
    if len({r.batch_size for p, r in reports if r.kind == MEMORY and r.status == "ok"}) < 2:
        return None, None, "fewer than two batch sizes with successful memory reports"
    try:
        from heptstudy.fitting.memmodel import fit_reports
        from heptstudy.fitting.plots import fit_figure, fit_table
    except ImportError as err:
        return None, None, f"the memory model is not available ({err})"
    try:
        models = fit_reports(paths)
    except Exception as err:  # noqa: BLE001 - too few points for a fit is a result, not a crash
        return None, None, f"no memory model could be fitted: {str(err).splitlines()[0]}"
    synthetic = any(r.data.synthetic for _, r in reports)
    fig = fit_figure(models, synthetic=synthetic)
    if tag:
        fig.axes[0].text(
            0.02,
            0.98,
            tag,
            transform=fig.axes[0].transAxes,
            ha="left",
            va="top",
            fontsize=9,
            color="0.3",
        )
    return fig, pd.DataFrame(fit_table(models)), ""
