"""``heptstudy fit validate``: the memory estimator against measured bench memory reports.

Each report is estimated on its own events with the code it measured, under the estimator
that runs now. A commit whose model and step differ from the running code's is copied out of git
under another name (imports renamed, to share a process); its pieces run in workers.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from heptstudy.atomic import atomic_write_text
from heptstudy.config import PLAN_AS_OLD_FIELDS
from heptstudy.errors import HeptstudyError
from heptstudy.estimate.autocast_policy import target_autocast
from heptstudy.estimate.bench_process import simulate_bench_process
from heptstudy.estimate.fake_step import estimate_step
from heptstudy.estimate.kernel_scratch import scratch_bytes
from heptstudy.estimate.kernel_stand_ins import target_kernels
from heptstudy.fingerprint import ROOT, commit_reasons
from heptstudy.meters.allocation_trace import TracingMemoryMeter
from heptstudy.paths import git, real_path
from heptstudy.units import MIB

#: A report passes when |estimated / measured - 1| is within these.
ALLOCATED_TOLERANCE, RESERVED_TOLERANCE = 0.03, 0.10
#: Devices with a caching allocator: reserved is estimated (simulated) and compared.
CACHING = ("cuda", "rocm")
INSTALL = "`make install-validate` (or `.venv/bin/pip install -e '.[validate]'`)"
#: Where an earlier commit's package keeps each piece of its step (module, newest first).
FAKE_STEP = ("estimate.fake_step", "measure.estimate.fake_step", "fitting.fake")
WHERE = {
    "validate": ("config",),
    "load_events": ("data",),
    "build_model": ("model",),
    "targets_from_batch": ("train.losses",),
    "build_optimizer": ("train.optim",),
    "build_scheduler": ("train.optim",),
    "autocast_dtype": ("train.precision", "train.trainer"),
    "prime_optimizer": ("train.step",),
    "run_step": ("train.step",),
    "forward_and_loss": ("train.trainer",),
    "_fake_targets": FAKE_STEP,
    "_fake_substitutions": FAKE_STEP,
}


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


def code_of(report, source: str, code: str | None = None) -> str | None:
    """The full sha of the commit whose code ``report`` measured, or None for the running code
    (``code`` ``"running"``, or a commit whose model and step code is the running code's)."""
    if code == "running":
        return None
    env = report.environment
    advice = "give --code COMMIT (the commit it measured) or --code running"
    if code is None and env.git_commit is None:
        raise HeptstudyError(f"{source}: environment.git_commit is null; {advice}")
    if code is None and env.git_dirty:
        raise HeptstudyError(
            f"{source}: environment.git_dirty is true: it measured uncommitted changes of "
            f"{env.git_commit[:9]}, which no commit holds; {advice}, or measure from a clean checkout"
        )
    rev = code or env.git_commit
    sha = (
        None
        if rev.startswith("-")
        else git("rev-parse", "--verify", "-q", f"{rev}^{{commit}}", cwd=ROOT)
    )
    if sha is None:
        what = "--code" if code else "environment.git_commit"
        raise HeptstudyError(
            f"{source}: {what} {rev!r} is no commit of the repository at {ROOT}; {advice} "
            "(for reports measured elsewhere: the commit of this repository their README names)"
        )
    sha = sha.strip()
    return None if commit_reasons(sha) == [] else sha


def _job(report, source: str, data_dir: Path) -> dict:
    cfg = dict(report.config)
    cfg["data"] = {**cfg["data"], "data_dir": str(data_dir)}
    return {
        "source": source,
        "config": cfg,
        "steps": [
            r.model_dump(include={"step", "counted", "event_indices", "hits", "padded_hits"})
            for r in report.steps
        ],
        "target": report.environment.device_kind,
        "torch_version": report.environment.torch_version,
        "warmup": report.summary.warmup_steps,
    }


def _piece(package: str, name: str, required: bool = True):
    for module in WHERE[name]:
        try:
            mod = importlib.import_module(f"{package}.{module}")
        except ModuleNotFoundError as err:
            if (err.name or "").split(".")[0] == package:
                continue  # no such module at that commit
            raise HeptstudyError(
                f"the code of commit {package.rsplit('_', 1)[-1]} needs the Python package "
                f"{err.name!r}, which is not installed: install it with {INSTALL}"
            ) from None
        if hasattr(mod, name):
            return getattr(mod, name)
    if not required:
        return None
    raise HeptstudyError(
        f"the code of commit {package.rsplit('_', 1)[-1]} has no {name} in "
        f"{', '.join(WHERE[name])}: its layout is none this validation knows (heptstudy.estimate."
        "validation.WHERE); add where that commit keeps it"
    )


def _old_step(package: str, config, batch, target: str, version: str):
    """An earlier commit's step under this estimator: (peak bytes, trace, calls)."""

    def get(name):
        return _piece(package, name)

    gpu = target in CACHING
    device = torch.device("cpu")
    dtype = get("autocast_dtype")(config, device)
    real_targets = get("targets_from_batch")(batch)
    torch.manual_seed(config.train.seed)
    with torch.device("meta"):
        model = get("build_model")(config)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    codes = batch["X"][..., 0]
    counts = {c: int((codes == c).sum()) for c in (1, 2)}
    fake_targets = get("_fake_targets")(real_targets, mode, "cpu")
    meter = TracingMemoryMeter(device, scratch=scratch_bytes if gpu else None)
    with contextlib.ExitStack() as stack:
        emulation = stack.enter_context(target_autocast(target, version)) if gpu else None
        kernels = stack.enter_context(target_kernels(target)) if gpu else None
        stack.enter_context(mode)
        stack.enter_context(get("_fake_substitutions")(fake_targets, counts))
        model.to_empty(device=device)
        model.train()
        fbatch = {k: mode.from_tensor(v) for k, v in batch.items()}
        optimizer = get("build_optimizer")(model, config.train)
        scheduler = get("build_scheduler")(optimizer, config.train)
        prime = _piece(package, "prime_optimizer", False) or _piece("heptstudy", "prime_optimizer")
        prime(model, optimizer, scheduler)  # LAMB's state, as before a counted bench step
        run_step = _piece(package, "run_step", required=False)
        if run_step is not None:
            mem = run_step(model, fbatch, optimizer, scheduler, config, dtype, meter=meter).memory
        else:  # before train.step: the bench metered forward, loss and backward itself
            meter.start_step(fbatch.values(), model=model, optimizer=optimizer)
            outputs, losses = get("forward_and_loss")(model, fbatch, config, dtype)
            losses["total"].backward()  # the outputs alive through backward, as in its bench
            mem = meter.stop_step()
            del outputs
    calls = {"scratch": meter.tracker.scratch_ops}
    if gpu:
        calls.update(autocast=emulation.calls, stand_ins=kernels.calls)
    return (
        mem.peak_allocated_bytes,
        meter.last_trace,
        {k: dict(sorted(v.items())) for k, v in calls.items()},
    )


def _running_step(config, batch, target: str, version: str):
    est = estimate_step(
        config, batch, "cpu", target=target, torch_version=version, record_trace=target in CACHING
    )
    calls = {"autocast": est.autocast_calls, "stand_ins": est.stand_in_calls}
    calls = {k: v for k, v in calls.items() if v is not None}
    return est.peak_allocated_bytes, est.trace, {**calls, "scratch": est.scratch_ops}


def estimate(job: dict, package: str | None = None, path: str | None = None) -> dict:
    """Estimated peaks of one report's steps, with the running code if ``package`` is None."""
    try:
        return _estimate(job, package, path)
    except Exception as err:
        # name the report (an earlier commit's errors too: they cannot be unpickled here)
        mine = isinstance(err, HeptstudyError)
        if not (mine or package and type(err).__module__.startswith(f"{package}.")):
            raise
        if mine and str(err).startswith(job["source"]):
            raise
        raise HeptstudyError(f"{job['source']}: {err}") from None


def _config_for(package: str, config: dict) -> dict:
    """``config`` as the code of ``package`` reads it (old commits: the old plan fields)."""
    fields = importlib.import_module(f"{package}.config").HEPTv2Config.model_fields
    if "activation_checkpointing_policy" not in fields:
        return config
    heptv2 = dict(config["model"]["heptv2"])
    plan = heptv2.pop("activation_checkpointing")
    if plan not in PLAN_AS_OLD_FIELDS:
        raise HeptstudyError(
            f"checkpointing plan {plan!r} did not exist at commit {package.rsplit('_', 1)[-1]}: "
            "give --code running, or the commit that measured the report"
        )
    heptv2.update(PLAN_AS_OLD_FIELDS[plan])
    return {**config, "model": {**config["model"], "heptv2": heptv2}}


def _estimate(job: dict, package: str | None = None, path: str | None = None) -> dict:
    if path and path not in sys.path:
        sys.path.insert(0, path)
    pkg = package or "heptstudy"
    started = time.perf_counter()
    config = _piece(pkg, "validate")(_config_for(pkg, job["config"]), f"{job['source']}'s config")
    load_events = _piece(pkg, "load_events")
    gpu, target, version = job["target"] in CACHING, job["target"], job["torch_version"]
    rows, traces, calls = [], [], {}
    for record in job["steps"]:
        if not (gpu or record["counted"]):
            continue  # CPU: no replay, so the warm-up steps are not needed
        batch = load_events(config, record["event_indices"], "train")
        hits, padded = batch["length"].tolist(), batch["padded_length"].tolist()
        if hits != record["hits"] or padded != record["padded_hits"]:
            raise HeptstudyError(
                f"{job['source']}: step {record['step']}'s events {record['event_indices']} have "
                f"{hits} hits in {config.data.data_dir}, the report lists {record['hits']}: give "
                "--data-dir the data the report measured (same generator, seed and event counts)"
            )
        peak, trace, calls = (
            _old_step(pkg, config, batch, target, version)
            if package
            else _running_step(config, batch, target, version)
        )
        traces.append(trace)
        rows.append({"step": record["step"], "tracked_mib": peak / MIB})
    out = {"calls_of_the_last_step": calls}
    if gpu:
        sim = simulate_bench_process(traces, warmup=job["warmup"], passes="both")
        for row, peaks in zip(rows, sim.native, strict=True):
            row.update(allocated_mib=peaks.peak_allocated_mib, reserved_mib=peaks.peak_reserved_mib)
        out.update(
            allocated_mib=sim.max_allocated() / MIB,
            reserved_mib=sim.max_reserved() / MIB,
            expandable_reserved_mib=sim.max_reserved("expandable") / MIB,
        )
    else:
        out["allocated_mib"] = max(r["tracked_mib"] for r in rows)
    return {**out, "steps": rows, "seconds": round(time.perf_counter() - started, 1)}


#: An import of the package, or a module of it named in a string (a lazy import); not schema
#: names ("heptstudy.bench/1").
_IMPORT = re.compile(
    r"^(\s*(?:from|import)\s+)heptstudy(?=[\s.])|([\"'])heptstudy(?=(?:\.\w+)+\2)", re.M
)


def copy_of_commit(sha: str, dest: Path) -> str:
    """Write commit ``sha``'s package, imports renamed, and configs to ``dest``; its name."""
    package = f"heptstudy_{sha[:12]}"
    paths = ["heptstudy"] + (["configs"] if git("ls-tree", sha, "configs", cwd=ROOT) else [])
    done = subprocess.run(
        ["git", "archive", "--format=tar", sha, *paths], cwd=ROOT, capture_output=True, check=False
    )
    if done.returncode != 0:
        raise HeptstudyError(f"git archive {sha[:9]} failed: {done.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        for member in tar.getmembers():
            top, _, rest = member.name.partition("/")
            if not member.isfile() or ".." in Path(rest).parts:
                continue
            data = tar.extractfile(member).read()
            if top == "heptstudy" and rest.endswith(".py"):
                data = _IMPORT.sub(lambda m: (m[1] or m[2]) + package, data.decode()).encode()
            out = dest / (package if top == "heptstudy" else top) / rest
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(data)
    return package


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
        if reason:
            skipped.append({"report": source, "reason": reason})
            continue
        _check(report, source)
        jobs[source] = (report, code_of(report, source, code), _job(report, source, data_dir))
    if not jobs:
        raise HeptstudyError(
            "no report to validate (memory reports, status ok, of cpu/cuda/rocm):\n"
            + "\n".join(f"  {s['report']}: {s['reason']}" for s in skipped)
        )
    results = {}
    for source, (_, sha, job) in jobs.items():
        if sha is None:
            progress(f"estimating {source} with the running code ...")
            results[source] = estimate(job)
    for sha in sorted({s for _, s, _ in jobs.values() if s}):
        mine = [src for src, (_, s, _) in jobs.items() if s == sha]
        progress(f"estimating {len(mine)} report(s) with the code of commit {sha[:9]} ...")
        with tempfile.TemporaryDirectory(prefix="heptstudy-validate-") as tmp:
            package = copy_of_commit(sha, Path(tmp))
            workers = min(len(mine), os.cpu_count() or 1)
            spawn = multiprocessing.get_context("spawn")
            # CPU kernels' warnings about the emulated target's dtypes say nothing of the estimate
            quiet = ("ignore", UserWarning)
            with ProcessPoolExecutor(workers, spawn, warnings.simplefilter, quiet) as pool:
                futures = {s: pool.submit(estimate, jobs[s][2], package, tmp) for s in mine}
                results.update((s, f.result()) for s, f in futures.items())
    rows = [_row(report, source, sha, results[source]) for source, (report, sha, _) in jobs.items()]
    head = git("rev-parse", "HEAD", cwd=ROOT)
    return {
        "what": "measured against estimated peak memory (MiB) of every memory report, on its own "
        "events, with the code it measured and the estimator that runs now",
        "estimator_commit": head.strip() if head else None,
        "estimator_tree_dirty": bool(git("status", "--porcelain", "--", "heptstudy", cwd=ROOT)),
        "data_dir": str(data_dir),
        "tolerance": {"allocated": ALLOCATED_TOLERANCE, "reserved": RESERVED_TOLERANCE},
        "rows": rows,
        "skipped": skipped,
        "all_within_tolerance": all(r["within_tolerance"] for r in rows),
    }


def _error(estimated, measured):
    return None if estimated is None or measured is None else estimated / measured - 1


def _row(report, source: str, sha: str | None, est: dict) -> dict:
    gpu = report.environment.device_kind in CACHING
    measured_res = report.summary.max_peak_reserved_mib if gpu else None
    alloc_err = _error(est["allocated_mib"], report.summary.max_peak_allocated_mib)
    res_err = _error(est.get("reserved_mib"), measured_res)
    return {
        "report": report.name or Path(source).stem,
        "file": source,
        "device": f"{report.environment.device_kind} ({report.environment.device_name})",
        "code": sha or "running",
        "recorded_commit": report.environment.git_commit,
        "batch_size": report.batch_size,
        "checkpointing": report.checkpointing.model_dump(),
        "measured_allocated_mib": report.summary.max_peak_allocated_mib,
        "estimated_allocated_mib": est["allocated_mib"],
        "allocated_error": alloc_err,
        "measured_reserved_mib": measured_res,
        "estimated_reserved_mib": est.get("reserved_mib"),
        "reserved_error": res_err,
        "expandable_reserved_mib": est.get("expandable_reserved_mib"),
        "within_tolerance": abs(alloc_err) <= ALLOCATED_TOLERANCE
        and (res_err is None or abs(res_err) <= RESERVED_TOLERANCE),
        "estimated_steps": est["steps"],
        "calls_of_the_last_step": est["calls_of_the_last_step"],
        "seconds": est["seconds"],
    }


def table(doc: dict) -> str:

    def mib(v):
        return "-" if v is None else f"{v:,.0f}"

    def pct(v):
        return "-" if v is None else f"{v:+.1%}"

    within = f"within {ALLOCATED_TOLERANCE:.0%} / {RESERVED_TOLERANCE:.0%}"
    lines = [
        f"| report | device | code | measured allocated | estimated allocated | error | measured "
        f"reserved | estimated reserved | error | expandable reserved (never measured) | {within} |",
        "|---|---|---|" + "---:|" * 7 + ":---:|",
    ]
    for r in doc["rows"]:
        cells = [r["report"], r["device"].split()[0], r["code"][:9]]
        cells += [mib(r["measured_allocated_mib"]), mib(r["estimated_allocated_mib"])]
        cells += [pct(r["allocated_error"]), mib(r["measured_reserved_mib"])]
        cells += [mib(r["estimated_reserved_mib"]), pct(r["reserved_error"])]
        cells += [mib(r["expandable_reserved_mib"]), "yes" if r["within_tolerance"] else "NO"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_outputs(doc: dict, out_dir: Path) -> list[Path]:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        atomic_write_text(out_dir / "validation.json", json.dumps(doc, indent=2) + "\n"),
        atomic_write_text(out_dir / "table.md", table(doc) + "\n"),
    ]
