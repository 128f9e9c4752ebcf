"""One run of a study matrix, measured the way its notebook measures it (the run's
MeasurementRequest through ``heptstudy.measure.bench.run_bench``), for a GPU node without Jupyter.

The report gets the run's name in OUT, as ``heptstudy study run`` would write it; running
``heptstudy study run --matrix MATRIX --out OUT`` later (on any machine with the package and
Jupyter) finds the reports, skips those runs and writes the aggregate notebook and report.html.

    python3 scripts/gpu/matrix_run.py MATRIX --list
    python3 scripts/gpu/matrix_run.py MATRIX --name NAME --out OUT [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from heptstudy.errors import HeptstudyError
from heptstudy.study.matrix import load_matrix


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("matrix")
    parser.add_argument("--list", action="store_true", help="print the run names in order")
    parser.add_argument("--name", help="the run to measure")
    parser.add_argument("--out", help="the study folder")
    parser.add_argument("--data-dir", help="TFDS data directory of every run")
    args = parser.parse_args(argv)
    try:
        matrix = load_matrix(args.matrix, data_dir=args.data_dir)
        if args.list:
            print("\n".join(run.name for run in matrix.runs))
            return 0
        if not (args.name and args.out):
            parser.error("give --list, or --name and --out")
        runs = {run.name: run for run in matrix.runs}
        if args.name not in runs:
            raise HeptstudyError(
                f"{args.matrix} has no run {args.name!r}; its runs: {', '.join(runs)}"
            )
        from heptstudy.measure.bench import run_bench
        from heptstudy.measure.summary import describe

        run = runs[args.name]
        build = getattr(run, "request", None) or run.options
        request = build(output=str(Path(args.out) / f"{run.name}.json"), progress=False)
        report = run_bench(request.resolve())
        print(describe(report))
        return 0
    except HeptstudyError as err:
        print(f"heptstudy: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
