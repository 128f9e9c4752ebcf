"""`heptstudy train`."""

from __future__ import annotations

import argparse

from heptstudy.cli import add_config_args
from heptstudy.config import load_config
from heptstudy.estimate.plans import predictor_for
from heptstudy.train.trainer import train


def _train(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)
    summary = train(
        config,
        resume=args.resume,
        progress=not args.no_progress,
        new_run=args.new_run,
        plan_predictor=predictor_for,
    )
    if summary["rank"] == 0:
        print(f"trained to step {summary['step']}; outputs in {summary['out_dir']}")
    return 0


def register_cli(sub) -> None:
    p = sub.add_parser("train", help="train the configured model (also under torchrun)")
    add_config_args(p)
    p.add_argument(
        "--resume",
        help="training-state file (OUT/checkpoints/step_NNNNNN.pt) to continue from exactly; "
        "the run continues in the folder that wrote it",
    )
    p.add_argument(
        "--new-run",
        action="store_true",
        help="train.out_dir already holds a run: start a new one in OUT/run-002 (run-003, ...)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_train, interrupted="nothing was trained; run the same command again")
