"""Issue 52's second goal asks for +3% at every2's peak (1,973 MiB). Every solver plan checkpoints
every layer and pays a floor of a few points whatever it keeps (experiments/recompute_floor/);
every2 leaves half the layers whole but recomputes the other half in full. Between them lie plans
that leave the first K backbone layers unchecked and checkpoint the others keeping what the solver
chose for them: this script measures a few of those, whole training steps at batch 4 of the study's
data, in one process.

1. Peaks: one step of each plan under the storage tracker on the counted batch of most slots,
   `off`, `every2` and `keep70` among them, to check the method against the reference's peaks.
2. Times: each plan's step between two `off` steps on the same batch, as `heptstudy bench paired`
   pairs them, over --rounds rounds; its overhead in a round over the mean of its neighbours.

The plans are built here from the model's own parts (a count plan of the `ops` policy, keep-sets
from `heptstudy.model.solver.choose_keep` on the configuration's cost table restricted to the
checkpointed layers); no configuration value names them.

    .venv/bin/python experiments/mixed_layers/mixed.py --rounds 4 \
        --output experiments/local/mixed_layers/mixed_b4.json
    .venv/bin/python experiments/mixed_layers/mixed.py --rounds 8 --compare every2,keep70 \
        --candidates 1:40,1:55 --output experiments/local/mixed_layers/whole1_b4.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from heptstudy.atomic import atomic_write_text, json_text
from heptstudy.data.batching import event_indices, load_events, to_device
from heptstudy.measure.paired import REFERENCE, overheads, paired_request
from heptstudy.meters.allocator import apply_allocator
from heptstudy.meters.memory import make_meter
from heptstudy.model.checkpoint_plan import CheckpointPlan, plan_named
from heptstudy.model.cost_table import read_cost_table
from heptstudy.model.op_groups import check_keep
from heptstudy.model.solver import choose_keep
from heptstudy.train.precision import autocast_dtype
from heptstudy.train.step import fresh_state, run_step

#: (backbone layers left unchecked, percent of the checkpointed layers' bytes they keep)
CANDIDATES = "1:40,2:10,2:25,2:40,3:10,3:25"


def mixed_plan(costs, unchecked: int, percent: int) -> CheckpointPlan:
    """The first ``unchecked`` backbone layers whole; the others and every decoder layer
    checkpointed, keeping per kind what the solver chose within ``percent`` of their bytes."""
    layers = dict(costs.layers)
    checked = replace(costs, layers={**layers, "backbone": layers["backbone"] - unchecked})
    choice = choose_keep(checked, percent / 100)
    keep = {kind: check_keep(names) for kind, names in choice.keep.items()}
    order = tuple(("backbone", i) for i in range(unchecked, layers["backbone"])) + tuple(
        ("decoder", i) for i in range(layers["decoder"])
    )
    name = f"whole{unchecked}_keep{percent}"
    return CheckpointPlan(
        name,
        f"first {unchecked} whole, the rest keep {percent}% ({choice.words()})",
        "ops",
        count=len(order),
        order=order,
        keep=frozenset().union(*keep.values()),
        kind_keep=tuple(sorted(keep.items())),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--candidates", default=CANDIDATES, help="K:NN,... (first K whole)")
    parser.add_argument("--compare", default="every2,keep25,keep70", help="named plans")
    parser.add_argument("--budget-mib", type=float, default=1973.0, help="every2's peak")
    parser.add_argument("--data-dir", default="data/tfds")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    # the request `heptstudy bench paired` makes: every layer wrapped, so a step may run any plan
    m = paired_request(
        batch_size=4, platform="local_cpu", data_dir=args.data_dir, steps=2, warmup=1
    ).resolve()
    apply_allocator(m.allocator)
    config, device = m.config, m.device
    costs = read_cost_table(config)[1]
    layers = config.model.heptv2.num_convs
    named = [plan_named(n, layers, config=config) for n in args.compare.split(",")]
    pairs = [tuple(map(int, c.split(":"))) for c in args.candidates.split(",")]
    mixed = [mixed_plan(costs, k, p) for k, p in pairs]
    off = plan_named(REFERENCE)
    dtype = autocast_dtype(config, device)
    batches = [
        to_device(load_events(config, idx, "train"), device) for idx in event_indices(config, 4, 3)
    ]
    widest = max((1, 2), key=lambda b: int(batches[b]["padded_length"].sum()))
    state = fresh_state(config, device)

    def step(plan, b: int, meter=None):
        return run_step(*state[:1], batches[b], *state[1:], config, dtype, plan=plan, meter=meter)

    step(off, 0)  # the optimizer's state exists before any peak is taken
    peaks = {}
    for plan in (off, *named, *mixed):
        peaks[plan.name] = step(plan, widest, make_meter(device)).memory.peak_allocated_mib
        print(f"peak {plan.name}: {peaks[plan.name]:,.0f} MiB  ({plan.label})", flush=True)
    timed = [p for p in mixed if peaks[p.name] <= args.budget_mib]
    plans = [*[p for p in named if p.name not in ("every2", "every3")], *timed]
    steps = []
    for r in range(args.rounds):
        b = 1 + r % 2
        for plan in (off, *[q for p in (plans if r % 2 == 0 else plans[::-1]) for q in (p, off)]):
            start = time.perf_counter()
            step(plan, b)
            steps.append({"round": r + 1, "plan": plan.name, "batch": b,
                          "time_s": time.perf_counter() - start})  # fmt: skip
        print(f"round {r + 1} of {args.rounds}", flush=True)
    over = overheads(steps)
    result = {
        "synthetic": True,
        "batch_size": 4,
        "rounds": args.rounds,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "peak_batch": widest,
        "plans": {p.name: p.label for p in (*named, *mixed)},
        "peak_allocated_mib": peaks,
        "overhead_median": {n: statistics.median(v) for n, v in over.items()},
        "overhead_per_round": over,
        "steps": steps,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.output, json_text(result, "the mixed plans' measurement"))
    for name, v in over.items():
        spread = f"{min(v):+.1%} to {max(v):+.1%}"
        print(f"{name:<18} {peaks[name]:>7,.0f} MiB  {statistics.median(v):+.1%} ({spread})")


if __name__ == "__main__":
    main()
