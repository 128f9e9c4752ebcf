"""`heptstudy` command line: a thin layer over the package."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from heptstudy.config import load_config
from heptstudy.errors import HeptstudyError, Interrupted, os_error_advice


def whole_number(minimum: int, example: int):
    """An argparse type: a whole number >= ``minimum`` (argparse reports anything else)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a whole number; give one of at least {minimum}, e.g. {example}"
            ) from None
        if value < minimum:
            raise argparse.ArgumentTypeError(
                f"{value} is below {minimum}; give a whole number of at least {minimum}, "
                f"e.g. {example}"
            )
        return value

    return parse


def add_set_arg(
    parser: argparse.ArgumentParser,
    help: str = "dotted override, e.g. model.heptv2.activation_checkpointing=true (repeatable)",
    default: object = None,
) -> None:
    """``--set KEY=VALUE`` (repeatable) into ``args.overrides``: the one override syntax.
    ``default``: [] unless given (a subcommand's SUPPRESS keeps its parent's ``--set``)."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[] if default is None else default,
        metavar="KEY=VALUE",
        help=help,
    )


def not_blank(option: str):
    """An argparse type refusing a blank value, which would otherwise read as None (the notebooks'
    spelling of it) or as the current folder, and quietly stand for something else."""

    def check(value: str) -> str:
        if not value.strip():
            raise argparse.ArgumentTypeError(
                f"{value!r} is empty; give a value, or leave {option} out for its default"
            )
        return value

    return check


def refuse_unread(command: str, options: list[str], why: str) -> None:
    """``options`` the user gave that ``command`` would parse and never read: refused by name
    rather than run without them."""
    if options:
        raise HeptstudyError(
            f"{command}: {', '.join(options)} {'does' if len(options) == 1 else 'do'} not apply "
            f"{why}; leave {'it' if len(options) == 1 else 'them'} out"
        )


def add_config_args(parser: argparse.ArgumentParser, set_default: object = None) -> None:
    parser.add_argument(
        "--config", help="YAML configuration file (defaults: the recommended model)"
    )
    add_set_arg(parser, default=set_default)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="heptstudy", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    config = sub.add_parser("config", help="configuration")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    show = config_sub.add_parser("show", help="print the fully resolved, validated configuration")
    add_config_args(show)
    show.set_defaults(func=lambda a: print(load_config(a.config, a.overrides).to_yaml(), end=""))
    # each area adds its subcommands; imported here, as they import this module's helpers
    from heptstudy.cli import bench, costs, data, fit, scenario, study, train

    for area in (data, train, bench, costs, scenario, study, fit):
        area.register_cli(sub)
    return parser


INTERRUPTED = 128 + signal.SIGINT  # the exit status a shell gives a command Ctrl-C ended
#: What Ctrl-C leaves, for a command that does not say more itself (:class:`Interrupted`).
NOTHING_KEPT = "nothing was written (every result appears only whole); run the same command again"


def _say(line: str) -> None:
    """One line on stderr in one write: the ranks of a launch share one stderr, and print writes
    a line and its end apart, so two ranks' lines could run together."""
    sys.stderr.write(f"heptstudy: {line}\n")
    sys.stderr.flush()


def _interrupted(stop: KeyboardInterrupt, args: argparse.Namespace | None) -> int:
    said = str(stop) if isinstance(stop, Interrupted) else getattr(args, "interrupted", None)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C cuts no line
    try:
        from tqdm.std import tqdm

        for bar in list(getattr(tqdm, "_instances", ())):  # the line starts a line of its own
            bar.close()
        _say(f"interrupted: {said or NOTHING_KEPT}")
    finally:
        signal.signal(signal.SIGINT, previous)
    return INTERRUPTED


def run_command() -> None:
    """``python -m heptstudy``: :func:`main`, ended the way a shell expects. After Ctrl-C the
    process ends by SIGINT itself, so that ``make`` and shells see an interrupt, not an error."""
    code = main()
    if code == INTERRUPTED:
        sys.stdout.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    args = None
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except KeyboardInterrupt as stop:
        return _interrupted(stop, args)
    except HeptstudyError as err:
        _say(f"error: {err}")
        return 2
    except OSError as err:
        # full disk, quota, ...: each writer kept or printed its result; say what failed
        where = f" ({err.filename})" if err.filename else ""
        _say(
            f"error: the system refused a file operation: {err.strerror or err}{where}. "
            f"{os_error_advice(err)}, and run the same command again"
        )
        return 1
