"""``heptstudy fit validate``: the memory estimator against measured bench memory reports of the
running code.

Each report is estimated on its own events with the running code. A report of a commit whose
model or step code differs is skipped, naming what to run instead: ``scripts/at_commit.sh``
runs that commit's own ``heptstudy fit validate`` from a git worktree.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from heptstudy.atomic import Output, check_outputs, write_output_files
from heptstudy.config import validate as validate_config
from heptstudy.data.batching import load_events
from heptstudy.errors import HeptstudyError
from heptstudy.estimate.bench_process import simulate_bench_process
from heptstudy.estimate.fake_step import estimate_step
from heptstudy.fingerprint import ROOT, commit_reasons
from heptstudy.paths import git, real_path
from heptstudy.units import MIB

#: A report passes when |estimated / measured - 1| is within these.
ALLOCATED_TOLERANCE, RESERVED_TOLERANCE = 0.03, 0.10
#: Devices with a caching allocator: reserved is estimated (simulated) and compared.
CACHING = ("cuda", "rocm")
#: What validates a report of other code (its commit's own `heptstudy fit validate`).
AT_COMMIT = "scripts/at_commit.sh {commit} fit validate --reports ... --data-dir ..."


def unusable(report) -> str | None:
    """Why a (schema-valid) report has nothing to validate, else None."""
    if report.kind != "memory" or report.status != "ok":
        return f"a {report.kind} report with status {report.status}: only memory reports (ok)"
    if report.checkpointing.plan == "auto":
        return "activation_checkpointing=auto: each step ran its own plan"
    if report.environment.device_kind not in ("cpu", *CACHING):
        return f"measured on {report.environment.device_kind}: the estimator knows cpu, cuda, rocm"
    return None


def _check(report, source: str) -> None:
    s = report.summary
    gpu = report.environment.device_kind in CACHING
    for name in ("max_peak_allocated_mib",) + (("max_peak_reserved_mib",) if gpu else ()):
        if not getattr(s, name):
            raise HeptstudyError(
                f"{source}: summary.{name} is {getattr(s, name)!r}; a measured peak must be > 0 "
                "MiB: the report is damaged, measure again (heptstudy bench)"
            )
    bad = [r.step for r in report.steps if len(r.event_indices) != report.batch_size]
    bad += [r.step for r in report.steps if len(r.hits) != len(r.event_indices)]
    if bad or not any(r.counted for r in report.steps):
        raise HeptstudyError(
            f"{source}: steps {bad or '(none counted)'}: every step must list batch_size "
            f"({report.batch_size}) event_indices and their hits, and one step must be counted: "
            "the report is damaged, measure again (heptstudy bench)"
        )


def other_code(report, code: str | None = None) -> str | None:
    """Why ``report`` is not of the running code's model and step (a skip reason), else None.

    ``code``: ``"running"`` (the reports stand for the running code), or the commit they
    measured when they record one this repository does not hold; None: each report's own."""
    if code == "running":
        return None
    env = report.environment
    running = "give --code running if it measured the running code's model and step"
    if code is None and env.git_commit is None:
        return f"environment.git_commit is null: {running}"
    if code is None and env.git_dirty:
        return (
            f"environment.git_dirty is true: it measured uncommitted changes of "
            f"{env.git_commit[:9]}, which no commit holds; {running}"
        )
    rev = code or env.git_commit
    sha = (
        None
        if rev.startswith("-")
        else git("rev-parse", "-q", "--verify", f"{rev}^{{commit}}", cwd=ROOT)
    )
    if sha is None and code:
        raise HeptstudyError(
            f"--code {rev!r} is no commit of the repository at {ROOT}; give 'running' or a commit "
            "of this repository whose code the reports measured"
        )
    if sha is None:
        return (
            f"environment.git_commit {rev!r} is no commit of this repository: {running}, or "
            "--code COMMIT with the commit of this repository whose code it measured"
        )
    sha = sha.strip()
    changed = commit_reasons(sha)
    if changed == []:
        return None
    why = " and ".join(changed) if changed else "code cannot be read by git here"
    return f"commit {sha[:9]}'s {why}: run its own code, {AT_COMMIT.format(commit=sha[:9])}"


def _row(report, source: str, data_dir: Path) -> dict:
    """Measured against estimated peaks of ``report``'s steps on its own events."""
    started = time.perf_counter()
    cfg = dict(report.config)
    cfg["data"] = {**cfg["data"], "data_dir": str(data_dir)}
    config = validate_config(cfg, f"{source}'s config")
    env, summary = report.environment, report.summary
    gpu = env.device_kind in CACHING
    rows, traces, calls = [], [], {}
    for record in report.steps:
        if not (gpu or record.counted):
            continue  # CPU: no replay, so the warm-up steps are not needed
        batch = load_events(config, record.event_indices, "train")
        hits, padded = batch["length"].tolist(), batch["padded_length"].tolist()
        if hits != record.hits or padded != record.padded_hits:
            raise HeptstudyError(
                f"{source}: step {record.step}'s events {record.event_indices} have {hits} hits "
                f"in {data_dir}, the report lists {record.hits}: give --data-dir the data the "
                "report measured (same generator, seed and event counts)"
            )
        est = estimate_step(
            config,
            batch,
            "cpu",
            target=env.device_kind,
            torch_version=env.torch_version,
            record_trace=gpu,
        )
        calls = {"autocast": est.autocast_calls, "stand_ins": est.stand_in_calls}
        calls = {k: v for k, v in calls.items() if v is not None} | {"scratch": est.scratch_ops}
        traces.append(est.trace)
        rows.append({"step": record.step, "tracked_mib": est.peak_allocated_bytes / MIB})
    allocated = max(r["tracked_mib"] for r in rows)
    reserved = expandable = measured_res = None
    if gpu:
        sim = simulate_bench_process(traces, warmup=summary.warmup_steps, passes="both")
        for row, peaks in zip(rows, sim.native, strict=True):
            row.update(allocated_mib=peaks.peak_allocated_mib, reserved_mib=peaks.peak_reserved_mib)
        allocated, reserved = sim.max_allocated() / MIB, sim.max_reserved() / MIB
        expandable = sim.max_reserved("expandable") / MIB
        measured_res = summary.max_peak_reserved_mib
    alloc_err = allocated / summary.max_peak_allocated_mib - 1
    res_err = None if reserved is None else reserved / measured_res - 1
    return {
        "report": report.name or Path(source).stem,
        "file": source,
        "device": f"{env.device_kind} ({env.device_name})",
        "recorded_commit": env.git_commit,
        "batch_size": report.batch_size,
        "checkpointing": report.checkpointing.model_dump(),
        "measured_allocated_mib": summary.max_peak_allocated_mib,
        "estimated_allocated_mib": allocated,
        "allocated_error": alloc_err,
        "measured_reserved_mib": measured_res,
        "estimated_reserved_mib": reserved,
        "reserved_error": res_err,
        "expandable_reserved_mib": expandable,
        "within_tolerance": abs(alloc_err) <= ALLOCATED_TOLERANCE
        and (res_err is None or abs(res_err) <= RESERVED_TOLERANCE),
        "estimated_steps": rows,
        "calls_of_the_last_step": calls,
        "seconds": round(time.perf_counter() - started, 1),
    }


def validate(reports, data_dir, code: str | None = None, progress=print) -> dict:
    """Measured against estimated for ``(path, BenchReport)`` pairs; returns the JSON document."""
    data_dir = real_path(data_dir, "--data-dir")
    if not data_dir.is_dir():
        raise HeptstudyError(
            f"--data-dir {str(data_dir)!r} is no folder; give the data the reports measured "
            "(e.g. data/tfds, made by `make study-data`)"
        )
    jobs, skipped = {}, []
    for path, report in reports:
        source = str(path)
        reason = unusable(report)
        if not reason:
            _check(report, source)  # a damaged report is refused, whichever code it measured
            reason = other_code(report, code)
        if reason:
            skipped.append({"report": source, "reason": reason})
        else:
            jobs[source] = report
    if not jobs:
        raise HeptstudyError(
            "no report to validate (memory reports, status ok, of cpu/cuda/rocm, of the running "
            "code):\n" + "\n".join(f"  {s['report']}: {s['reason']}" for s in skipped)
        )
    rows = []
    for source, report in jobs.items():
        progress(f"estimating {source} ...")
        try:
            rows.append(_row(report, source, data_dir))
        except HeptstudyError as err:
            if str(err).startswith(source):
                raise
            raise HeptstudyError(f"{source}: {err}") from None
    head = git("rev-parse", "HEAD", cwd=ROOT)
    return {
        "what": "measured against estimated peak memory (MiB) of every memory report of the "
        "running code, on its own events",
        "estimator_commit": head.strip() if head else None,
        "estimator_tree_dirty": bool(git("status", "--porcelain", "--", "heptstudy", cwd=ROOT)),
        "data_dir": str(data_dir),
        "tolerance": {"allocated": ALLOCATED_TOLERANCE, "reserved": RESERVED_TOLERANCE},
        "rows": rows,
        "skipped": skipped,
        "all_within_tolerance": all(r["within_tolerance"] for r in rows),
    }


def table(doc: dict) -> str:

    def mib(v):
        return "-" if v is None else f"{v:,.0f}"

    def pct(v):
        return "-" if v is None else f"{v:+.1%}"

    within = f"within {ALLOCATED_TOLERANCE:.0%} / {RESERVED_TOLERANCE:.0%}"
    lines = [
        f"| report | device | measured allocated | estimated allocated | error | measured "
        f"reserved | estimated reserved | error | expandable reserved (never measured) | {within} |",
        "|---|---|" + "---:|" * 7 + ":---:|",
    ]
    for r in doc["rows"]:
        cells = [r["report"], r["device"].split()[0]]
        cells += [mib(r["measured_allocated_mib"]), mib(r["estimated_allocated_mib"])]
        cells += [pct(r["allocated_error"]), mib(r["measured_reserved_mib"])]
        cells += [mib(r["estimated_reserved_mib"]), pct(r["reserved_error"])]
        cells += [mib(r["expandable_reserved_mib"]), "yes" if r["within_tolerance"] else "NO"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: What ``--out`` may replace, recognised by the words each has always begun with.
VALIDATION_FILE = Output(
    "heptstudy fit validate result", ".json", b'"what": "measured against estimated peak memory'
)
TABLE_FILE = Output("heptstudy fit validate table", ".md", b"| report | device | ")


def outputs(out_dir: Path) -> list[tuple[Path, Output]]:
    return [(out_dir / "validation.json", VALIDATION_FILE), (out_dir / "table.md", TABLE_FILE)]


def check_out(out_dir: Path) -> None:
    """Refused before the minutes of estimating: a file in the way that heptstudy did not write,
    or one where the folder should be."""
    if out_dir.exists() and not out_dir.is_dir():
        raise HeptstudyError(
            f"--out {str(out_dir)!r} is a file, not a folder; give a folder for validation.json "
            "and table.md"
        )
    check_outputs(outputs(Path(out_dir)), "--out")


def write_outputs(doc: dict, out_dir: Path) -> list[Path]:
    texts = [json.dumps(doc, indent=2), table(doc)]
    paths = outputs(Path(out_dir))
    files = [(path, text + "\n", kind) for (path, kind), text in zip(paths, texts, strict=True)]
    return write_output_files(files, "--out")
