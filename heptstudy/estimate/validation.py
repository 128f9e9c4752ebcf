"""``heptstudy fit validate``: today's estimator against the GPU's own memory reports.

The GPU evidence (``../shared/evidence/h200-2026-11-30/``: bench reports of commit 9a5529c on
one H200) measured code that has changed since. To check today's estimator on it, the command

1. checks the measured commit out in a temporary ``git worktree`` (removed afterwards) and
   makes its package importable under another name (:func:`renamed_copy`);
2. generates the reports' data with *that* commit's generator (``data generate`` with the
   evidence's seed and event counts) into a temporary folder; every step's events are checked
   against the hit counts the report lists;
3. runs, per memory report, one child process (:mod:`heptstudy.estimate.validation_child`):
   the old model and step on the report's exact events under today's target-faithful fake step,
   today's tracing tracker and today's bench-process replay (allocated and reserved, native and
   expandable segments);
4. writes measured against estimated for every memory report (table + JSON), atomically.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from heptstudy.atomic import atomic_write_text
from heptstudy.errors import HeptstudyError
from heptstudy.paths import base_dir

#: The folder holding today's package (put first on the child processes' path).
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
#: The H200 evidence, beside the repository (``../shared/...``).
EVIDENCE = base_dir().parent / "shared" / "evidence" / "h200-2026-11-30"
COMMIT = "9a5529c"
#: The evidence's data: ``data generate`` with these (README of the evidence).
EVENTS_TRAIN, EVENTS_TEST, SEED = 144, 8, 20261014
#: The issue's targets: |allocated error| <= 5 %, |reserved error| <= 10 %.
ALLOCATED_TOLERANCE, RESERVED_TOLERANCE = 0.05, 0.10


@dataclass(frozen=True)
class ValidationRequest:
    evidence: Path = EVIDENCE
    commit: str = COMMIT
    reports: tuple[str, ...] = ()  # report file names; empty: every memory report


def memory_reports(evidence: Path, names: tuple[str, ...] = ()) -> list[Path]:
    """The evidence's bench memory reports with a status ``ok`` (optionally only ``names``)."""
    if not evidence.is_dir():
        raise HeptstudyError(
            f"evidence folder {str(evidence)!r} does not exist; give --evidence, the folder of "
            "the GPU bench reports (e.g. ../shared/evidence/h200-2026-11-30)"
        )
    found = []
    for path in sorted(evidence.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("kind") == "memory" and data.get("status") == "ok":
            found.append(path)
    if names:
        by_name = {p.name: p for p in found}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise HeptstudyError(
                f"no memory report {', '.join(missing)} in {evidence}; there are: "
                f"{', '.join(sorted(by_name)) or 'none'}"
            )
        found = [by_name[n] for n in names]
    if not found:
        raise HeptstudyError(f"no bench memory report (kind memory, status ok) in {evidence}")
    return found


#: An import statement of the package (renamed in the copy of an earlier commit's package).
_IMPORT = re.compile(r"^(\s*)(from|import)(\s+)heptstudy(?=[\s.])", re.M)


def renamed_copy(checkout: Path, dest: Path, package: str) -> None:
    """Copy ``checkout``'s ``heptstudy`` package to ``dest/package`` with its import statements
    pointing at that name (nothing else changes: two versions of one package cannot share a
    process otherwise), and its ``configs`` to ``dest/configs``, where repository-relative
    lookups find them."""
    target = dest / package
    shutil.copytree(checkout / "heptstudy", target)
    if (checkout / "configs").is_dir():
        shutil.copytree(checkout / "configs", dest / "configs")
    for path in target.rglob("*.py"):
        text = path.read_text()
        renamed = _IMPORT.sub(lambda m: f"{m[1]}{m[2]}{m[3]}{package}", text)
        if renamed != text:
            path.write_text(renamed)


def _git(*args: str) -> str:
    done = subprocess.run(["git", *args], cwd=PACKAGE_ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise HeptstudyError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def _run(cmd: list[str], env: dict[str, str], what: str, cwd: Path) -> None:
    # cwd matters: ``python -m`` puts it first on the path, before PYTHONPATH
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-12:])
        raise HeptstudyError(f"{what} failed (exit {done.returncode}):\n{tail}")


def validate(request: ValidationRequest, progress=print) -> dict:
    """Re-estimate every memory report of ``request.evidence``; returns the JSON document."""
    reports = memory_reports(Path(request.evidence), request.reports)
    sha = _git("rev-parse", "--verify", f"{request.commit}^{{commit}}")
    package = f"heptstudy_{sha[:7]}"
    with tempfile.TemporaryDirectory(prefix="heptstudy-validate-") as tmp:
        tmp = Path(tmp)
        checkout = tmp / "checkout"
        _git("worktree", "add", "--detach", str(checkout), sha)
        try:
            renamed_copy(checkout, tmp / "pkg", package)
            data_dir = tmp / "data"
            progress(f"generating the evidence's data with {sha[:7]}'s generator ...")
            _run(
                [sys.executable, "-m", "heptstudy.cli", "data", "generate"]
                + ["--data-dir", str(data_dir), "--events-train", str(EVENTS_TRAIN)]
                + ["--events-test", str(EVENTS_TEST), "--seed", str(SEED)]
                + ["--no-progress"],
                {**os.environ, "PYTHONPATH": str(checkout)},
                f"data generate at {sha[:7]}",
                checkout,
            )
        finally:
            _git("worktree", "remove", "--force", str(checkout))
        path = os.pathsep.join([str(PACKAGE_ROOT), str(tmp / "pkg")])
        env = {**os.environ, "PYTHONPATH": path}
        rows = []
        for report in reports:
            out = tmp / f"{report.stem}.estimate.json"
            progress(f"estimating {report.name} ...")
            _run(
                [sys.executable, "-m", "heptstudy.estimate.validation_child"]
                + [package, str(report), str(data_dir), str(out)],
                env,
                f"the estimate of {report.name}",
                tmp,
            )
            rows.append(_row(json.loads(report.read_text()), json.loads(out.read_text())))
    return {
        "what": (
            f"today's estimator (target-faithful fake step + caching-allocator replay of the "
            f"bench process) on commit {sha[:7]}'s model and step, on the exact events of each "
            "GPU memory report; data generated (synthetic) with that commit's generator"
        ),
        "commit_estimated": sha,
        "estimator_commit": _head(),
        "evidence": str(request.evidence),
        "data": {
            "events_train": EVENTS_TRAIN,
            "events_test": EVENTS_TEST,
            "seed": SEED,
            "synthetic": True,
        },
        "tolerance": {"allocated": ALLOCATED_TOLERANCE, "reserved": RESERVED_TOLERANCE},
        "rows": rows,
        "all_within_tolerance": all(r["within_tolerance"] for r in rows),
    }


def _head() -> str:
    try:
        return _git("rev-parse", "HEAD")
    except HeptstudyError:
        return "unknown"


def _row(report: dict, est: dict) -> dict:
    summary = report["summary"]
    measured_alloc = float(summary["max_peak_allocated_mib"])
    measured_res = float(summary["max_peak_reserved_mib"])
    cats = report.get("memory_categories") or []
    gpu_tracker = sum(cats[0]["at_peak_bytes"].values()) / 2**20 if cats else None
    alloc_err = est["allocated_mib"] / measured_alloc - 1
    res_err = est["reserved_mib"] / measured_res - 1
    return {
        "report": report["name"],
        "batch_size": report["batch_size"],
        "checkpointing": report["checkpointing"],
        "measured_allocated_mib": measured_alloc,
        "measured_reserved_mib": measured_res,
        "gpu_tracker_mib": gpu_tracker,
        "estimated_tracked_mib": est["tracked_peak_mib"],
        "estimated_allocated_mib": est["allocated_mib"],
        "estimated_reserved_mib": est["reserved_mib"],
        "expandable_allocated_mib": est["expandable_allocated_mib"],
        "expandable_reserved_mib": est["expandable_reserved_mib"],
        "allocated_error": alloc_err,
        "reserved_error": res_err,
        "within_tolerance": abs(alloc_err) <= ALLOCATED_TOLERANCE
        and abs(res_err) <= RESERVED_TOLERANCE,
        "measured_steps": [
            {
                "step": s["step"],
                "allocated_mib": s.get("peak_allocated_mib"),
                "reserved_mib": s.get("peak_reserved_mib"),
            }
            for s in report["steps"]
        ],
        "estimated_steps": est["steps"],
        "hits_of_the_last_step": est["hits_of_the_last_step"],
        "seconds": est["seconds"],
    }


def table(doc: dict) -> str:
    """The Markdown table of a validation document."""
    lines = [
        "| report | measured allocated | estimated allocated | error | measured reserved | "
        "estimated reserved | error | GPU tracker | estimated tracked | expandable reserved "
        f"(never measured) | within {ALLOCATED_TOLERANCE:.0%} / {RESERVED_TOLERANCE:.0%} |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
    ]
    for r in doc["rows"]:
        tracker = f"{r['gpu_tracker_mib']:,.0f}" if r["gpu_tracker_mib"] is not None else "-"
        lines.append(
            f"| {r['report']} | {r['measured_allocated_mib']:,.0f} | "
            f"{r['estimated_allocated_mib']:,.0f} | {r['allocated_error']:+.1%} | "
            f"{r['measured_reserved_mib']:,.0f} | {r['estimated_reserved_mib']:,.0f} | "
            f"{r['reserved_error']:+.1%} | {tracker} | {r['estimated_tracked_mib']:,.0f} | "
            f"{r['expandable_reserved_mib']:,.0f} | {'yes' if r['within_tolerance'] else 'NO'} |"
        )
    return "\n".join(lines)


def write_outputs(doc: dict, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    text = table(doc)
    return [
        atomic_write_text(out_dir / "validation.json", json.dumps(doc, indent=2) + "\n"),
        atomic_write_text(out_dir / "table.md", text + "\n"),
    ]


__all__ = ["ValidationRequest", "memory_reports", "table", "validate", "write_outputs"]
