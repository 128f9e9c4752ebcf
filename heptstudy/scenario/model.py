"""Scenario files (the science) and platform profiles (hardware, runtime), by name or path."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heptstudy.config import PlatformConfig, load_platform, read_yaml
from heptstudy.errors import ConfigError
from heptstudy.names import check_name
from heptstudy.paths import PLATFORM_DIR, SCENARIO_DIR, find_file
from heptstudy.scenario.rules import ScenarioError

_SCENARIO_KEYS = {"name", "description", "shared", "variants", "test_split_events"}


@dataclass
class Scenario:
    name: str
    description: str
    shared: dict[str, Any]
    variants: dict[str, dict[str, Any]]
    test_split_events: dict[str, int]
    path: Path


def _find_or_refuse(name_or_path: str | Path, directory: Path, rule: str, what: str) -> Path:
    if (path := find_file(name_or_path, directory)) is None:
        known = sorted(p.stem for p in directory.glob("*.yaml"))
        raise ScenarioError(
            rule,
            f"{what} {str(name_or_path)!r} is neither a file nor a name in {directory}; "
            f"known: {known}",
        )
    return path


def load_scenario(name_or_path: str | Path) -> Scenario:
    path = _find_or_refuse(name_or_path, SCENARIO_DIR, "scenario-exists", "scenario")

    def refused(problem: str) -> ScenarioError:
        return ScenarioError("scenario-exists", f"scenario {str(path)!r}: {problem}")

    try:
        data = read_yaml(path, "scenario")
    except ConfigError as err:
        raise ScenarioError("scenario-exists", str(err)) from None
    unknown = sorted(set(data) - _SCENARIO_KEYS)
    missing = sorted({"name", "shared", "variants"} - set(data))
    if unknown or missing:
        raise refused(
            f"unknown top-level keys {unknown}, missing keys {missing}; a scenario holds exactly "
            f"{sorted(_SCENARIO_KEYS)} (model/data/train go under 'shared' or a variant)"
        )
    variants = data["variants"]
    if not isinstance(variants, Mapping) or not variants:
        raise refused(
            "'variants' must be a non-empty mapping of name -> partial configuration, got "
            f"{variants!r}"
        )
    shared = data.get("shared") or {}
    for where, part in [("shared", shared)] + [(f"variants.{k}", v) for k, v in variants.items()]:
        if part is not None and not isinstance(part, Mapping):
            raise refused(
                f"{where} must be a mapping (a partial configuration with model/data/train "
                f"sections), got {part!r}"
            )
    split = data.get("test_split_events") or {}
    if not isinstance(split, Mapping) or not all(
        isinstance(v, int) and v >= 0 for v in split.values()
    ):
        raise refused(
            "test_split_events must map a data set (NAME or NAME:VERSION) to a non-negative "
            f"event count, got {split!r}"
        )
    try:
        check_name(data["name"], f"scenario {str(path)!r}: name", example="hepv2_h100")
        for k in variants:
            check_name(k, f"scenario {str(path)!r}: variant", example="checkpointed")
    except ConfigError as err:
        raise ScenarioError("scenario-exists", str(err)) from None
    return Scenario(
        name=str(data["name"]),
        description=str(data.get("description", "")).strip(),
        shared=dict(shared),
        variants={str(k): dict(v or {}) for k, v in variants.items()},
        test_split_events={str(k): int(v) for k, v in split.items()},
        path=path,
    )


def find_platform(name_or_path: str | Path) -> tuple[PlatformConfig, Path]:
    path = _find_or_refuse(name_or_path, PLATFORM_DIR, "platform-exists", "platform profile")
    try:
        return load_platform(path), path
    except ConfigError as err:
        raise ScenarioError("platform-exists", str(err)) from None
