"""Measured against blind-predicted: every bench report under OUT/*/ (scripts/gpu/run.sh writes
study/: native allocator, expandable/: expandable segments, fused/) beside the committed
predictions (experiments/gpu_blind_predictions/predictions.json), as a table in
OUT/predictions_vs_measured.md and .json. The last step of run.sh; run it again in the checkout
after the session, where git can show the predictions' age.

    python3 scripts/gpu/compare_predictions.py OUT [--predictions FILE]

It shows that the comparison is blind: the commit that last changed the predictions file is the
commit the reports measured (environment.git_commit, else env.txt's COMMIT) or one of its
ancestors, and the file has no uncommitted change; and it says whether the predictions are of
this checkout's code. A report with no prediction is listed as such.

Exit status: 0 compared and shown blind; 1 nothing compared (no folder, no reports, an
unreadable report or predictions file: the message says which and why); 3 compared, but not
shown blind or not of this checkout's code (the table says why).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # this checkout's package, wherever the script is started

from heptstudy.atomic import atomic_write_text  # noqa: E402
from heptstudy.committed import repository_of  # noqa: E402
from heptstudy.errors import HeptstudyError  # noqa: E402
from heptstudy.estimate.predictions import (  # noqa: E402
    PREDICTIONS,
    read_predictions,
    stale_parts,
)
from heptstudy.measure.report import read_report  # noqa: E402
from heptstudy.paths import git, real_path, resolve_in_repo  # noqa: E402

#: The folders whose reports are predicted, and the figures of the predictions they measure.
PREDICTED = {"study": "", "expandable": "expandable_"}
NOT_BLIND = 3


class NothingToCompare(HeptstudyError):
    pass


@dataclass(frozen=True)
class GitAge:
    """``problems``: why the file is not shown to predate the measured commits (empty: it is)."""

    committed: str | None
    committed_date: str | None
    problems: list[str]


def git_age(path: str | os.PathLike, measured: list[str]) -> GitAge:
    path = real_path(path)
    if repository_of(path) is None:
        return GitAge(
            None,
            None,
            [
                f"{path} is not in a git checkout (or git is missing), so "
                "its age cannot be shown: compare in the checkout that "
                "committed it"
            ],
        )
    status = git("status", "--porcelain", "--", path.name, cwd=path.parent)
    out = git("log", "-1", "--format=%H %cI", "--", path.name, cwd=path.parent)
    last = out.split() if out and out.strip() else None
    if last is None or (status or "").startswith("??"):
        return GitAge(None, None, [f"{path} is not committed: commit it before the session"])
    problems = []
    if status and status.strip():
        problems.append(
            f"{path} has changes that are not committed (git diff -- {path}): the file "
            "compared is not the one committed"
        )
    if not measured:
        problems.append(
            "the reports record no git commit (a checkout without .git records none): pass "
            "COMMIT=<sha> to scripts/gpu/run.sh, which writes it into env.txt"
        )
    for commit in sorted(set(measured)):
        full = git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}", cwd=path.parent)
        if full is None:
            problems.append(
                f"the measured commit {commit} is not in this repository: fetch it, or compare "
                "in the checkout the session ran"
            )
        elif git("merge-base", "--is-ancestor", last[0], full.strip(), cwd=path.parent) is None:
            problems.append(
                f"{path.name} was last changed in {last[0][:12]}, which is not the measured "
                f"commit {commit[:12]} nor one of its ancestors: changed after (or beside) the "
                "measurement, it is not blind to it"
            )
    return GitAge(last[0], last[1], problems)


def _err(est, measured):
    return None if not isinstance(measured, (int, float)) or measured <= 0 else est / measured - 1


def _env_commit(out: Path) -> str | None:
    """The COMMIT run.sh wrote into env.txt (for reports made without .git)."""
    try:
        lines = (out / "env.txt").read_text().splitlines()
    except OSError:
        return None
    words = [line.split() for line in lines if line.startswith("commit ")]
    return words[-1][1] if words and len(words[-1]) == 2 and words[-1][1] != "unknown" else None


def rows(out: Path, doc: dict, source: Path) -> list[dict]:
    """One row per report under ``out``'s folders: compared, or why it is not."""
    if not out.is_dir():
        raise NothingToCompare(
            f"{out}: no such folder; give the OUT folder scripts/gpu/run.sh wrote (study/, "
            "expandable/, fused/)"
        )
    paths = sorted(p for p in out.glob("*/*.json") if p.parent.name != "logs")
    if not paths:
        raise NothingToCompare(
            f"{out} holds no bench reports (OUT/study/*.json, OUT/expandable/*.json): nothing to "
            "compare; was the session run (scripts/gpu/run.sh), and is this its OUT?"
        )
    fallback, found = _env_commit(out), []
    for path in paths:
        report, folder, name = read_report(path), path.parent.name, path.stem
        row = {"run": f"{folder}/{name}", "status": report.status}
        if folder not in PREDICTED:
            row["not_predicted"] = (
                f"{folder}/ is not predicted (the predictions are of the matrix's runs, study/, "
                "and of them with expandable segments, expandable/)"
            )
        elif name in doc["not_predicted"]:
            row["not_predicted"] = doc["not_predicted"][name]
        elif name not in doc["runs"] or report.kind != "memory":
            row["not_predicted"] = f"no prediction named {name} in {source}"
        else:
            key, pred, s = PREDICTED[folder], doc["runs"][name], report.summary
            alloc = s.max_peak_allocated_mib if s else None
            resv = s.max_peak_reserved_mib if s else None
            row |= {
                "commit": report.environment.git_commit or fallback,
                "measured_allocated_mib": alloc,
                "predicted_allocated_mib": pred[f"{key}allocated_mib"],
                "allocated_error": _err(pred[f"{key}allocated_mib"], alloc),
                "measured_reserved_mib": resv,
                "predicted_reserved_mib": pred[f"{key}reserved_mib"],
                "reserved_error": _err(pred[f"{key}reserved_mib"], resv),
            }
        found.append(row)
    return found


def notes(compared: list[dict], doc: dict, source: Path) -> tuple[list[str], bool]:
    """What shows (or fails to show) that the comparison is blind and of this code."""
    measured = sorted({r["commit"] for r in compared if r["commit"]})
    age = git_age(source, measured)
    unknown = sum(not r["commit"] for r in compared)
    problems = age.problems + (
        [f"{unknown} compared reports record no git commit and env.txt names none"]
        if unknown and measured
        else []
    )
    lines = [
        f"predictions: {source}, last changed in commit {age.committed or '(none)'} "
        f"({age.committed_date or 'not committed'}); measured: "
        f"{', '.join(measured) or 'no commit recorded'}"
    ]
    lines += [f"NOT shown blind: {p}" for p in problems] or [
        "shown blind: the predictions were committed in or before the measured commit and are "
        "unchanged since"
    ]
    matrix = (doc["fingerprint"].get("matrix") or {}).get("path", "configs/study/gpu.yaml")
    stale = stale_parts(doc, resolve_in_repo(matrix))
    head = (git("rev-parse", "HEAD", cwd=ROOT) or "(no git)").strip()
    lines.append(
        f"NOT of this checkout's code (at {head}): {', '.join(stale)} changed since they were made"
        if stale
        else f"of this checkout's model and step code, matrix and platforms (at {head})"
    )
    return lines, not problems and not stale


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
        if "not_predicted" in r:
            lines.append(f"| {r['run']} | {r['status']}, not predicted: {r['not_predicted']} |")
            continue
        lines.append(
            f"| {r['run']} | {r['status']} | {_mib(r['measured_allocated_mib'])} | "
            f"{_mib(r['predicted_allocated_mib'])} | {_pct(r['allocated_error'])} | "
            f"{_mib(r['measured_reserved_mib'])} | {_mib(r['predicted_reserved_mib'])} | "
            f"{_pct(r['reserved_error'])} |"
        )
    return "\n".join(lines)


def compare(out: Path, source: Path) -> int:
    doc = read_predictions(source)
    found = rows(out, doc, source)
    compared = [r for r in found if "not_predicted" not in r]
    if not compared:
        print(table(found))
        raise NothingToCompare(
            f"none of the {len(found)} reports under {out} is predicted in {source} (listed "
            "above): nothing to compare"
        )
    lines, blind = notes(compared, doc, source)
    text = "\n".join(
        [
            "Blind predictions (made without a GPU) against this session's measurements; MiB, "
            "max over counted steps; synthetic data.",
            *lines,
            "",
            table(found),
        ]
    )
    try:
        atomic_write_text(out / "predictions_vs_measured.md", text + "\n")
        atomic_write_text(
            out / "predictions_vs_measured.json",
            json.dumps({"notes": lines, "blind": blind, "rows": found}, indent=2) + "\n",
        )
    except OSError as exc:
        print(text)
        raise NothingToCompare(
            f"{exc.filename or out}: the table could not be written ({exc.strerror or exc}); "
            "copy the session's folder somewhere writable and compare there"
        ) from None
    print(text)
    return 0 if blind else NOT_BLIND


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the folder run.sh wrote (study/, expandable/, fused/)")
    parser.add_argument("--predictions", help="default: the committed blind predictions")
    args = parser.parse_args(argv)
    source = Path(args.predictions) if args.predictions else resolve_in_repo(PREDICTIONS)
    try:
        return compare(Path(args.out), source.resolve())
    except HeptstudyError as err:
        print(f"compare_predictions: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
