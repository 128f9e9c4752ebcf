"""Where relative paths point.

* Where results are written is taken from the working directory, like every path a shell
  command is given: ``train.out_dir`` (YAML, default or ``--set``), ``--output``, ``--out``,
  ``--figures``, ``--render-dir``, ``--save-model``. ``train.out_dir=runs/a`` and
  ``--output runs/a.json`` started in the same folder write next to each other. (Notebooks run
  in the repository root: :func:`heptstudy.study.at_project_root`.)
* Where input data are read, ``data.data_dir: data/tfds``, means the repository's
  ``data/tfds`` whether the command runs in the repository root, in ``notebooks/`` or in
  ``/tmp``: the data set is found, never made up, wherever the command starts. The repository
  is the folder holding this package and its ``pyproject.toml`` (an editable install, as
  ``make install`` makes); a copy installed elsewhere has no repository, and its relative paths
  are taken from the current directory.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

from heptstudy.errors import HeptstudyError

#: The folder holding this package: the repository for an editable install (``configs/``,
#: ``notebooks/`` beside the package), the site-packages folder for another install.
ROOT = Path(__file__).resolve().parents[1]
#: The repository holding this package, or None for a non-editable install.
REPO_ROOT: Path | None = ROOT if (ROOT / "pyproject.toml").is_file() else None


def base_dir() -> Path:
    """The folder relative configuration paths are resolved against."""
    return REPO_ROOT if REPO_ROOT is not None else Path.cwd()


def resolve_in_repo(path: str | os.PathLike) -> Path:
    """``path`` made absolute: ``~`` expanded, a relative path taken from :func:`base_dir`."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else base_dir() / p


def resolve_from_cwd(path: str | os.PathLike) -> Path:
    """``path`` made absolute: ``~`` expanded, a relative path taken from the working
    directory (where results are written, see the module docstring)."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path.cwd() / p


class SymlinkLoop(HeptstudyError):
    """A path given by the user runs into a loop of symbolic links."""


def real_path(path: str | os.PathLike, what: str = "path") -> Path:
    """``path`` made absolute with its symbolic links followed (:meth:`Path.resolve`, ``~``
    expanded, a relative path taken from the working directory); a loop of symbolic links is
    refused as :class:`SymlinkLoop` naming ``what`` (the option, e.g. ``--out``) and the path."""
    given = Path(path).expanduser()
    try:
        real = given.resolve()
        os.stat(real)  # Python 3.13 resolves a loop without a word
        loop = False
    except RuntimeError:  # pathlib before Python 3.13 reports a loop so, from deep inside
        loop = True
    except OSError as exc:
        loop = exc.errno == errno.ELOOP  # a path yet to be made is fine
    if not loop:
        return real
    raise SymlinkLoop(
        f"{what} {str(path)!r} ({given.absolute()}) is a symbolic-link loop, so it names no "
        "file or folder: fix the links (`ls -l` shows where each points) or choose another path"
    ) from None


#: The repository's training configurations (beside this package, editable install or not).
TRAINING_CONFIGS = ROOT / "configs" / "training"
SCENARIO_DIR = TRAINING_CONFIGS / "scenarios"
PLATFORM_DIR = TRAINING_CONFIGS / "platforms"


def find_file(name_or_path: str | Path, directory: Path) -> Path | None:
    """A path as given, else for a bare name ``directory/NAME`` or ``directory/NAME.yaml``; None if
    none exists."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    if p.parent == Path("."):
        for candidate in (directory / p.name, directory / f"{p.name}.yaml"):
            if candidate.is_file():
                return candidate
    return None


def git_bytes(
    *args: str, cwd: str | os.PathLike | None = None, timeout: float = 60
) -> bytes | None:
    """The output of ``git ARGS`` in ``cwd`` (default: the folder holding this package), byte for
    byte; None where git is missing or fails (no checkout, unknown commit)."""
    try:
        res = subprocess.run(
            ["git", *args], cwd=cwd or ROOT, capture_output=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout if res.returncode == 0 else None


def git(*args: str, cwd: str | os.PathLike | None = None, timeout: float = 60) -> str | None:
    """:func:`git_bytes` as text."""
    out = git_bytes(*args, cwd=cwd, timeout=timeout)
    return None if out is None else out.decode(errors="replace")
