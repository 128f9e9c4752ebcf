"""Study matrices (``configs/study/*.yaml``): the runs of a study, validated before anything runs."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from heptstudy.config import read_yaml
from heptstudy.errors import ConfigError, HeptstudyError
from heptstudy.measure.paired import (
    PAIRED_ONLY,
    paired_name,
    paired_request,
    plan_names,
    why_unpaired,
)
from heptstudy.measure.request import NOTEBOOK_PARAMETERS, MeasurementRequest, override_list
from heptstudy.names import check_name
from heptstudy.study.common import MEMORY, NOTEBOOKS, PAIRED, StudyError

# a run takes exactly its notebook's parameters; the runner picks the output itself
_KEYS = {nb: tuple(k for k in NOTEBOOK_PARAMETERS[nb] if k != "output") for nb in NOTEBOOKS}
_KEYS[PAIRED] += PAIRED_ONLY
_RUNNER_KEYS = {"notebook", "name", "repeats", "allocator"}
_RUN_KEYS = {*_RUNNER_KEYS, *(k for keys in _KEYS.values() for k in keys)}
ALLOCATOR_LINES = ("platform", "default")
_TOP_LEVEL_KEYS = set(
    "name description notes cell_timeout_s figures_dir defaults runs repeats".split()
)


def _overrides(mapping: dict[str, Any], where: str) -> list[str]:
    try:
        return override_list(mapping["overrides"])
    except ValueError as err:
        raise StudyError(f"{where}: parameter overrides={mapping['overrides']!r}: {err}") from None


@dataclass
class Run:
    name: str
    notebook: str  # "memory", "parity" or "paired"
    parameters: dict[str, Any]
    repeats: int = 1  # rounds of fresh processes (heptstudy.study.schedule)
    allocator: str = "platform"  # "default": started without the platform's allocator settings

    def request(
        self, progress: bool = True, parameters: dict[str, Any] | None = None
    ) -> MeasurementRequest:
        given = self.parameters if parameters is None else parameters
        if self.notebook == PAIRED:
            request = {k: v for k, v in given.items() if k not in PAIRED_ONLY}
            return paired_request(**request, progress=progress)
        return MeasurementRequest.build(kind=self.notebook, **given, progress=progress)


@dataclass
class Matrix:
    name: str
    description: str
    runs: list[Run]
    path: Path
    cell_timeout_s: int | None = None
    notes: list[str] = field(default_factory=list)


def load_matrix(path: str | os.PathLike, data_dir: str | None = None) -> Matrix:
    """Read a study matrix (see ``configs/study/``), every run validated before anything runs."""
    path = Path(path)
    data = _read_matrix(path)
    defaults = dict(data.get("defaults") or {})
    repeats = _repeats(data.get("repeats", 1), f"study matrix {path}")
    if data_dir:  # the command line's --data-dir: the default of every run
        defaults["data_dir"] = str(data_dir)
    bad = (set(defaults) - _RUN_KEYS) | ({"notebook", "name"} & set(defaults))
    if bad:
        raise StudyError(f"study matrix {path}: 'defaults' cannot set {sorted(bad)}")
    runs = [
        _load_run(entry, f"study matrix {path}, run {i + 1}", defaults, repeats)
        for i, entry in enumerate(data["runs"])
    ]
    names = [(r.allocator, r.name) for r in runs]
    dupes = sorted({n for a, n in names if names.count((a, n)) > 1})
    if dupes:
        raise StudyError(
            f"study matrix {path}: several runs are named {dupes}; give them a 'name:'"
        )
    name = data.get("name") if data.get("name") is not None else path.stem
    timeout = data.get("cell_timeout_s")
    if timeout is not None:  # papermill reads 0 as no limit: null (or no key) is the one way
        _at_least_one(
            timeout,
            f"study matrix {path}",
            "cell_timeout_s",
            "the seconds one notebook cell may run, a whole number >= 1 (for example 3600), or "
            "leave the key out (or null) for no limit",
        )
    return Matrix(
        name=check_name(name, f"study matrix {path}: name", example="cpu_default"),
        description=str(data.get("description") or ""),
        runs=runs,
        path=path,
        cell_timeout_s=timeout,
        notes=[str(n) for n in data.get("notes") or []],
    )


def _read_matrix(path: Path) -> dict[str, Any]:
    """The matrix file's mapping, with a non-empty ``runs:`` list and no unknown top-level key."""
    try:
        data = read_yaml(path, "study matrix")
    except ConfigError as err:
        raise StudyError(str(err)) from None
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list) or not data["runs"]:
        raise StudyError(
            f"study matrix {path}: needs a non-empty 'runs:' list (see configs/study/)"
        )
    unknown = set(data) - _TOP_LEVEL_KEYS
    if unknown:
        raise StudyError(f"study matrix {path}: unknown top-level keys {sorted(unknown)}")
    return data


def _load_run(entry: Any, where: str, defaults: dict[str, Any], repeats: int) -> Run:
    """One entry of ``runs:`` over the matrix's defaults, its request built to validate it."""
    if not isinstance(entry, dict):
        raise StudyError(f"{where}: each run is a mapping of parameters, got {entry!r}")
    unknown = set(entry) - _RUN_KEYS
    if unknown:
        raise StudyError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_RUN_KEYS)}")
    notebook = entry.get("notebook", MEMORY)
    if notebook not in NOTEBOOKS:
        raise StudyError(f"{where}: notebook {notebook!r} is not one of {sorted(NOTEBOOKS)}")
    keys = _KEYS[notebook]
    misplaced = set(entry) & (set(_RUN_KEYS) - set(keys) - _RUNNER_KEYS)
    if misplaced:
        raise StudyError(f"{where}: {sorted(misplaced)} do not apply to {notebook}.ipynb")
    params = {k: v for k, v in {**defaults, **entry}.items() if k in keys}
    if "overrides" in defaults and "overrides" in entry:  # a run's add to the defaults'
        params["overrides"] = _overrides(defaults, where) + _overrides(entry, where)
    run = Run(
        name="",
        notebook=notebook,
        parameters=params,
        repeats=_repeats(entry.get("repeats", repeats if notebook == MEMORY else 1), where),
        allocator=_allocator_line({**defaults, **entry}.get("allocator", "platform"), where),
    )
    if run.repeats > 1 and notebook != MEMORY:
        raise StudyError(
            f"{where}: repeats={run.repeats} applies to memory runs only"
            + (" (a paired run has rounds: give rounds)" if notebook == PAIRED else "")
        )
    if notebook == PAIRED:
        _check_paired(params, where)
    try:
        request = run.request(progress=False)
    except HeptstudyError as err:
        raise StudyError(f"{where}: {err}") from None
    default = paired_name(request) if notebook == PAIRED else request.name
    run.name = check_name(
        entry["name"] if entry.get("name") is not None else default, f"{where}: name"
    )
    return run


def _check_paired(params: dict[str, Any], where: str) -> None:
    """A paired run names its plans as a list and its rounds as a whole number >= 1 (the plans
    themselves are checked against the model when the study prepares its runs)."""
    plans = params.get("plans")
    # booleans: YAML's bare off/true, each the plan it spells (plan_names)
    if (
        not isinstance(plans, list)
        or not plans
        or not all(isinstance(p, str | bool) for p in plans)
    ):
        raise StudyError(
            f"{where}: plans={plans!r} is not allowed: a paired run names the plans to time "
            "against off as a list, e.g. plans: [full, keep70]"
        )
    named = plan_names(plans)
    if unpaired := [p for p in named if why_unpaired(p)]:
        why = "; ".join(f"{p}: {why_unpaired(p)}" for p in unpaired)
        raise StudyError(
            f"{where}: plans {unpaired} cannot be paired ({why}); name the plans to compare "
            "with off, e.g. plans: [full, keep70]"
        )
    params["plans"] = named
    _at_least_one(params.get("rounds"), where, "rounds", "the paired rounds, e.g. rounds: 3")


def _at_least_one(value: Any, where: str, key: str, wanted: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise StudyError(f"{where}: {key}={value!r} is not allowed: give {wanted}")
    return value


def _repeats(value: Any, where: str) -> int:
    wanted = "the number of rounds of fresh processes, an integer >= 1"
    return _at_least_one(value, where, "repeats", f"{wanted} (3 or more for step-time comparisons)")


def _allocator_line(value: Any, where: str) -> str:
    if value not in ALLOCATOR_LINES:
        raise StudyError(
            f"{where}: allocator={value!r} is not allowed: 'platform' (the platform profile's "
            "allocator settings, the default) or 'default' (the allocator as it comes)"
        )
    return value
