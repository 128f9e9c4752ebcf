"""Are the committed blind predictions (experiments/gpu_blind_predictions/predictions.json) of
this checkout? `make check-predictions` runs it, and scripts/gpu/run.sh before it measures
anything: a GPU measures only code whose predictions were made, and committed, first.

    python3 scripts/gpu/check_predictions.py [--matrix configs/study/gpu.yaml] [--predictions F]

Of this checkout: made from its model and step code, matrix and platform profiles; every run of
the matrix predicted or said why not; predicted for the GPU session's device and PyTorch
(experiments/h200_2026-11-30/session.yaml). Exit status 0 when they are, 1 when not (what
differs and the command that regenerates them, 7 to 10 minutes on two cores).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's package, wherever the script is started

from heptstudy.errors import HeptstudyError  # noqa: E402
from heptstudy.estimate.predictions import (  # noqa: E402
    PREDICTIONS,
    REGENERATE,
    read_predictions,
    session_facts,
    stale_parts,
)
from heptstudy.paths import resolve_in_repo  # noqa: E402
from heptstudy.study.matrix import load_matrix  # noqa: E402

MATRIX = "configs/study/gpu.yaml"


def problems(doc: dict, matrix: Path, session: dict) -> list[str]:
    """Why ``doc`` is not of this checkout (empty: it is)."""
    out = [f"{part} changed since they were made" for part in stale_parts(doc, matrix)]
    names = {run.name for run in load_matrix(matrix).runs}
    covered = set(doc["runs"]) | set(doc["not_predicted"])
    if covered != names:
        out.append(
            f"runs of {matrix.name} neither predicted nor said why not: "
            f"{sorted(names - covered) or 'none'}; predicted runs it does not have: "
            f"{sorted(covered - names) or 'none'}"
        )
    target = (session["device_kind"], ".".join(session["torch_version"].split(".")[:2]))
    other = {
        name: (run.get("target"), run.get("torch_version"))
        for name, run in doc["runs"].items()
        if (run.get("target"), run.get("torch_version")) != target
    }
    if other:
        out.append(
            f"runs predicted for another device or PyTorch than the GPU session's {target}: "
            + ", ".join(f"{name} {t}" for name, t in sorted(other.items()))
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--matrix", default=MATRIX, help=f"the GPU study (default {MATRIX})")
    parser.add_argument("--predictions", default=PREDICTIONS, help="default: the committed file")
    args = parser.parse_args(argv)
    try:
        path = resolve_in_repo(args.predictions)
        found = problems(read_predictions(path), resolve_in_repo(args.matrix), session_facts())
    except HeptstudyError as err:
        print(f"check_predictions: {err}", file=sys.stderr)
        return 1
    if found:
        print(f"{path} is not of this checkout:", file=sys.stderr)
        print("\n".join(f"  {p}" for p in found), file=sys.stderr)
        print(
            f"regenerate it with `{REGENERATE}` (7 to 10 minutes) and commit it before any GPU "
            "measures this code",
            file=sys.stderr,
        )
        return 1
    print(f"{path}: of this checkout's model and step code, matrix and platforms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
