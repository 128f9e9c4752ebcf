"""`heptstudy train`."""

from __future__ import annotations

import argparse
import logging
import re
import signal

from heptstudy.cli import INTERRUPTED, add_config_args, whole_number
from heptstudy.config import load_config
from heptstudy.estimate.plans import predictor_for
from heptstudy.train.trainer import train


def _train(args: argparse.Namespace) -> int:
    if args.nproc_per_node is not None:
        return _launch(args)
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


def _launch(args: argparse.Namespace) -> int:
    """``torchrun --standalone --nproc-per-node N -m heptstudy.cli train ...`` in this process,
    so that Ctrl-C ends with each process's one line, not torchrun's traceback after them."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    worker = ["train", *(a for o in args.overrides for a in ("--set", o))]
    worker += ["--config", args.config] if args.config else []
    worker += ["--resume", args.resume] if args.resume else []
    worker += ["--new-run"] * args.new_run + ["--no-progress"] * args.no_progress
    launch = ["--standalone", "--nproc-per-node", str(args.nproc_per_node), "-m", "heptstudy.cli"]
    loggers = [logging.getLogger(f"torch.distributed.elastic.{m}") for m in _NOTICES_FROM]
    for logger in loggers:
        logger.addFilter(_shutdown_notices)
    try:
        run(parse_args([*launch, *worker]))
    except SignalException as stop:
        if stop.sigval != signal.SIGINT:
            raise
        return INTERRUPTED  # every process has said what was kept
    except ChildFailedError as failed:  # every process has said why
        code = min(f.exitcode for f in failed.failures.values())
        return INTERRUPTED if code == -signal.SIGINT else max(code, 1)
    finally:
        for logger in loggers:
            logger.removeFilter(_shutdown_notices)
    return 0


_NOTICES_FROM = ("agent.server.api", "multiprocessing.api")
_CTRL_C_NOTICE = re.compile(r"Received (2|\S*SIGINT) death signal|closing signal SIGINT")


def _shutdown_notices(record: logging.LogRecord) -> bool:
    """The agent's notices that it passes Ctrl-C on: each process says what it kept."""
    return not _CTRL_C_NOTICE.search(record.getMessage())


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
    p.add_argument(
        "--nproc-per-node",
        type=whole_number(1, 2),
        metavar="N",
        help="train on N processes of this machine (torchrun --standalone, started here; "
        "Ctrl-C stops them all with one line each)",
    )
    p.set_defaults(func=_train, interrupted="nothing was trained; run the same command again")
