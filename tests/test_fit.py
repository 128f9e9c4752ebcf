"""Will it fit: memory-model arithmetic, held-out validation on CPU measurements, fake-device
estimate against CPU live bytes, and the `heptstudy fit` command."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import TINY_MODEL

from heptstudy.config import load_config
from heptstudy.data.sampler import InterleavedShardSampler
from heptstudy.fit import (
    LinearFit,
    MemoryModel,
    Point,
    batch_longest,
    evaluate,
    fit_linear,
    fit_points,
    fit_reports,
    model_key,
)

GIB_MIB = 1024.0


def _model(fixed, per_hit, per_event=0.0) -> MemoryModel:
    fit = LinearFit("peak_allocated", fixed, per_hit, per_event)
    return MemoryModel(
        key={}, source="hand-made", source_detail="test", allocated=fit, reserved=None, inputs=[]
    )


# --------------------------------------------------------------------------- arithmetic


def test_batch_longest_follows_the_sampler():
    lengths = np.arange(1, 38)
    got = batch_longest(
        lengths, 3, world_size=2, seed=5, num_steps=20, shard_sizes=[20, 17], pad_to_multiple=4
    )
    for rank in range(2):
        s = InterleavedShardSampler([20, 17], seed=5, rank=rank, world_size=2)
        want = [max(-(-lengths[i] // 4) * 4 for i in s.take(3)) for _ in range(20)]
        assert got[:, rank].tolist() == want


def test_hand_made_distribution_single_device():
    # 10 events: nine of 10 hits, one (the last) of 100; sequential order, batches of two:
    # (0,1) (2,3) (4,5) (6,7) (8,9) -> only the last batch holds the long event.
    lengths = [10] * 9 + [100]
    mm = _model(fixed=1000.0, per_hit=1.0)  # MiB, MiB per padded hit
    ans = evaluate(
        mm,
        lengths,
        2,
        device_memory_gib=1150 / GIB_MIB,
        mode="sequential",
        num_steps=50,
        pad_to_multiple=10,
    )
    assert ans.peaks_gib["max"] * GIB_MIB == pytest.approx(1200)  # 1000 + 2 x 100
    assert ans.peaks_gib["min"] * GIB_MIB == pytest.approx(1020)  # 1000 + 2 x 10
    assert ans.p_batch_exceeds == pytest.approx(0.2)
    assert ans.failing_steps_simulated == 10  # one step in five, 50 steps
    assert ans.expected_failures == pytest.approx(10)
    assert ans.worst_possible["peak_gib"] * GIB_MIB == pytest.approx(1200)
    assert ans.spare_gib_at_worst * GIB_MIB == pytest.approx(-50)
    assert not ans.fits
    assert ans.largest_safe_batch == 1  # one event: at most 1000 + 100 = 1100 <= 1150


def test_hand_made_distribution_two_ranks_and_margin():
    # Rank 1 takes events 1,3,5,7,9,1,3,... -> batches [1,3] [5,7] [9,1] [3,5] [7,9]: 2 in 5 hold
    # event 9; rank 0 never does. A step fails when any rank fails.
    lengths = [10] * 9 + [100]
    mm = _model(fixed=1000.0, per_hit=1.0)
    ans = evaluate(
        mm,
        lengths,
        2,
        device_memory_gib=2.0,
        safety_margin_gib=2.0 - 1150 / GIB_MIB,
        world_size=2,
        mode="sequential",
        num_steps=50,
        pad_to_multiple=10,
    )
    assert ans.usable_gib * GIB_MIB == pytest.approx(1150)
    assert ans.p_step_fails == pytest.approx(0.4)
    assert ans.p_batch_exceeds == pytest.approx(0.2)
    assert ans.expected_failures == pytest.approx(20)
    # with a smaller margin everything fits, and the spare memory is the usable less the worst
    ok = evaluate(
        mm,
        lengths,
        2,
        device_memory_gib=2.0,
        safety_margin_gib=0.5,
        world_size=2,
        mode="sequential",
        num_steps=50,
        pad_to_multiple=10,
    )
    assert ok.fits and ok.expected_failures == 0
    assert ok.spare_gib_at_worst * GIB_MIB == pytest.approx(1.5 * GIB_MIB - 1200)


def test_nnls_recovers_known_coefficients_and_holds_out():
    pts = [Point(b, L, 500 + 0.25 * b * L + 3 * b) for b in (1, 2, 4, 8) for L in (64, 128, 256)]
    fit = fit_linear(pts)
    assert (fit.fixed_mib, fit.per_padded_hit_mib, fit.per_event_mib) == pytest.approx(
        (500, 0.25, 3), rel=1e-6
    )
    mm = fit_points({"k": 1}, pts, held_out_batch_sizes=[2, 8])
    assert mm.validation["held_out_batch_sizes"] == [2, 8]
    assert mm.validation["max_abs_rel_error"] < 1e-9
    again = MemoryModel.from_dict(json.loads(json.dumps(mm.to_dict())))
    assert again.predict_allocated_mib(3, 100) == pytest.approx(500 + 75 + 9)


# --------------------------------------------------------------------------- CPU measurements


@pytest.fixture(scope="module")
def cpu_reports(tiny_data_dir, tmp_path_factory):
    from heptstudy.measure.bench import BenchOptions, run_bench

    out = tmp_path_factory.mktemp("reports")
    torch.set_num_threads(2)
    paths = []
    for b in (1, 2, 3, 4, 6):
        opts = BenchOptions(
            batch_size=b,
            steps=2,
            warmup=1,
            data_dir=str(tiny_data_dir),
            overrides=list(TINY_MODEL),
            output=str(out / f"baseline_b{b}.json"),
            progress=False,
        )
        run_bench(opts)
        paths.append(out / f"baseline_b{b}.json")
    return paths


def test_held_out_cpu_measurements_within_ten_percent(cpu_reports):
    (mm,) = fit_reports(cpu_reports, held_out_batch_sizes=[3, 6])
    assert mm.source == "measured" and mm.key["device_kind"] == "cpu"
    assert mm.validation["held_out_points"] >= 4  # two counted steps each of batch 3 and 6
    assert mm.validation["max_abs_rel_error"] < 0.10, mm.residuals()
    assert mm.allocated.fixed_mib > 0 and mm.allocated.per_padded_hit_mib > 0


def test_bench_records_the_host_load(cpu_reports):
    from heptstudy.measure.report import read_report

    load = read_report(cpu_reports[0]).environment.load_average_1min
    assert isinstance(load, float) and load >= 0.0


def test_fake_estimate_matches_cpu_live_bytes(tiny_data_dir):
    from heptstudy.data import load_events
    from heptstudy.fit import estimate_step
    from heptstudy.measure.memory import make_meter
    from heptstudy.model import build_model
    from heptstudy.train.optim import build_optimizer, build_scheduler
    from heptstudy.train.trainer import forward_and_loss, train_step

    cfg = load_config(
        overrides=TINY_MODEL
        + [f"data.data_dir={tiny_data_dir}", "model.heptv2.activation_checkpointing=true"]
    )
    batch = load_events(cfg, [0, 5, 9])
    est = estimate_step(cfg, batch, device_type="cpu")
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg)
    opt, sch = build_optimizer(model, cfg.train), None
    sch = build_scheduler(opt, cfg.train)
    train_step(model, batch, opt, sch, cfg)  # LAMB state exists, as before a counted step
    meter = make_meter("cpu")
    meter.start_step(batch.values(), model=model, optimizer=opt)
    _, losses = forward_and_loss(model, batch, cfg, None)
    losses["total"].backward()
    real = meter.stop_step().peak_allocated_bytes
    assert abs(est.peak_allocated_bytes - real) / real < 0.10
    assert (
        est.device == "fake cpu"
        and est.padded_batch_hits == batch["X"].shape[0] * batch["X"].shape[1]
    )


# --------------------------------------------------------------------------- the command


def test_fit_command_with_a_stored_model(tiny_data_dir, tmp_path, capsys):
    from heptstudy.cli import main
    from heptstudy.fitting.cli import resolve_config

    platform = "configs/training/platforms/lumi_mi250x.yaml"
    _, rv, _ = resolve_config(
        "configs/training/scenarios/cld_pf_heptv2_batch512_50k.yaml",
        platform,
        "hit_heptv2_grouped_tracker_features",
        str(tiny_data_dir),
    )
    key = model_key(rv.config.to_dict(), "rocm")
    mm = fit_points(
        key,
        [Point(b, L, 2000 + 0.5 * b * L) for b in (1, 4) for L in (128, 512)],
        source="estimated",
        source_detail="hand-made for the test",
    )
    mm.save(tmp_path / "fits" / "lumi.json")
    args = [
        "fit",
        "--platform",
        platform,
        "--per-device-batch",
        "48",
        "--data-dir",
        str(tiny_data_dir),
        "--fits-dir",
        str(tmp_path / "fits"),
    ]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert text.startswith("48 events per lumi_mi250x GCD: fits, with ")
    assert "ESTIMATED" in text and "SYNTHETIC" in text and "safety margin" in text
    assert main(args + ["--json", "--safety-margin-gib", "63.9"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["answer"].startswith(
        "48 events per lumi_mi250x GCD: does NOT fit: expected to fail 50,000 times"
    )
    assert out["memory_model"]["source"] == "estimated" and out["synthetic_data"]
    assert out["result"]["largest_safe_batch"] is None  # not even one event fits in 0.1 GiB
