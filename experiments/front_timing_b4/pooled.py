"""The per-round step-time overheads over ``off`` (batch 4, padded) of every round that timed the
reference's computation: the reference at 3466417 (read from git, commit fdb77d6), this folder's
4 rounds run right after it, and the reference at 703a155 (the same computation; read from git,
commit c88c15e, the last to hold it before the reference was measured again with the front timed
in pairs). Each round's overhead is a plan's mean step over ``off``'s mean step in that round.

    .venv/bin/python experiments/front_timing_b4/pooled.py
"""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: the commits holding the references measured at 3466417 and at 703a155
REFERENCES = ("fdb77d6", "c88c15e")
PLANS = {
    "off": "baseline",
    "full": "checkpointed",
    "keep10": "checkpointed_keep10",
    "keep20": "checkpointed_keep20",
    "keep25": "checkpointed_keep25",
    "keep70": "checkpointed_keep70",
    "every2": "checkpointed_every2",
    "every3": "checkpointed_every3",
    "selective": "checkpointed_selective",
}


def _git_text(commit: str, path: str) -> str:
    show = ["git", "show", f"{commit}:experiments/cpu_reference/{path}"]
    return subprocess.run(show, cwd=ROOT, capture_output=True, text=True, check=True).stdout


def _reference_rounds(read) -> list[dict[str, float]]:
    rounds = []
    for files in ("{}_b4.json", "repeats/{}_b4.r2.json", "repeats/{}_b4.r3.json"):
        steps = {p: json.loads(read(files.format(n))) for p, n in PLANS.items()}
        rounds.append({p: r["summary"]["mean_step_time_s"] for p, r in steps.items()})
    return rounds


def main() -> None:
    here = Path(__file__).parent
    rounds = _reference_rounds(lambda p: _git_text(REFERENCES[0], p))
    for r in range(1, 5):
        reports = {p.stem.split("_r")[0]: p for p in here.glob(f"*_r{r}.json")}
        rounds.append(
            {
                p: json.loads(f.read_text())["summary"]["mean_step_time_s"]
                for p, f in reports.items()
            }
        )
    rounds += _reference_rounds(lambda p: _git_text(REFERENCES[1], p))
    print("plan       rounds  median overhead  range")
    for plan in list(PLANS)[1:]:
        over = [100 * (r[plan] / r["off"] - 1) for r in rounds if plan in r]
        print(
            f"{plan:10s} {len(over):6d}  {statistics.median(over):+14.0f}%  "
            f"{min(over):+.0f} to {max(over):+.0f}%"
        )


if __name__ == "__main__":
    main()
