"""Will it fit: the occupancy tail, the memory model (allocated and reserved) and its held-out
validation on the committed H200 reports, which reports and models are refused and why, the
fake-device estimate against CPU live bytes, and `heptstudy fit` (from any folder)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY_MODEL

from heptstudy.config import load_config
from heptstudy.data.sampler import InterleavedShardSampler
from heptstudy.estimate.keys import mismatches, model_key
from heptstudy.estimate.memory_model import (
    FitError,
    LinearFit,
    MemoryModel,
    Point,
    ReservedFit,
    fit_allocated,
    fit_points,
)
from heptstudy.fitting import FitRequest, fit, occupancy
from heptstudy.fitting.predict import evaluate
from heptstudy.fitting.reports import fit_reports
from heptstudy.fitting.select import choose_model
from heptstudy.measure.report import read_report

REPO = Path(__file__).resolve().parents[1]
H200 = REPO / "experiments" / "h200_2026-11-30"
FITS = REPO / "configs" / "fit"
MIB_PER_GIB = 1024.0


def _model(fixed, per_hit, per_event=0.0, ratio=None) -> MemoryModel:
    return MemoryModel(
        key={},
        source="measured",
        source_detail="hand-made",
        allocated=LinearFit(fixed, per_hit, per_event),
        reserved=None if ratio is None else ReservedFit(ratio),
        allocated_points=[],
    )


# --------------------------------------------------------------------------- the occupancy tail


def test_batch_longest_distribution_matches_the_sampler():
    # 40 events in 4 shards; the sampler's batches of 4 over 400 epochs against the formula
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 100, size=40)
    sampler = InterleavedShardSampler([10, 10, 10, 10], seed=3)
    longest = np.array([lengths[sampler.take(4)].max() for _ in range(4000)])
    for level in (60, 85, 95):
        want = occupancy.batch_longest_cdf(lengths, 4, [level])[0]
        assert abs((longest <= level).mean() - want) < 0.03, level


def test_probabilities_by_hand():
    # 10 events, 1 too long: a batch of 2 holds it with probability 1 - C(9,2)/C(10,2) = 0.2
    assert occupancy.p_step_fails(10, 1, 2, 1) == pytest.approx(0.2)
    # two ranks: 4 events per step, 1 - C(9,4)/C(10,4) = 0.4
    assert occupancy.p_step_fails(10, 1, 2, 2) == pytest.approx(0.4)
    # 2 steps of 2 events meet it with 1 - C(9,4)/C(10,4); a whole epoch always does
    assert occupancy.p_run_fails(10, 1, 2, 1, 2) == pytest.approx(0.4)
    assert occupancy.p_run_fails(10, 1, 2, 1, 5) == 1.0
    # 3 ranks over 10 events: each epoch leaves one event out, so one epoch misses the bad one
    # with probability 1/10, and two epochs with 1/100
    assert occupancy.p_run_fails(10, 1, 3, 3, 1) == pytest.approx(0.9)
    assert occupancy.p_run_fails(10, 1, 3, 3, 2) == pytest.approx(0.99)
    assert occupancy.p_run_fails(10, 0, 3, 3, 10**6) == 0.0


def test_answer_counts_the_longest_event_and_the_whole_recipe():
    # nine events of 10 hits and one of 100; 1000 MiB + 1 MiB per padded hit; 1150 MiB usable
    lengths = [10] * 9 + [100]
    ans = evaluate(_model(1000.0, 1.0), lengths, 2, 1150 / MIB_PER_GIB, num_steps=50)
    assert not ans.fits
    assert ans.worst_batch["longest_padded"] == 100
    assert ans.worst_batch["allocated_gib"] * MIB_PER_GIB == pytest.approx(1200)
    assert ans.worst_batch["margin_gib"] * MIB_PER_GIB == pytest.approx(-50)
    t = ans.criterion
    assert (t.quantity, t.events_too_long, t.longest_fitting_padded) == ("allocated", 1, 10)
    assert t.p_step_fails == pytest.approx(0.2)
    assert t.p_run_fails == 1.0  # 50 steps of 2 = ten epochs: the long event is always met
    assert t.expected_failing_steps == pytest.approx(10)
    assert t.largest_safe_batch == 1  # 1000 + 100 <= 1150 < 1000 + 200
    assert ans.typical_batches[0]["longest_padded"] == 10  # the median batch: short events only


def test_reserved_is_the_criterion_when_modelled():
    lengths = [10] * 9 + [100]
    # 500 MiB + 1 MiB per padded hit allocated, reserved 1.5 x that; 1000 MiB usable: allocated
    # fits every batch (at most 700), reserved not a batch holding the long event (1050)
    ans = evaluate(_model(500.0, 1.0, ratio=1.5), lengths, 2, 1000 / MIB_PER_GIB, num_steps=1)
    assert ans.criterion.quantity == "reserved" and not ans.fits
    assert ans.worst_batch["reserved_gib"] * MIB_PER_GIB == pytest.approx(1050)
    assert ans.worst_batch["margin_gib"] * MIB_PER_GIB == pytest.approx(-50)
    assert ans.allocated_only.events_too_long == 0 and ans.criterion.events_too_long == 1
    assert ans.criterion.p_run_fails == pytest.approx(0.2)  # one step of 2 of the 10 events
    assert ans.criterion.largest_safe_batch == 1  # 1.5 x (500 + 100 b) <= 1000
    assert ans.allocated_only.largest_safe_batch == 5  # 500 + 100 b <= 1000


def test_packed_answer_follows_a_batch_of_slots_not_its_longest_event():
    """Nine events of 10 hits and one of 100, 1 MiB per slot: a padded batch of 2 holding the
    long event takes 200 slots, a packed one 110, so packing fits where padding does not."""
    lengths = [10] * 9 + [100]
    usable = 1150 / MIB_PER_GIB
    padded = evaluate(_model(1000.0, 1.0), lengths, 2, usable, num_steps=50)
    packed = evaluate(_model(1000.0, 1.0), lengths, 2, usable, num_steps=50, batching="packed")
    assert not padded.fits and packed.fits
    assert packed.worst_batch["padded_batch_hits"] == 110  # the two longest events together
    assert packed.worst_batch["allocated_gib"] * MIB_PER_GIB == pytest.approx(1110)
    t = packed.criterion
    assert t.longest_fitting_padded == 150 and t.p_step_fails == 0.0  # the most slots that fit
    assert t.largest_safe_batch == 6  # 100 + 5 x 10 = 150 slots fit, 7 events take 160
    # a tighter device: batches holding the long event (2 of every 10 draws) overflow
    tight = evaluate(
        _model(1000.0, 1.0), lengths, 2, 1050 / MIB_PER_GIB, num_steps=1, batching="packed"
    )
    assert not tight.fits and tight.criterion.p_step_fails == pytest.approx(0.2, abs=0.02)
    assert [r["padded_batch_hits"] for r in packed.typical_batches] == [20, 110, 110]


# --------------------------------------------------------------------------- the memory model


def test_nnls_recovers_known_coefficients_and_validates_both_peaks():
    alloc = [Point(b, L, 500 + 0.25 * b * L + 3 * b) for b in (1, 2, 4, 8) for L in (64, 128, 256)]
    reserved = [Point(p.batch_size, p.longest_padded, 1.25 * p.peak_mib) for p in alloc]
    fit = fit_allocated(alloc)
    assert (fit.fixed_mib, fit.per_padded_hit_mib, fit.per_event_mib) == pytest.approx(
        (500, 0.25, 3), rel=1e-6
    )
    mm = fit_points({"attention_backend": "plain"}, alloc, reserved)
    assert mm.reserved.ratio == pytest.approx(1.25)
    assert [r["held_out_batch_size"] for r in mm.validation["reserved"]["rows"]] == [1, 2, 4, 8]
    assert mm.held_out_error("allocated") < 1e-9 and mm.held_out_error("reserved") < 1e-9
    again = MemoryModel.from_dict(json.loads(json.dumps(mm.to_dict())))
    assert again.predict_reserved_mib(3, 100) == pytest.approx(1.25 * (500 + 75 + 9))


def test_single_batch_size_is_fitted_but_not_validated():
    mm = fit_points({}, [Point(4, L, 100 + 0.1 * 4 * L) for L in (128, 256, 512)])
    assert mm.held_out_error("allocated") is None
    assert "no batch size can be left out" in mm.validation["allocated"]["why"]
    with pytest.raises(FitError, match="two different padded batch sizes"):
        fit_allocated([Point(4, 128, 100.0)])


@pytest.fixture(scope="module")
def h200_models():
    models, rejected = fit_reports([H200])
    return {m.key["checkpointing"]: m for m in models}, rejected


def test_h200_reports_give_validated_models(h200_models):
    models, rejected = h200_models
    assert sorted(Path(r.path).name for r in rejected) == [
        "parity_deterministic_b1.json",
        "parity_deterministic_b1_fused.json",
    ]
    assert all("only memory reports" in r.reason for r in rejected)
    full = models["full"]
    assert full.key["device_kind"] == "cuda" and full.key["attention_backend"] == "plain"
    assert full.provenance["device_names"] == ["NVIDIA H200"]
    assert full.provenance["torch_versions"] == ["2.11.0+cu130"]
    for mm in (models["off"], full):
        assert [r["held_out_batch_size"] for r in mm.validation["allocated"]["rows"]] == [4, 16, 48]
        assert mm.held_out_error("allocated") <= 0.10, mm.validation
        assert mm.held_out_error("reserved") is not None  # reported, whatever it is
    # every batch of 48 measured with checkpointing within 2% of the fit
    for p in full.allocated_points:
        if p.batch_size == 48:
            pred = full.predict_allocated_mib(48, p.longest_padded)
            assert abs(pred - p.peak_mib) / p.peak_mib < 0.02
    # the policies measured at batch 4 only: fitted, not validated
    assert models["selective"].held_out_error("allocated") is None


def test_stored_measured_models_are_the_fit_of_the_committed_reports(h200_models):
    models, _ = h200_models
    stored = [MemoryModel.load(p) for p in sorted(FITS.glob("*_measured.json"))]
    assert len(stored) == 2
    for s in stored:
        assert s.source == "measured" and "h200_2026-11-30" in s.provenance["reports"][0]
        refit = models[s.key["checkpointing"]]
        assert s.key == refit.key
        assert s.allocated.per_padded_hit_mib == pytest.approx(refit.allocated.per_padded_hit_mib)
        assert s.reserved.ratio == pytest.approx(refit.reserved.ratio)


@pytest.fixture
def fresh_fits(tmp_path):
    """A copy of configs/fit whose models carry the fingerprint of the code that runs now, as if
    regenerated for it (same figures): for tests of how a model is chosen, not of staleness."""
    from heptstudy import fingerprint as code_fingerprint

    out = tmp_path / "fits"
    out.mkdir()
    for path in FITS.glob("*.json"):
        mm = MemoryModel.load(path)
        mm.fingerprint = code_fingerprint.make(mm.source, mm.key)
        mm.save(out / path.name)
    return out


# --------------------------------------------------------------------------- refusals, with why


def _h200_key(**changes):
    config = read_report(H200 / "checkpointed_b48.json").config
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        d = config
        for part in path:
            d = d[part]
        d[last] = value
    return config


def test_fused_configuration_is_told_why_the_plain_reports_do_not_hold(fresh_fits):
    key = model_key(_h200_key(model__heptv2__attention_backend="fused"), "cuda")
    with pytest.raises(FitError) as err:
        choose_model(key, [H200])
    text = str(err.value)
    assert "attention_backend: model 'plain', configured 'fused'" in text
    assert "checkpointed_b16.json, checkpointed_b4.json, checkpointed_b48.json" in text
    assert "parity_deterministic_b1.json: a 'parity' report" in text
    # allowed to fall back: the stored model of its own key answers (one made from this code),
    # the measured one is a cross-check that names the difference
    choice = choose_model(key, [H200], fresh_fits, stored_if_reports_unusable=True)
    assert choice.model is not None and choice.model.key["attention_backend"] == "fused"
    assert any(
        m.source == "measured" and d == ["attention_backend: model 'plain', configured 'fused'"]
        for _, m, d in choice.cross_checks
    )


def test_other_device_kind_and_failed_reports_are_refused(tmp_path):
    bad = json.loads((H200 / "checkpointed_b4.json").read_text())
    bad["status"], bad["error"] = "oom", "CUDA out of memory. Tried to allocate 2 GiB"
    bad["oom"] = {"message": bad["error"], "batch_size": 4, "padded_hits": []}
    (tmp_path / "oom_b4.json").write_text(json.dumps(bad))
    (tmp_path / "notes.json").write_text(json.dumps({"hello": 1}))
    shutil.copy(H200 / "checkpointed_b16.json", tmp_path)
    shutil.copy(H200 / "checkpointed_b48.json", tmp_path)
    key = model_key(_h200_key(), "rocm")
    with pytest.raises(FitError) as err:
        choose_model(key, [tmp_path])
    text = str(err.value)
    assert "oom_b4.json: status 'oom' (CUDA out of memory. Tried to allocate 2 GiB)" in text
    assert "notes.json: not a heptstudy bench report" in text
    assert "device_kind: model 'cuda', configured 'rocm'" in text
    with pytest.raises(FitError, match="no such file or directory"):
        choose_model(key, [tmp_path / "missing"])


def test_mismatches_name_the_field_and_the_assumed_defaults():
    have = model_key(_h200_key(), "cuda")
    want = model_key(_h200_key(model__heptv2__width=256), "cuda")
    diffs, _ = mismatches(have, want)
    assert diffs == ["model.heptv2.width: model 512, configured 256"]
    old = json.loads(json.dumps(have))
    hash_seed = old["model"]["heptv2"].pop("hash_seed")  # a field the model predates
    diffs, assumed = mismatches(old, model_key(_h200_key(), "cuda"))
    assert diffs == [] and assumed == [f"model.heptv2.hash_seed={hash_seed!r}"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"per_device_batch": 0}, "per-device batch 0 is not allowed"),
        ({"per_device_batch": True}, "per-device batch True is not allowed"),
        ({"safety_margin_gib": -5.0}, "--safety-margin-gib -5.0 is not allowed"),
        ({"safety_margin_gib": float("nan")}, "--safety-margin-gib nan is not allowed"),
    ],
)
def test_bad_requests_are_refused(changes, message):
    with pytest.raises(FitError, match=message):
        FitRequest(**{"platform": "h100", "per_device_batch": 4, **changes})


# --------------------------------------------------------------------------- the fake estimate


def test_fake_estimate_matches_cpu_live_bytes(tiny_data_dir):
    from heptstudy.data.batching import load_events
    from heptstudy.estimate.fake_step import estimate_step
    from heptstudy.meters.memory import make_meter
    from heptstudy.model import build_model
    from heptstudy.train.optim import build_optimizer, build_scheduler
    from heptstudy.train.step import run_step

    cfg = load_config(
        overrides=TINY_MODEL
        + [f"data.data_dir={tiny_data_dir}", "model.heptv2.activation_checkpointing=true"]
    )
    batch = load_events(cfg, [0, 5, 9])
    est = estimate_step(cfg, batch, device_type="cpu")
    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg)
    opt = build_optimizer(model, cfg.train)
    sch = build_scheduler(opt, cfg.train)
    run_step(model, batch, opt, sch, cfg, None)  # LAMB state exists, as before a counted step
    real = run_step(model, batch, opt, sch, cfg, None, meter=make_meter("cpu")).memory
    real = real.peak_allocated_bytes
    assert abs(est.peak_allocated_bytes - real) / real < 0.10
    assert est.padded_batch_hits == batch["X"].shape[0] * batch["X"].shape[1]
    from heptstudy import stand_ins

    assert stand_ins.active() is None  # the stand-ins are gone after the fake step


def test_no_mock_in_production_code():
    offenders = [
        str(p.relative_to(REPO))
        for p in (REPO / "heptstudy").rglob("*.py")
        if "unittest.mock" in p.read_text() or "mock.patch" in p.read_text()
    ]
    assert offenders == []


# --------------------------------------------------------------------------- the command


def _h100_with(tmp_path, backend: str) -> str:
    """A copy of the h100 profile running ``backend`` (whatever the profile's default is)."""
    text = (REPO / "configs/training/platforms/h100.yaml").read_text()
    path = tmp_path / f"h100_{backend}.yaml"
    path.write_text(re.sub(r"(?m)^attention_backend:.*$", f"attention_backend: {backend}", text))
    return str(path)


def test_fit_from_outside_the_repository(tiny_data_dir, tmp_path, monkeypatch, capsys):
    from heptstudy.cli import main

    monkeypatch.chdir(tmp_path)  # configs/... and the stored fits resolve from the repository
    args = [
        "fit",
        "--platform",
        "h100",
        "--per-device-batch",
        "1",
        "--data-dir",
        str(tiny_data_dir),
        # the tiny model at one event per device: estimated in two fake steps; the stored fits (of the full model) are read from
        # the repository and each is named with why it does not hold
        *(f"--set={o}" for o in TINY_MODEL),
    ]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert text.startswith("1 events per h100 GPU: fits on this data")
    assert f"{FITS}/" in text and "SYNTHETIC" in text
    assert "GiB reserved of 72.0 GiB usable (80 GiB less the 8 GiB safety margin" in text
    # 0.05 GiB usable: less than the two cuBLAS workspaces alone
    assert main(args + ["--json", "--safety-margin-gib", "79.95"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["answer"].startswith("1 events per h100 GPU: does NOT fit on this data")
    assert out["result"]["criterion"]["quantity"] == "reserved"
    assert out["result"]["criterion"]["p_run_fails"] == 1.0
    assert out["result"]["criterion"]["largest_safe_batch"] is None  # not one event
    assert main(args + ["--safety-margin-gib", "80"]) == 2
    assert "platform 'h100' has 80 GiB per device" in capsys.readouterr().err


def test_fused_platform_is_told_why_the_measured_model_does_not_hold(
    tiny_data_dir, tmp_path, capsys, fresh_fits
):
    from heptstudy.cli import main

    args = ["fit", "--platform", _h100_with(tmp_path, "fused"), "--per-device-batch", "24"]
    args += ["--data-dir", str(tiny_data_dir), "--fits-dir", str(fresh_fits)]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert text.startswith("24 events per h100 GPU: fits on this data by an ESTIMATED model")
    # the stored fused model is a target-faithful GPU estimate: it carries reserved
    assert "Criterion: peak reserved" in text
    assert (
        "Cross-check, not the answer (attention_backend: model 'plain', configured 'fused')" in text
    )
    assert main(args + ["--reports", str(H200)]) == 2
    assert "none of the reports given fits" in capsys.readouterr().err


def test_measured_model_answers_a_plain_cuda_platform(tiny_data_dir, tmp_path, fresh_fits):
    result = fit(
        FitRequest(
            platform=_h100_with(tmp_path, "plain"),
            data_dir=str(tiny_data_dir),
            fits_dir=str(fresh_fits),
        )
    )
    assert result.model.source == "measured" and result.answer.criterion.quantity == "reserved"
    assert result.answer.per_device_batch == 48  # the recipe's: 384 over 8 devices
    assert result.model_origin.endswith("plain_ckpt-full_a094eac16527_measured.json")
    w = result.answer.worst_batch
    assert w["reserved_gib"] == pytest.approx(result.model.reserved.ratio * w["allocated_gib"])


def test_report_layer_on_the_h200_reports(tiny_data_dir):
    import matplotlib

    matplotlib.use("Agg")
    from heptstudy import study

    reports = study.load_reports(H200)
    fig, table, why = study.optional_fit_figure(reports)
    assert why == "" and set(table["checkpointing"]) >= {"off", "full"}
    validation, why = study.fit_validation(reports)
    assert set(validation["peak"]) == {"allocated", "reserved"}
    allocated = validation[validation["peak"] == "allocated"]
    assert allocated["max |error| [%]"].max() <= 10.0
    runs = study.reports_frame(reports).assign(data_dir=str(tiny_data_dir))
    figure, predictions, skipped = study.platform_predictions(runs, reports)
    # the plain-attention CUDA reports answer for h100 when its profile runs the plain attention;
    # never for LUMI (ROCm), which a stored estimate of this code answers, or, when the stored
    # ones are of other code (refused, see configs/fit/README.md), no model: skipped, with why
    from heptstudy.scenario import find_platform

    h100_plain = find_platform("h100")[0].attention_backend == "plain"
    models = dict(zip(predictions["platform"], predictions["memory model"], strict=True))
    if h100_plain:
        assert models["h100"].startswith("measured (reports")
    for name in ("h100", "lumi_mi250x"):
        if name in models:
            assert models[name].startswith(("measured", "estimated"))
        else:
            assert any(s.startswith(f"{name}: no measured or stored memory model") for s in skipped)
    assert len(models) + len(skipped) == 2
    panels = [ax for ax in figure.axes if ax.get_xlabel()]
    assert len(panels) == len(models)  # one panel per answered platform
    figure.canvas.draw()
    for ax in panels:
        # the device line drawn below the top, the legend below the panel (inside, the device
        # line and the histogram drawn over the panel crossed it)
        device = next(line for line in ax.get_lines() if line.get_label().startswith("device"))
        assert device.get_ydata()[0] < ax.get_ylim()[1]
        legend = ax.get_legend().get_window_extent()
        assert legend.y1 < ax.get_window_extent().y0


# --------------------------------------------------------------------------- auto checkpointing


def _auto_predictor():
    from heptstudy.model.adaptive_checkpointing import PlanPredictor
    from heptstudy.model.checkpoint_plan import FULL, OFF

    # per padded hit: off 1 MiB, full 0.25 MiB; budget 15 MiB: events of 10 hits run off, 20
    # full, 100 not at all
    models = {"off": _model(0.0, 1.0), "full": _model(0.0, 0.25)}
    return PlanPredictor([OFF, FULL], models, 15.0, "hand-made budget")


def test_auto_answer_by_hand():
    from heptstudy.fitting.auto import auto_words, evaluate_auto

    lengths = np.array([10, 10, 10, 20, 100])
    a = evaluate_auto(
        _auto_predictor(), lengths, 1, rates={"off": 1e-3, "full": 2e-3}, rate_sources={"off": 4}
    )
    assert a.plan_fractions == pytest.approx({"off": 0.6, "full": 0.2})
    assert a.checkpointing_fraction == pytest.approx(0.2)
    assert a.p_batch_exceeds_budget == pytest.approx(0.2)
    assert a.p_step_exceeds_budget == pytest.approx(0.2)
    # over the batches that run: 3/4 off at 10 hits x 1 ms, 1/4 full at 20 hits x 2 ms
    assert a.mean_step_s == pytest.approx(0.75 * 0.010 + 0.25 * 0.040)
    assert a.mean_step_full_s == pytest.approx(0.75 * 0.020 + 0.25 * 0.040)
    assert "P(step exceeds the budget) = 0.2" in "\n".join(auto_words(a))
    predictor = _auto_predictor()
    predictor.order_source = "model.heptv2.auto_plan_order"
    said = "\n".join(auto_words(evaluate_auto(predictor, lengths, 1)))
    assert "  plans, cheapest first: off, full (model.heptv2.auto_plan_order)" in said
    # two ranks per step: a step fails when either batch holds the 100-hit event
    two = evaluate_auto(_auto_predictor(), lengths, 1, world_size=2)
    assert two.p_step_exceeds_budget == pytest.approx(1 - (4 / 5) * (3 / 4))


def test_auto_step_time_is_not_invented_without_measurements():
    from heptstudy.fitting.auto import auto_words, evaluate_auto

    a = evaluate_auto(_auto_predictor(), np.array([10, 20]), 1, rates={"off": 1e-3})
    assert a.mean_step_s is None and a.mean_step_full_s is None
    assert "not available" in a.not_available and "full" in a.not_available
    assert a.not_available in "\n".join(auto_words(a))


def test_auto_rates_come_from_each_steps_plan():
    from types import SimpleNamespace as NS

    from heptstudy.data.layout import BatchGeometry
    from heptstudy.fitting.auto import measured_rates
    from heptstudy.model.checkpoint_plan import AUTO, FULL

    def step(plan, t, padded, batching="padded", counted=True):
        g = BatchGeometry.of_events(padded, batching)
        return NS(counted=counted, time_s=t, geometry=g, checkpoint_plan=plan)

    auto = NS(
        kind="memory",
        status="ok",
        plan=AUTO,
        steps=[step("off", 2.0, [10, 20]), step("full", 8.0, [20, 20])],
    )
    full = NS(
        kind="memory",
        status="ok",
        plan=FULL,
        steps=[step(None, 4.0, [20, 10]), step(None, 9.0, [5], counted=False)],
    )
    packed = NS(kind="memory", status="ok", plan=FULL, steps=[step(None, 3.0, [20, 10], "packed")])
    rates, used = measured_rates([auto, full, packed])
    # padded: a batch of events of 10 and 20 hits computes over 2 x 20 slots
    assert rates == pytest.approx({"off": 2.0 / 40, "full": (8.0 / 40 + 4.0 / 40) / 2})
    assert used == {"off": 1, "full": 2}
    # packed: over its 30 slots, and only packed steps price packed batches
    assert measured_rates([auto, full, packed], packed=True) == ({"full": 3.0 / 30}, {"full": 1})
    # a paired timing prices each of its steps (off and the plans) on its round's batch
    paired = {
        "batches": [{"geometry": {"events": 2, "slots": 40, "longest": 20, "packed": False}}],
        "steps": [
            {"plan": "off", "batch": 0, "time_s": 2.4},
            {"plan": "keep70", "batch": 0, "time_s": 2.8},
            {"plan": "off", "batch": 0, "time_s": 2.0},
            # auto's step prices the plan it ran
            {"plan": "auto", "ran": "keep70", "batch": 0, "time_s": 3.2},
        ],
    }
    rates, used = measured_rates([auto], paired=[paired])
    assert rates == pytest.approx({"off": 2.0 / 40, "full": 8.0 / 40, "keep70": 3.0 / 40})
    assert used == {"off": 3, "full": 1, "keep70": 2}


def test_auto_step_times_come_from_the_study_s_reports_of_this_configuration():
    from heptstudy.fitting.api import _timed_reports

    # the study folder whose front is timed in pairs: its paired timings price the solver plans
    # (their memory-only reports time nothing); only what the folder holds is under test
    study = REPO / "experiments" / "study_paired_epyc"
    plain = ["model.heptv2.attention_backend=plain"]
    key = model_key(load_config(overrides=plain).to_dict(), "cpu")
    bench, paired, other = _timed_reports([study], key)
    assert sorted(r["name"] for r in paired) == ["packed_paired_b4", "paired_b4"]
    assert {r.name for r in bench} >= {"baseline_b4", "checkpointed_keep25_b4"} and not other
    # measured on a CPU in float32: no step time of it prices a bfloat16 configuration
    bf16 = model_key(load_config(overrides=[*plain, "train.dtype=bfloat16"]).to_dict(), "cpu")
    bench, paired, other = _timed_reports([study], bf16)
    assert bench == paired == [] and "paired_b4.json" in other and "baseline_b4.json" in other


def test_auto_on_packed_batches_follows_the_packed_slots():
    """A budget between the packed and the padded geometry: padded batches of a long and a short
    event must checkpoint, the same events packed need not."""
    from heptstudy.fitting.auto import evaluate_auto

    lengths = np.array([10, 100])  # one batch of both: padded 2 x 100 slots, packed 110
    # off 1 MiB per slot, full 0.25; budget 150 MiB lies between 110 and 200
    predictor = _auto_predictor()
    predictor.budget_mib = 150.0
    padded = evaluate_auto(predictor, lengths, 2)
    packed = evaluate_auto(predictor, lengths, 2, packed=True)
    assert padded.plan_fractions == {"off": 0.0, "full": 1.0}
    assert packed.plan_fractions == {"off": 1.0, "full": 0.0}
    assert (padded.worst_batch_plan, packed.worst_batch_plan) == ("full", "off")
    assert packed.worst_batch_peak_mib == pytest.approx(110.0)
    assert "110 slots" in packed.worst_batch and "packed" in packed.worst_batch


def test_auto_reports_and_the_budget_in_the_key():
    full = model_key(_h200_key(), "cuda")
    # the budget chooses a plan, it does not change the memory a plan needs
    budget = model_key(_h200_key(model__heptv2__memory_budget_gib=3.5), "cuda")
    assert mismatches(full, budget)[0] == [] and budget["model_hash"] == full["model_hash"]
    # an auto report's steps ran several plans: it holds for none of them
    auto = model_key(_h200_key(model__heptv2__activation_checkpointing="auto"), "cuda")
    assert auto["checkpointing"] == "auto"
    assert "checkpointing: model 'auto', configured 'full'" in mismatches(auto, full)[0]


def test_auto_reports_give_no_memory_model_and_say_why():
    from heptstudy.estimate.keys import checkpointing_words

    # the committed reports are what the documented `heptstudy fit --reports
    # experiments/cpu_reference` reads, and the one auto run there that ran several plans (off
    # and layers1); only their plans are under test, not their figures
    reference = REPO / "experiments" / "cpu_reference"
    models, rejected = fit_reports([reference / "auto_b4.json", reference / "checkpointed_b4.json"])
    assert [checkpointing_words(m.key) for m in models] == ["full"]
    assert [Path(r.path).name for r in rejected] == ["auto_b4.json"]
    assert "ran different plans" in rejected[0].reason
    every2 = fit_reports([reference / "checkpointed_every2_b4.json"])[0][0]
    assert checkpointing_words(every2.key) == "every 2"


def test_fit_auto_sets_auto_on_the_fitted_variant_only(tiny_data_dir):
    from heptstudy.fitting.api import resolve_config

    # the default scenario also holds a model without a HEPTv2 backbone (track_cluster_mlpf),
    # which refuses activation_checkpointing=auto
    request = FitRequest(platform="local_cpu", checkpointing="auto", data_dir=str(tiny_data_dir))
    _, variant, _ = resolve_config(request)
    assert variant.config.model.heptv2.activation_checkpointing == "auto"


def test_fit_refuses_an_unknown_checkpointing_answer():
    with pytest.raises(FitError, match="--checkpointing 'sometimes' is not allowed"):
        FitRequest(platform="h100", checkpointing="sometimes")


def test_estimate_memory_model_fits_fake_steps(tiny_data_dir, tiny_overrides):
    """The estimated model behind `heptstudy fit` without reports: fake steps fitted per hit."""
    from heptstudy.config import load_config
    from heptstudy.estimate.fake_step import estimate_memory_model

    config = load_config(overrides=[*tiny_overrides, f"data.data_dir={tiny_data_dir}"])
    mm = estimate_memory_model(config, 2, "cpu")
    assert mm.source == "estimated"
    assert mm.reserved is None  # a CPU platform: allocated only, as before the simulator
    assert mm.predict_allocated_mib(2, 512) > mm.predict_allocated_mib(2, 128) > 0


def test_the_fit_figure_tells_every_model_apart():
    """The reference's nine memory models: no two share a colour (the report's style cycles six,
    and drew keep 25% in off's colour)."""
    import matplotlib

    matplotlib.use("Agg")
    from heptstudy import plots, study

    with matplotlib.rc_context():  # the report's style, as aggregate.ipynb draws it
        plots.use_style()
        fig, table, why = study.optional_fit_figure(
            study.load_reports(REPO / "experiments" / "cpu_reference")
        )
    assert why == "" and len(table) == 9
    colors = [
        tuple(c.get_facecolor()[0]) for c in fig.axes[0].collections if "allocated" in c.get_label()
    ]
    assert len(colors) == len(set(colors)) == 9


@pytest.mark.parametrize(
    "argv,says",
    [
        (
            ["validate", "--reports", "r", "--data-dir", "d", "--platform", "h100", "--json"],
            "error: unrecognized arguments: --platform h100 --json",
        ),
        (
            ["--per-device-batch", "-5", "validate", "--reports", "r", "--data-dir", "d"],
            "fit validate: --platform, --per-device-batch do not apply",
        ),
        (["--per-device-batch", "8", "--out", "D", "--code", "x"], "--code, --out do not apply"),
        (["--per-device-batch", "8", "--save-model", ""], "--save-model: '' is empty"),
        (["--per-device-batch", "8", "--data-dir", " "], "--data-dir: ' ' is empty"),
        (["--per-device-batch", "8", "--fits-dir", "no/such"], "--fits-dir 'no/such' is not a"),
    ],
)
def test_fit_refuses_an_option_it_would_ignore(argv, says, tmp_path, monkeypatch):
    """Options of the other mode, blank paths and a missing --fits-dir were ignored, or read as
    'not given', without a word."""
    from conftest import run_cli

    monkeypatch.chdir(tmp_path)
    platform = [] if argv[0] == "validate" else ["--platform", "h100"]
    code, _, err = run_cli("fit", *platform, *argv)
    assert code == 2 and says in err and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []


def test_fit_validate_help_is_its_own():
    from conftest import run_cli

    code, out, _ = run_cli("fit", "validate", "--help")
    assert code == 0 and out.startswith("usage: heptstudy fit validate")
    assert "--reports" in out and "--out" in out and "--per-device-batch" not in out


def test_fit_validate_refuses_a_file_as_out_before_estimating(tmp_path):
    from conftest import run_cli

    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    code, out, err = run_cli(
        "fit",
        "validate",
        "--reports",
        str(tmp_path),
        "--data-dir",
        str(tmp_path),
        "--out",
        str(notes),
    )
    assert code == 2 and f"--out {str(notes)!r} is a file, not a folder" in err, err
    assert out == "" and notes.read_text() == "mine\n"
