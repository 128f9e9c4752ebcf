"""Throughput of the input path on one core: read + decode, pad (collate) and tracker features.

    .venv/bin/python scripts/bench_data.py --data-dir data/tfds --events 200 --batch 4

Prints events/s for reading alone and for reading + padding + neighbourhood features, per
wall-clock second and per CPU second of this process (the latter is the one-core cost when the
machine is shared), and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")


def main() -> None:
    import torch

    torch.set_num_threads(1)
    from heptstudy.data.batching import collate
    from heptstudy.data.tfds import open_dataset

    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default="data/tfds")
    ap.add_argument("--dataset", default="cld_edm_ttbar_hits:3.2.1")
    ap.add_argument("--configs", nargs="+", default=["1"])
    ap.add_argument("--events", type=int, default=200)
    ap.add_argument("--batch", type=int, default=4)
    from heptstudy.config import TrackerFeaturesConfig

    ap.add_argument("--radii", nargs="+", type=float, default=TrackerFeaturesConfig().radii)
    args = ap.parse_args()
    ds = open_dataset(args.data_dir, args.dataset, args.configs, "train")
    n = min(args.events, len(ds))
    t0, c0 = time.perf_counter(), time.process_time()
    hits = sum(len(ds[i]["X"]) for i in range(n))
    t_read, c_read = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    for s in range(0, n, args.batch):
        collate([ds[i] for i in range(s, min(s + args.batch, n))], 128, args.radii)
    t_all, c_all = time.perf_counter() - t0, time.process_time() - c0
    print(
        json.dumps(
            {
                "events": n,
                "mean_hits_per_event": hits / n,
                "synthetic": ds.metadata["synthetic"],
                "read_events_per_s": n / t_read,
                "read_pad_features_events_per_s": n / t_all,
                "read_events_per_cpu_s": n / c_read,
                "read_pad_features_events_per_cpu_s": n / c_all,
                "load_average_1min": os.getloadavg()[0],
                "cpu_threads": 1,
                "radii": list(args.radii),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
