"""What the study modules share: the notebooks, the errors, the paths."""

from __future__ import annotations

import os
from pathlib import Path

from heptstudy.errors import HeptstudyError
from heptstudy.measure.request import MEMORY, PAIRED, PARITY
from heptstudy.paths import ROOT

NOTEBOOKS = {MEMORY: "memory.ipynb", PARITY: "parity.ipynb", PAIRED: "paired.ipynb"}


class StudyError(HeptstudyError):
    """A study matrix, experiments directory or rendering step is unusable."""


def at_project_root() -> Path:
    """Move to the project root (JupyterLab starts kernels in ``notebooks/``), so relative paths
    mean what they do on the command line."""
    cwd = Path.cwd().resolve()
    if cwd == ROOT / "notebooks":
        os.chdir(ROOT)
    return Path.cwd()
