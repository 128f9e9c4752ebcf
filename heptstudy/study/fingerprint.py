"""Whether a report in a study folder is the measurement a run of the study would make now.

A study resumes a run (keeps its report instead of measuring again) only when the report carries
the same fingerprint as the run has now: a hash of

* the machine: host name, device kind and model;
* the code: commit, and the content of uncommitted changes and new files of the package,
  notebooks and configurations (experiments and figures excluded); PyTorch and Python;
* the run: every field of its measurement request except where the report goes, and the
  configuration it resolves to;
* the data: name, size and modification time of every file of the data sets it reads;
* the allocator settings its measurement applies (none: what its process is started with).

The runner writes the fingerprint into a report after checking that the report itself says the
same about what it measured (:func:`mismatches`); a report without a fingerprint (one measured
elsewhere, or before fingerprints) is never resumed.
"""

from __future__ import annotations

import hashlib
import json
import platform
import socket
import subprocess
import sys
from functools import lru_cache
from typing import Any

from heptstudy.paths import ROOT, git


def _canonical(value: Any) -> Any:
    """JSON's view of ``value`` (tuples as lists, keys as strings), so both sides compare alike."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def fingerprint(identity: dict[str, Any]) -> str:
    text = json.dumps(_canonical(identity), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


_CODE = (":(top)heptstudy", ":(top)notebooks", ":(top)configs", ":(top)pyproject.toml")


@lru_cache(maxsize=1)
def code_state() -> dict[str, Any]:
    """The commit, and a hash of what differs from it in the code (None when clean)."""
    root = ROOT
    commit = git("rev-parse", "HEAD", cwd=root)
    if commit is None:
        return {"git_commit": None, "changes": None}
    diff = git("diff", "HEAD", "--", *_CODE, cwd=root) or ""
    new = (git("ls-files", "--others", "--exclude-standard", "--", *_CODE, cwd=root) or "").split()
    h = hashlib.sha256(diff.encode())
    for name in sorted(new):
        try:
            h.update(name.encode() + b"\0" + (root / name).read_bytes())
        except OSError:
            h.update(name.encode() + b"\0<unreadable>")
    changed = bool(diff or new)
    return {"git_commit": commit.strip(), "changes": h.hexdigest()[:20] if changed else None}


@lru_cache(maxsize=4)
def device_identity(kind: str) -> dict[str, Any]:
    """Host name, device kind and model. A GPU's name is read in a short child process, so that
    the runner holds no GPU context (it would take device memory from the measurements)."""
    from heptstudy.measure.report import device_name

    name: str | None
    if kind == "cpu":
        name = device_name("cpu")
    else:
        try:
            res = subprocess.run(
                [sys.executable, "-c", "import torch; print(torch.cuda.get_device_name(0))"],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            name = res.stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            name = None
    return {"hostname": socket.gethostname(), "device_type": kind, "device_name": name}


def data_identity(config) -> dict[str, Any]:
    """Name, size and modification time of every file of the data sets a run reads (every
    builder config, both splits' folder); a regenerated or replaced data set differs."""
    from heptstudy.data.tfds import parse_dataset
    from heptstudy.paths import resolve_in_repo

    d = config.data
    root = resolve_in_repo(d.data_dir)
    name, version = parse_dataset(d.dataset)
    files = []
    for cfg in d.configs:
        folder = root / name / str(cfg) / version
        for path in sorted(folder.glob("*")) if folder.is_dir() else []:
            st = path.stat()
            files.append([path.name, st.st_size, st.st_mtime_ns])
    h = hashlib.sha256(json.dumps(files).encode()).hexdigest()[:20]
    return {"data_dir": str(root), "dataset": d.dataset, "files": h}


def run_identity(m) -> dict[str, Any]:
    """What a run (its resolved :class:`~heptstudy.measure.request.Measurement`) measures now on
    this machine (see the module docstring)."""
    import torch

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


def mismatches(report, identity: dict[str, Any]) -> list[str]:
    """What a report says it measured that differs from ``identity`` (empty: it agrees). Only
    what a report records is compared; a failure report's missing figures are not a mismatch."""
    from heptstudy.measure.report import short_repr

    env = report.environment
    machine = identity["machine"]
    request = identity["request"]
    found = {
        "host name": (env.hostname, machine["hostname"]),
        "commit": (env.git_commit, identity["code"]["git_commit"]),
        "PyTorch": (env.torch_version, identity["torch"]),
        "kind": (report.kind, request.get("kind")),
        "batch size": (report.batch_size, request.get("batch_size")),
        "configuration": (_canonical(report.config), _canonical(identity["config"])),
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
    return [
        f"{what}: report {short_repr(got, 60)}, run {short_repr(want, 60)}"
        for what, (got, want) in found.items()
        if got != want
    ]
