"""The child process of ``heptstudy fit validate``: one GPU memory report, re-estimated.

It imports an earlier commit's package under another name (the parent checked the commit out
and renamed its package in a copy, see :mod:`heptstudy.estimate.validation`), builds that
code's model, loss and optimizer and runs that code's training step (forward, loss, backward,
as its bench measured it) on the report's exact events, with *today's* estimator around it:
the target's autocast lists, kernel stand-ins and kernel scratch, today's tracing storage
tracker, and today's bench-process replay through the caching-allocator simulator.

Usage: ``python -m heptstudy.estimate.validation_child PACKAGE REPORT DATA_DIR OUT_JSON``
(``PACKAGE`` importable on ``sys.path``). Writes one JSON object.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sys
import time
from pathlib import Path

import torch

from heptstudy.atomic import atomic_write_text
from heptstudy.estimate.autocast_policy import target_autocast
from heptstudy.estimate.bench_process import simulate_bench_process
from heptstudy.estimate.kernel_scratch import scratch_bytes
from heptstudy.estimate.kernel_stand_ins import target_kernels
from heptstudy.meters.allocation_trace import TracingMemoryMeter
from heptstudy.train.step import prime_optimizer
from heptstudy.units import MIB


def _old(package: str, module: str):
    return importlib.import_module(f"{package}.{module}")


def _config(package: str, report: dict, data_dir: str):
    cfg = dict(report["config"])
    cfg["data"] = {**cfg["data"], "data_dir": data_dir}
    return _old(package, "config").validate(cfg, "the report's configuration")


def _old_fake_step(package: str, config, batch, target: str, version: str):
    """The old code's step on fake CPU tensors, as its own ``estimate_step`` ran it (its
    stand-ins for the Hungarian matching and the per-type encoding), metered by today's tracing
    tracker with today's scratch table, under today's target autocast and kernel choices."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake = _old(package, "fitting.fake")
    build_model = _old(package, "model").build_model
    losses_mod = _old(package, "train.losses")
    optim = _old(package, "train.optim")
    trainer = _old(package, "train.trainer")

    device = torch.device("cpu")
    dtype = trainer.autocast_dtype(config, device)
    real_targets = losses_mod.targets_from_batch(batch)
    torch.manual_seed(config.train.seed)
    with torch.device("meta"):
        model = build_model(config)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    codes = batch["X"][..., 0]
    type_counts = {c: int((codes == c).sum()) for c in (1, 2)}
    fake_targets = fake._fake_targets(real_targets, mode, "cpu")
    meter = TracingMemoryMeter(device, track_categories=True, scratch=scratch_bytes)
    with contextlib.ExitStack() as stack:
        emulation = stack.enter_context(target_autocast(target, version))
        kernels = stack.enter_context(target_kernels(target))
        stack.enter_context(mode)
        stack.enter_context(fake._fake_substitutions(fake_targets, type_counts))
        model.to_empty(device=device)
        model.train()
        fbatch = {k: mode.from_tensor(v) for k, v in batch.items()}
        optimizer = optim.build_optimizer(model, config.train)
        scheduler = optim.build_scheduler(optimizer, config.train)
        prime_optimizer(model, optimizer, scheduler)  # LAMB's state, as in a counted step
        meter.start_step(fbatch.values(), model=model, optimizer=optimizer)
        _, losses = trainer.forward_and_loss(model, fbatch, config, dtype)
        losses["total"].backward()
        mem = meter.stop_step()
        calls = {
            "autocast": dict(sorted(emulation.calls.items())),
            "stand_ins": dict(sorted(kernels.calls.items())),
            "scratch": dict(sorted(meter.tracker.scratch_ops.items())),
        }
    return mem, meter.last_trace, calls


def run(package: str, report_path: str, data_dir: str) -> dict:
    report = json.loads(Path(report_path).read_text())
    config = _config(package, report, data_dir)
    load_events = _old(package, "data").load_events
    env = report["environment"]
    target = "rocm" if env.get("device_kind") == "rocm" else "cuda"
    version = env["torch_version"]
    steps, traces, per_step, calls = report["steps"], [], [], None
    started = time.perf_counter()
    for record in steps:
        batch = load_events(config, record["event_indices"], "train")
        hits, padded = batch["length"].tolist(), batch["padded_length"].tolist()
        if hits != record["hits"] or padded != record["padded_hits"]:
            raise SystemExit(
                f"{report_path}: step {record['step']}'s events have {hits} hits here, "
                f"{record['hits']} in the report: the generated data differ from the measured "
                "data (check the seed and event counts)"
            )
        mem, trace, calls = _old_fake_step(package, config, batch, target, version)
        traces.append(trace)
        per_step.append(
            {"step": record["step"], "tracked_peak_mib": mem.peak_allocated_bytes / MIB}
        )
    warmup = int(report["summary"]["warmup_steps"])
    sim = simulate_bench_process(traces, warmup=warmup, passes="both")
    for row, native, expandable in zip(per_step, sim.native, sim.expandable, strict=True):
        row.update(
            allocated_mib=native.peak_allocated_mib,
            reserved_mib=native.peak_reserved_mib,
            expandable_allocated_mib=expandable.peak_allocated_mib,
            expandable_reserved_mib=expandable.peak_reserved_mib,
        )
    counted = per_step[warmup:] or per_step
    return {
        "report": Path(report_path).name,
        "target": target,
        "torch_version": version,
        "tracked_peak_mib": max(r["tracked_peak_mib"] for r in counted),
        "allocated_mib": sim.max_allocated("native") / MIB,
        "reserved_mib": sim.max_reserved("native") / MIB,
        "expandable_allocated_mib": sim.max_allocated("expandable") / MIB,
        "expandable_reserved_mib": sim.max_reserved("expandable") / MIB,
        "steps": per_step,
        "hits_of_the_last_step": calls,
        "assumptions": list(sim.assumptions),
        "seconds": time.perf_counter() - started,
    }


def main(argv: list[str]) -> int:
    package, report_path, data_dir, out = argv
    result = run(package, report_path, data_dir)
    atomic_write_text(out, json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
