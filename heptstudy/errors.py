"""Errors caused by the user's input or environment, which the CLI prints as one message;
anything else is a bug and keeps its traceback."""

from __future__ import annotations

import difflib
import errno
from collections.abc import Callable, Sequence
from typing import Any


class HeptstudyError(Exception):
    """Base class of user-facing errors."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, saying what was kept and how to go on; a ``KeyboardInterrupt``: never swallowed."""


class ConfigError(HeptstudyError, ValueError):
    """A configuration, platform profile or scenario could not be loaded or did not validate."""


class DataError(HeptstudyError):
    """A data set is missing, malformed or holds values the study cannot use."""


_FULL = "Free space (or raise the quota)"
_DENIED = "You may not write there: fix the folder's permissions or choose another folder"
#: What to do after the file system refused, following what it said.
_ADVICE = {
    errno.ENOSPC: _FULL,
    errno.EDQUOT: _FULL,
    errno.EFBIG: "Raise the file size limit (ulimit -f) or free space",
    errno.EROFS: "The file system is read-only: choose a folder on a writable one",
    errno.EACCES: _DENIED,
    errno.EPERM: _DENIED,
    errno.EISDIR: "A folder stands where a file is to be written: move it away or choose another path",
    errno.ENOTDIR: "A file stands where a folder is needed: move it away or choose another path",
    errno.ELOOP: "The path holds a loop of symbolic links: fix the links or choose another path",
    errno.ENOENT: "A folder on the way does not exist: create it or choose another path",
}


def os_error_advice(err: OSError) -> str:
    return _ADVICE.get(err.errno) or f"Fix what the system reports ({err.strerror or err})"


def _unknown_key_hint(key: str, known: Sequence[str]) -> str:
    """The nearest known key, never one of ``key``'s own sections (``model`` for ``model.foo``);
    else the keys its section has."""
    candidates = [k for k in known if not key.startswith(k + ".")]
    near = difflib.get_close_matches(key, candidates, n=1)
    if near:
        return f"; did you mean {near[0]!r}?"
    section = key.rpartition(".")[0]
    siblings = [k.rpartition(".")[2] for k in known if k.rpartition(".")[0] == section and section]
    return f"; {section} has {', '.join(siblings)}" if siblings else ""


def describe_invalid(
    err: Any,
    *,
    noun: str,
    known: Sequence[str] = (),
    header: str = "",
    footer: str = "",
    show: Callable[[Any], str] = repr,
    list_known: bool = False,
    spell: Callable[[str, str], str] | None = None,
) -> str:
    """A pydantic ``ValidationError``, a line per error naming ``noun key=value`` (or as
    ``spell(key, value)`` writes it: an option, say); an unknown key gets the nearest ``known``."""
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        value = show(e.get("input"))
        given = spell(key, value) if spell else f"{noun} {key}={value}"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            hint = _unknown_key_hint(key, known)
            also = f" (known: {', '.join(known)})" if list_known else ""
            lines.append(f"unknown {noun} {key}={value}{hint}{also}")
        elif e["type"] == "missing":
            lines.append(f"{noun} {key} is missing")
        elif not key or msg.startswith((key.split(".")[-1] + "=", key + ".")):  # names them itself
            lines.append(msg)
        elif e.get("input", "") is None:  # YAML reads `key:` and `--set key=` as null
            lines.append(
                f"{given} is not allowed: {msg}; give {key} a value (an empty one reads as null)"
            )
        else:
            lines.append(f"{given} is not allowed: {msg}")
    if header:
        lines = [header, *(f"  {line}" for line in lines)]
    return "\n".join([*lines, footer] if footer else lines)
