"""Where a checkpointed step's extra time falls, phase by phase: whole training steps at batch 4
of the study's data, each plan's step between two `off` steps on the same batch in one process (as
`heptstudy bench paired` pairs them), split at the step's phase marks (backbone forward, decoder
and heads, loss, backward, optimizer).

    .venv/bin/python experiments/recompute_floor/phases_b4.py keep100 keep70 full --rounds 3 \
        --output experiments/local/recompute_floor/phases_b4.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch

from heptstudy.atomic import atomic_write_text, json_text
from heptstudy.data.batching import event_indices, load_events, to_device
from heptstudy.measure.paired import REFERENCE, paired_plans
from heptstudy.measure.request import MeasurementRequest
from heptstudy.meters.allocator import apply_allocator
from heptstudy.model.checkpoint_plan import plan_named
from heptstudy.train.precision import autocast_dtype
from heptstudy.train.step import PhaseClock, fresh_state, run_step


class _Clock(PhaseClock):
    """The step's phase marks with the time each was reached."""

    def __init__(self) -> None:
        super().__init__()
        self.marks = [("before", time.perf_counter())]

    def mark(self, phase: str) -> None:
        super().mark(phase)
        self.marks.append((phase, time.perf_counter()))

    def stop(self) -> None:
        super().stop()
        self.marks.append(("after", time.perf_counter()))

    def phases(self) -> dict[str, float]:
        self.marks.append(("end", time.perf_counter()))
        out: dict[str, float] = defaultdict(float)
        for (phase, start), (_, end) in zip(self.marks, self.marks[1:], strict=False):
            out[phase] += end - start
        out["total"] = self.marks[-1][1] - self.marks[0][1]
        return dict(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plans", nargs="+")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data-dir", default="data/tfds")
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    m = MeasurementRequest.build(
        kind="memory",
        batch_size=4,
        checkpointing="auto",
        passes="timing",
        platform="local_cpu",
        data_dir=args.data_dir,
        steps=2,
        warmup=1,
        progress=False,
    ).resolve()
    apply_allocator(m.allocator)
    plans = paired_plans(args.plans, m)
    config, device = m.config, m.device
    dtype = autocast_dtype(config, device)
    indices = event_indices(config, 4, 3)
    batches = [to_device(load_events(config, idx, "train"), device) for idx in indices]
    state = fresh_state(config, device)
    off = plan_named(REFERENCE)

    def step(plan, b: int) -> dict[str, float]:
        clock = _Clock()
        run_step(*state[:1], batches[b], *state[1:], config, dtype, plan=plan, clock=clock)
        return clock.phases()

    for plan in (off, *plans):  # first calls and the heap's growth, untimed
        step(plan, 0)
    extra: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in range(args.rounds):
        b = 1 + r % 2
        before = step(off, b)
        for plan in plans if r % 2 == 0 else plans[::-1]:
            here, after = step(plan, b), step(off, b)
            for phase in here:
                base = (before.get(phase, 0.0) + after.get(phase, 0.0)) / 2
                extra[plan.name][phase].append(here[phase] - base)
                extra[REFERENCE][phase].append(base)
            before = after
        print(f"round {r + 1} of {args.rounds}", flush=True)
    result = {
        "synthetic": True,
        "batch_size": 4,
        "rounds": args.rounds,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "off_s": {p: statistics.median(v) for p, v in extra[REFERENCE].items()},
        "extra_s": {
            name: {p: statistics.median(v) for p, v in per.items()}
            for name, per in extra.items()
            if name != REFERENCE
        },
        "extra_s_per_round": {n: dict(per) for n, per in extra.items() if n != REFERENCE},
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.output, json_text(result, "the phase split"))
    phases = [p for p in result["off_s"] if p not in ("before", "after", "end")]
    print(f"{'':<10}" + "".join(f"{p:>18}" for p in phases))
    print(f"{'off':<10}" + "".join(f"{result['off_s'][p]:>17.3f}s" for p in phases))
    for name, per in result["extra_s"].items():
        print(f"{name:<10}" + "".join(f"{per.get(p, 0.0):>+17.3f}s" for p in phases))


if __name__ == "__main__":
    main()
