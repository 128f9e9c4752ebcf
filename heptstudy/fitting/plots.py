"""Figures and tables of memory models and fit answers."""

from __future__ import annotations

import numpy as np

from heptstudy.estimate.keys import checkpointing_words
from heptstudy.estimate.memory_model import MemoryModel


def fit_table(models: list[MemoryModel]) -> list[dict]:
    return [
        {
            "source": m.source,
            "device": m.key.get("device_kind"),
            "dtype": m.key.get("dtype"),
            "attention": m.key.get("attention_backend"),
            "checkpointing": m.key.get("checkpointing"),
            "fixed_mib": m.allocated.fixed_mib,
            "per_padded_hit_kib": m.allocated.per_padded_hit_mib * 1024,
            "per_event_mib": m.allocated.per_event_mib,
            "reserved_ratio": m.reserved.ratio if m.reserved else None,
            "allocated_held_out_max_error": m.held_out_error("allocated"),
            "reserved_held_out_max_error": m.held_out_error("reserved"),
        }
        for m in models
    ]


_MARKERS = ("o", "s", "^", "D", "v", "P", "<", "h", ">", "p")


def fit_figure(models: list[MemoryModel], synthetic: bool = False):
    """Measured peaks against padded batch hits and each batch size's fitted allocated line."""
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=(8.6, 4.2))
    # a colour and a marker of each model's own: the style's cycle repeats after six colours
    colors = plt.get_cmap("tab10" if len(models) <= 10 else "tab20").colors
    for i, m in enumerate(models):
        color, marker = colors[i % len(colors)], _MARKERS[i % len(_MARKERS)]
        ck = checkpointing_words(m.key)
        pts = m.allocated_points
        label = f"{m.source} {m.key.get('device_kind')}, checkpointing {ck}: allocated"
        xs, ys = [p.padded_batch_hits for p in pts], [p.peak_mib for p in pts]
        ax.scatter(xs, ys, color=color, marker=marker, s=16, label=label)
        if rp := m.reserved_points:
            ratio = f" ({m.reserved.ratio:.2f} x allocated)" if m.reserved else ""
            xs, ys = [p.padded_batch_hits for p in rp], [p.peak_mib for p in rp]
            ax.scatter(xs, ys, color=color, marker="x", s=20, label=f"reserved{ratio}")
        top = max(p.padded_batch_hits for p in pts) * 1.05
        for b in sorted({p.batch_size for p in pts}):
            xs = np.linspace(b, top, 50)
            ax.plot(xs, m.predict_allocated_mib(b, xs / b), color=color, lw=0.8, alpha=0.6)
    ax.set_xlabel("padded batch hits (batch size x longest padded event)")
    ax.set_ylabel("peak [MiB]")
    ax.set_title("memory model" + (" — synthetic data" if synthetic else ""))
    # beside the axes: inside, it hides the points and the figure's tag
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    ax.figure.tight_layout()
    return ax.figure


def peak_vs_longest_figure(results: dict, synthetic: bool = False):
    """One panel per platform (``{name: FitResult}``): predicted peaks against the batch's
    longest padded event, and (right axis) how often a batch's longest event has each length."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5.2 * len(results), 5.0), squeeze=False)
    for ax, (name, r) in zip(axes[0], results.items(), strict=True):
        a, c = r.answer, r.answer.curve
        x = np.array(c["longest_padded"])
        ax.plot(x, c["allocated_gib"], color="C0", label="peak allocated")
        if c["reserved_gib"] is not None:
            ax.plot(x, c["reserved_gib"], color="C1", label="peak reserved")
        measured = [p for p in r.model.allocated_points if p.batch_size == a.per_device_batch]
        if measured:
            label = f"{r.model.source} steps of {a.per_device_batch} (allocated)"
            xy = [p.longest_padded for p in measured], [p.peak_mib / 1024 for p in measured]
            ax.scatter(*xy, color="C0", s=16, zorder=3, label=label)
        device = f"device {a.device_memory_gib:g} GiB"
        ax.axhline(a.device_memory_gib, color="k", lw=1.2, label=device)
        ax.axhline(a.usable_gib, color="k", ls=":", lw=1, label=f"usable {a.usable_gib:.1f} GiB")
        ax.axvline(x.max(), color="0.5", ls="--", lw=0.8, label="longest event of the data")
        # room above the device line, which would lie on the frame; a peak beyond it stays drawn
        highest = max([a.device_memory_gib, *c["allocated_gib"], *(c["reserved_gib"] or [])])
        ax.set_ylim(bottom=0, top=1.08 * highest)
        ax.set_xlabel("longest padded event in the batch [hits]")
        ax.set_ylabel(f"predicted peak, batch of {a.per_device_batch} [GiB]")
        ax.set_title(f"{name}: {r.model.source} model", fontsize=9)
        twin = ax.twinx()
        pmf = np.diff(np.array(c["p_batch_longest_at_most"]), prepend=0.0)
        bins = np.linspace(x.min(), x.max() + 1, 41)
        mass, _ = np.histogram(x, bins=bins, weights=pmf)
        twin.stairs(mass, bins, fill=True, color="C2", alpha=0.25)
        twin.set_ylabel("fraction of batches (longest event in bin)", color="C2", fontsize=8)
        twin.set_ylim(bottom=0)
        # below the panel: inside, the device line and the histogram (drawn over the panel)
        # cross it
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    if synthetic:
        fig.suptitle("synthetic (generated) data", fontsize=9)
    fig.tight_layout()
    return fig
