"""`heptstudy train`."""

from __future__ import annotations

import argparse


def _train(args: argparse.Namespace) -> int:
    from heptstudy.config import load_config
    from heptstudy.train.trainer import train

    config = load_config(args.config, args.overrides)
    summary = train(config, resume=args.resume, progress=not args.no_progress)
    if summary["rank"] == 0:
        print(f"trained to step {summary['step']}; outputs in {summary['out_dir']}")
    return 0


def register_cli(sub) -> None:
    from heptstudy.cli import add_config_args

    p = sub.add_parser("train", help="train the configured model (also under torchrun)")
    add_config_args(p)
    p.add_argument("--resume", help="checkpoint to continue from exactly")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_train)
