"""One rule for names that become part of a path (an identifier: none can reach another
folder, hide a file or carry shell or markup text), and :func:`inside`, which keeps a path
(symbolic links too) inside its folder."""

from __future__ import annotations

import os
import re
from pathlib import Path

from heptstudy.errors import ConfigError, HeptstudyError
from heptstudy.paths import real_path

NAME_RULE = (
    "letters, digits, '_', '-' and '.' only (at most 100), not starting with '.', "
    "no '/' or other separator, no spaces"
)
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,99}")


class OutsideFolder(HeptstudyError):
    """An output path would land outside the folder it is meant for."""


def is_name(value: object) -> bool:
    return isinstance(value, str) and _NAME.fullmatch(value) is not None


def check_name(value: object, what: str, *, example: str = "baseline_b4") -> str:
    if is_name(value):
        return value  # type: ignore[return-value]
    raise ConfigError(
        f"{what} {value!r} cannot be used: it becomes part of a file name, so it must have "
        f"{NAME_RULE}; rename it, e.g. {example!r}"
    )


def inside(folder: str | os.PathLike, path: str | os.PathLike, what: str) -> Path:
    """``path`` (relative ones taken from ``folder``) when it resolves inside ``folder``."""
    base = Path(folder).expanduser()
    target = Path(path).expanduser()
    if not target.is_absolute():
        target = base / target
    real_base, real_target = real_path(base, what), real_path(target, what)
    if real_target == real_base or not real_target.is_relative_to(real_base):
        raise OutsideFolder(
            f"{what} {str(path)!r} would be written to {str(real_target)!r}, outside its "
            f"folder {str(real_base)!r}; nothing was written. Use a name with {NAME_RULE} "
            "(and no symbolic link leading out of the folder)"
        )
    return target
