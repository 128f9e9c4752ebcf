"""Print the figures README.md quotes, from the reports of this folder.

python experiments/checkpointing_limit_cpu_b4/summarize.py
"""

import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
MIB = 2**20


def load(rel):
    path = HERE / rel
    return json.loads(path.read_text()) if path.exists() else None


def breakdown(rel):
    r = load(rel)
    if r is None:
        print(f"{rel}: missing")
        return
    cat = max(r["memory_categories"], key=lambda c: c["peak_bytes"])
    print(f"{rel}: peak {cat['peak_bytes'] / MIB:,.1f} MiB at step {cat['step']}")
    owners = cat.get("by_module_bytes") or {}
    for owner, by_cat in sorted(owners.items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(by_cat.values()) / MIB
        if total >= 0.05:
            parts = ", ".join(f"{c} {b / MIB:,.1f}" for c, b in by_cat.items() if b)
            print(f"  {owner:28s} {total:8.1f}  ({parts})")


def mean_step(r):
    return r["summary"]["mean_step_time_s"]


REFERENCE = "../cpu_reference"


def reference_round(name, r):
    return f"{REFERENCE}/{name}.json" if r == 1 else f"{REFERENCE}/repeats/{name}.r{r}.json"


def main():
    parity = load(f"{REFERENCE}/parity_deterministic_b1.json")
    if parity:
        p = parity["parity"]["checkpointed_vs_baseline"]
        print(
            f"parity: outputs {sum(o['equal'] for o in p['outputs'])}/{len(p['outputs'])}, "
            f"loss equal {p['loss']['equal']} (max |d| {p['loss']['max_abs_diff']}), gradients "
            f"{sum(g['equal'] for g in p['gradients'])}/{len(p['gradients'])}"
        )
    breakdown("breakdown/before_checkpointed_b4.json")
    breakdown(f"{REFERENCE}/checkpointed_b4.json")
    overheads = []
    for r in (1, 2, 3):
        off = load(reference_round("baseline_b4", r))
        full = load(reference_round("checkpointed_b4", r))
        if off and full:
            o, f = mean_step(off), mean_step(full)
            overheads.append(100 * (f / o - 1))
            print(f"round {r}: off {o:.2f} s, full {f:.2f} s, overhead {overheads[-1]:+.1f}%")
    if overheads:
        print(
            f"overhead median {statistics.median(overheads):+.1f}% "
            f"(range {min(overheads):+.1f} to {max(overheads):+.1f})"
        )
    auto, off, full = (
        load(f"auto12_436d7af/{n}_b4.json") for n in ("auto", "baseline", "checkpointed")
    )
    if auto:
        budget = auto["checkpointing"]["memory_budget_mib"]
        counted = [s for s in auto["steps"] if s["counted"]]
        plans = {}
        for s in counted:
            plans[s["checkpoint_plan"]] = plans.get(s["checkpoint_plan"], 0) + 1
        errors = [
            100 * (s["predicted_peak_mib"] / s["peak_allocated_mib"] - 1) for s in auto["steps"]
        ]
        print(f"auto: budget {budget:,.0f} MiB, mean step {mean_step(auto):.2f} s, plans {plans}")
        print(
            f"  largest peak {max(s['peak_allocated_mib'] for s in auto['steps']):,.1f} MiB, "
            f"steps above budget {sum(s['peak_allocated_mib'] > budget for s in auto['steps'])}"
        )
        print(f"  predicted vs measured: {min(errors):+.2f}% to {max(errors):+.2f}%")
        for s in auto["steps"]:
            print(
                f"   step {s['step']}: {s['checkpoint_plan']:8s} longest {max(s['padded_hits'])}"
                f" predicted {s['predicted_peak_mib']:,.0f} measured {s['peak_allocated_mib']:,.0f}"
                f" time {s['time_s']:.2f}"
            )
        if off and full:
            o, f, a = mean_step(off), mean_step(full), mean_step(auto)
            over = f / o - 1
            print(
                f"  off {o:.2f} s, full {f:.2f} s ({100 * over:+.1f}%), auto {a:.2f} s "
                f"({100 * (a / o - 1):+.1f}%); bound off x (1 + {100 * over / 2:.1f}%) = "
                f"{o * (1 + over / 2):.2f} s"
            )


if __name__ == "__main__":
    main()
