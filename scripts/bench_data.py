"""Throughput of the input path on one core: read + decode, tracker features and padding.

    .venv/bin/python scripts/bench_data.py --data-dir data/tfds --events 400 --batch 4 \
        --out experiments/data_stats/bench_data.json

The process is pinned to one CPU (``sched_setaffinity``) and runs single-threaded; events come
through the training ``BatchLoader`` (sampler order, ``num_workers=0``), so the figure is the
one-core cost of what a training step consumes.  Each pass reads the same events again: the first
may include disk reads, later ones read from the page cache.  A separate pass splits the CPU time
per event into reading, features and padding (collate).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")


def _pin_to_one_cpu() -> int | None:
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


def _timed_pass(config, n_batches: int, batch: int) -> dict[str, float]:
    from heptstudy.data.batching import BatchLoader

    loader = BatchLoader(config, per_device_batch=batch)
    t0, c0 = time.perf_counter(), time.process_time()
    lengths = [next(loader)["length"] for _ in range(n_batches)]
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    events = sum(len(x) for x in lengths)
    return {
        "events": events,
        "mean_hits_per_event": float(sum(x.sum() for x in lengths)) / events,
        "events_per_s": events / wall,
        "events_per_cpu_s": events / cpu,
    }


def _stage_split(config, n_batches: int, batch: int) -> dict[str, float]:
    """CPU milliseconds per event of each stage, on the loader's events."""
    from heptstudy.data.batching import BatchLoader, collate
    from heptstudy.data.features import tracker_neighbourhood

    loader = BatchLoader(config, per_device_batch=batch)
    radii = config.model.tracker_features.radii
    ms = {"read": 0.0, "features": 0.0, "collate": 0.0}
    n = 0
    for _ in range(n_batches):
        events = []
        for i in loader.sampler.take(batch):
            c = time.process_time()
            ev = loader.dataset[i]
            ms["read"] += time.process_time() - c
            c = time.process_time()
            ev["neighbourhood"] = tracker_neighbourhood(ev["X"], radii)
            ms["features"] += time.process_time() - c
            events.append(ev)
        c = time.process_time()
        collate(events, config.data.pad_to_multiple)
        ms["collate"] += time.process_time() - c
        n += len(events)
    return {f"{k}_ms_per_event": 1e3 * v / n for k, v in ms.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default="data/tfds")
    ap.add_argument("--configs", nargs="+", default=["1"])
    ap.add_argument("--events", type=int, default=400, help="events per pass")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--radii", nargs="+", type=float, default=None, help="default: the config's")
    ap.add_argument("--out", help="also write the JSON here (atomically)")
    args = ap.parse_args()

    cpu = _pin_to_one_cpu()
    import torch

    torch.set_num_threads(1)
    from heptstudy.atomic import atomic_write_text
    from heptstudy.config import load_config
    from heptstudy.data.batching import dataset_for

    overrides = [
        f"data.data_dir={args.data_dir}",
        f"data.configs=[{','.join(repr(str(c)) for c in args.configs)}]",
        "data.num_workers=0",
    ]
    if args.radii:
        overrides.append(f"model.tracker_features.radii=[{','.join(map(str, args.radii))}]")
    config = load_config(overrides=overrides)
    n_batches = max(1, args.events // args.batch)
    passes = [_timed_pass(config, n_batches, args.batch) for _ in range(args.passes)]
    per_s = [p["events_per_s"] for p in passes]
    result = {
        "what": "read + tracker features + padding through BatchLoader, one CPU, one thread",
        "synthetic": bool(dataset_for(config, "train").metadata.get("synthetic", False)),
        "data_dir": args.data_dir,
        "configs": args.configs,
        "events_per_pass": passes[0]["events"],
        "batch": args.batch,
        "radii": config.model.tracker_features.radii,
        "pinned_cpu": cpu,
        "passes": passes,
        "median_events_per_s": statistics.median(per_s),
        "min_events_per_s": min(per_s),
        **_stage_split(config, n_batches, args.batch),
        "load_average_1min": os.getloadavg()[0],
    }
    text = json.dumps(result, indent=1) + "\n"
    print(text, end="")
    if args.out:
        atomic_write_text(args.out, text)


if __name__ == "__main__":
    main()
