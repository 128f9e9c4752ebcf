"""The order a study measures in: rounds of fresh processes, compared runs one after the other
(same host conditions); rounds 2..N of ``repeats: N`` time only (memory does not vary)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heptstudy.measure.paired import PAIRED_DIR
from heptstudy.study.common import MEMORY, PAIRED

PLATFORM, DEFAULT = "platform", "default"
DEFAULT_ALLOCATOR_DIR = "default_allocator"
REPEATS_DIR = "repeats"
_ROUND = re.compile(r"^(?P<name>.+)\.r(?P<round>\d+)$")


@dataclass(frozen=True)
class Execution:
    run: Any  # heptstudy.study.matrix.Run
    round: int

    @property
    def name(self) -> str:
        return self.run.name

    @property
    def report(self) -> Path:
        folder = Path(DEFAULT_ALLOCATOR_DIR) if self.run.allocator == DEFAULT else Path()
        if self.run.notebook == PAIRED:
            folder /= PAIRED_DIR
        if self.round == 1:
            return folder / f"{self.name}.json"
        return folder / REPEATS_DIR / f"{self.name}.r{self.round}.json"

    @property
    def notebook(self) -> Path:
        return Path("notebooks") / self.report.with_suffix(".ipynb")

    @property
    def parameters(self) -> dict[str, Any]:
        params = dict(self.run.parameters)
        if self.round > 1 and self.run.notebook == MEMORY:
            params["passes"] = "timing"
        return params

    @property
    def label(self) -> str:
        extra = [f"round {self.round}"] if self.round > 1 else []
        extra += ["default allocator"] if self.run.allocator == DEFAULT else []
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


def report_files(out: Path, paired: bool = False) -> list[Path]:
    """The bench reports of a study folder (and its paired timings too, if ``paired``)."""
    found = sorted((out / PAIRED_DIR).glob("*.json")) if paired else []
    for folder in (Path(), Path(DEFAULT_ALLOCATOR_DIR)):
        found += sorted((out / folder).glob("*.json"))
        found += sorted((out / folder / REPEATS_DIR).glob("*.json"))
    return found
