"""Bench reports -> measured memory models, one per configuration. A counted step's allocated
point sits at (batch size, its longest padded event), its reserved one (the pool persists) at
the longest padded event of *every step so far* in the process."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from heptstudy import fingerprint as code_fingerprint
from heptstudy.estimate.keys import key_label, model_key
from heptstudy.estimate.memory_model import FitError, MemoryModel, Point, fit_points
from heptstudy.measure.report import PAIRED_KIND, BenchReport, ReportError, validate_report
from heptstudy.measure.report_checks import check_consistent


@dataclass
class Rejected:
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


@dataclass
class ReportGroup:
    key: dict[str, Any]
    allocated: list[Point] = field(default_factory=list)
    reserved: list[Point] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    environments: list[dict[str, Any]] = field(default_factory=list)

    def provenance(self) -> dict[str, Any]:
        def values(name: str) -> list:
            return sorted({str(e.get(name)) for e in self.environments if e.get(name) is not None})

        return {
            "reports": self.files,
            "device_names": values("device_name"),
            "platform_profiles": values("platform"),
            "torch_versions": values("torch_version"),
            "git_commits": values("git_commit"),
            "measured_at": values("created_at"),
            "synthetic_data": sorted({bool(e.get("synthetic")) for e in self.environments}),
        }


def expand_report_paths(paths) -> list[Path]:
    """Files as given, folders as their ``*.json`` files; a missing path (a typo) is refused."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(p.glob("*.json"))
        elif p.is_file():
            out.append(p)
        else:
            raise FitError(
                f"--reports {str(p)!r}: no such file or directory; give bench report files or "
                "folders holding them (e.g. experiments/h200_2026-11-30)"
            )
    return out


def _memory_report(path: Path) -> BenchReport | str:
    """The usable memory report at ``path``, as this heptstudy reads it, else why not."""
    try:
        rep = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return f"cannot be read as JSON ({type(err).__name__}: {err})"
    if isinstance(rep, dict) and rep.get("kind") == PAIRED_KIND:
        return (
            "a paired timing: step times, no peaks (they serve heptstudy fit --checkpointing auto)"
        )
    schema = rep.get("schema_version") if isinstance(rep, dict) else None
    if not (isinstance(schema, str) and schema.startswith("heptstudy.bench/")):
        return f"not a heptstudy bench report (schema_version {schema!r})"
    try:
        # as this heptstudy writes it (the checkpointing plan's name in today's fields)
        report = validate_report(rep, source=path.name)
        check_consistent(report, path)
    except ReportError as err:
        return " ".join(str(err).split("\n"))
    if report.kind != "memory":
        return f"a {report.kind!r} report: only memory reports hold per-step peaks"
    if report.status != "ok":
        error = str(report.error or "").strip().splitlines()
        return f"status {report.status!r}" + (f" ({error[0][:200]})" if error else "")
    if "model" not in report.config or "train" not in report.config:
        return "no resolved configuration (config.model, config.train)"
    if not any(
        s.counted and s.peak_allocated_mib is not None and s.padded_hits for s in report.steps
    ):
        return "no counted step with a peak allocated and its padded hits"
    return report


AUTO_REPORT = (
    "activation_checkpointing=auto: its steps ran different plans, so its peaks hold for no "
    "single configuration (its step times still serve heptstudy fit --checkpointing auto)"
)


def read_groups(paths) -> tuple[list[ReportGroup], list[Rejected]]:
    groups: dict[str, ReportGroup] = {}
    rejected: list[Rejected] = []
    for path in expand_report_paths(paths):
        report = _memory_report(path)
        if isinstance(report, str):
            rejected.append(Rejected(str(path), report))
            continue
        key = model_key(report.config, report.environment.device_kind)
        if key["checkpointing"] == "auto":
            rejected.append(Rejected(str(path), AUTO_REPORT))
            continue
        group = groups.setdefault(key_label(key), ReportGroup(key))
        group.files.append(str(path))
        env = report.environment.model_dump(mode="json")
        group.environments.append(
            {**env, "created_at": report.created_at, "synthetic": report.data.synthetic}
        )
        longest_so_far = 0
        for s in report.steps:
            if s.geometry is None:
                continue
            batch, longest = s.geometry.events, s.geometry.length
            longest_so_far = max(longest_so_far, longest)
            if not s.counted or s.peak_allocated_mib is None:
                continue
            where = f"{path.name}#step{s.step}"
            group.allocated.append(Point(batch, longest, float(s.peak_allocated_mib), where))
            # a CPU's reserved is the process's resident set, no multiple of its tensors
            if s.peak_reserved_mib is not None and report.environment.device_kind != "cpu":
                group.reserved.append(
                    Point(batch, longest_so_far, float(s.peak_reserved_mib), where)
                )
    return list(groups.values()), rejected


def fit_reports(paths) -> tuple[list[MemoryModel], list[Rejected]]:
    """One measured memory model per configuration, and the reports that gave none with why."""
    groups, rejected = read_groups(paths)
    models = []
    for group in groups:
        sizes = sorted({p.batch_size for p in group.allocated})
        names = ", ".join(Path(f).name for f in group.files)
        try:
            models.append(
                fit_points(
                    group.key,
                    group.allocated,
                    group.reserved,
                    source="measured",
                    source_detail=f"bench reports {names} (batch sizes {sizes})",
                    provenance=group.provenance(),
                )
            )
        except FitError as err:
            for f in group.files:
                rejected.append(Rejected(f, f"its configuration cannot be fitted: {err}"))
    return models, rejected


def save_measured_models(
    paths, out_dir: str | Path, code_commit: str | None = None
) -> tuple[list[Path], list[Rejected]]:
    """Write ``LABEL_measured.json`` for every configuration validated on a held-out batch size,
    fingerprinted with ``code_commit``, else with the one commit the reports name."""
    models, rejected = fit_reports(paths)
    written = []
    for m in models:
        if m.held_out_error("allocated") is None:
            why = m.validation["allocated"].get("why", "not validated")
            rejected += [Rejected(f, f"not stored: {why}") for f in m.provenance["reports"]]
            continue
        commits = m.provenance.get("git_commits") or []
        commit = code_commit or (commits[0] if len(commits) == 1 else None)
        if commit is None:
            raise FitError(
                f"the reports of {key_label(m.key)} name {len(commits)} commits ({commits}); a "
                "stored model needs the one commit its code was: name it (code_commit=..., or "
                "scripts/regenerate_fits.sh --measured DIR COMMIT)"
            )
        torch_versions = m.provenance.get("torch_versions") or [None]
        try:
            m.fingerprint = code_fingerprint.make(
                "measured", m.key, torch_version=torch_versions[0], commit=commit
            )
        except code_fingerprint.CommitUnreadable as err:
            raise FitError(
                f"cannot read the code of commit {commit!r} with git "
                f"({str(err).splitlines()[0] if str(err) else type(err).__name__}); the "
                "reports' code must be a commit of this repository: name the commit the "
                "measured copy was checked out at (code_commit=..., or scripts/"
                "regenerate_fits.sh --measured DIR COMMIT)"
            ) from None
        written.append(m.save(Path(out_dir) / f"{key_label(m.key)}_measured.json"))
    return written, rejected
