"""Study matrices (``configs/study/*.yaml``): the runs of a study, validated before anything runs."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from heptstudy.config import read_yaml
from heptstudy.errors import ConfigError, DataError, HeptstudyError
from heptstudy.measure.bench import check_event_counts as run_event_counts
from heptstudy.measure.paired import (
    PAIRED_ONLY,
    paired_name,
    paired_plans,
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


def load_matrix(
    path: str | os.PathLike, data_dir: str | None = None, *, build_configs: bool = True
) -> Matrix:
    """Read a study matrix (see ``configs/study/``), every run validated before anything runs:
    its parameters and, with ``build_configs``, the configuration its measurement would use (a
    paired run's plans too), so that a run that can only fail is refused here, by its index."""
    data = _read_matrix(path)  # before Path(): read_yaml refuses '', which Path() reads as '.'
    path = Path(path)
    where = f"study matrix {path}"
    defaults = _defaults(data.get("defaults"), where, data_dir)
    repeats = _repeats(data.get("repeats", 1), where)
    runs = [
        _load_run(entry, f"{where}, run {i + 1}", defaults, repeats, build_configs)
        for i, entry in enumerate(data["runs"])
    ]
    names = [(r.allocator, r.name) for r in runs]
    dupes = sorted({n for a, n in names if names.count((a, n)) > 1})
    if dupes:
        raise StudyError(f"{where}: several runs are named {dupes}; give them a 'name:'")
    name = data.get("name") if data.get("name") is not None else path.stem
    timeout = data.get("cell_timeout_s")
    if timeout is not None:  # papermill reads 0 as no limit: null (or no key) is the one way
        _at_least_one(
            timeout,
            where,
            "cell_timeout_s",
            "the seconds one notebook cell may run, a whole number >= 1 (for example 3600), or "
            "leave the key out (or null) for no limit",
        )
    return Matrix(
        name=check_name(name, f"{where}: name", example="cpu_default"),
        description=_description(data.get("description"), where),
        runs=runs,
        path=path,
        cell_timeout_s=timeout,
        notes=_notes(data.get("notes"), where),
    )


def _defaults(value: Any, where: str, data_dir: str | None) -> dict[str, Any]:
    """``defaults:``, the parameters every run takes unless it gives its own."""
    if value is None:  # no key, or `defaults:` with nothing under it
        value = {}
    if not isinstance(value, dict):
        raise StudyError(
            f"{where}: defaults={value!r} is not allowed: give a mapping of run parameters that "
            "every run takes unless it gives its own, e.g. defaults: {platform: local_cpu, "
            "steps: 2}, or leave the key out"
        )
    defaults = dict(value)
    if data_dir:  # the command line's --data-dir: the default of every run
        defaults["data_dir"] = str(data_dir)
    bad = (set(defaults) - _RUN_KEYS) | ({"notebook", "name"} & set(defaults))
    if bad:
        raise StudyError(f"{where}: 'defaults' cannot set {sorted(bad)}")
    return defaults


def _description(value: Any, where: str) -> str:
    """The report's description: one string (str() of a list would print its brackets)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise StudyError(
            f"{where}: description={value!r} is not allowed: give one string (YAML's "
            "'description: >' folds the indented lines below it into one), or leave the key out"
        )
    return value


def _notes(value: Any, where: str) -> list[str]:
    """The report's notes: a list of strings (a bare string would be iterated letter by letter)."""
    if value is None:
        return []
    example = 'e.g. notes: ["CPU memory: ..."], or leave the key out'
    if not isinstance(value, list):
        raise StudyError(
            f"{where}: notes={value!r} is not allowed: give a list of strings, one per note, "
            + example
        )
    for i, note in enumerate(value):
        if not isinstance(note, str):
            raise StudyError(
                f"{where}: notes item {i + 1}, {note!r}, is not allowed: each note is a string "
                "(quote it in the YAML), " + example
            )
    return list(value)


def _read_matrix(path: str | os.PathLike) -> dict[str, Any]:
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


def _load_run(
    entry: Any, where: str, defaults: dict[str, Any], repeats: int, build_configs: bool
) -> Run:
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
    if build_configs:
        _build_config(run, request, f"{where} ({run.name})")
    return run


def _build_config(run: Run, request: MeasurementRequest, where: str) -> None:
    """Build the configuration the run's measurement would use, as ``study run`` does before
    it measures (heptstudy.study.runner.prepare): an override or plan that the configuration
    refuses is refused now, not in the run's kernel. No model is built and no data read."""
    try:
        measurement = request.resolve()
    except HeptstudyError as err:
        raise StudyError(f"{where}: {err}") from None
    if run.notebook != PAIRED:
        return
    plans = run.parameters["plans"]
    try:  # a paired run's plans are the model's to name: a count plan, say, by its layers
        paired_plans(plans, measurement)
    except HeptstudyError as err:
        # said as the bench command says it, which the run does not use
        said = str(err).removeprefix("heptstudy bench paired: ")
        raise StudyError(f"{where}: plans={plans!r}: {said}") from None


def _check_paired(params: dict[str, Any], where: str) -> None:
    """A paired run names its plans as a list and its rounds as a whole number >= 1 (the plans
    themselves are checked against the model with its configuration: _build_config)."""
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


def check_event_counts(matrix: Matrix) -> list[str]:
    """Refuse, in one :class:`StudyError` naming each, the runs that need more events than their
    data set holds (``study run`` refuses them before it measures); return a note for each data
    set that could not be opened, whose counts are then left to ``study run``."""
    short, unopened = [], {}
    for i, run in enumerate(matrix.runs):
        m = run.request(progress=False).resolve()
        try:
            run_event_counts(m)  # the counts alone: reading every event takes seconds a run
        except DataError as err:  # none there (yet), or one that does not open: study run's
            unopened.setdefault(m.config.data.data_dir, f"{run.name}: {err}")
        except HeptstudyError as err:
            short.append(f"run {i + 1} ({run.name}): {err}")
    if short:
        raise StudyError(
            f"study matrix {matrix.path}: {len(short)} run(s) need more events than their data "
            "set holds, so they can only fail:\n  " + "\n  ".join(short)
        )
    return [
        f"the events of the runs on {folder} were not counted ({said}); study run counts them "
        "before it measures"
        for folder, said in unopened.items()
    ]
