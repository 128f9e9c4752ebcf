"""``heptstudy scenario resolve|render``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from heptstudy.cli import add_set_arg
from heptstudy.errors import ConfigError
from heptstudy.fitting import fit_warning
from heptstudy.paths import OUTPUT_ROOT
from heptstudy.scenario.render import refuse_empty_path, render, shell_join
from heptstudy.scenario.resolve import Resolution, resolve, summary


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--scenario", required=True, help="scenario YAML, or a name in configs/training/scenarios"
    )
    p.add_argument(
        "--platform", required=True, help="platform YAML, or a name in configs/training/platforms"
    )
    only = "resolve only this variant (repeatable; all are still checked)"
    p.add_argument("--variant", action="append", metavar="NAME", help=only)
    add_set_arg(p, help="dotted override applied to every variant, e.g. train.num_steps=4")
    p.add_argument(
        "--data-dir",
        help="shorthand for --set data.data_dir=DIR (also where the test-split size is read "
        "from); a relative DIR, typed here, is taken from the working directory, while one in "
        "the scenario file or the default data/tfds is taken from the repository",
    )
    p.add_argument(
        "--resume",
        metavar="PATH",
        help="append --resume PATH (an existing step_NNNNNN.pt checkpoint) to the launch "
        "command (scenario resolve: with --dry-run); one variant only (--variant NAME): a "
        "checkpoint is one variant's training state",
    )
    p.add_argument("--json", action="store_true", help="print the resolution as JSON")


def _overrides(args: argparse.Namespace) -> list[str]:
    """``--set`` with ``--data-dir`` as ``data.data_dir`` (quoted: any folder name is text)."""
    if args.data_dir is None:
        return list(args.overrides)
    refuse_empty_path(args.data_dir, "--data-dir", "resolved", "the folder holding the data set")
    return [*args.overrides, f"data.data_dir={json.dumps(args.data_dir)}"]


def _resolution(
    args: argparse.Namespace, out: str | None, written: bool, option: str = "--out"
) -> tuple[Resolution, list[Path]]:
    """The scenario resolved (and ``written`` into ``out``, named by ``option``), printed as JSON
    or as a summary."""
    given = _overrides(args)
    if written:  # an empty `out` is refused there, as for any caller
        res, scripts = render(
            args.scenario, args.platform, out, args.variant, given, args.resume, option=option
        )
    else:
        res, scripts = resolve(args.scenario, args.platform, args.variant, given), []
    print(json.dumps(res.to_dict(), indent=2) if args.json else summary(res))
    return res, scripts


def _dry_run_only(args: argparse.Namespace) -> None:
    """Without --dry-run nothing is written or launched: an option for those is refused, not
    ignored (a --resume the user believes checked, say)."""
    given = {"--render-dir": args.render_dir, "--resume": args.resume}
    if named := [option for option, value in given.items() if value is not None]:
        options, verb = " and ".join(named), "apply" if len(named) > 1 else "applies"
        raise ConfigError(
            f"{options} only {verb} with --dry-run (which writes the configurations and prints "
            "the launch commands); without it nothing is written or launched, so nothing was "
            f"resolved. Add --dry-run, or leave {options} out"
        )


def _cmd_resolve(args: argparse.Namespace) -> int:
    if not args.dry_run:
        _dry_run_only(args)
    res, _ = _resolution(args, args.render_dir, written=args.dry_run, option="--render-dir")
    if args.json:
        return 0
    if warning := fit_warning(res):
        print(f"warning: {warning}", file=sys.stderr)
    if args.dry_run:
        print("dry run: nothing was launched; the launch commands are")
        for v in res.variants:
            print(f"# {v.name} (configuration {v.config_path})")
            print(shell_join(v.launch))
    return 0


def _cmd_render(args: argparse.Namespace) -> int:
    res, scripts = _resolution(args, args.out, written=True)
    if not args.json:
        for v, s in zip(res.variants, scripts, strict=True):
            print(f"rendered {v.name}: configuration {v.config_path}, launch script {s}")
    return 0


def register_cli(subparsers: argparse._SubParsersAction) -> None:
    sc = subparsers.add_parser(
        "scenario", help="training scenarios: resolve, check, render launches"
    )
    sub = sc.add_subparsers(dest="scenario_command", required=True)
    r = sub.add_parser("resolve", help="resolve a scenario on a platform and check its invariants")
    _add_common(r)
    dry = "also write the resolved configurations and print the exact launch commands"
    r.add_argument("--dry-run", action="store_true", help=dry)
    where = (
        "where --dry-run writes configurations (default "
        f"{OUTPUT_ROOT}/train/_rendered/SCENARIO/PLATFORM)"
    )
    r.add_argument("--render-dir", help=where)
    r.set_defaults(func=_cmd_resolve)
    w = sub.add_parser(
        "render",
        help="write resolved configurations and launch scripts (Slurm batch "
        "scripts for Slurm profiles) into --out",
    )
    _add_common(w)
    w.add_argument("--out", required=True, help="directory for the rendered files")
    w.set_defaults(func=_cmd_render)
