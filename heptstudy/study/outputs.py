"""Where a study writes; a replaced result is moved to ``superseded/<time>/`` once its
replacement exists, so nothing is deleted or lost."""

from __future__ import annotations

import os
import re
import shutil
import socket
from dataclasses import astuple, dataclass
from datetime import datetime, timezone
from pathlib import Path

from heptstudy.atomic import Output, check_outputs, folder_write_problem
from heptstudy.committed import LOCAL_FOLDERS, RESULT_TOPS, committed_place, refuse_committed
from heptstudy.names import is_name
from heptstudy.paths import ROOT, SymlinkLoop, real_path
from heptstudy.study.common import StudyError
from heptstudy.study.frames import require_study

SUPERSEDED = "superseded"
PENDING = ".pending"

#: What the aggregate writes into a study folder in place of what is there (every other result
#: of a run is moved to superseded/ instead), recognised by what each has always held: the page
#: is titled by the executed notebook's name, the notebook's first cell holds the parameter the
#: runner gives it, every table has a batch_size column (aggregate.ipynb writes these four).
REPORT_PAGE = Output("heptstudy study report page", ".html", b"<title>aggregate</title>")
AGGREGATE_NOTEBOOK = Output("heptstudy aggregate notebook", ".ipynb", b'experiments_dir = \\"')
STUDY_TABLE = Output("heptstudy study table", ".csv", b"batch_size")
TABLES = ("comparison.csv", "packing.csv", "overhead.csv", "front.csv")


@dataclass(frozen=True)
class StudyFolders:
    out: Path  # the reports, executed notebooks, report.html
    figures: Path


def shown(path: str | os.PathLike | None) -> str | None:
    """Relative to the repository when inside it: no absolute path of this machine in a report."""
    if path is None:
        return None
    p = Path(path)
    try:
        return str(real_path(ROOT / p).relative_to(ROOT.resolve()))
    except (ValueError, OSError, SymlinkLoop):
        return str(p)


def default_study_dir() -> Path:
    """``experiments/local/<host>-<YYYYMMDD>`` in the repository."""
    host = re.sub(r"[^A-Za-z0-9_.-]+", "-", socket.gethostname()) or "host"
    day = datetime.now(timezone.utc).strftime("%Y%m%d")
    return ROOT / "experiments" / "local" / f"{host}-{day}"


def default_figures(out: Path) -> Path:
    """``figures/<name>`` for a committed reference study, else the folder's own ``figures/``."""
    place = committed_place(out)
    if place is not None and place.reference and place.name not in RESULT_TOPS:
        return place.repository / "figures" / place.name
    return out / "figures"


def study_folders(
    out: str | os.PathLike | None, figures: str | os.PathLike | None, reference: str | None
) -> StudyFolders:
    """A reference study by name, else ``--out``; a committed folder needs ``reference``."""
    if reference is not None:
        if not is_name(reference) or reference in LOCAL_FOLDERS:
            raise StudyError(
                f"--reference {reference!r} is not a reference study name: use letters, digits, "
                "'_', '-' or '.', e.g. --reference cpu_reference (not 'local')"
            )
        if out is not None or figures is not None:
            raise StudyError(
                f"--reference {reference} writes experiments/{reference} and figures/{reference}; "
                "leave out --out and --figures"
            )
        return StudyFolders(ROOT / "experiments" / reference, ROOT / "figures" / reference)
    out_dir = real_path(out, "--out") if out is not None else default_study_dir()
    fig_dir = real_path(figures, "--figures") if figures is not None else out_dir / "figures"
    _refuse_committed(out_dir, fig_dir)
    return StudyFolders(out_dir, fig_dir)


def _refuse_committed(out_dir: Path, fig_dir: Path) -> None:
    for flag, path in (("--out", out_dir), ("--figures", fig_dir)):
        own = (
            f"For your own study leave out {flag} (it goes to {shown(default_study_dir())}) or "
            "choose a folder outside experiments/ and figures/, e.g. experiments/local/NAME"
        )
        refuse_committed(path, flag, own)


def aggregate_folders(
    out: str | os.PathLike | None, figures: str | os.PathLike | None, reference: str | None = None
) -> tuple[Path, Path]:
    """``study aggregate``'s folders: ``--out`` and ``--figures``, both refused when committed, or
    the committed study ``reference`` and the figures folder it holds (figures/NAME, else its
    own figures/)."""
    if reference is not None:
        out_dir, fig_dir = astuple(study_folders(None, figures, reference))
        if not out_dir.is_dir():
            raise StudyError(
                f"--reference {reference}: experiments/{reference} is no committed study; give the "
                "name of a folder of experiments/ a study run wrote, e.g. --reference cpu_reference"
            )
        if not fig_dir.is_dir():
            fig_dir = out_dir / "figures"
        require_study(out_dir)
        return out_dir, fig_dir
    out_dir = real_path(out, "--out")
    if not out_dir.is_dir():
        raise StudyError(
            f"--out {shown(out_dir)} is not a folder of reports; run `heptstudy study run` first"
        )
    fig_dir = real_path(figures, "--figures") if figures is not None else default_figures(out_dir)
    _refuse_committed(out_dir, fig_dir)
    require_study(out_dir)
    return out_dir, fig_dir


def check_writable(*folders: Path) -> None:
    """Create each folder and a file in it (removed again), or stop before anything runs."""
    for folder in folders:
        if (problem := folder_write_problem(folder, create=True)) is not None:
            raise StudyError(
                f"cannot write to {shown(folder)}: {problem}; nothing was measured. Choose a "
                "writable folder (--out / --figures) or fix its permissions"
            )


class Superseded:
    """``superseded/<time>/`` of a study folder, created on the first move; a file outside the
    folder (figures/NAME of a reference study) goes to its ``figures/``."""

    def __init__(self, out: Path):
        self.out = out
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        self.folder = out / SUPERSEDED / stamp
        self.moved: list[Path] = []

    def move_aside(self, path: Path) -> None:
        if path.exists():
            outside = not path.is_relative_to(self.out)
            target = self.folder / (
                Path("figures", path.name) if outside else path.relative_to(self.out)
            )
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(path), str(target))
            self.moved.append(target)


def replace_with_pending(pending: Path, final: Path, superseded: Superseded) -> None:
    """The old result moved aside, then the new one in: one of them is always in place."""
    superseded.move_aside(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(pending, final)


def aggregate_outputs(out: Path) -> list[tuple[Path, Output]]:
    """The files an aggregate replaces in ``out``, each with the kind it may replace."""
    files = [(out / "report.html", REPORT_PAGE), (out / "aggregate.ipynb", AGGREGATE_NOTEBOOK)]
    return files + [(out / name, STUDY_TABLE) for name in TABLES]


def refuse_foreign_outputs(out: Path) -> None:
    """Before anything runs: no file heptstudy did not write is in the way of the aggregate."""
    check_outputs(aggregate_outputs(out), "--out")
