"""Hits-per-event statistics of a data set split: JSON numbers and a histogram PNG."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from heptstudy.atomic import Output, atomic_savefig, atomic_write_text, figure_kind
from heptstudy.data.batching import padded_sizes
from heptstudy.data.tfds import CONFIG_KEYS, Inputs, open_dataset

STATS_SCHEMA = "heptstudy.data_stats/1"
QUANTILES = (0.05, 0.10, 0.25, 0.50, 0.75, 0.90, 0.95, 0.99)
TAIL_THRESHOLD = 13_000
#: Statistics replace only statistics.
STATS_FILE = Output(
    "heptstudy data statistics file", ".json", f'"schema": "{STATS_SCHEMA}"'.encode()
)


def _summary(values: np.ndarray) -> dict[str, Any]:
    if len(values) == 0:
        return {"n": 0}
    return {
        "min": int(values.min()),
        "max": int(values.max()),
        "mean": float(values.mean()),
        "quantiles": {f"p{round(q * 100):02d}": float(np.quantile(values, q)) for q in QUANTILES},
    }


def hits_stats(
    data_dir: str | Path,
    dataset: str,
    configs: Sequence[str],
    split: str,
    pad_to_multiple: int = 128,
    inputs: Inputs = CONFIG_KEYS,
) -> dict[str, Any]:
    """Hits (elements) per event of ``split``: total, tracker and calorimeter, padded sizes;
    messages name the inputs as ``inputs`` says."""
    inputs.refuse_repeated(configs)
    ds = open_dataset(data_dir, dataset, configs, split, inputs)
    total, tracker, calo = [], [], []
    for i in range(len(ds)):
        X = ds[i]["X"]
        total.append(len(X))
        tracker.append(int((X[:, 0] == 1).sum()))
        calo.append(int((X[:, 0] == 2).sum()))
    total_a = np.array(total, dtype=np.int64)
    padded = padded_sizes(total, pad_to_multiple)
    md = ds.metadata
    return {
        "schema": STATS_SCHEMA,
        "synthetic": bool(md.get("synthetic", False)),
        "dataset": f"{ds.name}:{md.get('version')}",
        "configs": list(ds.shard_names),
        "split": split,
        "data_dir": str(data_dir),
        "num_events": len(ds),
        "pad_to_multiple": int(pad_to_multiple),
        "row_kind": "hits" if ds.is_hits else "elements",
        "total": _summary(total_a),
        "tracker": _summary(np.array(tracker)),
        "calorimeter": _summary(np.array(calo)),
        "padded": _summary(padded),
        "tail_threshold": TAIL_THRESHOLD,
        "events_above_tail_threshold": int((total_a > TAIL_THRESHOLD).sum()),
        "generator": {k: md[k] for k in ("generator", "seed", "occupancy_scale") if k in md},
        "per_event": {"total": total, "tracker": tracker, "calorimeter": calo},
    }


def write_stats(stats: dict[str, Any], out_dir: str | Path) -> tuple[Path, Path, bool]:
    """``<dataset>_<split>_stats.json`` and a ``.png`` histogram of hits per event into
    ``out_dir``; True when they replace earlier ones (a file of another kind is refused first)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{stats['dataset'].split(':')[0]}_{stats['split']}_stats"
    js, png = out / f"{stem}.json", out / f"{stem}.png"
    replaced = STATS_FILE.check(js, "--out")
    figure_kind(png).check(png, "--out")  # both refused before either is written
    atomic_write_text(js, json.dumps(stats, indent=1) + "\n", kind=STATS_FILE)
    per = stats["per_event"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    top = max(per["total"]) if per["total"] else 1
    bins = np.linspace(0, top * 1.05 + 1, 60)
    for key, label in (("total", "all"), ("tracker", "tracker"), ("calorimeter", "calorimeter")):
        ax.hist(per[key], bins=bins, histtype="step", lw=1.5, label=label)
    med = stats["total"]["quantiles"]["p50"]
    ax.axvline(med, color="k", ls="--", lw=1, label=f"median {med:.0f}")
    if top > (tail := stats["tail_threshold"]):
        ax.axvline(tail, color="grey", ls=":", lw=1, label=f"{tail:,}")
    ax.set(xlabel=f"{stats['row_kind']} per event", ylabel="events")
    kind = "synthetic" if stats["synthetic"] else "real"
    ax.set_title(
        f"{stats['dataset']} configs {','.join(stats['configs'])} {stats['split']} "
        f"({kind}, {stats['num_events']} events)"
    )
    ax.legend()
    fig.tight_layout()
    atomic_savefig(fig, png, dpi=120)
    plt.close(fig)
    return js, png, replaced
