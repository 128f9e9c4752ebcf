"""What the study modules share: the two notebooks, the allowed values, the errors, the paths."""

from __future__ import annotations

import os
from pathlib import Path

from heptstudy.errors import HeptstudyError

#: Memory measurements of a matrix run ``memory.ipynb``; parity runs ``parity.ipynb``.
MEMORY, PARITY = "memory", "parity"
NOTEBOOKS = {MEMORY: "memory.ipynb", PARITY: "parity.ipynb"}
VARIANTS = ("hit_heptv2_grouped_tracker_features", "track_cluster_mlpf")
DTYPES = ("float32", "bfloat16")
#: Steps and warm-up when a notebook leaves them at ``None``: the GPU protocol of the original
#: measurements, and fewer on CPU where one full-size step takes tens of seconds.
AUTO_STEPS = {"gpu": (5, 2), "cpu": (2, 1)}


class NotebookParameterError(HeptstudyError, ValueError):
    """A notebook (or matrix) parameter has a value the study cannot use."""


class StudyError(HeptstudyError):
    """A study matrix, experiments directory or rendering step is unusable."""


def project_root() -> Path:
    """The checkout holding this package (``configs/`` and ``notebooks/`` live there)."""
    return Path(__file__).resolve().parents[2]


def notebooks_dir() -> Path:
    return project_root() / "notebooks"


def at_project_root() -> Path:
    """In JupyterLab the kernel starts in ``notebooks/``; move to the project root so that the
    relative paths of the study (``data/tfds``, ``experiments/``, ``figures/``) mean the same as
    on the command line. Anywhere else the working directory is left alone."""
    cwd = Path.cwd().resolve()
    root = project_root()
    if cwd == root / "notebooks":
        os.chdir(root)
    return Path.cwd()
