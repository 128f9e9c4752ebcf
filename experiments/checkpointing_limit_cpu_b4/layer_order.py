"""Which backbone layers a count plan should checkpoint first: the first K or the last K.

For K = 1..N-1, the peak allocated memory of one training step of the bench report's model
under ``layersK`` (first K) and ``lastK`` (last K), on the batch of the report's largest
counted step, estimated on fake tensors (the estimate ``auto`` calibrates with; on CPU the
storage tracker of the real step measures the same quantity), for the CPU (the report's
device) and for the CUDA target-faithful step. ``full`` and ``off`` for scale.

    python experiments/checkpointing_limit_cpu_b4/layer_order.py REPORT.json DATA_DIR OUT.json [cpu] [cuda]

DATA_DIR holds the report's events (the report names the folder of the machine it ran on).
"""

import json
import sys
import time
from pathlib import Path

from heptstudy.config import Config
from heptstudy.data.batching import load_events
from heptstudy.estimate.fake_step import estimate_step
from heptstudy.model.adaptive_checkpointing import plan_config
from heptstudy.model.checkpoint_plan import FULL, OFF, plan_named

report = json.loads(Path(sys.argv[1]).read_text())
config = Config.model_validate(report["config"])
config = config.model_copy(
    update={"data": config.data.model_copy(update={"data_dir": sys.argv[2]})}
)
step = max((s for s in report["steps"] if s["counted"]), key=lambda s: max(s["padded_hits"]))
batch = load_events(config, step["event_indices"], "train")
n = config.model.heptv2.num_convs
TARGETS = sys.argv[4:] or ["cpu"]
rows = []
for target in TARGETS:
    counts = [f"{word}{k}" for k in range(1, n) for word in ("layers", "last")]
    for plan in [OFF, *(plan_named(name, n) for name in counts), FULL]:
        started = time.perf_counter()
        fixed = plan_config(config, plan)
        est = estimate_step(fixed, batch, "cpu", target=target, plan=plan if plan.count else None)
        rows.append(
            {
                "target": target,
                "plan": plan.name,
                "label": plan.label,
                "checkpointed_layers": plan.count if plan.count else (n if plan is FULL else 0),
                "peak_allocated_mib": round(est.peak_allocated_mib, 2),
                "seconds": round(time.perf_counter() - started, 2),
            }
        )
        print(f"{target:5s} {plan.name:8s} {est.peak_allocated_mib:9.1f} MiB", flush=True)
out = {
    "what": "estimated peak allocated MiB of one training step, first-K against last-K "
    "checkpointed backbone layers (fake tensors); synthetic events",
    "report": sys.argv[1],
    "events": step["event_indices"],
    "padded_hits": step["padded_hits"],
    "rows": rows,
}
Path(sys.argv[3]).write_text(json.dumps(out, indent=1) + "\n")
