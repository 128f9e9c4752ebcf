"""`heptstudy data generate` and `heptstudy data stats` (paths as :mod:`heptstudy.paths` says)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from heptstudy.atomic import folder_write_problem
from heptstudy.cli import whole_number
from heptstudy.committed import refuse_committed
from heptstudy.data.generate import generate_datasets
from heptstudy.data.stats import hits_stats, write_stats
from heptstudy.data.tfds import DATA_OPTIONS
from heptstudy.errors import DataError
from heptstudy.locks import holding
from heptstudy.paths import OUTPUT_ROOT, resolve_from_cwd, resolve_in_repo

DEFAULT_DATA_DIR = "data/tfds"
DEFAULT_STATS_DIR = f"{OUTPUT_ROOT}/data_stats"


def _data_dir(args: argparse.Namespace) -> str:
    return args.data_dir or str(resolve_in_repo(DEFAULT_DATA_DIR))


def _writable_folder(folder: str | Path, option: str) -> Path:
    """Refuse, before any work, a folder that could not be created or written. Creates nothing."""
    folder = Path(folder)
    if (problem := folder_write_problem(folder)) is not None:
        raise DataError(
            f"{option} {str(folder)!r} cannot be written ({problem}); nothing was generated or "
            f"measured. Give {option} a folder you can write to"
        )
    return folder


def _generate(args: argparse.Namespace) -> int:
    DATA_OPTIONS.refuse_repeated(args.configs)
    result = generate_datasets(
        _writable_folder(_data_dir(args), "--data-dir"),
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
    DATA_OPTIONS.refuse_repeated(args.configs)  # counted twice, and the same --out file written
    out = resolve_from_cwd(args.out or DEFAULT_STATS_DIR)
    refuse_committed(
        out, "--out", f"Leave out --out (it goes to {DEFAULT_STATS_DIR}) or give your own folder"
    )
    out = _writable_folder(out, "--out")
    stats = hits_stats(
        _data_dir(args),
        args.dataset,
        args.configs,
        args.split,
        args.pad_to_multiple,
        inputs=DATA_OPTIONS,  # the user gave options, not configuration keys
    )
    with holding(out, "statistics folder (--out)"):
        js, png, replaced = write_stats(stats, out)
    shown = ("dataset", "split", "num_events", "synthetic", "total", "events_above_tail_threshold")
    print(json.dumps({k: stats[k] for k in shown}, indent=1))
    print(f"wrote {js} and {png}")
    if replaced:
        print("(they replace the statistics of the same data set and split written earlier)")
    return 0


def register_cli(subparsers) -> None:
    data = subparsers.add_parser("data", help="generate synthetic data sets, data set statistics")
    sub = data.add_subparsers(dest="data_command", required=True)

    gen = sub.add_parser("generate", help="write synthetic cld_edm_ttbar_hits and _pf data sets")
    data_dir = f"TFDS data directory (default: the repository's {DEFAULT_DATA_DIR})"
    gen.add_argument("--data-dir", help=data_dir)
    gen.add_argument("--events-train", type=whole_number(1, 256), required=True)
    gen.add_argument("--events-test", type=whole_number(1, 64), required=True)
    gen.add_argument("--seed", type=whole_number(0, 20261014), required=True)
    gen.add_argument("--configs", nargs="+", default=["1"], help="builder configs (1..10)")
    gen.add_argument(
        "--occupancy-scale", type=float, default=1.0, help="hit multiplicity factor (1 = CLD-like)"
    )
    workers = "processes simulating events (default: up to 2)"
    gen.add_argument("--workers", type=whole_number(1, 2), help=workers)
    gen.add_argument("--no-progress", action="store_true", help="no progress bar")
    gen.set_defaults(
        func=_generate,
        interrupted="no data set was put in place and nothing is left half-written; run the "
        "same command again",
    )

    st = sub.add_parser("stats", help="hits-per-event distribution as JSON and PNG")
    st.add_argument("--data-dir", help=data_dir)
    st.add_argument("--dataset", default="cld_edm_ttbar_hits:3.2.1", help="NAME:VERSION")
    st.add_argument("--configs", nargs="+", default=["1"])
    st.add_argument("--split", default="train")
    st.add_argument("--pad-to-multiple", type=whole_number(1, 128), default=128)
    st.add_argument(
        "--out", help=f"output directory (default: {DEFAULT_STATS_DIR} in the current directory)"
    )
    st.set_defaults(func=_stats)
