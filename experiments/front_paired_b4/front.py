"""The front at batch 4 with the paired overheads: each plan's peak allocated memory from the
CPU reference (experiments/cpu_reference, round 1) and its step-time overhead over ``off`` from
this folder's paired timing (``heptstudy bench paired``), the plans that dominate it by the
study's own rule (no more memory and no more overhead, less of one). Prints the table and draws
it as the study draws its front (paired_front.png and .pdf here).

    .venv/bin/python experiments/front_paired_b4/front.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from heptstudy import plots
from heptstudy.model.checkpoint_plan import plan_named
from heptstudy.study.front import dominators

HERE = Path(__file__).parent
REFERENCE = HERE.parent / "cpu_reference"
REPORTS = {"padded": "paired_b4.json", "packed": "packed_paired_b4.json"}
#: the reference's report of each plan at batch 4 (packed ones start with packed_)
NAMES = {"full": "checkpointed", "off": "baseline"}


def _peak(plan: str, batching: str) -> float:
    name = NAMES.get(plan, f"checkpointed_{plan}")
    prefix = "packed_" if batching == "packed" else ""
    report = json.loads((REFERENCE / f"{prefix}{name}_b4.json").read_text())
    return report["summary"]["max_peak_allocated_mib"]


def front() -> pd.DataFrame:
    rows = []
    for batching, file in REPORTS.items():
        paired = json.loads((HERE / file).read_text())
        rows.append(
            dict(
                batching=batching,
                batch_size=4,
                policy="off",
                peak_allocated_mib=_peak("off", batching),
                step_time_overhead_pct=0.0,
                overhead_min_pct=None,
                overhead_max_pct=None,
                rounds=paired["rounds"],
            )
        )
        for plan, o in paired["overhead"].items():
            rows.append(
                dict(
                    batching=batching,
                    batch_size=4,
                    policy=plan_named(plan, 6).label,  # as the study labels it
                    peak_allocated_mib=_peak(plan, batching),
                    step_time_overhead_pct=100 * o["median"],
                    overhead_min_pct=100 * o["min"],
                    overhead_max_pct=100 * o["max"],
                    rounds=len(o["per_round"]),
                )
            )
    table = pd.DataFrame(rows)
    table["dominated_by"] = [dominators(table, row) for _, row in table.iterrows()]
    return table


if __name__ == "__main__":
    table = front()
    print(table.round(1).to_string(index=False))
    plots.use_style()
    tag = "paired timing, peaks from the CPU reference; synthetic data"
    print(*plots.save(plots.policy_front(table, tag), HERE, "paired_front"), sep="\n")
