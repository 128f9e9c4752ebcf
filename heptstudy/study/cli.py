"""``heptstudy study run|aggregate|check``."""

from __future__ import annotations

import argparse
from pathlib import Path

from heptstudy.study.common import StudyError
from heptstudy.study.matrix import load_matrix
from heptstudy.study.runner import aggregate_study, run_study


def _cmd_run(args: argparse.Namespace) -> int:
    results = run_study(
        args.matrix,
        args.out,
        force=args.force,
        figures_dir=args.figures,
        data_dir=args.data_dir,
        progress=not args.no_progress,
        aggregate=not args.no_aggregate,
    )
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    print("runs: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    if not args.no_aggregate:
        print(f"report: {Path(args.out) / 'report.html'}")
    return 0


def _cmd_aggregate(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if not out.is_dir():
        raise StudyError(f"{out} is not a directory of reports; run `heptstudy study run` first")
    html = aggregate_study(out, args.figures or Path("figures") / out.name)
    print(f"report: {html}")
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    m = load_matrix(args.matrix)
    for run in m.runs:
        print(f"{run.name:<28} {run.notebook}.ipynb  {run.parameters}")
    return 0


def register_cli(subparsers) -> None:
    study = subparsers.add_parser(
        "study", help="run a study matrix of notebooks; aggregate; HTML report"
    )
    sub = study.add_subparsers(dest="study_command", required=True)
    run = sub.add_parser(
        "run", help="every measurement of a matrix in its own kernel, then the report"
    )
    run.add_argument(
        "--matrix", required=True, help="study matrix YAML, e.g. configs/study/cpu_default.yaml"
    )
    run.add_argument(
        "--out", required=True, help="experiments directory, e.g. experiments/cpu_reference"
    )
    run.add_argument("--force", action="store_true", help="rerun measurements whose report exists")
    run.add_argument("--figures", help="figures directory (default figures/<name of --out>)")
    run.add_argument(
        "--data-dir",
        help="TFDS data directory of every run (default: the matrix's, else data/tfds)",
    )
    run.add_argument("--no-aggregate", action="store_true", help="only the measurements")
    run.add_argument("--no-progress", action="store_true")
    run.set_defaults(func=_cmd_run)
    agg = sub.add_parser(
        "aggregate", help="aggregate.ipynb and report.html of an experiments directory"
    )
    agg.add_argument("--out", required=True, help="experiments directory holding the JSON reports")
    agg.add_argument("--figures", help="figures directory (default figures/<name of --out>)")
    agg.set_defaults(func=_cmd_aggregate)
    check = sub.add_parser("check", help="validate a study matrix and list its runs")
    check.add_argument("--matrix", required=True)
    check.set_defaults(func=_cmd_check)
