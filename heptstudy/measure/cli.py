"""`heptstudy bench`: one measurement, one JSON report."""

from __future__ import annotations

import argparse


def _bench(args: argparse.Namespace) -> int:
    from heptstudy.errors import ConfigError
    from heptstudy.measure.bench import BenchOptions, default_output, run_bench
    from heptstudy.measure.summary import describe

    if args.batch_size is None:
        raise ConfigError("heptstudy bench needs --batch-size B (events per step, an integer >= 1)")
    opts = BenchOptions(
        batch_size=args.batch_size,
        checkpointing=args.checkpointing,
        steps=args.steps,
        warmup=args.warmup,
        variant=args.variant,
        platform=args.platform,
        data_dir=args.data_dir,
        dtype=args.dtype,
        seed=args.seed,
        overrides=args.overrides,
        parity_only=args.parity_only,
        deterministic=args.deterministic,
        progress=not args.no_progress,
    )
    opts.output = args.output or str(default_output(opts))
    report = run_bench(opts)
    print(describe(report))
    print(f"report: {opts.output}")
    return 0


def _bench_backbone(args: argparse.Namespace) -> int:
    import json

    import torch

    from heptstudy.atomic import atomic_write_text
    from heptstudy.config import load_config
    from heptstudy.measure.backbone import (
        check_backbone_request,
        describe_backbone,
        run_backbone_bench,
    )

    check_backbone_request(args.hits, args.repeats, args.device, args.threads, args.output)
    if args.threads:
        torch.set_num_threads(args.threads)
    config = load_config(args.config, args.overrides)
    result = run_backbone_bench(config, args.hits, repeats=args.repeats, device=args.device)
    print(describe_backbone(result))
    if args.output:
        atomic_write_text(args.output, json.dumps(result, indent=2) + "\n")
        print(f"written: {args.output}")
    return 0


def _add_backbone(sub) -> None:
    from heptstudy.cli import add_config_args

    p = sub.add_parser("backbone", help="forward+backward of the HEPTv2 backbone alone on N hits")
    p.add_argument("--hits", type=int, default=10000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, help="torch intra-op threads (default: PyTorch's choice)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--output", help="JSON file for the result")
    add_config_args(p)
    p.set_defaults(func=_bench_backbone)


def register_cli(sub) -> None:
    from heptstudy.cli import add_set_arg

    p = sub.add_parser(
        "bench",
        help="measure peak memory and step time, or checkpointing parity",
        description="heptstudy bench --batch-size B [...] measures one configuration; "
        "heptstudy bench backbone --hits N times the backbone alone",
    )
    _add_backbone(p.add_subparsers(dest="bench_command"))
    p.add_argument("--batch-size", type=int, help="events per step (required)")
    p.add_argument(
        "--checkpointing",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="activation checkpointing of the HEPTv2 layers (default: off)",
    )
    p.add_argument("--steps", type=int, default=5, help="counted steps (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="uncounted warm-up steps (default 2)")
    p.add_argument(
        "--variant", choices=["hit_heptv2_grouped_tracker_features", "track_cluster_mlpf"]
    )
    p.add_argument("--platform", help="platform profile YAML (device, dtype, attention backend)")
    p.add_argument("--data-dir", help="TFDS data directory (default: data.data_dir)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"])
    p.add_argument("--seed", type=int, help="initialisation and event-selection seed (train.seed)")
    add_set_arg(p)
    p.add_argument("--output", help="report path (default experiments/scratch/NAME.json)")
    p.add_argument(
        "--parity-only", action="store_true", help="checkpointing parity instead of memory/time"
    )
    p.add_argument(
        "--deterministic", action="store_true", help="torch.use_deterministic_algorithms(True)"
    )
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_bench)
