"""``heptstudy study run|aggregate|check``."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections import Counter

from heptstudy.atomic import Output, atomic_write_text, json_text
from heptstudy.cli import whole_number
from heptstudy.errors import HeptstudyError
from heptstudy.estimate.predictions import PREDICTIONS
from heptstudy.locks import holding_all
from heptstudy.measure.paired import complete, read_paired
from heptstudy.measure.report import ReportError, read_report
from heptstudy.paths import OUTPUT_ROOT, real_path, resolve_from_cwd
from heptstudy.study.blind_predictions import predict_matrix
from heptstudy.study.frames import host_usage_of
from heptstudy.study.matrix import check_event_counts, load_matrix
from heptstudy.study.outputs import aggregate_folders, shown
from heptstudy.study.runner import aggregate_study, run_study
from heptstudy.study.schedule import schedule

#: Not the committed predictions: a default run must not change a file git tracks.
DEFAULT_PREDICTIONS = OUTPUT_ROOT / "gpu_blind_predictions" / "predictions.json"


def _cmd_run(args: argparse.Namespace) -> int:
    data_dir = str(real_path(args.data_dir, "--data-dir")) if args.data_dir else None
    done = run_study(
        args.matrix,
        args.out,
        reference=args.reference,
        force=args.force,
        figures_dir=args.figures,
        data_dir=data_dir,
        progress=not args.no_progress,
        aggregate=not args.no_aggregate,
    )
    print()
    print(measured_table(done.results))
    counts = Counter("resumed" if r.status == "skipped" else r.status for r in done.results)
    print("runs: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    if done.superseded:
        print(f"replaced results moved to: {shown(done.superseded)}/")
    print(f"reports: {shown(done.folders.out)}/")
    if done.report_html is not None:
        print(f"report: {shown(done.report_html)}")
        print(f"figures: {shown(done.folders.figures)}/")
    failed = [r.label for r in done.results if r.status == "error"]
    if failed:
        print(
            f"heptstudy: error: {len(failed)} run(s) failed: {', '.join(failed)}; their reports "
            "and executed notebooks (notebooks/) say why; fix the cause and run the same "
            "command again (finished runs are resumed)"
        )
        return 1
    return 0


def measured_table(results) -> str:
    """A short plain-text table of what a study run did: one line per execution."""
    lines = [
        f"{'run':<44} {'status':<8} {'how':<9} {'step [s]':>9} {'alloc [MiB]':>12} "
        f"{'sys/step':>8}  host"
    ]
    for r in results:
        how = "resumed" if r.status == "skipped" else "measured"
        with contextlib.suppress(HeptstudyError):  # a paired timing: off's step, its rounds
            paired = read_paired(r.report)
            status = "ok" if complete(paired) else "partial"
            host, off = paired.get("environment", {}).get("hostname"), paired["off_step_time_s"]
            lines.append(
                f"{r.label:<44} {status:<8} {how:<9} {off:9.2f} {'':>12} {'':>8}  {host} "
                f"(off; {len(paired['plans'])} plans paired with it over {paired['rounds']} rounds)"
            )
            continue
        try:
            report = read_report(r.report)
        except ReportError:
            lines.append(f"{r.label:<44} {'unread':<8} {how:<9}")
            continue
        s, sys_frac = report.summary, host_usage_of(report)["sys_fraction"]
        step, alloc = (s.mean_step_time_s, s.max_peak_allocated_mib) if s else (None, None)
        cells = [
            f"{step:9.2f}" if step is not None else " " * 9,
            f"{alloc:12,.0f}" if alloc is not None else " " * 12,
            f"{100 * sys_frac:7.0f}%" if sys_frac is not None else " " * 8,
        ]
        lines.append(
            f"{r.label:<44} {report.status:<8} {how:<9} {' '.join(cells)}  "
            f"{report.environment.hostname}"
        )
    return "\n".join(lines)


def _cmd_aggregate(args: argparse.Namespace) -> int:
    out, figures = aggregate_folders(args.out, args.figures, args.reference)
    matrix = _matrix_of(out)
    # not while a study run writes them
    with holding_all((out, "study folder (--out)"), (figures, "figures folder (--figures)")):
        html = aggregate_study(out, figures, matrix=matrix, progress=not args.no_progress)
    print(f"report: {shown(html)}")
    return 0


def _matrix_of(out):
    """The matrix a study folder was measured with (its title, description and notes for the
    report), or None, said, where the folder holds none that reads."""
    path = out / "matrix.yaml"
    if not path.is_file():
        return None
    try:
        # for its title and notes: runs measured with a configuration that no longer builds
        # (a key renamed since) are the folder's results all the same
        return load_matrix(path, build_configs=False)
    except HeptstudyError as err:
        print(f"{shown(path)} does not read ({err}); the report is titled by the folder's name")
        return None


def _cmd_check(args: argparse.Namespace) -> int:
    data_dir = str(real_path(args.data_dir, "--data-dir")) if args.data_dir else None
    m = load_matrix(args.matrix, data_dir=data_dir)
    for note in check_event_counts(m):
        print(f"note: {note}", file=sys.stderr)
    for ex in schedule(m.runs):
        print(f"{ex.label:<44} {ex.run.notebook}.ipynb  {ex.parameters}")
    return 0


def _cmd_predict(args: argparse.Namespace) -> int:
    out = resolve_from_cwd(args.out)
    # any version of the predictions' schema: --out replaces only them
    mark = b'"schema": "heptstudy.blind_predictions/'
    kind = Output("heptstudy blind predictions file", ".json", mark)
    kind.check(out, "--out")  # before the minutes of estimating
    doc = predict_matrix(args.matrix, args.data_dir, jobs=args.jobs)
    atomic_write_text(out, json_text(doc, f"the predictions {out}"), kind=kind)
    print(f"wrote {out}")
    return 0


def register_cli(subparsers) -> None:
    study = subparsers.add_parser(
        "study", help="run a study matrix of notebooks; aggregate; HTML report"
    )
    sub = study.add_subparsers(dest="study_command", required=True)
    _add_run(sub)
    _add_aggregate(sub)
    _add_predict(sub)
    check = sub.add_parser(
        "check",
        help="validate a study matrix and list its runs",
        description="Refuses a matrix with a run that can only fail: a parameter, override or "
        "plan its configuration refuses, or more events than its data set holds. Measures "
        "nothing and builds no model.",
    )
    check.add_argument("--matrix", required=True)
    check.add_argument(
        "--data-dir",
        help="TFDS data directory of every run, as study run --data-dir (default: the matrix's, "
        "else data/tfds)",
    )
    check.set_defaults(func=_cmd_check)


def _add_run(sub) -> None:
    run = sub.add_parser(
        "run",
        help="every measurement of a matrix in its own kernel, then the report",
        description="Measures on this machine into a folder of its own "
        "(experiments/local/<host>-<date> unless --out says otherwise). The committed "
        "reference studies are written only with --reference NAME.",
    )
    run.add_argument(
        "--matrix", required=True, help="study matrix YAML, e.g. configs/study/cpu_default.yaml"
    )
    where = run.add_mutually_exclusive_group()
    where.add_argument(
        "--out",
        help="study folder (default experiments/local/<host>-<date>); not a committed one",
    )
    where.add_argument(
        "--reference",
        metavar="NAME",
        help="regenerate the committed reference study experiments/NAME (figures/NAME)",
    )
    run.add_argument(
        "--force",
        action="store_true",
        help="measure every run again; old results are moved to superseded/, not deleted",
    )
    run.add_argument("--figures", help="figures folder (default: figures/ in the study folder)")
    run.add_argument(
        "--data-dir",
        help="TFDS data directory of every run (default: the matrix's, else data/tfds)",
    )
    run.add_argument("--no-aggregate", action="store_true", help="only the measurements")
    run.add_argument("--no-progress", action="store_true")
    run.set_defaults(func=_cmd_run, interrupted="nothing was measured; run the same command again")


def _add_aggregate(sub) -> None:
    agg = sub.add_parser(
        "aggregate", help="aggregate.ipynb and report.html of an experiments directory"
    )
    folder = agg.add_mutually_exclusive_group(required=True)
    folder.add_argument("--out", help="study folder holding the JSON reports")
    folder.add_argument(
        "--reference",
        metavar="NAME",
        help="the committed study experiments/NAME, from its committed reports (after a change "
        "to the aggregate; a change to the model or step needs `make reference`)",
    )
    agg.add_argument(
        "--figures",
        help="figures folder (default: figures/ in the study folder; figures/NAME for the "
        "reference study experiments/NAME)",
    )
    agg.add_argument("--no-progress", action="store_true")
    agg.set_defaults(
        func=_cmd_aggregate,
        interrupted="the previous aggregate.ipynb and report.html (if any) are kept as they "
        "were; run the same command again",
    )


def _add_predict(sub) -> None:
    predict = sub.add_parser(
        "predict",
        help="blind predictions of a GPU matrix's memory runs, made without a GPU",
    )
    predict.add_argument(
        "--matrix", required=True, help="study matrix, e.g. configs/study/gpu.yaml"
    )
    predict.add_argument("--data-dir", required=True, help="the generated data the GPU carries")
    predict.add_argument(
        "--out",
        default=str(DEFAULT_PREDICTIONS),
        help=f"output JSON (default: {DEFAULT_PREDICTIONS}; the committed ones, which "
        f"scripts/regenerate_fits.sh writes: {PREDICTIONS})",
    )
    predict.add_argument(
        "--jobs",
        type=whole_number(1, 2),
        default=1,
        metavar="N",
        help="runs estimated at a time, each in a process of its own (default 1)",
    )
    predict.set_defaults(func=_cmd_predict)
