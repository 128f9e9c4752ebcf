"""`heptstudy bench`: one measurement, one JSON report."""

from __future__ import annotations

import argparse

from heptstudy.cli import not_blank, refuse_unread


def request_from_args(args: argparse.Namespace):
    """Only the options given (the request states every default); a bad value named by option."""
    from heptstudy.measure.request import MeasurementRequest, RequestError
    from heptstudy.paths import resolve_from_cwd

    given = {f: getattr(args, f) for f in MeasurementRequest.model_fields if hasattr(args, f)}
    if "data_dir" in given:  # typed in a shell: from the working directory, as `ls` reads it
        given["data_dir"] = str(resolve_from_cwd(given["data_dir"]))
    try:
        return MeasurementRequest.build(spell=lambda f, v: f"{_flag(f)[0]} {v}", **given)
    except RequestError as err:
        raise RequestError(f"heptstudy bench: {err}") from None


def _flag(field: str) -> tuple[str, dict]:
    return _FLAGS.get(field, ("--" + field.replace("_", "-"), {}))


def _bench(args: argparse.Namespace) -> int:
    from heptstudy.measure.bench import run_bench
    from heptstudy.measure.summary import describe

    measurement = request_from_args(args).resolve()
    run_bench(measurement, announce=lambda report: print(describe(report), flush=True))
    print(f"report: {measurement.report_path}")
    return 0


def _bench_backbone(args: argparse.Namespace) -> int:
    import torch

    from heptstudy.atomic import json_text, write_text_or_keep
    from heptstudy.config import load_config
    from heptstudy.measure.backbone import (
        check_backbone_request,
        describe_backbone,
        run_backbone_bench,
    )
    from heptstudy.measure.request import MeasurementRequest

    _refuse_given(
        args,
        [f for f in MeasurementRequest.model_fields if f not in ("output", "overrides")],
        "backbone",
        "the backbone bench takes --hits, --repeats, --threads, --device, --output, --config "
        "and --set (e.g. --set model.heptv2.activation_checkpointing=true)",
    )
    output, overrides = getattr(args, "output", None), getattr(args, "overrides", [])
    check_backbone_request(args.hits, args.repeats, args.device, args.threads, output)
    if args.threads:
        torch.set_num_threads(args.threads)
    config = load_config(args.config, overrides)
    result = run_backbone_bench(config, args.hits, repeats=args.repeats, device=args.device)
    print(describe_backbone(result))
    if output:
        text = json_text(result, f"the result {output}")
        write_text_or_keep(output, text, "the result")
        print(f"written: {output}")
    return 0


def _refuse_given(args: argparse.Namespace, fields, command: str, takes: str) -> None:
    """Options of ``heptstudy bench`` given before a subcommand that does not read them (argparse
    parses them as bench's own)."""
    given = [_flag(f)[0] for f in fields if hasattr(args, f)]
    refuse_unread(f"heptstudy bench {command}", given, f"to it: {takes}")


def _bench_paired(args: argparse.Namespace) -> int:
    from heptstudy.measure.paired import describe_paired, paired_measurement, run_paired
    from heptstudy.measure.request import NOT_PAIRED

    _refuse_given(
        args,
        NOT_PAIRED,
        "paired",
        "it times its PLANs against off (--checkpointing), always with checkpointing and by "
        "step time alone, without parity (--parity-only, --deterministic, --passes)",
    )
    # the layers wrapped as auto wraps them, so that every step can run its own plan
    args.checkpointing, args.passes = "auto", "timing"
    m = paired_measurement(request_from_args(args))
    report = run_paired(m, args.plans, args.rounds)
    print(describe_paired(report))
    print(f"report: {m.report_path}")
    return 0


_NOTHING_MEASURED = "nothing was measured or written; run the same command again"


_TEXT_OPTIONS = ("output", "data_dir", "platform", "variant")

#: Request fields whose option is not the plain ``--field-name VALUE``.
_FLAGS: dict[str, tuple[str, dict]] = {
    "kind": (
        "--parity-only",
        dict(
            action="store_const",
            const="parity",
            help="checkpointing parity (kind parity) instead of memory and step time",
        ),
    ),
    "overrides": ("--set", dict(action="append", metavar="KEY=VALUE")),
    **{
        f: (f"--{f.replace('_', '-')}", dict(type=not_blank(f"--{f.replace('_', '-')}")))
        for f in _TEXT_OPTIONS
    },
    "progress": ("--no-progress", dict(action="store_const", const=False, help="no progress bar")),
    "checkpointing": ("--checkpointing", dict(metavar="PLAN")),
    "deterministic": ("--deterministic", dict(action=argparse.BooleanOptionalAction)),
}


def register_cli(sub) -> None:
    from heptstudy.cli import add_config_args
    from heptstudy.measure.request import NOT_PAIRED, MeasurementRequest

    p = sub.add_parser(
        "bench",
        help="measure peak memory and step time, or checkpointing parity",
        description="heptstudy bench --batch-size B [...] measures one configuration; "
        "heptstudy bench backbone --hits N times the backbone alone",
    )
    kinds = p.add_subparsers(dest="bench_command")
    b = kinds.add_parser("backbone", help="forward+backward of the HEPTv2 backbone alone on N hits")
    b.add_argument("--hits", type=int, default=10000)
    b.add_argument("--repeats", type=int, default=3)
    b.add_argument("--threads", type=int, help="torch intra-op threads (default: PyTorch's choice)")
    b.add_argument("--device", default="cpu")
    # SUPPRESS: `bench --output F backbone` (bench's own --output and --set) still counts
    b.add_argument(
        "--output",
        type=not_blank("--output"),
        default=argparse.SUPPRESS,
        help="JSON file for the result",
    )
    add_config_args(b, set_default=argparse.SUPPRESS)
    b.set_defaults(func=_bench_backbone, interrupted=_NOTHING_MEASURED)
    paired = kinds.add_parser(
        "paired",
        help="step-time overheads of plans against off, paired step by step in one process",
        description="heptstudy bench paired PLAN [PLAN ...] times each plan between two off "
        "steps on the same batch, in one process, for --rounds rounds: the overhead of each plan "
        "over off, with drift slower than a step cancelled (memory: heptstudy bench)",
    )
    paired.add_argument(
        "plans",
        nargs="+",
        metavar="PLAN",
        help="plans to compare with off; auto runs on each batch the plan it chooses within "
        "model.heptv2.memory_budget_gib (--set)",
    )
    paired.add_argument("--rounds", type=int, default=3, help="paired rounds (default 3)")
    paired.set_defaults(func=_bench_paired, interrupted=_NOTHING_MEASURED)
    # an option per request field; one not given is not passed: the request's default applies
    for field, info in MeasurementRequest.model_fields.items():
        flag, extra = _flag(field)
        p.add_argument(
            flag, dest=field, default=argparse.SUPPRESS, **{"help": info.description, **extra}
        )
        # the options paired does not take are parsed too (unlisted), to be refused by name
        said = {"help": _PAIRED_HELP.get(field) or extra.get("help") or info.description}
        if field in NOT_PAIRED:
            said = {"help": argparse.SUPPRESS}
        paired.add_argument(flag, dest=field, default=argparse.SUPPRESS, **{**extra, **said})
    p.set_defaults(func=_bench, interrupted=_NOTHING_MEASURED)


#: What a paired timing's options mean where that differs from a measurement.
_PAIRED_HELP = {
    "steps": "counted batches, taken by the rounds in turn; None: 2 on cpu, 5 on cuda",
    "warmup": "warm-up batches (every plan's untimed warm-up step runs on the first); None: 1 on "
    "cpu, 2 on cuda",
    "output": "report path; None: experiments/local/scratch/[packed_]paired_bB.json",
}
