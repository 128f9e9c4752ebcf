"""`heptstudy fit`: its arguments as a :class:`~heptstudy.fitting.api.FitRequest`."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path

from heptstudy.cli import add_set_arg, not_blank, refuse_unread
from heptstudy.data.layout import BATCHINGS
from heptstudy.errors import HeptstudyError
from heptstudy.fitting.api import DEFAULT_SCENARIO, DEFAULT_VARIANT, FitRequest, fit, repo_path
from heptstudy.fitting.reports import expand_report_paths
from heptstudy.fitting.words import render
from heptstudy.measure.report_checks import checked_report

#: fit's own options and their defaults: given before `validate`, they would be ignored.
_FIT_ONLY = {
    "platform": None,
    "per_device_batch": None,
    "scenario": DEFAULT_SCENARIO,
    "variant": DEFAULT_VARIANT,
    "fits_dir": None,
    "safety_margin_gib": None,
    "checkpointing": None,
    "batching": None,
    "save_model": None,
    "estimate": False,
    "overrides": [],
    "json": False,
}


#: validate's options, as fit's parser reads them when given before `validate` (or without it).
_VALIDATE_ONLY = {"misplaced_code": "--code", "misplaced_out": "--out"}


def _option(dest: str) -> str:
    return "--set" if dest == "overrides" else "--" + dest.replace("_", "-")


def _refuse_misplaced(args: argparse.Namespace) -> None:
    given = [option for dest, option in _VALIDATE_ONLY.items() if getattr(args, dest) is not None]
    why = "(options of `heptstudy fit validate` go after the word validate)"
    refuse_unread("heptstudy fit", given, why)


def _cmd_fit(args: argparse.Namespace) -> int:
    _refuse_misplaced(args)
    needed = {"--platform": args.platform, "--per-device-batch": args.per_device_batch}
    if missing := [flag for flag, value in needed.items() if value is None]:
        raise HeptstudyError(
            f"heptstudy fit needs {' and '.join(missing)} (e.g. --platform h100 "
            "--per-device-batch 48); `heptstudy fit validate` checks the estimator instead"
        )
    if args.fits_dir is not None and not repo_path(args.fits_dir).is_dir():
        raise HeptstudyError(
            f"--fits-dir {args.fits_dir!r} is not a folder here or in the repository; give the "
            "folder of stored memory models, or leave --fits-dir out for configs/fit"
        )
    # every request field the command line has; FitRequest makes the lists tuples
    given = {f.name: getattr(args, f.name) for f in fields(FitRequest) if hasattr(args, f.name)}
    request = FitRequest(**given)
    if args.save_model:  # refused before the fit, not after it
        from heptstudy.estimate.memory_model import MODEL_FILE

        MODEL_FILE.check(args.save_model, "--save-model")
    result = fit(request)
    if args.save_model:
        result.model.save(args.save_model)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(render(result))
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    # the estimator (fake tensors, simulator) is loaded only for the command that uses it
    from heptstudy.estimate import validation

    _refuse_misplaced(args)
    given = [_option(d) for d, default in _FIT_ONLY.items() if getattr(args, d) != default]
    refuse_unread("heptstudy fit validate", given, "(it estimates the reports' own runs)")
    if args.out:
        validation.check_out(Path(args.out))
    reports = [(path, checked_report(path)) for path in expand_report_paths(args.reports)]
    doc = validation.validate(reports, args.data_dir, args.code, lambda s: print(s, flush=True))
    for s in doc["skipped"]:
        print(f"skipped {s['report']}: {s['reason']}")
    print(validation.table(doc))
    for path in validation.write_outputs(doc, Path(args.out)) if args.out else ():
        print(f"wrote {path}")
    within = (
        f"{validation.ALLOCATED_TOLERANCE:.0%} allocated and "
        f"{validation.RESERVED_TOLERANCE:.0%} reserved"
    )
    ok = doc["all_within_tolerance"]
    print(f"every report within {within}" if ok else f"NOT every report within {within}")
    return 0 if ok else 1


def register_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "fit", help="will a per-device batch fit a platform's memory over the whole data set?"
    )
    _text(p, "--platform", help="platform profile (YAML file or name); required to fit")
    p.add_argument("--per-device-batch", type=int, help="events per device; required to fit")
    _text(
        p,
        "--scenario",
        default=DEFAULT_SCENARIO,
        help=f"training scenario (default {DEFAULT_SCENARIO})",
    )
    _text(
        p,
        "--variant",
        default=DEFAULT_VARIANT,
        help=f"scenario variant (default {DEFAULT_VARIANT})",
    )
    _text(p, "--data-dir", help="TFDS data directory (default: the scenario's)")
    p.add_argument(
        "--reports",
        nargs="*",
        default=[],
        help="bench reports (files or folders) to fit a measured model from; refused, with the "
        "reason for each, when none of them was measured in this configuration",
    )
    _text(p, "--fits-dir", help="stored memory models (default: the repository's configs/fit)")
    p.add_argument(
        "--safety-margin-gib",
        type=float,
        help="memory kept free for the context and kernel workspaces, 0 <= margin < device "
        "memory (default 10%% of the device)",
    )
    p.add_argument(
        "--checkpointing",
        choices=["auto"],
        help="auto: also answer for activation_checkpointing=auto (plans per step, expected step "
        "time from --reports, P(step exceeds the budget)); default: the recipe's setting",
    )
    p.add_argument(
        "--batching",
        choices=BATCHINGS,
        help="padded: every event filled to its batch's longest; packed: the batch's events in "
        "one stream, the answer over the batch's slots in all (default: the recipe's)",
    )
    _text(p, "--save-model", help="write the memory model used to this JSON file")
    p.add_argument(
        "--estimate",
        action="store_true",
        help="estimate the memory model now on a fake device (no GPU), ignoring stored models "
        "and reports; with --save-model this regenerates a stored estimated model for the "
        "current code (see scripts/regenerate_fits.sh)",
    )
    add_set_arg(p, help="dotted override of the resolved recipe (repeatable)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    for dest, option in _VALIDATE_ONLY.items():  # read only to be refused by name
        _text(p, option, dest=dest, help=argparse.SUPPRESS)
    p.set_defaults(func=_cmd_fit)
    modes = p.add_subparsers(dest="what", metavar="{validate}")
    _add_validate(modes)


def _add_validate(modes) -> None:
    v = modes.add_parser(
        "validate",
        help="hold the estimator to measured reports",
        description="Estimate every memory report of --reports that measured the running code, "
        "on its own events in --data-dir, and print measured against estimated (reports of other "
        "code: scripts/at_commit.sh COMMIT fit validate ...).",
    )
    v.add_argument(
        "--reports",
        nargs="+",
        required=True,
        help="bench memory reports, files or folders (e.g. experiments/cpu_reference)",
    )
    _text(v, "--data-dir", required=True, help="the TFDS data directory they measured")
    _text(
        v,
        "--code",
        help="the code the reports measured: 'running' (reports that stand for the running "
        "code) or a commit (for reports whose own environment.git_commit this repository does "
        "not hold); default: each report's commit. Reports of a commit whose model or step code "
        "is not the running code's are skipped",
    )
    _text(v, "--out", help="folder for validation.json and table.md")
    v.set_defaults(func=_cmd_validate)


def _text(parser, option: str, **kwargs) -> None:
    """An option whose value is text (a name, a path): a blank one is refused."""
    parser.add_argument(option, type=not_blank(option), **kwargs)
