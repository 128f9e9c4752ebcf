"""Figures and tables for the aggregation notebook (matplotlib; nothing is shown or saved here)."""

from __future__ import annotations

import numpy as np

from heptstudy.fitting.memmodel import MemoryModel


def fit_table(models: list[MemoryModel]) -> list[dict]:
    """One row per memory model: provenance, coefficients, residuals, held-out error."""
    return [
        {
            "source": m.source,
            **m.key,
            "fixed_mib": m.allocated.fixed_mib,
            "per_padded_hit_kib": m.allocated.per_padded_hit_mib * 1024,
            "per_event_mib": m.allocated.per_event_mib,
            "fit_max_rel_residual": m.allocated.max_abs_rel_residual,
            "held_out_batch_sizes": m.validation.get("held_out_batch_sizes"),
            "held_out_max_rel_error": m.validation.get("max_abs_rel_error"),
        }
        for m in models
    ]


def fit_figure(models: list[MemoryModel], ax=None, synthetic: bool = False):
    """Peak allocated against padded batch hits: measured points (held-out ones open) and the
    fitted lines, one colour per model. Returns the figure."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, m in enumerate(models):
        color = f"C{i}"
        pts = m.inputs + m.held_out
        x = np.array([p.padded_batch_hits for p in pts])
        label = (
            f"{m.source}: {m.key['variant']} {m.key['device_kind']} ckpt={m.key['checkpointing']}"
        )
        ax.scatter(
            [p.padded_batch_hits for p in m.inputs],
            [p.peak_allocated_mib for p in m.inputs],
            color=color,
            s=14,
            label=label,
        )
        if m.held_out:
            ax.scatter(
                [p.padded_batch_hits for p in m.held_out],
                [p.peak_allocated_mib for p in m.held_out],
                facecolors="none",
                edgecolors=color,
                s=30,
                label=f"held out (max err {m.validation.get('max_abs_rel_error', 0):.1%})",
            )
        for b in sorted({p.batch_size for p in pts}):
            xs = np.linspace(0, x.max() * 1.05, 50)
            ax.plot(xs, m.predict_allocated_mib(b, xs / b), color=color, lw=0.8, alpha=0.6)
    ax.set_xlabel("padded batch hits (batch size x longest padded event)")
    ax.set_ylabel("peak allocated [MiB]")
    ax.set_title("memory model" + (" — synthetic data" if synthetic else ""))
    ax.legend(fontsize=7)
    return ax.figure


def peak_distribution_figure(answers: dict, ax=None, synthetic: bool = False):
    """Histogram of predicted per-batch peaks, one per platform (``{name: FitAnswer}``), with
    each platform's usable memory and device memory marked. Returns the figure."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, (name, a) in enumerate(answers.items()):
        edges, counts = np.array(a.histogram["edges_gib"]), np.array(a.histogram["counts"])
        ax.stairs(
            counts / counts.sum(), edges, color=f"C{i}", label=f"{name}: B={a.per_device_batch}"
        )
        ax.axvline(a.usable_gib, color=f"C{i}", ls="--", lw=0.8)
        ax.axvline(a.device_memory_gib, color=f"C{i}", ls=":", lw=0.8)
    ax.set_xlabel("predicted peak allocated per batch [GiB] (dashed: usable, dotted: device)")
    ax.set_ylabel("fraction of batches")
    ax.set_title("per-batch peak distribution" + (" — synthetic data" if synthetic else ""))
    ax.legend(fontsize=7)
    return ax.figure
