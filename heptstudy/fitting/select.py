"""Which memory model answers for a configuration, and why the others do not. A model holds only
for its own key; one differing only in device kind or attention backend is a cross-check."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from heptstudy.estimate.keys import mismatches
from heptstudy.estimate.memory_model import FitError, MemoryModel
from heptstudy.fingerprint import REGENERATE, stale_reasons
from heptstudy.fitting.reports import Rejected, fit_reports

CROSS_CHECK_SETTINGS = ("device_kind:", "attention_backend:")
#: How a cross-check measured on older code starts its list of differences.
STALE_PREFIX = "measured on older code"


@dataclass
class Choice:
    model: MemoryModel | None = None
    origin: str = ""  # "reports DIR..." or the stored file
    assumptions: list[str] = field(default_factory=list)
    not_used: list[Rejected] = field(default_factory=list)
    cross_checks: list[tuple[str, MemoryModel, list[str]]] = field(default_factory=list)


def _choose(choice: Choice, candidates, key: dict[str, Any]) -> bool:
    """Whether one of ``candidates`` holds for ``key``, the best becoming ``choice``'s model;
    the others are not used."""
    holding = []
    for origin, model in candidates:
        diffs, assumed = mismatches(model.key, key)
        if not diffs:
            holding.append((origin, model, assumed))
            continue
        choice.not_used.append(
            Rejected(origin, f"{model.source} for another configuration: {'; '.join(diffs)}")
        )
        same = (model.key, model.source, model.allocated)
        seen = any((m.key, m.source, m.allocated) == same for _, m, _ in choice.cross_checks)
        if all(d.startswith(CROSS_CHECK_SETTINGS) for d in diffs) and not seen:
            choice.cross_checks.append((origin, model, diffs))
    # measured first, then the best validated
    holding.sort(key=lambda c: (c[1].source != "measured", c[1].held_out_error("allocated") or 0))
    if holding:
        choice.origin, choice.model, choice.assumptions = holding[0]
    return bool(holding)


def _report_names(model: MemoryModel) -> str:
    files = model.provenance.get("reports") or []
    folders = sorted({str(Path(f).parent) for f in files})
    return f"reports {', '.join(Path(f).name for f in files)} in {', '.join(folders)}"


def _of_this_code(
    choice: Choice, stored: list[tuple[str, MemoryModel]], key: dict[str, Any]
) -> list[tuple[str, MemoryModel]]:
    """The stored models of the code that runs now. A measured one of older code stays as a
    labelled cross-check: the only GPU evidence a laptop has, and regenerating it needs a GPU."""
    current = []
    for origin, model in stored:
        reasons = stale_reasons(model.fingerprint, model.source, model.key)
        if not reasons:
            current.append((origin, model))
            continue
        commit = (model.fingerprint or {}).get("commit")
        made = f"{model.source} on commit {commit[:9]}" if commit else model.source
        how = REGENERATE.get(model.source, REGENERATE["estimated"])
        choice.not_used.append(
            Rejected(
                origin,
                f"{made}, from other code than this: {'; '.join(reasons)}. Regenerate: {how}",
            )
        )
        diffs, _ = mismatches(model.key, key)
        if model.source == "measured" and all(d.startswith(CROSS_CHECK_SETTINGS) for d in diffs):
            label = f"{STALE_PREFIX} ({made}: {'; '.join(reasons)})"
            choice.cross_checks.append((origin, model, [*diffs, label]))
    return current


def choose_model(
    key: dict[str, Any], reports=(), fits_dir: Path | None = None, stored_if_reports_unusable=False
) -> Choice:
    """The model for ``key``: from ``reports`` when given, else (or, with
    ``stored_if_reports_unusable``, when none of them holds) from ``fits_dir``."""
    choice = Choice()
    if reports:
        models, rejected = fit_reports(reports)
        choice.not_used += rejected
        if _choose(choice, [(_report_names(m), m) for m in models], key):
            return choice
        if not stored_if_reports_unusable:
            lines = "\n".join(f"  {r}" for r in choice.not_used) or "  (no reports found)"
            raise FitError(
                f"none of the reports given fits a memory model for this configuration "
                f"({key['variant']} on {key['device_kind']}, {key['dtype']}, attention "
                f"{key['attention_backend']}, checkpointing "
                f"{key['checkpointing']}):\n{lines}\n"
                "Measure this configuration with `heptstudy bench` on the platform's device, or "
                "run without --reports to answer from a stored or estimated model"
            )
    if fits_dir is not None:
        stored = []
        for path in sorted(fits_dir.glob("*.json")) if fits_dir.is_dir() else []:
            try:
                stored.append((str(path), MemoryModel.load(path)))
            except FitError as err:
                choice.not_used.append(Rejected(str(path), str(err)))
        _choose(choice, _of_this_code(choice, stored, key), key)
    return choice
