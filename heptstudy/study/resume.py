"""Whether a report in a study folder is the measurement a run of the study would make now:
only a report stamped with the run's fingerprint is resumed, never one measured elsewhere."""

from __future__ import annotations

import platform
import socket
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch

from heptstudy.atomic import json_text, write_text_or_keep
from heptstudy.data.tfds import parse_dataset
from heptstudy.errors import HeptstudyError
from heptstudy.fingerprint import canonical, code_state, digest
from heptstudy.measure.paired import PAIRED_FILE, complete, read_paired
from heptstudy.measure.report import ReportError, device_name, read_report, short_repr, write_report
from heptstudy.paths import resolve_in_repo


@lru_cache(maxsize=4)
def device_identity(kind: str) -> dict[str, Any]:
    """Host name, device kind and model. A GPU's name is read in a short child process, so that
    the runner holds no GPU context (it would take device memory from the measurements)."""
    name: str | None
    if kind == "cpu":
        name = device_name("cpu")
    else:
        try:
            cmd = [sys.executable, "-c", "import torch; print(torch.cuda.get_device_name(0))"]
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
            name = res.stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            name = None
    return {"hostname": socket.gethostname(), "device_type": kind, "device_name": name}


def data_identity(config) -> dict[str, Any]:
    d = config.data
    root = resolve_in_repo(d.data_dir)
    name, version = parse_dataset(d.dataset)
    files = []
    for cfg in d.configs:
        folder = root / name / str(cfg) / version
        for path in sorted(folder.glob("*")) if folder.is_dir() else []:
            st = path.stat()
            files.append([path.name, st.st_size, st.st_mtime_ns])
    return {"data_dir": str(root), "dataset": d.dataset, "files": digest(files)[:20]}


def run_identity(m) -> dict[str, Any]:
    fields = m.request.model_dump(mode="json", exclude={"output", "progress"})
    return {
        "machine": device_identity(m.device.type),
        "code": code_state(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "request": fields,
        "config": m.config.to_dict(),
        "data": data_identity(m.config),
        "allocator": dict(m.allocator),
    }


def _where(hostname, commit, torch_version, identity: dict[str, Any]) -> dict[str, tuple]:
    """(report's, run's) host name, commit and PyTorch version: what every report must share."""
    return {
        "host name": (hostname, identity["machine"]["hostname"]),
        "commit": (commit, identity["code"]["git_commit"]),
        "PyTorch": (torch_version, identity["torch"]),
    }


def _differences(found: dict[str, tuple]) -> list[str]:
    return [
        f"{what}: report {short_repr(got, 60)}, run {short_repr(want, 60)}"
        for what, (got, want) in found.items()
        if got != want
    ]


_DIFFERS = "not resumable, the report differs from the run: "


def mismatches(report, identity: dict[str, Any]) -> list[str]:
    """What a report measured unlike ``identity`` (a failure's missing figures are not)."""
    env = report.environment
    machine = identity["machine"]
    request = identity["request"]
    found = {
        **_where(env.hostname, env.git_commit, env.torch_version, identity),
        "kind": (report.kind, request.get("kind")),
        "batch size": (report.batch_size, request.get("batch_size")),
        "configuration": (canonical(report.config), canonical(identity["config"])),
    }
    if machine["device_name"] is not None:
        found["device"] = (env.device_name, machine["device_name"])
    if report.kind == "memory":
        found["checkpointing"] = (report.checkpointing.plan, request.get("checkpointing"))
    if report.summary is not None:
        found["counted steps"] = (report.summary.counted_steps, request.get("steps"))
        found["warm-up steps"] = (report.summary.warmup_steps, request.get("warmup"))
    if report.parity is not None:
        found["deterministic"] = (report.parity.deterministic, request.get("deterministic"))
    settings = env.allocator_settings
    if settings is not None and identity["allocator"] is not None:
        found["allocator settings"] = (dict(settings), identity["allocator"])
    return _differences(found)


def resumable(path: Path, fingerprint: str, identity: dict[str, Any]) -> tuple[bool, str]:
    """Whether the report at ``path`` is this run's result (resume it), and why (not)."""
    if "paired" in identity:
        return _paired_resumable(path, fingerprint)
    try:
        report = read_report(path)
    except ReportError:
        return False, "its report cannot be read: measuring again"
    stored = report.fingerprint
    if report.status == "error":
        return False, "its report is an error: measuring again"
    host = report.environment.hostname
    if stored is None:
        return False, (
            f"its report (measured on {host}) has no fingerprint of this study: measuring again"
        )
    differs = mismatches(report, identity)
    if stored != fingerprint or differs:
        detail = f" ({differs[0]})" if differs else ""
        return False, (
            f"its report (measured on {host}) was measured with another machine, code, "
            f"configuration, data or allocator{detail}: measuring again"
        )
    return True, f"resumed: report with the same fingerprint ({report.status})"


def stamp(path: Path, fingerprint: str, identity: dict[str, Any]) -> str:
    """Stamp the run's fingerprint into its new report if the report agrees; else say why."""
    if "paired" in identity:
        return _paired_stamp(path, fingerprint, identity)
    try:
        report = read_report(path)
    except ReportError as err:
        return f"report unreadable: {str(err).splitlines()[0]}"
    if report.status == "error":
        return ""
    if differs := mismatches(report, identity):
        return _DIFFERS + "; ".join(differs)
    write_report(report.model_copy(update={"fingerprint": fingerprint}), path)
    return ""


def report_status(path: Path) -> str:
    """``ok``, ``oom`` or ``error`` of the report a run wrote (a paired timing's: ``ok`` when it
    timed every round asked for)."""
    try:
        return "ok" if complete(read_paired(path)) else "error"
    except HeptstudyError:
        return read_report(path).status


def _paired_stamp(path: Path, fingerprint: str, identity: dict[str, Any]) -> str:
    try:
        report = read_paired(path)
    except HeptstudyError:
        return ""  # the runner's failure report: never resumed
    env = report.get("environment", {})
    differs = _differences(
        {
            **_where(
                env.get("hostname"), env.get("git_commit"), env.get("torch_version"), identity
            ),
            "plans": (list(report.get("plans", {})), identity["paired"]["plans"]),
            "rounds": (report.get("rounds_asked"), identity["paired"]["rounds"]),
            "configuration": (canonical(report.get("config")), canonical(identity["config"])),
        }
    )
    if differs:
        return _DIFFERS + "; ".join(differs)
    if not complete(report):
        return f"not resumable: {report.get('rounds')} of {report.get('rounds_asked')} rounds"
    text = json_text({**report, "fingerprint": fingerprint}, "the paired timing")
    write_text_or_keep(path, text, "the paired timing", PAIRED_FILE)
    return ""


def _paired_resumable(path: Path, fingerprint: str) -> tuple[bool, str]:
    try:
        report = read_paired(path)
    except HeptstudyError:
        return False, "its report is no paired timing (a failure): measuring again"
    host = report.get("environment", {}).get("hostname")
    if report.get("fingerprint") != fingerprint:
        return False, (
            f"its report (measured on {host}) has no fingerprint of this run (another machine, "
            "code, configuration, data, allocator, plans or rounds, or interrupted): measuring again"
        )
    return True, "resumed: report with the same fingerprint (ok)"
