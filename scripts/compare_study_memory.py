"""Compare a study's memory figures with a reference study's, run by run, step by step.

    python scripts/compare_study_memory.py STUDY REFERENCE [--table OUT.md]

For every memory report of STUDY with a namesake in REFERENCE: are the events and each counted
step's peak allocated bytes the same (the storage tracker is deterministic, so a change means the
step changed), and how far the peak reserved (the process's resident set) moved; for parity
reports, how many outputs, loss and gradients are equal in each. Exits 1 when the events or a
counted step's allocated peak differ. The warm-up steps enter no figure, and their peaks depend on
what ran before them in the process (a memory-only run measures its warm-up step first, a
memory-and-time run after its timed pass): a difference there is listed, not counted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from heptstudy.atomic import atomic_write_text
from heptstudy.measure.paired import PAIRED_DIR
from heptstudy.measure.report import ReportError, read_report
from heptstudy.units import MIB


def _equal_counts(report) -> str:
    c = report.parity.checkpointed_vs_baseline
    outputs = sum(o.equal for o in c.outputs)
    grads = sum(bool(g.equal) for g in c.gradients)
    return f"outputs {outputs}/{c.num_outputs}, loss {c.loss.equal}, gradients {grads}/{c.num_gradients}"


def compare(study: Path, reference: Path) -> tuple[list[str], int]:
    rows = [
        "| report | events | peak allocated per counted step, bytes | allocated | max reserved, MiB: "
        "reference -> study |",
        "|---|---|---|---|---|",
    ]
    differing = 0
    for path in sorted(study.rglob("*.json")):
        ref_path = reference / path.relative_to(study)
        # paired timings hold step times, no peaks; superseded/ holds earlier runs' reports
        if not ref_path.exists() or path.relative_to(study).parts[0] in (PAIRED_DIR, "superseded"):
            continue
        new, ref = read_report(path), read_report(ref_path)
        name = str(path.relative_to(study))
        if new.kind == "parity":
            rows.append(
                f"| {name} | | parity: {_equal_counts(new)} (reference: {_equal_counts(ref)}) | | |"
            )
            continue
        if new.status != "ok" or new.steps[0].peak_allocated_mib is None:
            continue  # a timing-only run
        same_events = [s.event_indices for s in new.steps] == [s.event_indices for s in ref.steps]
        peaks, ref_peaks = _counted_peaks(new), _counted_peaks(ref)
        same = same_events and peaks == ref_peaks
        differing += not same
        in_bytes = " / ".join(f"{round(p * MIB):,}" for p in peaks)
        warmup = _warmup_change(new, ref)
        reserved = (
            f"{ref.summary.max_peak_reserved_mib:,.1f} -> {new.summary.max_peak_reserved_mib:,.1f}"
        )
        rows.append(
            f"| {name} | {'same' if same_events else 'DIFFERENT'} | {in_bytes} | "
            f"{'identical' if same else 'DIFFERENT'}{warmup} | {reserved} |"
        )
    return rows, differing


def _counted_peaks(report) -> list[float | None]:
    return [s.peak_allocated_mib for s in report.steps if s.counted]


def _warmup_change(new, ref) -> str:
    """A note of the warm-up steps whose peak moved (by how much), or nothing."""
    moved = [
        f"{a.peak_allocated_mib - b.peak_allocated_mib:+.2f} MiB"
        for a, b in zip(new.steps, ref.steps, strict=False)
        if not a.counted and a.peak_allocated_mib != b.peak_allocated_mib
    ]
    return f" (warm-up step {', '.join(moved)}, not a figure)" if moved else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", type=Path)
    parser.add_argument("reference", type=Path)
    parser.add_argument("--table", type=Path, help="also write the table (Markdown) here")
    args = parser.parse_args(argv)
    for name in ("study", "reference"):
        if not getattr(args, name).is_dir():
            parser.error(
                f"{name} {getattr(args, name)} is not a folder: give the study folders that hold "
                "the JSON reports, e.g. experiments/local/HOST-DATE experiments/cpu_reference"
            )
    try:
        rows, differing = compare(args.study, args.reference)
    except ReportError as err:
        parser.error(f"{err}; only reports written by heptstudy can be compared")
    if len(rows) == 2:  # the header alone: a typo must not read as a reproduction
        parser.error(
            f"no JSON report of {args.study} has a namesake in {args.reference}: nothing was "
            "compared; give the folder a study run wrote its reports to"
        )
    text = "\n".join(rows) + "\n"
    print(text, end="")
    if args.table:
        atomic_write_text(args.table, text)
    print(
        f"{differing} memory report(s) with other events or a different allocated peak in a "
        "counted step",
        file=sys.stderr,
    )
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
