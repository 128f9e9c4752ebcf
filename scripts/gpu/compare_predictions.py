"""Measured against blind-predicted: every report scripts/gpu/run.sh wrote under OUT/study/
(native allocator) and OUT/expandable/ (expandable segments) beside the committed predictions
(experiments/gpu_blind_predictions/predictions.json), as a table in OUT/predictions_vs_measured.md
and OUT/predictions_vs_measured.json. Runs at the end of run.sh; reads only JSON (no torch).

    python3 scripts/gpu/compare_predictions.py OUT [--predictions FILE]

It says whether the predictions are of the code the GPU ran: the reports' git commit, and the
code hashes the predictions recorded against those of this checkout (when the package imports).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "experiments" / "gpu_blind_predictions" / "predictions.json"


def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _err(est, measured):
    if not isinstance(est, (int, float)) or not isinstance(measured, (int, float)) or not measured:
        return None
    return est / measured - 1


def rows(out: Path, predictions: dict) -> list[dict]:
    runs = predictions.get("runs") or {}
    found = []
    for folder, mode in (("study", "native"), ("expandable", "expandable")):
        for path in sorted((out / folder).glob("*.json")):
            report = _load(path)
            name = path.stem
            pred = runs.get(name)
            if report is None or pred is None:
                if report is not None and name in (predictions.get("not_predicted") or {}):
                    found.append({"run": f"{folder}/{name}", "skipped": True})
                continue
            s = report.get("summary") or {}
            key = "" if mode == "native" else "expandable_"
            alloc, resv = s.get("max_peak_allocated_mib"), s.get("max_peak_reserved_mib")
            found.append(
                {
                    "run": f"{folder}/{name}",
                    "status": report.get("status"),
                    "commit": (report.get("environment") or {}).get("git_commit"),
                    "measured_allocated_mib": alloc,
                    "predicted_allocated_mib": pred[f"{key}allocated_mib"],
                    "allocated_error": _err(pred[f"{key}allocated_mib"], alloc),
                    "measured_reserved_mib": resv,
                    "predicted_reserved_mib": pred[f"{key}reserved_mib"],
                    "reserved_error": _err(pred[f"{key}reserved_mib"], resv),
                }
            )
    return found


def _code_note(predictions: dict) -> str:
    try:
        sys.path.insert(0, str(ROOT))
        from heptstudy.estimate.predictions import stale_parts

        matrix = Path((predictions.get("fingerprint") or {}).get("matrix", {}).get("path", ""))
        stale = stale_parts(
            predictions, matrix if matrix.is_file() else ROOT / "configs/study/gpu.yaml"
        )
    except Exception as err:  # the comparison itself needs no package: say why, go on
        return f"code fingerprint not checked ({type(err).__name__}: {err})"
    if stale:
        return "the predictions are NOT of this checkout's code: " + ", ".join(stale) + " changed"
    return "the predictions are of this checkout's model and step code, matrix and platforms"


def _pct(x) -> str:
    return "-" if x is None else f"{x:+.1%}"


def _mib(x) -> str:
    return "-" if not isinstance(x, (int, float)) else f"{x:,.0f}"


def table(found: list[dict]) -> str:
    lines = [
        "| run | status | measured allocated | predicted | error | measured reserved | "
        "predicted | error |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in found:
        if r.get("skipped"):
            lines.append(f"| {r['run']} | not predicted | | | | | | |")
            continue
        lines.append(
            f"| {r['run']} | {r['status']} | {_mib(r['measured_allocated_mib'])} | "
            f"{_mib(r['predicted_allocated_mib'])} | {_pct(r['allocated_error'])} | "
            f"{_mib(r['measured_reserved_mib'])} | {_mib(r['predicted_reserved_mib'])} | "
            f"{_pct(r['reserved_error'])} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the folder run.sh wrote (study/, expandable/)")
    parser.add_argument("--predictions", default=str(DEFAULT))
    args = parser.parse_args(argv)
    predictions = _load(Path(args.predictions))
    if predictions is None:
        print(f"no readable predictions file {args.predictions}: nothing to compare")
        return 1
    out = Path(args.out)
    found = rows(out, predictions)
    note = _code_note(predictions)
    text = "\n".join(
        [
            "Blind predictions (made without a GPU) against this session's measurements; MiB, "
            "max over counted steps; synthetic data.",
            note,
            "",
            table(found),
        ]
    )
    (out / "predictions_vs_measured.md").write_text(text + "\n")
    (out / "predictions_vs_measured.json").write_text(
        json.dumps({"code": note, "rows": found}, indent=2) + "\n"
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
