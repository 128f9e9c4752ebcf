"""Where a study's time went, from the Papermill start and end times its notebooks record: the
minutes from the first run's start to the last run's end, and the minutes of each kind of run
(fresh processes measuring memory and time, or time only, or memory only; paired timings; the
parity; the aggregate, which can be run again later).

    .venv/bin/python experiments/study_paired_epyc/durations.py experiments/cpu_reference \
        experiments/study_paired_epyc
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path


def _papermill(path: Path) -> dict:
    return json.loads(path.read_text())["metadata"]["papermill"]


def _kind(path: Path, parameters: dict) -> str:
    if "paired" in path.parent.name:
        return "paired timing, one process"
    if "parity" in path.name:
        return "parity"
    passes = parameters.get("passes", "both" if path.parent.name != "repeats" else "timing")
    return {
        "both": "fresh process: memory and time",
        "timing": "fresh process: time only",
        "memory": "fresh process: memory only",
    }[passes]


def durations(folder: Path) -> tuple[float, dict[str, list[float]]]:
    """(minutes from the first run's start to the last run's end, seconds of each run by kind)."""
    notebooks = sorted((folder / "notebooks").rglob("*.ipynb"))
    runs: dict[str, list[float]] = {}
    for path in notebooks:
        meta = _papermill(path)
        runs.setdefault(_kind(path, meta["parameters"]), []).append(meta["duration"])
    runs["aggregate"] = [_papermill(folder / "aggregate.ipynb")["duration"]]
    first = min(datetime.fromisoformat(_papermill(p)["start_time"]) for p in notebooks)
    last = max(datetime.fromisoformat(_papermill(p)["end_time"]) for p in notebooks)
    return (last - first).total_seconds() / 60, runs


def main(folders: list[str]) -> None:
    for folder in map(Path, folders):
        minutes, runs = durations(folder)
        print(f"{folder}: {minutes:.1f} minutes from the first run's start to the last run's end")
        for kind, seconds in sorted(runs.items(), key=lambda kv: -sum(kv[1])):
            print(f"  {kind:32s} {len(seconds):3d} runs  {sum(seconds) / 60:6.1f} min")


if __name__ == "__main__":
    main(sys.argv[1:] or ["experiments/cpu_reference"])
