"""The paired overheads over ``off`` at batch 4 of both references measured on the AMD EPYC, per
round: the reference at c88c15e (read from git at f411d3f, the last commit holding it) and the
committed one. Each round's overhead is the plan's step over the two ``off`` steps beside it, as
the paired timing takes it; the pooled median and range are over all 6 rounds.

    .venv/bin/python experiments/study_paired_epyc/pooled_paired.py
"""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EARLIER = "f411d3f"
FILES = {"padded": "paired/paired_b4.json", "packed": "paired/packed_paired_b4.json"}


def _earlier(path: str) -> dict:
    show = ["git", "show", f"{EARLIER}:experiments/cpu_reference/{path}"]
    return json.loads(
        subprocess.run(show, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    )


def main() -> None:
    for batching, path in FILES.items():
        now = json.loads((ROOT / "experiments" / "cpu_reference" / path).read_text())
        before = _earlier(path)
        print(f"{batching}: plan, rounds, median overhead, range (earlier | committed rounds)")
        for plan, over in now["overhead"].items():
            earlier = before["overhead"].get(plan, {}).get("per_round", [])
            pooled = [100 * v for v in [*earlier, *over["per_round"]]]
            each = " ".join(f"{100 * v:+.1f}" for v in earlier) or "-"
            print(
                f"  {plan:10s} {len(pooled)}  {statistics.median(pooled):+6.1f}%  "
                f"{min(pooled):+.1f} to {max(pooled):+.1f}%  ({each} | "
                + " ".join(f"{100 * v:+.1f}" for v in over["per_round"])
                + ")"
            )


if __name__ == "__main__":
    main()
