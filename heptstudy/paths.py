"""Where relative paths point: outputs (``train.out_dir``, ``--output``, ...) from the working
directory, as in any shell command; input data (``data.data_dir`` in a configuration, a scenario
or a matrix) from the repository, so it is found wherever the command starts (a non-editable
install has none: the working directory); a ``--data-dir`` typed on the command line from the
working directory, as the shell reads it."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

from heptstudy.errors import HeptstudyError

#: Where every command writes by default: one folder, ignored by git (.gitignore), relative to
#: the working directory (a study's: to the repository). docs/usage.md "Where outputs go".
OUTPUT_ROOT = Path("experiments/local")

#: The repository for an editable install, the site-packages folder for another.
ROOT = Path(__file__).resolve().parents[1]
REPO_ROOT: Path | None = ROOT if (ROOT / "pyproject.toml").is_file() else None


def base_dir() -> Path:
    """The folder relative configuration paths are resolved against."""
    return REPO_ROOT if REPO_ROOT is not None else Path.cwd()


def resolve_in_repo(path: str | os.PathLike) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else base_dir() / p


def resolve_from_cwd(path: str | os.PathLike) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path.cwd() / p


class SymlinkLoop(HeptstudyError):
    """A path given by the user runs into a loop of symbolic links."""


def real_path(path: str | os.PathLike, what: str = "path") -> Path:
    """``path`` made absolute, links followed; a link loop is refused naming ``what``."""
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


SCENARIO_DIR = ROOT / "configs" / "training" / "scenarios"
PLATFORM_DIR = ROOT / "configs" / "training" / "platforms"


def git_bytes(*args: str, cwd: str | os.PathLike | None = None) -> bytes | None:
    """The output of ``git ARGS``; None where git is missing or fails."""
    try:
        res = subprocess.run(["git", *args], cwd=cwd or ROOT, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout if res.returncode == 0 else None


def git(*args: str, cwd: str | os.PathLike | None = None) -> str | None:
    out = git_bytes(*args, cwd=cwd)
    return None if out is None else out.decode(errors="replace")
