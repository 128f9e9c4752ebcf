"""An earlier commit's package, importable next to today's: a copy of its ``heptstudy`` folder
under another package name, with its import statements pointing at that name (nothing else
in it changes). Two versions of one package cannot share a process otherwise."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

_IMPORT = re.compile(r"^(\s*)(from|import)(\s+)heptstudy(?=[\s.])", re.M)


def renamed_copy(checkout: Path, dest: Path, package: str) -> Path:
    """Copy ``checkout``'s ``heptstudy`` package to ``dest/package`` (and its ``configs`` to
    ``dest/configs``, where repository-relative lookups find them); returns ``dest``."""
    if not package.isidentifier():
        raise ValueError(f"package name {package!r} is not a Python identifier")
    target = dest / package
    shutil.copytree(checkout / "heptstudy", target)
    if (checkout / "configs").is_dir():
        shutil.copytree(checkout / "configs", dest / "configs")
    for path in target.rglob("*.py"):
        text = path.read_text()
        renamed = _IMPORT.sub(lambda m: f"{m[1]}{m[2]}{m[3]}{package}", text)
        if renamed != text:
            path.write_text(renamed)
    return dest
