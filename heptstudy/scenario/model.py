"""Scenario files (the science) and platform profiles (hardware, runtime), by name or path."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heptstudy.config import PlatformConfig, load_platform, read_yaml
from heptstudy.errors import ConfigError
from heptstudy.names import check_name
from heptstudy.paths import PLATFORM_DIR, SCENARIO_DIR
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
    """A path as given, else for a bare name ``directory/NAME`` or ``directory/NAME.yaml``."""
    p = Path(name_or_path)
    bare = p.parent == Path(".")
    candidates = (p, directory / p.name, directory / f"{p.name}.yaml") if bare else (p,)
    if (path := next((c for c in candidates if c.is_file()), None)) is None:
        known = sorted(p.stem for p in directory.glob("*.yaml"))
        raise ScenarioError(
            rule,
            f"{what} {str(name_or_path)!r} is neither a file nor a name in {directory}; "
            f"known: {known}",
        )
    return path


def load_scenario(name_or_path: str | Path) -> Scenario:
    path = _find_or_refuse(name_or_path, SCENARIO_DIR, "scenario-exists", "scenario")
    where = f"scenario {str(path)!r}"
    # every problem below is the scenario-exists rule's
    try:
        data = read_yaml(path, "scenario")
        unknown = sorted(set(data) - _SCENARIO_KEYS)
        missing = sorted({"name", "shared", "variants"} - set(data))
        if unknown or missing:
            raise ConfigError(
                f"{where}: unknown top-level keys {unknown}, missing keys {missing}; a scenario "
                f"holds exactly {sorted(_SCENARIO_KEYS)} (model/data/train go under 'shared' or "
                "a variant)"
            )
        variants = data["variants"]
        if not isinstance(variants, Mapping) or not variants:
            raise ConfigError(
                f"{where}: 'variants' must be a non-empty mapping of name -> partial "
                f"configuration, got {variants!r}"
            )
        shared = data.get("shared") or {}
        parts = [("shared", shared)] + [(f"variants.{k}", v) for k, v in variants.items()]
        for key, part in parts:
            if part is not None and not isinstance(part, Mapping):
                raise ConfigError(
                    f"{where}: {key} must be a mapping (a partial configuration with "
                    f"model/data/train sections), got {part!r}"
                )
        split = data.get("test_split_events") or {}
        if not isinstance(split, Mapping) or not all(
            isinstance(v, int) and v >= 0 for v in split.values()
        ):
            raise ConfigError(
                f"{where}: test_split_events must map a data set (NAME or NAME:VERSION) to a "
                f"non-negative event count, got {split!r}"
            )
        check_name(data["name"], f"{where}: name", example="hepv2_h100")
        for k in variants:
            check_name(k, f"{where}: variant", example="checkpointed")
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
