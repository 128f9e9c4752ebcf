"""Current code (CPU build, CPU autocast: NOT the CUDA-faithful step) fake steps on the H200
evidence's events, each step's trace replayed through the simulated bench process."""
import json, sys, time
from heptstudy.config import load_config
from heptstudy.data import load_events
from heptstudy.estimate.fake_step import estimate_step
from heptstudy.estimate.bench_process import simulate_bench_process
MIB = 2**20
ev = "experiments/h200_2026-11-30"
out = {}
for name, ck in (("baseline_b4", "false"), ("checkpointed_b4", "true")):
    rep = json.load(open(f"{ev}/{name}.json"))
    cfg = load_config(overrides=[f"data.data_dir={sys.argv[1]}", "model.heptv2.attention_backend=plain",
                                 "train.dtype=bfloat16", f"model.heptv2.activation_checkpointing={ck}", "data.nvalid=4"])
    traces, tracked = [], []
    t0 = time.time()
    for s in rep["steps"]:
        est = estimate_step(cfg, load_events(cfg, s["event_indices"], "train"), "cpu", record_trace=True)
        traces.append(est.trace); tracked.append(est.peak_allocated_bytes / MIB)
    t1 = time.time()
    p = simulate_bench_process(traces, warmup=rep["summary"]["warmup_steps"])
    t2 = time.time()
    n = sum(len(t.events) for t in traces)
    out[name] = dict(
        measured_9a5529c=(rep["summary"]["max_peak_allocated_mib"], rep["summary"]["max_peak_reserved_mib"]),
        tracked_max=max(tracked[rep["summary"]["warmup_steps"]:]),
        sim_native=(p.max_allocated() / MIB, p.max_reserved() / MIB),
        sim_expandable=(p.max_allocated("expandable") / MIB, p.max_reserved("expandable") / MIB),
        events=n, fake_steps_s=t1 - t0, replay_s=t2 - t1)
    print(name, out[name], flush=True)
json.dump(out, open("experiments/simulated_bench_b4_current_code/result.json", "w"), indent=1)
