"""`heptstudy data generate` and `heptstudy data stats`."""

from __future__ import annotations

import argparse
import json


def _generate(args: argparse.Namespace) -> int:
    from heptstudy.data.generate import generate_datasets

    result = generate_datasets(
        args.data_dir,
        events_train=args.events_train,
        events_test=args.events_test,
        seed=args.seed,
        configs=args.configs,
        occupancy_scale=args.occupancy_scale,
        progress=not args.no_progress,
        workers=args.workers,
    )
    print(
        f"wrote {result['events']['train']} train + {result['events']['test']} test synthetic "
        f"events per config {result['configs']} to {result['data_dir']} "
        f"({result['seconds']:.1f} s); jets: {result['metadata']['jets']}"
    )
    return 0


def _stats(args: argparse.Namespace) -> int:
    from heptstudy.data.stats import hits_stats, write_stats

    stats = hits_stats(args.data_dir, args.dataset, args.configs, args.split, args.pad_to_multiple)
    js, png = write_stats(stats, args.out)
    summary = {k: stats[k] for k in ("dataset", "split", "num_events", "synthetic")}
    summary["total"] = stats["total"]
    summary["events_above_tail_threshold"] = stats["events_above_tail_threshold"]
    print(json.dumps(summary, indent=1))
    print(f"wrote {js} and {png}")
    return 0


def register_cli(subparsers) -> None:
    data = subparsers.add_parser("data", help="generate synthetic data sets, data set statistics")
    sub = data.add_subparsers(dest="data_command", required=True)

    gen = sub.add_parser("generate", help="write synthetic cld_edm_ttbar_hits and _pf data sets")
    gen.add_argument("--data-dir", default="data/tfds", help="TFDS data directory")
    gen.add_argument("--events-train", type=int, required=True)
    gen.add_argument("--events-test", type=int, required=True)
    gen.add_argument("--seed", type=int, required=True)
    gen.add_argument("--configs", nargs="+", default=["1"], help="builder configs (1..10)")
    gen.add_argument(
        "--occupancy-scale", type=float, default=1.0, help="hit multiplicity factor (1 = CLD-like)"
    )
    gen.add_argument(
        "--workers", type=int, default=None, help="processes simulating events (default: up to 2)"
    )
    gen.add_argument("--no-progress", action="store_true", help="no progress bar")
    gen.set_defaults(func=_generate)

    st = sub.add_parser("stats", help="hits-per-event distribution as JSON and PNG")
    st.add_argument("--data-dir", default="data/tfds")
    st.add_argument("--dataset", default="cld_edm_ttbar_hits:3.2.1", help="NAME:VERSION")
    st.add_argument("--configs", nargs="+", default=["1"])
    st.add_argument("--split", default="train")
    st.add_argument("--pad-to-multiple", type=int, default=128)
    st.add_argument("--out", default="experiments/data_stats", help="output directory")
    st.set_defaults(func=_stats)
