"""Committed results are written only by the commands meant to regenerate them.

The reference studies and their figures (``experiments/<name>``, ``figures/<name>``) are in
git; ``make reference`` (``heptstudy study run --reference NAME``) regenerates them. Every other
writer (``study run --out``, ``study aggregate --out/--figures``, ``data stats --out``,
``bench --output``, ``bench backbone --output``, ``fit --save-model``) asks :func:`refuse_committed`
before writing, so that no other command can replace a committed file.
"""

from __future__ import annotations

import os
from pathlib import Path

from heptstudy.errors import HeptstudyError
from heptstudy.paths import git

#: The checkout of this package (experiments/, figures/ live there).
ROOT = Path(__file__).resolve().parents[1]
#: Folders of a user's own results: never committed (see .gitignore).
LOCAL_FOLDERS = ("local", "scratch", "train")


class CommittedFolder(HeptstudyError):
    """A command other than ``--reference`` was asked to write into committed results."""


def _tracked(folder: Path) -> bool | None:
    """Whether git tracks a file under ``folder``; None without git or outside a checkout."""
    out = git("ls-files", "--", str(folder), cwd=ROOT)
    return None if out is None else bool(out.strip())


def _ignored(path: Path) -> bool:
    """Whether git ignores ``path`` (a study's .pending/ and superseded/, experiments/local/):
    nothing written there can change a committed file."""
    return git("check-ignore", "-q", "--", str(path), cwd=ROOT) is not None


def committed_name(path: str | os.PathLike) -> str | None:
    """The reference-study name when ``path`` is (inside) a committed results folder: one of
    ``experiments/<name>`` or ``figures/<name>`` holding files tracked by git (without git,
    every such folder other than the local ones), unless git ignores ``path`` itself;
    ``experiments`` or ``figures`` for the top folders themselves; else None."""
    root = ROOT.resolve()
    path = Path(path).expanduser().resolve()
    for top in ("experiments", "figures"):
        try:
            rel = path.relative_to(root / top)
        except ValueError:
            continue
        if not rel.parts:
            return top
        if rel.parts[0] in LOCAL_FOLDERS:
            return None
        tracked = _tracked(root / top / rel.parts[0])
        if tracked is False or (tracked and _ignored(path)):
            return None
        return rel.parts[0]
    return None


def refuse_committed(path: str | os.PathLike, flag: str, instead: str) -> None:
    """Raise :class:`CommittedFolder` when ``path`` (the value of option ``flag``) lies in a
    committed results folder; ``instead`` says where the user's own results can go."""
    name = committed_name(path)
    if name is None:
        return
    shown = Path(path).expanduser().resolve()
    try:
        shown = shown.relative_to(ROOT.resolve())
    except ValueError:
        pass
    regenerate = (
        f"`heptstudy study run --reference {name} ...` (make reference)"
        if name not in ("experiments", "figures")
        else "`make reference`"
    )
    raise CommittedFolder(
        f"{flag} {shown} is a committed reference folder ({name}): only {regenerate} writes "
        f"there, so nothing was written. {instead}"
    )
