"""Figures of the notebooks, one call per picture; :func:`save` writes a figure as PNG and PDF."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from heptstudy.atomic import atomic_savefig
from heptstudy.data.layout import EventLayout, layout_of
from heptstudy.measure.summary import PHASE_LABELS
from heptstudy.model.heptv2 import hit_coordinates
from heptstudy.units import MIB

COLORS = {False: "#1f77b4", True: "#d62728"}  # baseline blue, checkpointed red
LABELS = {False: "no checkpointing", True: "checkpointing"}


def use_style() -> None:
    import matplotlib.pyplot as plt

    try:
        import mplhep

        plt.style.use(mplhep.style.ROOT)
        plt.rcParams.update({"figure.figsize": (7.5, 5.0), "font.size": 13, "legend.fontsize": 11})
    except Exception:  # noqa: BLE001 - style only
        plt.style.use("default")


def _ax(figsize=(7.5, 5.0)):
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=figsize)


def save(fig, figures_dir: str | Path, name: str) -> list[Path]:
    out = Path(figures_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.pdf"]
    atomic_savefig(fig, paths[0], dpi=150, bbox_inches="tight")
    # no creation date: a figure drawn again from the same reports is the same file
    atomic_savefig(fig, paths[1], bbox_inches="tight", metadata={"CreationDate": None})
    return paths


def data_label(synthetic: bool | None) -> str:
    return {True: "synthetic data", False: "real data", None: "data unknown"}[synthetic]


def _finish(fig, ax, tag: str = "") -> Any:
    if tag:
        ax.text(
            0.02, 0.98, tag, transform=ax.transAxes, ha="left", va="top", fontsize=10, color="0.3"
        )
    fig.tight_layout()
    return fig


def _note(ax, text: str, xy, offset, **style) -> None:
    ax.annotate(text, xy, textcoords="offset points", xytext=offset, **style)


def _group(n: int) -> list[tuple[float, float]]:
    """(offset, width) of each of ``n`` bars side by side around a tick."""
    width = 0.8 / max(n, 1)
    return [((j - (n - 1) / 2) * width, width) for j in range(n)]


def run_steps(steps, title: str = "") -> Any:
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    x = steps["step"].to_numpy()
    counted = steps["counted"].to_numpy(bool)
    peaks = [("peak_allocated_mib", "peak allocated"), ("peak_reserved_mib", "peak reserved")]
    for ax, cols, ylabel in (
        (a1, [("time_s", "step time")], "step time [s]"),
        (a2, peaks, "memory [MiB]"),
    ):
        for (col, label), (shift, width) in zip(cols, _group(len(cols)), strict=True):
            y = steps[col].astype(float).to_numpy()
            bars = ax.bar(x + shift, np.nan_to_num(y), width, label=label)
            for b, c in zip(bars, counted, strict=True):
                if not c:
                    b.set_hatch("//")
                    b.set_alpha(0.5)
        ax.set(xlabel="step (hatched: warm-up, not counted)", ylabel=ylabel)
        ax.set_xticks(x)
        if len(cols) > 1:
            ax.set_ylim(0, ax.get_ylim()[1] * 1.25)
            ax.legend(loc="upper center", ncol=2)
    if title:
        fig.suptitle(title, fontsize=12)
    return _finish(fig, ax)


def memory_categories(categories: dict[str, int], title: str = "", by_module=None) -> Any:
    """Live MiB by category at the step's peak; with ``by_module`` (a report's
    ``by_module_bytes``) stacked by the module that made them, the 14 largest owners."""
    if not by_module:
        fig, ax = _ax((7.5, 4.0))
        names = list(categories)
        vals = np.array([categories[n] for n in names], float) / MIB
        ax.barh(names, vals, color="#4c72b0")
        for i, v in enumerate(vals):
            ax.text(v, i, f" {v:,.1f}", va="center", fontsize=10)
        ax.set_xlabel("live MiB at the step's peak")
        ax.set_title(title, fontsize=12)
        return _finish(fig, ax)
    owners = sorted(by_module, key=lambda o: -sum(by_module[o].values()))
    rest = owners[14:]
    shown = {o: by_module[o] for o in owners[:14]}
    if rest:
        shown[f"{len(rest)} more"] = sum((Counter(by_module[o]) for o in rest), Counter())
    names = list(shown)[::-1]
    fig, ax = _ax((8.5, 0.35 * len(names) + 1.8))
    left = np.zeros(len(names))
    for cat, color in CATEGORY_COLORS.items():
        vals = np.array([shown[n].get(cat, 0) for n in names], float) / MIB
        if vals.any():
            ax.barh(names, vals, left=left, color=color, label=cat.replace("_", " "))
            left += vals
    for i, v in enumerate(left):
        ax.text(v, i, f" {v:,.1f}", va="center", fontsize=9)
    ax.set_xlabel("live MiB at the step's peak, by the module that made it")
    ax.set_xlim(0, left.max() * 1.2 if len(left) else 1)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(title, fontsize=12)
    return _finish(fig, ax)


#: padded batches drawn solid with dots, packed ones dashed with diamonds
BATCHING_STYLE = {False: ("o-", ""), True: ("D--", ", packed")}


def memory_vs_batch(mem, column: str, ylabel: str, oom=None, tag: str = "") -> Any:
    """Peak memory against batch size, off and full, padded and packed; out of memory: crosses."""
    from matplotlib.ticker import FixedLocator, NullLocator

    fig, ax = _ax()
    mem = mem[mem["policy_label"].isin(["off", "full"])]
    for packed, (style, suffix) in BATCHING_STYLE.items():
        of_kind = mem[mem["packed_batches"] == packed]
        for ckpt in (False, True):
            sel = of_kind[(of_kind["checkpointing"] == ckpt) & of_kind[column].notna()]
            if sel.empty:
                continue
            sel, label = sel.sort_values("batch_size"), LABELS[ckpt] + suffix
            ax.plot(
                sel["batch_size"], sel[column], style, color=COLORS[ckpt], label=label, lw=2, ms=7
            )
            for b, v in zip(sel["batch_size"], sel[column], strict=True):
                dy = -14 if packed else 5
                _note(ax, f"{v:,.0f}", (b, v), (5, dy), fontsize=9, color=COLORS[ckpt])
    if oom is not None and not oom.empty:
        top = max(ax.get_ylim()[1], 1.0)
        for ckpt in (False, True):
            sel = oom[oom["checkpointing"] == ckpt]
            if not sel.empty:
                label = f"{LABELS[ckpt]}: out of memory / failed"
                marks = dict(color=COLORS[ckpt], ms=12, mew=3, label=label, clip_on=False)
                ax.plot(sel["batch_size"], [top] * len(sel), "x", **marks)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="batch size [events]", ylabel=ylabel)
    values = sorted({int(b) for f in (mem, oom) if f is not None for b in f["batch_size"]})
    if values:
        ax.xaxis.set_major_locator(FixedLocator(values))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([str(v) for v in values])
        ax.set_xlim(values[0] / 1.5, values[-1] * 1.5)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.25)
    ax.legend(loc="upper left", bbox_to_anchor=(0.0, 0.92))
    return _finish(fig, ax, tag)


def percent_vs_batch(comp, columns: list[tuple[str, str]], ylabel: str, tag: str = "") -> Any:
    fig, ax = _ax()
    x = np.arange(len(comp))
    for (col, label), (shift, width) in zip(columns, _group(len(columns)), strict=True):
        y = comp[col].astype(float).to_numpy()
        bars = ax.bar(x + shift, np.nan_to_num(y), width, label=label)
        for b, v in zip(bars, y, strict=True):
            if np.isfinite(v):
                xy, va = (b.get_x() + b.get_width() / 2, v), "bottom" if v >= 0 else "top"
                ax.annotate(f"{v:.0f}%", xy, ha="center", va=va, fontsize=10)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(x, [str(int(b)) for b in comp["batch_size"]])
    ax.set(xlabel="batch size [events]", ylabel=ylabel)
    lo, hi = ax.get_ylim()
    ax.set_ylim(min(lo, 0), hi * 1.2 if hi > 0 else hi)
    if len(columns) > 1:
        ax.legend(loc="upper right")
    return _finish(fig, ax, tag)


def parity_gradients(reports) -> Any:
    """Relative L2 difference of every parameter gradient: checkpointed vs baseline against
    repeat vs baseline (points on the diagonal: checkpointing changes no more than a repeat)."""
    fig, ax = _ax((6.5, 6.0))
    lo, hi = np.inf, 0.0
    for _, r in reports:
        if r.kind != "parity" or r.status != "ok" or r.parity is None:
            continue
        rep, c = (
            np.maximum([g.rel_l2 for g in pair.gradients], 1e-12)
            for pair in (r.parity.repeat_vs_baseline, r.parity.checkpointed_vs_baseline)
        )
        ax.scatter(rep, c, s=14, alpha=0.7, label=f"{r.name} ({len(c)} gradients)")
        lo, hi = min(lo, rep.min(), c.min()), max(hi, rep.max(), c.max())
    if np.isfinite(lo):  # some report drawn
        lo, hi = lo / 2, max(hi * 2, lo * 10)
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="equal")
        ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi))
        ax.legend(loc="upper left", fontsize=9)
    else:
        ax.text(0.5, 0.5, "no parity reports", ha="center", transform=ax.transAxes)
    ax.set_xlabel("repeat vs baseline: gradient rel. L2 (1e-12 = equal)")
    ax.set_ylabel("checkpointed vs baseline: gradient rel. L2")
    return _finish(fig, ax)


def hits_per_event(stats: dict[str, Any] | None, measured: list[int] | None = None) -> Any:
    """Hits per event of the data set, with the events of the measured steps on top."""
    fig, ax = _ax()
    if stats is None and not measured:
        ax.text(0.5, 0.5, "data set not available", ha="center", transform=ax.transAxes)
        return fig
    values = list(stats["per_event"]["total"]) if stats else []
    top = max(values + list(measured or []) + [1])
    bins = np.linspace(0, top * 1.05 + 1, 50)
    if stats:
        label = f"{stats['split']} split ({stats['num_events']} events)"
        ax.hist(values, bins=bins, histtype="stepfilled", alpha=0.35, color="#4c72b0", label=label)
        med = stats["total"]["quantiles"]["p50"]
        ax.axvline(med, color="k", ls="--", lw=1, label=f"median {med:,.0f}")
        kind = "synthetic" if stats["synthetic"] else "real"
        title = f"{stats['dataset']} configs {','.join(stats['configs'])} ({kind})"
        ax.set_title(title, fontsize=12)
    if measured:
        label = f"events of the counted steps ({len(measured)}, repeats included)"
        ax.hist(measured, bins=bins, histtype="step", lw=2, color="#d62728", label=label)
    ax.set(xlabel="hits per event", ylabel="events")
    ax.legend(loc="upper right", fontsize=9)
    return _finish(fig, ax)


def event_hits(batch, event: int = 0, synthetic: bool | None = None) -> Any:
    """One event's hits in (eta, phi), coloured by the particle that made them (grey: none)."""
    fig, ax = _ax((8, 5.5))
    span = layout_of(batch).spans[event]
    n, hits = span.hits, slice(span.start, span.start + span.hits)
    coords = hit_coordinates(batch["X"][span.row, hits]).cpu().numpy()
    owner = batch["ytarget"][span.row, hits, 13].cpu().numpy().astype(int)  # 0: no particle
    none = owner == 0
    ax.scatter(coords[none, 0], coords[none, 1], s=2, c="0.8", label="no particle", rasterized=True)
    ids = np.unique(owner[~none])
    perm = np.random.default_rng(0).permutation(len(ids))
    colour = dict(zip(ids, perm, strict=True))
    c = np.array([colour[o] for o in owner[~none]])
    ax.scatter(coords[~none, 0], coords[~none, 1], s=3, c=c, cmap="tab20", rasterized=True)
    ax.set(xlabel=r"$\eta$", ylabel=r"$\phi$")
    title = f"event {int(batch['event_index'][event])}: {n:,} hits, {len(ids)} particles"
    ax.set_title(f"{title} ({data_label(synthetic)})", fontsize=12)
    ax.legend(loc="upper right", markerscale=4, fontsize=9)
    return _finish(fig, ax)


def lsh_buckets(model, batch, layer: int = 0, round_: int = 0, head: int = 0) -> Any:
    """The LSH buckets of one layer, round and head on the first event, six drawn large."""
    import torch

    fig, ax = _ax((8, 5.5))
    blk = model.backbone[layer]
    span = layout_of(batch).spans[0]
    slots = slice(span.start, span.stop)
    X = batch["X"][span.row, slots][None]
    mask = batch["mask"][span.row, slots][None]
    layout = EventLayout.padded([span.hits], span.slots)
    with torch.no_grad():
        order = blk.bucket_order(hit_coordinates(X), mask, layout)
    n = span.hits
    rank = order.rank[0, round_, head, :n].cpu().numpy()
    bucket = rank // blk.block_size
    coords = hit_coordinates(X)[0, :n].cpu().numpy()
    nb = int(bucket.max()) + 1
    shuffle = np.random.default_rng(1).permutation(nb)
    ax.scatter(
        coords[:, 0], coords[:, 1], s=2, c=shuffle[bucket], cmap="tab20", alpha=0.5, rasterized=True
    )
    picks = np.linspace(0, nb - 1, min(6, nb)).astype(int)
    for k, b in enumerate(picks):
        sel = bucket == b
        xy = coords[sel, 0], coords[sel, 1]
        ax.scatter(*xy, s=18, color=f"C{k % 10}", edgecolor="k", lw=0.3, label=f"bucket {b}")
    ax.set(xlabel=r"$\eta$", ylabel=r"$\phi$")
    buckets = f"{nb} buckets of {blk.block_size} hits"
    ax.set_title(f"layer {layer}, hash round {round_}, head {head}: {buckets}", fontsize=12)
    ax.legend(loc="upper right", fontsize=8, ncol=2, markerscale=1)
    return _finish(fig, ax)


def memory_timeline(steps: dict[str, Any]) -> Any:
    """Live memory over one training step; ``steps`` maps a label to a ``StepMemory``."""
    fig, ax = _ax((10, 5))
    for i, (label, mem) in enumerate(steps.items()):
        if not mem.timeline:
            continue
        t = np.array(mem.timeline, dtype=float)
        base = (mem.baseline_bytes or 0) / MIB
        color = list(COLORS.values())[i % 2]
        peak = f"{label}: peak {t[:, 1].max() / MIB:,.0f} MiB"
        ax.plot(t[:, 0], t[:, 1] / MIB, lw=1.2, color=color, label=peak)
        for op, mark in mem.marks:
            if mark == "backward":
                ax.axvline(op, color=color, ls=":", lw=1)
                style = dict(color=color, fontsize=9, rotation=90, va="bottom")
                _note(ax, "backward starts", (op, base), (3, 3), **style)
    ax.set_xlabel("operator index within the step (forward, loss, backward)")
    ax.set_ylabel("live tensor memory [MiB]")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left")
    return _finish(fig, ax)


POLICY_COLORS = {
    "off": "#1f77b4",
    "full": "#d62728",
    "selective": "#2ca02c",
    "every 2": "#ff7f0e",
    "every 3": "#9467bd",
    "auto": "#8c564b",
}


def policy_front(front, tag: str = "") -> Any:
    """Peak allocated against the step-time overhead over off, a panel per batching and batch
    size of ``front`` (:func:`heptstudy.study.front.front_frame`): a dot per layer plan, a
    square per solver plan, each with the range of its overhead over the rounds; hollow where
    another plan dominates it, the plans on the front joined by a line."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    front = front.dropna(subset=["step_time_overhead_pct", "peak_allocated_mib"])
    panels = list(front.groupby(["batching", "batch_size"], sort=False))
    fig, axes = plt.subplots(
        1, len(panels), figsize=(7.5 * len(panels), 6.5), sharey=True, squeeze=False
    )
    placed = []
    for ax, ((batching, b), rows) in zip(axes[0], panels, strict=True):
        best = rows[rows["dominated_by"] == ""].sort_values("step_time_overhead_pct")
        xy = best["step_time_overhead_pct"], best["peak_allocated_mib"]
        ax.plot(*xy, "-", color="0.6", lw=1.2, zorder=1)
        placed.append((ax, [_front_point(ax, row) for _, row in rows.iterrows()]))
        ax.set_xlabel(f"step-time overhead over off [%], {batching} batches of {int(b)}")
        lo, hi = ax.get_xlim()
        ax.set_xlim(lo - 0.2 * (hi - lo), hi + 0.25 * (hi - lo))  # room for the labels
    axes[0][0].set_ylabel("peak allocated [MiB]")
    axes[0][0].set_ylim(0, axes[0][0].get_ylim()[1] * 1.15)
    key = [
        Line2D([], [], marker="o", ls="", color="0.3", label="layer plan"),
        Line2D([], [], marker="s", ls="", color="0.3", label="solver plan (keepNN)"),
        Line2D([], [], marker="o", ls="", color="0.3", mfc="white", label="dominated"),
        Line2D([], [], color="0.6", label="the front"),
    ]
    axes[0][-1].legend(handles=key, loc="upper right", fontsize=8)
    _finish(fig, axes[0][0], tag)
    for ax, labels in placed:
        _place_labels(fig, ax, labels)
    return fig


def _front_point(ax, row) -> tuple[str, tuple[float, float], str]:
    """One plan's marker and its overhead's range over the rounds; its ``(label, point,
    colour)``."""
    import matplotlib.pyplot as plt

    pol, over = row["policy"], row["step_time_overhead_pct"]
    solver = pol.startswith("keep ")
    colour = (
        plt.cm.viridis(0.85 * float(pol[5:-1]) / 100) if solver else POLICY_COLORS.get(pol, "0.3")
    )
    here = (over, row["peak_allocated_mib"])
    lo, hi = row["overhead_min_pct"], row["overhead_max_pct"]
    if lo == lo and hi == hi and hi > lo:  # a range over the rounds (not NaN)
        ax.errorbar(*here, xerr=[[over - lo], [hi - over]], fmt="none", ecolor=colour, capsize=3)
    face = colour if row["dominated_by"] == "" else "white"
    ax.plot(*here, "s" if solver else "o", ms=8, color=colour, mfc=face, mew=2, zorder=2)
    return pol, here, colour


#: Pixels of distance from its point a label may move to cross one more point of a line.
_LINE_WEIGHT = 20.0
#: Pixels of air kept around each label, so that neighbours do not read as one.
_LABEL_AIR = 6.0
_SHIFT = {"left": 0.0, "right": 1.0, "bottom": 0.0, "top": 1.0, "center": 0.5}


def _place_labels(fig, ax, labels, fontsize: float = 9, sweeps: int = 3) -> None:
    """Each label where it stays inside the axes and covers no other label, marker, legend or
    text (these first), lies nearer its own point than any other (so that it names the point a
    reader takes it for), crosses as few lines as it can and keeps near its point: placed one by
    one, then each placed again among the others until none moves."""
    renderer = fig.canvas.get_renderer()
    hard, soft = _label_obstacles(fig, ax, renderer, labels)
    frame = ax.get_window_extent(renderer).extents
    spots = _label_spots()
    points = fig.dpi / 72
    candidates = []  # per label: each spot's box (x0, y0, x1, y1) with air, and its distance
    for text, xy, _ in labels:
        probe = ax.text(0, 0, text, fontsize=fontsize)
        size = probe.get_window_extent(renderer).size
        probe.remove()
        x, y = ax.transData.transform(xy)
        boxes = []
        for (dx, dy), ha, va in spots:
            x0 = x + dx * points - _SHIFT[ha] * size[0]
            y0 = y + dy * points - _SHIFT[va] * size[1]
            boxes.append((x0, y0, x0 + size[0], y0 + size[1]))
        air = np.array([-1, -1, 1, 1]) * _LABEL_AIR
        candidates.append(np.array(boxes) + air)
    distance = np.array([np.hypot(*offset) * points for offset, _, _ in spots])
    at = ax.transData.transform(np.array([xy for _, xy, _ in labels], dtype=float))
    chosen = [None] * len(labels)
    for _ in range(sweeps):
        moved = False
        for i, boxes in enumerate(candidates):
            others = [candidates[j][k] for j, k in enumerate(chosen) if k is not None and j != i]
            covered = _covered(boxes, frame, np.array(hard + others).reshape(-1, 4))
            soft_cost = _LINE_WEIGHT * _crossed(boxes, soft) + distance
            best = int(np.lexsort((soft_cost, _nearer_another(boxes, at, i), covered))[0])
            moved |= chosen[i] != best
            chosen[i] = best
        if not moved:
            break
    for (text, xy, colour), k in zip(labels, chosen, strict=True):
        offset, ha, va = spots[k]
        # a label away from its point is tied to it by a thin line
        far = abs(offset[1]) > 12 or abs(offset[0]) > 7
        tie = dict(arrowstyle="-", color=colour, lw=0.6, shrinkB=6) if far else None
        ax.annotate(
            text, xy, textcoords="offset points", xytext=offset, ha=ha, va=va,
            fontsize=fontsize, color=colour, arrowprops=tie,
        )  # fmt: skip


def _label_spots() -> list[tuple[tuple[float, float], str, str]]:
    """Where a point's label may go, nearest first: (offset in points, horizontal, vertical
    anchor); the label beside, above or below its point, then further away."""
    spots = []
    for dx in (7, 30, 60):
        for dy in (0, 3, 12, 26, 40, 54, 68):
            for side in (1, -1):
                ha = "left" if side > 0 else "right"
                if dy == 0:
                    spots.append(((dx * side, 0), ha, "center"))
                    continue
                spots += [((dx * side, dy), ha, "bottom"), ((dx * side, -dy), ha, "top")]
    return sorted(spots, key=lambda spot: float(np.hypot(*spot[0])))


def _label_obstacles(fig, ax, renderer, labels) -> tuple[list, Any]:
    """What no label may cover (texts, the legend, the markers: boxes ``(x0, y0, x1, y1)``) and
    what it had better not (points along the lines and label-less arrows), in display pixels."""
    hard = [tuple(t.get_window_extent(renderer).extents) for t in ax.texts if t.get_text()]
    if ax.get_legend() is not None:
        hard.append(tuple(ax.get_legend().get_window_extent(renderer).extents))
    radius = 6 * fig.dpi / 72  # a marker of 9 points, and a little air
    for _, xy, _ in labels:
        x, y = ax.transData.transform(xy)
        hard.append((x - radius, y - radius, x + radius, y + radius))
    return hard, np.array(_line_samples(ax)).reshape(-1, 2)


def _line_samples(ax, step: float = 4.0) -> list[tuple[float, float]]:
    """Display points every ``step`` pixels along the axes' lines and label-less arrows."""
    paths = [line.get_xydata() for line in ax.lines if line.get_linestyle() not in ("None", "")]
    paths += [np.array([t.xy, t.xyann]) for t in ax.texts if not t.get_text()]
    samples = []
    for path in paths:
        pts = ax.transData.transform(np.asarray(path, dtype=float))
        for a, b in zip(pts[:-1], pts[1:], strict=True):
            n = max(int(np.hypot(*(b - a)) / step), 1)
            samples += [tuple(a + (b - a) * k / n) for k in range(n + 1)]
    return samples


#: A label reads as naming the nearest point unless another is nearly as near: it must lie this
#: many times nearer its own point than any other.
_OWN_NEARER = 1.5


def _nearer_another(boxes, points, own: int) -> Any:
    """For each box (with its air), whether a point other than ``points[own]`` lies about as
    near to its text or nearer (within :data:`_OWN_NEARER` times its own point's distance)."""
    boxes = boxes + np.array([1, 1, -1, -1]) * _LABEL_AIR
    dx = np.maximum(boxes[:, None, 0] - points[None, :, 0], points[None, :, 0] - boxes[:, None, 2])
    dy = np.maximum(boxes[:, None, 1] - points[None, :, 1], points[None, :, 1] - boxes[:, None, 3])
    gap = np.hypot(np.clip(dx, 0, None), np.clip(dy, 0, None))  # box to point, 0 inside
    return (np.delete(gap, own, axis=1) < _OWN_NEARER * gap[:, [own]]).any(axis=1)


def _covered(boxes, frame, hard) -> Any:
    """Area of each box outside ``frame`` or over any of ``hard``."""
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    outside = area - _overlaps(boxes, np.array([frame]))[:, 0]
    return outside + _overlaps(boxes, hard).sum(axis=1)


def _overlaps(a, b) -> Any:
    """Area shared by each box of ``a`` (rows) with each of ``b`` (columns)."""
    w = np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0])
    h = np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1])
    return np.clip(w, 0, None) * np.clip(h, 0, None)


def _crossed(boxes, samples) -> Any:
    """How many of the line ``samples`` each box holds."""
    x, y = samples[:, 0][None, :], samples[:, 1][None, :]
    inside = (
        (boxes[:, [0]] <= x) & (x <= boxes[:, [2]]) & (boxes[:, [1]] <= y) & (y <= boxes[:, [3]])
    )
    return inside.sum(axis=1)


CATEGORY_COLORS = {
    "parameters": "#4c72b0",
    "gradients": "#dd8452",
    "optimizer_state": "#937860",
    "inputs": "#8c8c8c",
    "activations": "#c44e52",
    "temporaries": "#55a868",
}


def memory_categories_stacked(categories, tag: str = "") -> Any:
    """Live MiB by category at the step's peak, one stacked bar per memory report."""
    fig, ax = _ax((max(7.5, 0.9 * len(categories) + 3), 5.5))
    x, pos, last = [], 0.0, None
    for b in categories["batch_size"]:
        if last is not None and b != last:
            pos += 0.6
        x.append(pos)
        pos, last = pos + 1, b
    layers = [
        (cat.replace("_", " "), color, categories[cat].astype(float).to_numpy())
        for cat, color in CATEGORY_COLORS.items()
    ]
    runs = zip(categories["batch_size"], categories["policy"], strict=True)
    ticks = [f"b{int(b)}\n{p}" for b, p in runs]
    ax.set_xlabel("batch size and checkpointing policy")
    totals = [f"{top:,.0f}" for top in sum(vals for _, _, vals in layers)]
    return _stacked(fig, ax, np.array(x), layers, totals, ticks, "live MiB at the step's peak", tag)


PHASE_COLORS = ("#4c72b0", "#8172b3", "#ccb974", "#c44e52", "#55a868")


def step_breakdown_figure(breakdown, tag: str = "") -> Any:
    """Mean time per step phase, one stacked bar per memory report, its mean step time above."""
    fig, ax = _ax((max(7.5, 0.9 * len(breakdown) + 3), 5.5))
    layers = [
        (label, color, breakdown[label].astype(float).fillna(0.0).to_numpy())
        for label, color in zip(PHASE_LABELS.values(), PHASE_COLORS, strict=True)
    ]
    steps = [f"{step:.3g} s" for step in breakdown["mean_step_s"]]
    ylabel = "mean time per counted step [s]"
    x = np.arange(len(breakdown))
    return _stacked(
        fig, ax, x, layers, steps, breakdown["name"], ylabel, tag, rotation=30, ha="right"
    )


def _stacked(fig, ax, x, layers, above, ticks, ylabel: str, tag: str, **tick_style) -> Any:
    """Bars at ``x`` stacked from ``layers`` (label, colour, values), ``above`` written on top."""
    bottom = np.zeros(len(x))
    for label, color, vals in layers:
        ax.bar(x, vals, 0.8, bottom=bottom, color=color, label=label)
        bottom += vals
    for xi, top, text in zip(x, bottom, above, strict=True):
        ax.annotate(text, (xi, top), ha="center", va="bottom", fontsize=9)
    ax.set_xticks(x, ticks, **tick_style, fontsize=9)
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, ax.get_ylim()[1] * 1.3)
    ax.legend(loc="upper left", bbox_to_anchor=(0.0, 0.92), ncol=3, fontsize=9)
    return _finish(fig, ax, tag)


def overhead_spread_figure(over, tag: str = "") -> Any:
    """Each policy's step-time overhead over ``off``: median and range over the rounds; the
    allocator as it comes hatched."""
    import matplotlib.pyplot as plt

    fig, ax = _ax((max(7.5, 0.7 * len(over) + 3), 5.0))
    # a row of runs not compared (different machines, commits or versions) has no overhead
    rows = over[over["overhead_median_pct"].notna()]
    rows = rows.sort_values(["batch_size", "allocator_line", "policy"], kind="stable")
    series = list(dict.fromkeys(zip(rows["allocator_line"], rows["policy"], strict=True)))
    batches = sorted(rows["batch_size"].unique())
    cycle = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    groups = zip(series, _group(len(series)), strict=True)
    for j, ((line, policy), (shift, width)) in enumerate(groups):
        part = rows[(rows["allocator_line"] == line) & (rows["policy"] == policy)]
        xs = np.array([batches.index(b) for b in part["batch_size"]], dtype=float) + shift
        med = part["overhead_median_pct"].astype(float).to_numpy()
        lo = med - part["overhead_min_pct"].astype(float).to_numpy()
        hi = part["overhead_max_pct"].astype(float).to_numpy() - med
        label = policy if line == "platform" else f"{policy} (allocator as it comes)"
        colour, hatch = cycle[j % len(cycle)], "//" if line != "platform" else None
        err = np.vstack([lo, hi])
        ax.bar(xs, med, width, yerr=err, capsize=3, color=colour, hatch=hatch, label=label)
        for x, v, n in zip(xs, med, part["rounds"], strict=True):
            _note(ax, f"{v:.0f}%\n({int(n)})", (x, v), (0, 2), ha="center", va="bottom", fontsize=8)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(np.arange(len(batches)), [str(int(b)) for b in batches])
    ax.set_xlabel("batch size [events]")
    ax.set_ylabel("step-time overhead against off [%]\nmedian, bars: min-max over rounds (n)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
    return _finish(fig, ax, tag)
