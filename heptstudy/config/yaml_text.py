"""YAML as users write it: their files, their ``--set KEY=VALUE`` values, values shown back."""

from __future__ import annotations

import json
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


#: What PyYAML's safe constructors raise, besides YAMLError, for a value that parses but cannot
#: be built (a date 2001-13-01, ``!!float abc``, ``!!bool maybe``, lists nested thousands deep).
_UNBUILDABLE = (ValueError, AttributeError, KeyError, RecursionError)


def _yaml_problem(err: Exception) -> str:
    """The parser's words for text it could not read as YAML, never its snippet of the text."""
    if isinstance(err, yaml.YAMLError):
        return getattr(err, "problem", None) or "unreadable"
    if isinstance(err, RecursionError):
        return "lists or mappings nested too deep"
    return "a date or !!tagged value that cannot be built"


def read_yaml(path: str | Path, what: str) -> dict[str, Any]:
    """The mapping of a user's YAML file; every problem a :class:`ConfigError` naming the file."""
    if not str(path).strip():  # Path('') is '.', which would be called a folder
        raise ConfigError(
            f"{what} file {str(path)!r} is an empty path; give the path of a YAML file"
        )
    p = Path(path)
    if not p.is_file():
        # /dev/null would read as an empty file; /dev/zero or a named pipe would never end
        problem = "is not a regular file (a device, a pipe or a socket)"
        problem = "is a folder" if p.is_dir() else problem if p.exists() else "does not exist"
        raise ConfigError(f"{what} file {str(p)!r} {problem}; give the path of a YAML file")
    problem = None
    try:
        data = yaml.safe_load(p.read_text())
    except UnicodeDecodeError:
        problem = "is not text (not UTF-8)"
    except OSError as err:
        problem = f"cannot be read ({err.strerror or err})"
    except (yaml.YAMLError, *_UNBUILDABLE) as err:
        # position and the parser's words only: its snippet is the content of any file at all
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = f"is not valid YAML{where} ({_yaml_problem(err)})"
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
            f"{what} file {str(p)!r} must hold a mapping of KEY: VALUE lines, found "
            f"{type(data).__name__}; write its settings as KEY: VALUE, one per line"
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
    """``KEY=VALUE`` strings (``--set``, a request's overrides) as nested mappings; each VALUE
    read by OmegaConf's loader: PyYAML's safe one (no Python objects), refusing recursive
    aliases and alias bombs too, and reading 1e3 as a number."""
    items = list(overrides)
    for item in items:
        if "=" not in item or item.startswith("="):
            raise ConfigError(
                f"override {item!r} is not of the form KEY=VALUE "
                "(for example model.heptv2.activation_checkpointing=true)"
            )
    conf = OmegaConf.create()
    try:
        for item in items:  # one by one: a value YAML cannot read is named with its KEY
            conf.merge_with_dotlist([item])
        return OmegaConf.to_container(conf, resolve=True)  # type: ignore[return-value]
    except OmegaConfBaseException as err:
        raise ConfigError(f"could not parse overrides {items}: {err}") from None
    except (yaml.YAMLError, *_UNBUILDABLE) as err:
        key, _, value = item.partition("=")
        short = len(value) <= 60  # a long value shown whole would bury the rest of the message
        raise ConfigError(
            f"override {key}: its value {(value if short else value[:57] + '...')!r} is not YAML "
            f"that can be read ({_yaml_problem(err)}); a value is a number, true/false, null, a "
            "word or a [list] of them, without !!tags or *aliases; to give it as text, quote it: "
            f"--set '{key}={json.dumps(value if short else 'TEXT')}'"
        ) from None
