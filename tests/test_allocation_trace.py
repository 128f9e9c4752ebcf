"""The ordered storage trace of a step and the replay of a bench process through the
caching-allocator simulator (expected figures worked out by hand in comments)."""

from __future__ import annotations

import pytest
import torch

from heptstudy.errors import HeptstudyError
from heptstudy.estimate.bench_process import simulate_bench_process
from heptstudy.meters.allocation_trace import StepTrace, TracingMemoryMeter

MIB = 1024**2


def _running_peak(trace: StepTrace) -> int:
    live = sum(n for _, n, _ in trace.resident) + sum(n for _, n in trace.adopted)
    peak = live
    for kind, _, nbytes in trace.events:
        live += nbytes if kind == "alloc" else -nbytes
        peak = max(peak, live)
    return peak


def test_trace_orders_the_steps_storages_and_names_the_gradients():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8, bias=False)  # weight: 8 x 8 fp32 = 256 B
    x = torch.randn(16, 8)  # 512 B
    meter = TracingMemoryMeter("cpu")
    meter.start_step([x], model=model)
    y = model(x)  # 16 x 8 fp32 = 512 B, the step's first allocation
    loss = (y * y).sum()
    del y
    loss.backward()
    mem = meter.stop_step()
    trace = meter.last_trace
    assert sorted((n, c) for _, n, c in trace.resident) == [(256, "parameters"), (512, "inputs")]
    assert trace.events[0][0] == "alloc" and trace.events[0][2] == 512
    # the trace's own running total reaches exactly the tracker's peak
    assert _running_peak(trace) == mem.peak_allocated_bytes
    # every free names a block allocated before it (or a resident one)
    seen = {b for b, _, _ in trace.resident}
    for kind, block, _ in trace.events:
        if kind == "alloc":
            assert block not in seen
            seen.add(block)
        else:
            assert block in seen
    grad_block = next(iter(trace.gradient_ids))
    assert trace.gradient_ids == {grad_block} and trace.live_at_end[grad_block] == 256
    assert all(b not in {r for r, _, _ in trace.resident} for b in trace.live_at_end)


def test_fake_step_trace_replays_to_the_trackers_peak(tiny_data_dir, tiny_overrides):
    from heptstudy.config import load_config
    from heptstudy.data.batching import load_events
    from heptstudy.estimate.fake_step import estimate_step

    cfg = load_config(overrides=tiny_overrides + [f"data.data_dir={tiny_data_dir}"])
    est = estimate_step(cfg, load_events(cfg, [0, 5, 9]), device_type="cpu", record_trace=True)
    assert est.trace is not None and est.trace.events
    assert _running_peak(est.trace) == est.peak_allocated_bytes
    assert est.trace.gradient_ids and est.trace.resident_bytes("optimizer_state")
    peaks = simulate_bench_process([est.trace] * 3)
    for mode in ("native", "expandable"):
        # the simulator counts rounded blocks and the process's other pieces (workspaces, all
        # batches): never below what the tracker saw
        assert peaks.max_allocated(mode) >= est.peak_allocated_bytes
        assert peaks.max_reserved(mode) >= peaks.max_allocated(mode)


def _step(act_mib: int, first_block: int = 10) -> StepTrace:
    act, grad = first_block, first_block + 1
    return StepTrace(
        resident=[(0, 16 * MIB, "parameters"), (1, 12 * MIB, "inputs")],
        events=[
            ("alloc", act, act_mib * MIB),
            ("alloc", grad, 16 * MIB),
            ("free", act, act_mib * MIB),
        ],
        live_at_end={grad: 16 * MIB},
        gradient_ids=frozenset({grad}),
    )


def test_bench_process_replay_by_hand():
    # batches 2 x 12 MiB, parameters 16 MiB, workspaces 2 x 32 MiB, LAMB state 2 x 16 MiB made
    # after step 0's window; step 0: a 40 MiB activation and a 16 MiB gradient, step 1: 30 MiB
    # and 16 MiB; memory pass only, one warm-up step.
    peaks = simulate_bench_process(
        [_step(40), _step(30)], warmup=1, passes="memory", optimizer_state=[16 * MIB] * 2
    )
    # Native. Own segments: 12 + 12 + 16 + 32 + 32 = 104 MiB before step 0. Step 0: act -> new
    # 40 MiB segment, grad -> new 16 MiB segment: 160 allocated and reserved at the peak. Act
    # freed; the state's 2 x 16 MiB split the free 40 MiB block (8 MiB left); grad freed.
    # Step 1: 30 MiB fits neither the 8 nor the 16 MiB free block -> new 30 MiB segment
    # (190 MiB reserved), grad -> the free 16 MiB block; allocated 104 + 32 + 30 + 16 = 182
    assert [(s.peak_allocated // MIB, s.peak_reserved // MIB) for s in peaks.native] == [
        (160, 160),
        (182, 190),
    ]
    # Expandable (one segment, 20 MiB pages). Batches: 20 then 40 MiB mapped (12 + 12, 16 MiB
    # free at the end), parameters take those 16 MiB; workspaces map 40 more (8 free at the
    # end), then 40 more (16 free): 120 MiB. Step 0: act extends the 16 MiB end block by 2
    # pages (160 MiB), grad takes the 16 MiB left: peak 160 / 160. Act freed (a 40 MiB hole at
    # 104), the state splits it (8 MiB left at 136), grad freed: it merges with those 8 MiB
    # into a 24 MiB end block. Step 1: act (30) extends it by one page (180 MiB; 14 left),
    # grad (16) by one more (200 MiB): allocated 104 + 32 + 30 + 16 = 182, reserved 200
    assert [(s.peak_allocated // MIB, s.peak_reserved // MIB) for s in peaks.expandable] == [
        (160, 160),
        (182, 200),
    ]
    assert peaks.max_reserved("native") == 190 * MIB
    assert peaks.max_reserved("expandable") == 200 * MIB
    assert peaks.ignored_frees == 0


def test_timed_pass_leaves_its_segments_to_the_memory_pass():
    # segments are never released, so the memory pass of a "both" process starts with at
    # least the reserved bytes the whole timed pass reached
    steps = [_step(40), _step(30)]
    memory_only = simulate_bench_process(steps, passes="memory", optimizer_state=[16 * MIB] * 2)
    both = simulate_bench_process(steps, passes="both", optimizer_state=[16 * MIB] * 2)
    for mode in ("native", "expandable"):
        first_pass_max = max(s.peak_reserved for s in getattr(memory_only, mode))
        assert getattr(both, mode)[0].peak_reserved >= first_pass_max


def test_bench_process_refuses_no_steps_by_name():
    with pytest.raises(HeptstudyError, match="at least one step trace"):
        simulate_bench_process([])


def test_incomplete_trace_is_refused():
    bad = StepTrace(resident=[], events=[("free", 99, 512)])
    with pytest.raises(HeptstudyError, match="frees block 99"):
        simulate_bench_process([bad])
