"""What a checkpointed layer costs beyond what it recomputes: the six-layer backbone alone, forward
and backward on one generated event, timed in turn under off, every op group kept (lean SwiGLU, as
the solver plans run), every group kept with the SwiGLU's hidden products kept too (not lean), and
full; then torch.profiler's self CPU time and calls of every op in backward, against off.

    .venv/bin/python experiments/recompute_floor/layer_floor.py --hits 12000 --rounds 8 \
        --output experiments/local/recompute_floor/layer_floor_12000.json
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from heptstudy.atomic import atomic_write_text, json_text
from heptstudy.config import load_config
from heptstudy.model import example_batch
from heptstudy.model.checkpoint_plan import FULL, OFF, CheckpointPlan, apply_plan, plan_named
from heptstudy.model.heptv2 import HEPTv2Layer, hit_coordinates
from heptstudy.model.op_groups import GROUP_NAMES


@dataclasses.dataclass(frozen=True)
class _NotLean(CheckpointPlan):
    """Every group kept and the SwiGLU's hidden products too (as off keeps them)."""

    @property
    def lean(self) -> bool:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hits", type=int, default=12000)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--profiled-rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    config = load_config()
    cfg = config.model.heptv2
    all_groups = plan_named("all_groups", keep=GROUP_NAMES)
    fields = {f.name: getattr(all_groups, f.name) for f in dataclasses.fields(CheckpointPlan)}
    plans = {
        "off": OFF,
        "all_groups": all_groups,
        "all_groups_not_lean": _NotLean(**{**fields, "name": "all_groups_not_lean"}),
        "full": FULL,
    }
    batch = example_batch(config, 1, args.hits, seed=0)
    mask, coords, layout = batch["mask"], hit_coordinates(batch["X"]), batch["layout"]
    x = torch.randn(*mask.shape, cfg.embedding_dim, requires_grad=True)
    grad = torch.randn_like(x)
    backbones = {}
    for name, plan in plans.items():
        torch.manual_seed(0)
        holder = torch.nn.Module()
        holder.backbone = torch.nn.ModuleList(HEPTv2Layer(cfg, i) for i in range(cfg.num_convs))
        backbones[name] = apply_plan(holder, plan).backbone.train()

    def step(name: str, profiled: bool = False):
        layers = backbones[name]
        t0 = time.perf_counter()
        orders = [layer.bucket_order(coords, mask, layout) for layer in layers]
        out = x
        for layer, order in zip(layers, orders, strict=True):
            out = layer(out, mask, coords, layout, order)
        t1 = time.perf_counter()
        if profiled:
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                out.backward(grad)
            ops = {e.key: (e.self_cpu_time_total / 1e6, e.count) for e in prof.key_averages()}
        else:
            out.backward(grad)
            ops = None
        t2 = time.perf_counter()
        x.grad = None
        layers.zero_grad(set_to_none=True)
        return t1 - t0, t2 - t1, ops

    for name in plans:  # first calls and the heap's growth, untimed
        step(name)
    forward, backward = defaultdict(list), defaultdict(list)
    for r in range(args.rounds):
        for name in list(plans) if r % 2 == 0 else list(plans)[::-1]:
            f, b, _ = step(name)
            forward[name].append(f)
            backward[name].append(b)
    ops = defaultdict(lambda: defaultdict(list))
    for _ in range(args.profiled_rounds):
        for name in ("off", "all_groups", "full"):
            for op, value in step(name, profiled=True)[2].items():
                ops[name][op].append(value)
    median = {
        name: {op: (statistics.median(v[0] for v in vals), vals[0][1]) for op, vals in per.items()}
        for name, per in ops.items()
    }
    off_f, off_b = statistics.median(forward["off"]), statistics.median(backward["off"])
    result = {
        "synthetic": True,
        "hits": args.hits,
        "padded_hits": int(mask.shape[1]),
        "layers": cfg.num_convs,
        "rounds": args.rounds,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "plans": {
            name: {
                "forward_s": statistics.median(forward[name]),
                "backward_s": statistics.median(backward[name]),
                "step_overhead": (
                    statistics.median(forward[name]) + statistics.median(backward[name])
                )
                / (off_f + off_b)
                - 1,
                "backward_extra_s": statistics.median(backward[name]) - off_b,
                "forward_s_per_round": forward[name],
                "backward_s_per_round": backward[name],
            }
            for name in plans
        },
        "backward_ops_beyond_off": {
            name: {
                op: {
                    "self_s": median[name].get(op, (0.0, 0))[0]
                    - median["off"].get(op, (0.0, 0))[0],
                    "calls": median[name].get(op, (0.0, 0))[1],
                    "calls_off": median["off"].get(op, (0.0, 0))[1],
                }
                for op in set(median[name]) | set(median["off"])
            }
            for name in ("all_groups", "full")
        },
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.output, json_text(result, "the layer floor"))
    for name, p in result["plans"].items():
        print(
            f"{name:<18} forward {p['forward_s']:.3f} s  backward {p['backward_s']:.3f} s  "
            f"step {p['step_overhead']:+.1%}"
        )
    for name, per in result["backward_ops_beyond_off"].items():
        print(f"\n{name}: backward ops beyond off (profiled self time)")
        for op, v in sorted(per.items(), key=lambda kv: -kv[1]["self_s"])[:15]:
            print(f"  {op:<58} {v['self_s']:+.4f} s  calls {v['calls']} (off {v['calls_off']})")


if __name__ == "__main__":
    main()
