"""YAML as users write it: their files, their ``--set KEY=VALUE`` values, values shown back."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from heptstudy.errors import ConfigError


def as_yaml(value: Any) -> str:
    """``value`` as a user writes it in YAML or ``--set`` (true, not True)."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def read_yaml(path: str | Path, what: str) -> dict[str, Any]:
    """The mapping of a user's YAML file; every problem a :class:`ConfigError` naming the file."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{what} file {str(p)!r} is a folder; give the path of a YAML file")
    if not p.is_file():
        raise ConfigError(f"{what} file {str(p)!r} does not exist; give the path of a YAML file")
    problem = None
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as err:
        # position and the parser's words only: its snippet is the content of any file at all
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = f"is not valid YAML{where} ({getattr(err, 'problem', None) or 'unreadable'})"
    except UnicodeDecodeError:
        problem = "is not text (not UTF-8)"
    except OSError as err:
        problem = f"cannot be read ({err.strerror or err})"
    if problem is not None:
        readable = " you can read" if problem.startswith("cannot") else ""
        raise ConfigError(
            f"{what} file {str(p)!r} {problem}; give the path of a {what} YAML file{readable}"
        )
    if (loop := _alias_loop(data)) is not None:
        raise ConfigError(
            f"{what} file {str(p)!r}: {loop or 'the top level'} contains itself through a YAML "
            "alias (*name inside the &name it refers to), a value without end; write the value "
            "out, or point the alias at a section that does not hold it"
        )
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{what} file {str(p)!r} must hold a mapping, found {type(data).__name__}"
        )
    return dict(data)


def _alias_loop(data: Any) -> str | None:
    """The dotted key of a mapping or list that holds itself (PyYAML builds one from a recursive
    alias), else None; each shared value is walked once, so an alias bomb costs no more."""
    done: set[int] = set()
    path: dict[int, str] = {}
    stack: list[tuple[Any, str, bool]] = [(data, "", False)]
    while stack:
        node, where, leaving = stack.pop()
        if leaving:
            del path[id(node)]
            done.add(id(node))
            continue
        if not isinstance(node, (dict, list)) or id(node) in done:
            continue
        if id(node) in path:
            return path[id(node)]
        path[id(node)] = where
        stack.append((node, where, True))
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            stack.append((value, f"{where}.{key}" if where else str(key), False))
    return None


def parse_overrides(overrides: Iterable[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings (``--set``, a request's overrides) as nested mappings."""
    items = list(overrides)
    for item in items:
        if "=" not in item or item.startswith("="):
            raise ConfigError(
                f"override {item!r} is not of the form KEY=VALUE "
                "(for example model.heptv2.activation_checkpointing=true)"
            )
    try:
        return OmegaConf.to_container(OmegaConf.from_dotlist(items), resolve=True)  # type: ignore[return-value]
    except OmegaConfBaseException as err:
        raise ConfigError(f"could not parse overrides {items}: {err}") from None
