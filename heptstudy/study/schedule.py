"""The order a study measures in: rounds of fresh processes, so that compared runs see the same
host conditions.

Round 1 runs every run of the matrix once, as its notebook measures it (memory and time). A run
with ``repeats: N`` (default: the matrix's ``repeats``, else 1) runs again in rounds 2..N,
timing only (its memory figures do not change from one process to the next). Inside a round the
runs keep the matrix's order, so the runs compared with one another (off and on at one batch
size, each policy and off) follow each other; the rounds repeat that, and the report gives the
median and range over the rounds of each comparison instead of a single pair of means.

A run with ``allocator: default`` is measured with the allocator as it comes (the platform's
allocator settings removed): the line an unconfigured CPU training would see. Its reports go to
``default_allocator/``; those of rounds 2..N to ``repeats/`` (``NAME.rN.json``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heptstudy.study.common import MEMORY

PLATFORM, DEFAULT = "platform", "default"
#: The folder of the runs measured with the default allocator, and of rounds 2..N.
DEFAULT_ALLOCATOR_DIR = "default_allocator"
REPEATS_DIR = "repeats"
_ROUND = re.compile(r"^(?P<name>.+)\.r(?P<round>\d+)$")


@dataclass(frozen=True)
class Execution:
    """One fresh process of a study: a run of the matrix in one round."""

    run: Any  # heptstudy.study.matrix.Run
    round: int

    @property
    def name(self) -> str:
        return self.run.name

    @property
    def allocator(self) -> str:
        return self.run.allocator

    @property
    def report(self) -> Path:
        """The report's path inside the study folder."""
        folder = Path(DEFAULT_ALLOCATOR_DIR) if self.allocator == DEFAULT else Path()
        if self.round == 1:
            return folder / f"{self.name}.json"
        return folder / REPEATS_DIR / f"{self.name}.r{self.round}.json"

    @property
    def notebook(self) -> Path:
        """The executed notebook's path inside the study folder."""
        return Path("notebooks") / self.report.with_suffix(".ipynb")

    @property
    def parameters(self) -> dict[str, Any]:
        """The notebook parameters: the run's, timing only in rounds after the first."""
        params = dict(self.run.parameters)
        if self.round > 1 and self.run.notebook == MEMORY:
            params["passes"] = "timing"
        return params

    @property
    def label(self) -> str:
        extra = [f"round {self.round}"] if self.round > 1 else []
        extra += ["default allocator"] if self.allocator == DEFAULT else []
        return f"{self.name} ({', '.join(extra)})" if extra else self.name


def schedule(runs) -> list[Execution]:
    """Round 1: every run in the matrix's order; round r: the runs repeated at least r times."""
    rounds = max((r.repeats for r in runs), default=1)
    return [Execution(run, k) for k in range(1, rounds + 1) for run in runs if run.repeats >= k]


def locate(relpath: Path) -> tuple[str, str, int]:
    """(allocator line, run name, round) of a report's path inside a study folder."""
    allocator = DEFAULT if DEFAULT_ALLOCATOR_DIR in relpath.parts[:-1] else PLATFORM
    m = _ROUND.match(relpath.stem)
    if m and REPEATS_DIR in relpath.parts[:-1]:
        return allocator, m["name"], int(m["round"])
    return allocator, relpath.stem, 1


def report_files(out: Path) -> list[Path]:
    """Every report of a study folder: round 1, the repeats, the default-allocator runs."""
    found = []
    for folder in (Path(), Path(DEFAULT_ALLOCATOR_DIR)):
        found += sorted((out / folder).glob("*.json"))
        found += sorted((out / folder / REPEATS_DIR).glob("*.json"))
    return found
