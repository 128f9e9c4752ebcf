"""`heptstudy fit`: will a per-device batch fit a platform's memory over the whole data set?
A thin layer: the arguments become a :class:`~heptstudy.fitting.api.FitRequest`."""

from __future__ import annotations

import argparse
import json

from heptstudy.fitting.api import DEFAULT_SCENARIO, DEFAULT_VARIANT, FitRequest, fit
from heptstudy.fitting.words import render


def _cmd_fit(args: argparse.Namespace) -> int:
    request = FitRequest(
        platform=args.platform,
        per_device_batch=args.per_device_batch,
        scenario=args.scenario,
        variant=args.variant,
        data_dir=args.data_dir,
        reports=tuple(args.reports),
        fits_dir=args.fits_dir,
        safety_margin_gib=args.safety_margin_gib,
        overrides=tuple(args.overrides),
        checkpointing=args.checkpointing,
    )
    result = fit(request)
    if args.save_model:
        result.model.save(args.save_model)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(render(result))
        if result.auto is not None:
            from heptstudy.fitting.auto import auto_words

            print("\n".join(auto_words(result.auto)))
    return 0


def register_cli(subparsers) -> None:
    from heptstudy.cli import add_set_arg

    p = subparsers.add_parser(
        "fit", help="will a per-device batch fit a platform's memory over the whole data set?"
    )
    p.add_argument("--platform", required=True, help="platform profile (YAML file or name)")
    p.add_argument("--per-device-batch", required=True, type=int, help="events per device")
    p.add_argument(
        "--scenario",
        default=DEFAULT_SCENARIO,
        help=f"training scenario (default {DEFAULT_SCENARIO})",
    )
    p.add_argument(
        "--variant", default=DEFAULT_VARIANT, help=f"scenario variant (default {DEFAULT_VARIANT})"
    )
    p.add_argument("--data-dir", default=None, help="TFDS data directory (default: the scenario's)")
    p.add_argument(
        "--reports",
        nargs="*",
        default=[],
        help="bench reports (files or folders) to fit a measured model from; refused, with the "
        "reason for each, when none of them was measured in this configuration",
    )
    p.add_argument(
        "--fits-dir",
        default=None,
        help="stored memory models (default: the repository's configs/fit)",
    )
    p.add_argument(
        "--safety-margin-gib",
        type=float,
        default=None,
        help="memory kept free for the context and kernel workspaces, 0 <= margin < device "
        "memory (default 10%% of the device)",
    )
    p.add_argument(
        "--checkpointing",
        choices=["auto"],
        default=None,
        help="auto: also answer for activation_checkpointing=auto (plans per step, expected step "
        "time from --reports, P(step exceeds the budget)); default: the recipe's setting",
    )
    p.add_argument(
        "--save-model", default=None, help="write the memory model used to this JSON file"
    )
    add_set_arg(p, help="dotted override of the resolved recipe (repeatable)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_fit)
