"""Where relative paths of a configuration point: the repository, wherever a command starts.

``data.data_dir: data/tfds`` in a YAML file, a default or a ``--set`` override means the
repository's ``data/tfds`` whether the command runs in the repository root, in ``notebooks/``
or in ``/tmp``. The repository is the folder holding this package and its ``pyproject.toml``
(an editable install, as ``make install`` makes); a copy installed elsewhere has no repository,
and its relative paths are taken from the current directory.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def _find_repository() -> Path | None:
    root = Path(__file__).resolve().parents[1]
    return root if (root / "pyproject.toml").is_file() and (root / "heptstudy").is_dir() else None


#: The repository holding this package, or None for a non-editable install.
REPO_ROOT: Path | None = _find_repository()


def base_dir() -> Path:
    """The folder relative configuration paths are resolved against."""
    return REPO_ROOT if REPO_ROOT is not None else Path.cwd()


def resolve_in_repo(path: str | os.PathLike) -> Path:
    """``path`` made absolute: ``~`` expanded, a relative path taken from :func:`base_dir`."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else base_dir() / p


#: The repository's training configurations (beside this package, editable install or not).
TRAINING_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "training"
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


def git(*args: str, cwd: str | os.PathLike | None = None, timeout: float = 20) -> str | None:
    """The output of ``git ARGS`` in ``cwd`` (default: the folder of this package); None where
    git is missing or fails (no checkout)."""
    where = Path(cwd) if cwd is not None else Path(__file__).resolve().parent
    try:
        res = subprocess.run(
            ["git", *args], cwd=where, capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout if res.returncode == 0 else None
