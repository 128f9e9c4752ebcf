"""A study's paired timings (``notebook: paired`` runs, ``paired/*.json`` in its folder) as rows of
the overhead frame: a plan timed there takes its overhead from its paired rounds rather than from
rounds of fresh processes."""

from __future__ import annotations

import statistics
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from heptstudy.errors import HeptstudyError
from heptstudy.measure.paired import PAIRED_DIR, REFERENCE, complete, read_paired
from heptstudy.model.checkpoint_plan import plan_named

PAIRED_TIMING = "paired, one process"
FRESH_PROCESSES = "fresh processes"


def load_paired(experiments_dir: str | Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every paired-timing report of a study folder; a file that is none (the report the runner
    wrote for a failed run) is skipped with a warning saying why."""
    found = []
    for path in sorted((Path(experiments_dir) / PAIRED_DIR).glob("*.json")):
        try:
            found.append((path, read_paired(path)))
        except HeptstudyError as err:
            warnings.warn(f"skipped {path.name}: {err}", stacklevel=2)
    return found


def _of_batching(reports, packed: bool) -> Iterator[tuple[dict[str, Any], Callable[[str], str]]]:
    """The paired timings of padded (or packed) batches, each with its plans' labels: labelled as
    the memory reports label their plans, so that the two meet."""
    for _, report in reports:
        if (report.get("batching") == "packed") == packed:
            layers = report.get("config", {}).get("model", {}).get("heptv2", {}).get("num_convs")
            yield report, lambda name, layers=layers: plan_named(name, layers).label


def paired_rows(reports, packed: bool) -> list[dict[str, Any]]:
    """Overhead-frame rows (``heptstudy.study.frames.OVERHEAD_COLUMNS``) of the paired timings
    of padded (or packed) batches, one per plan."""
    rows = []
    for report, label in _of_batching(reports, packed):
        steps = report.get("steps", [])
        off = [s["time_s"] for s in steps if s["plan"] == REFERENCE]
        done, asked = report.get("rounds"), report.get("rounds_asked")
        flag = "" if complete(report) else f"{done} of {asked} rounds (interrupted)"
        for name, over in report.get("overhead", {}).items():
            per_round = [100 * v for v in over["per_round"]]
            on = [s["time_s"] for s in steps if s["plan"] == name]
            rows.append(
                {
                    "allocator_line": "platform",
                    "batch_size": int(report["batch_size"]),
                    "policy": label(name),
                    "rounds": len(per_round),
                    "off_step_s": statistics.median(off) if off else None,
                    "on_step_s": statistics.median(on) if on else None,
                    "overhead_median_pct": statistics.median(per_round),
                    "overhead_min_pct": min(per_round),
                    "overhead_max_pct": max(per_round),
                    "off_sys_pct": None,
                    "on_sys_pct": None,
                    "flag": flag,
                    "allocator": None,
                    "timing": PAIRED_TIMING,
                }
            )
    return rows


def paired_round_steps(
    reports, packed: bool
) -> dict[tuple[int, str], dict[int, tuple[Any, float]]]:
    """The median step of each plan (``off`` too) in each round of the paired timings of padded
    (or packed) batches: ``{(batch size, plan label): {round: (batch, seconds)}}``; a round's
    batch is named so that padded and packed rounds meet only on the same events."""
    found: dict[tuple[int, str], dict[int, tuple[Any, float]]] = {}
    for report, label in _of_batching(reports, packed):
        by: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for step in report.get("steps", []):
            by.setdefault((step["plan"], step["round"]), []).append(step)
        for (name, k), steps in by.items():
            seconds = statistics.median(s["time_s"] for s in steps)
            found.setdefault((int(report["batch_size"]), label(name)), {})[k] = (
                steps[0]["batch"],
                seconds,
            )
    return found
