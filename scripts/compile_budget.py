"""torch.compile's activation memory budget next to the solver plans, on one backbone layer.

    .venv/bin/python scripts/compile_budget.py [--data-dir data/tfds] [--repeats 3]
        [--out experiments/compile_budget/result.json]

The peer a user would try instead of a ``keepNN`` plan: compile the layer with inductor and let
its min-cut partitioner choose what to recompute within
``torch._functorch.config.activation_memory_budget`` (a fraction of what the forward would save).
On the recommended model's first backbone layer, fed the 4 events of the committed cost table
(configs/checkpointing/op_costs_cpu.json; generated, synthetic data), this measures:

- eager: off, full (the layer recomputed) and keepNN at each budget of ``BUDGETS`` (the keep-sets
  the solver chose on the table), with the bytes the table says each keeps;
- compiled: each budget and 1.0 (nothing recomputed): the bytes the partitioned forwards save for
  the backward (exact: the backward graphs' inputs that are neither the layer's inputs nor its
  weights), the graphs and graph breaks dynamo made, and the compile time.

Seconds are forward+backward wall time, the median of ``--repeats`` after one unmeasured (which,
compiled, compiles), under the ``local_cpu`` allocator settings the study's runs apply. A
variant that fails is written with its error: what a user would meet.
"""

from __future__ import annotations

import argparse
import statistics
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from heptstudy.atomic import json_text, write_text_or_keep
from heptstudy.config import load_config
from heptstudy.data.batching import load_events
from heptstudy.measure.op_costs import layer_inputs, one_layer
from heptstudy.meters.allocator import apply_allocator, measurement_allocator
from heptstudy.model.checkpoint_plan import FULL, apply_plan, plan_named
from heptstudy.model.cost_table import read_cost_table, solved_keep

BUDGETS = (0.10, 0.20, 0.25, 0.70)
CPU = torch.device("cpu")


class _Holder(nn.Module):
    """A one-layer backbone, so that a plan wraps the layer as it wraps the model's."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.backbone = nn.ModuleList([layer])


def _timed(run, args_of, repeats: int) -> dict:
    seconds = []
    for _ in range(repeats + 1):
        args = args_of()
        start = time.perf_counter()
        out = run(*args)
        out.float().square().mean().backward()
        seconds.append(time.perf_counter() - start)
    return {"first_s": seconds[0], "seconds": statistics.median(seconds[1:]), "all_s": seconds}


def _attempt(measure) -> dict:
    try:
        return measure()
    except Exception as err:  # noqa: BLE001 - what failed is the finding
        lines = traceback.format_exception_only(err)
        return {"error": "".join(lines).strip()[:2000]}


def _eager(config, plan, args_of, repeats: int) -> dict:
    layer = one_layer(config, "backbone", CPU)
    if plan is not None:
        layer = apply_plan(_Holder(layer), plan).backbone[0]
    return _timed(layer, args_of, repeats)


def _compiled(config, budget: float, args_of, repeats: int) -> dict:
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    saved, graphs = [], {"forward": 0, "backward": 0}

    def inner(gm, example_inputs, *rest, **kwargs):
        backward = kwargs.get("is_backward", False)
        graphs["backward" if backward else "forward"] += 1
        if backward:  # its inputs: what the forward saved, then the incoming gradients
            names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
            for name, value in zip(names, example_inputs, strict=False):
                if isinstance(value, torch.Tensor) and not name.startswith(("tangents", "primals")):
                    saved.append(value.numel() * value.element_size())
        return compile_fx_inner(gm, example_inputs, *rest, **kwargs)

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    layer = one_layer(config, "backbone", CPU)
    with torch._functorch.config.patch(activation_memory_budget=budget):
        compiled = torch.compile(
            layer, backend=lambda gm, ex: compile_fx(gm, ex, inner_compile=inner)
        )
        result = _timed(compiled, args_of, repeats)
    breaks = dict(torch._dynamo.utils.counters["graph_break"])
    return {
        **result,
        "compile_and_first_step_s": result["first_s"],
        "saved_bytes": sum(saved),
        "graphs": graphs,
        "graph_breaks": {str(k): v for k, v in breaks.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default="data/tfds")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="experiments/compile_budget/result.json")
    args = parser.parse_args()
    # as every study run: glibc keeps freed memory, so that no variant pays page faults for
    # returning its activations to the kernel (docs/allocator.md)
    allocator = apply_allocator(measurement_allocator(None, "cpu"))
    config = load_config(overrides=[f"data.data_dir={args.data_dir}"])
    table = read_cost_table(config)[0]
    batch = load_events(config, table["data"]["event_indices"], "train")
    args_of = lambda: layer_inputs("backbone", batch, config, CPU)  # noqa: E731 - fresh inputs
    groups = table["kinds"]["backbone"]["groups"]
    total = sum(g["bytes"] for g in groups.values())
    variants = {
        "eager off": {
            "kept_bytes": total,
            **_attempt(lambda: _eager(config, None, args_of, args.repeats)),
        }
    }
    variants["eager full"] = {
        "kept_bytes": 0,
        **_attempt(lambda: _eager(config, FULL, args_of, args.repeats)),
    }
    for budget in BUDGETS:
        name = f"keep{round(budget * 100)}"
        keep = solved_keep(config, name).keep["backbone"]
        kept = sum(groups[g]["bytes"] for g in keep)
        plan = plan_named(name, config=config)
        variants[f"eager {name}"] = {
            "kept_bytes": kept,
            "keeps": sorted(keep),
            **_attempt(lambda plan=plan: _eager(config, plan, args_of, args.repeats)),
        }
    for budget in (1.0, *BUDGETS):
        variants[f"compiled budget {budget:g}"] = _attempt(
            lambda budget=budget: _compiled(config, budget, args_of, args.repeats)
        )
        print(f"compiled budget {budget:g}: {variants[f'compiled budget {budget:g}']}", flush=True)
    result = {
        "what": "one backbone layer of the recommended model, forward+backward on CPU",
        "data": {"event_indices": table["data"]["event_indices"], "synthetic": True},
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "allocator": asdict(allocator),
        "uncheckpointed_group_bytes": total,
        "variants": variants,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_or_keep(out, json_text(result, str(out)), str(out))
    for name, v in variants.items():
        print(f"{name:28} {v.get('seconds', float('nan')):8.3f} s  "
              f"{(v.get('saved_bytes', v.get('kept_bytes')) or 0) / 2**20:9.1f} MiB  {v.get('error', '')[:120]}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
