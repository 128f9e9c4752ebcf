"""Occupancy-adaptive checkpointing: the plan follows the batch, the result does not."""

import pytest
import torch

from heptstudy.config import load_config
from heptstudy.errors import ConfigError, HeptstudyError
from heptstudy.estimate.plans import calibrate, memory_budget_mib, predictor_for
from heptstudy.measure.parity import build_seeded
from heptstudy.meters.memory import make_meter
from heptstudy.model import example_batch
from heptstudy.model.adaptive_checkpointing import (
    NoPlanFits,
    candidate_plans,
    plan_config,
)
from heptstudy.model.checkpoint_plan import AUTO as AUTO_PLAN
from heptstudy.model.checkpoint_plan import FULL, OFF, unwrapped_name
from heptstudy.train.step import run_step
from tests.conftest import TINY_MODEL

CPU = torch.device("cpu")
AUTO = [*TINY_MODEL, "model.heptv2.activation_checkpointing=auto"]


@pytest.fixture(scope="module")
def auto_config():
    return load_config(overrides=[*AUTO, "model.heptv2.memory_budget_gib=1"])


@pytest.fixture(scope="module")
def predictor(auto_config):
    # two shapes (fake-tensor steps, about a second each): enough for a fit in B x L
    shapes = [(1, 64), (2, 480)]
    batches = [example_batch(auto_config, b, n, seed=i) for i, (b, n) in enumerate(shapes)]
    return calibrate(auto_config, batches, CPU, (1.0, "test"), plans=[OFF, FULL])


def _pass(config, batch, plan=None, measure=True):
    """One step without update from the seeded initial weights and dropout seed: outputs,
    losses, gradients and the measured peak (storage tracker)."""
    model = build_seeded(config, CPU)
    model.train()
    torch.manual_seed(99)
    meter = make_meter(CPU) if measure else None
    result = run_step(
        model, batch, None, None, config, None, meter=meter, keep_outputs=True, plan=plan
    )
    grads = {
        unwrapped_name(n): p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }
    return result.outputs, result.losses, grads, meter and result.memory.peak_allocated_mib


def _identical(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_short_batch_runs_without_and_long_batch_with_checkpointing(auto_config, predictor):
    short = example_batch(auto_config, 2, [100, 90], seed=11)
    long = example_batch(auto_config, 2, [80, 600], seed=12)
    off_cfg, full_cfg = plan_config(auto_config, OFF), plan_config(auto_config, FULL)
    off_long, full_long = _pass(off_cfg, long), _pass(full_cfg, long)
    # a budget between the long batch's measured peaks without and with checkpointing
    predictor.budget_mib = (off_long[3] + full_long[3]) / 2
    assert full_long[3] < predictor.budget_mib < off_long[3]

    short_choice = predictor.choose_for(short)
    long_choice = predictor.choose_for(long)
    assert short_choice.plan == OFF
    assert long_choice.plan == FULL
    assert long_choice.predictions_mib["off"] > predictor.budget_mib

    for batch, choice, fixed_cfg in ((short, short_choice, off_cfg), (long, long_choice, full_cfg)):
        fixed = _pass(fixed_cfg, batch, measure=False) if batch is short else full_long
        outputs, losses, grads, peak = _pass(auto_config, batch, plan=choice.plan)
        _identical(outputs, fixed[0])
        _identical(losses, fixed[1])
        _identical(grads, fixed[2])
        assert peak < predictor.budget_mib
        # the estimate counts LAMB's state too, which a step without update does not hold
        assert peak <= choice.predicted_peak_mib


def test_no_plan_fits_names_batch_prediction_and_budget(auto_config, predictor):
    long = example_batch(auto_config, 2, [80, 600], seed=12)
    predictor.budget_mib = 0.5
    with pytest.raises(NoPlanFits, match=r"events \[0, 1\].*608 hits.*budget of 0 MiB"):
        predictor.choose_for(long)


def test_auto_step_without_a_plan_is_refused(auto_config):
    model = build_seeded(auto_config, CPU)
    model.train()
    batch = example_batch(auto_config, 1, 40)
    with pytest.raises(HeptstudyError, match="without a chosen plan"):
        run_step(model, batch, None, None, auto_config, None)
    run_step(model, batch, None, None, auto_config, None, plan=OFF)
    # the step's plan was chosen, not written into the model or its configuration
    assert model.checkpoint_plan is AUTO_PLAN
    assert auto_config.model.heptv2.activation_checkpointing == "auto"


def test_configuration_of_auto_and_budget():
    assert load_config(overrides=AUTO).model.heptv2.adaptive
    assert not load_config(overrides=TINY_MODEL).model.heptv2.adaptive
    with pytest.raises(ConfigError, match="a number is not a checkpointing plan"):
        load_config(overrides=["model.heptv2.activation_checkpointing=2"])
    with pytest.raises(ConfigError, match="track_cluster_mlpf"):
        load_config(
            overrides=[
                *AUTO,
                "model.variant=track_cluster_mlpf",
                "data.dataset=cld_edm_ttbar_pf:3.2.1",
            ]
        )
    with pytest.raises(ConfigError, match="memory_budget_gib"):
        memory_budget_mib(load_config(overrides=AUTO), CPU)
    given = load_config(overrides=[*AUTO, "model.heptv2.memory_budget_gib=2.5"])
    assert memory_budget_mib(given, CPU) == (2560.0, "model.heptv2.memory_budget_gib")
    auto = load_config(overrides=AUTO)
    assert [p.name for p in candidate_plans(auto)] == ["off", "layers1", "layers2", "full"]
    one_layer = load_config(
        overrides=[
            *AUTO,
            "model.heptv2.num_convs=1",
            "model.heptv2.auto_plan_order=[selective,every2,full]",
        ]
    )
    assert [p.name for p in candidate_plans(one_layer)] == ["off", "selective", "full"]


def test_plan_order_is_configurable_and_checked():
    order = load_config(overrides=[*AUTO, "model.heptv2.auto_plan_order=[every2,full]"])
    assert [p.name for p in candidate_plans(order)] == ["off", "every2", "full"]
    for bad in ("[full,full]", "[]", "[off,full]", "[partial]"):
        with pytest.raises(ConfigError, match="auto_plan_order"):
            load_config(overrides=[*AUTO, f"model.heptv2.auto_plan_order={bad}"])
    # the order chooses among plans, it does not change their memory: same model key
    from heptstudy.estimate.keys import model_key

    plain = load_config(overrides=AUTO).to_dict()
    assert model_key(order.to_dict(), "cpu") == model_key(plain, "cpu")


@pytest.mark.slow  # auto calibrated on fake tensors, then two training steps (about 20 s)
def test_training_records_plan_and_predicted_peak_per_step(tiny_data_dir, tmp_path):
    import json

    from heptstudy.train.trainer import train
    from tests.conftest import tiny_train_overrides

    overrides = tiny_train_overrides(tiny_data_dir, tmp_path / "run", num_steps=2, val_freq=2)
    # a budget no plan can miss: this test is about the records, the choice is tested above
    config = load_config(
        overrides=[
            *overrides,
            "model.heptv2.activation_checkpointing=auto",
            "model.heptv2.memory_budget_gib=64",
        ]
    )
    with pytest.raises(HeptstudyError, match="needs a plan predictor"):
        train(config, progress=False)  # the trainer sits below the estimate: it is given one
    assert not (tmp_path / "run").exists()
    summary = train(config, progress=False, plan_predictor=predictor_for)
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    steps = [r for r in map(json.loads, lines) if r["kind"] == "train"]
    assert [r["checkpoint_plan"] for r in steps] == [["off"], ["off"]]
    assert all(0 < r["predicted_peak_mib"] < r["memory_budget_mib"] for r in steps)
    assert summary["step"] == 2


@pytest.mark.slow  # auto calibrated on fake tensors, then a bench (about 17 s)
def test_bench_report_has_plan_and_predicted_peak_next_to_measured(tiny_data_dir, tmp_path):
    from heptstudy.measure import bench
    from heptstudy.measure import report as rp
    from tests.conftest import tiny_request

    path = tmp_path / "auto_b2.json"
    request = tiny_request(
        tiny_data_dir,
        path,
        overrides=["model.heptv2.memory_budget_gib=64"],
        batch_size=2,
        steps=1,
        warmup=1,
        checkpointing="auto",
    )
    assert request.name == "auto_b2"
    bench.run_bench(request.resolve())
    report = rp.read_report(path)
    assert report.checkpointing.plan == "auto"
    assert report.checkpointing.memory_budget_mib == 64 * 1024
    for step in report.steps:
        assert step.checkpoint_plan == "off"  # nothing needs checkpointing in 64 GiB
        assert step.peak_allocated_mib <= step.predicted_peak_mib * 1.1
    # off fits every batch of the run in 64 GiB: the first round of plans (one per core) is
    # calibrated, the dearer ones are named as skipped
    described = next(n for n in report.notes if "adaptive checkpointing" in n)
    plans = candidate_plans(load_config(overrides=[*request.overrides, *AUTO]))
    calibrated = described.split("; plans ")[1].split(" (cheapest")[0].split(", ")
    assert calibrated[0] == "off" and 1 <= len(calibrated) < len(plans)
    skipped = [p.name for p in plans[len(calibrated) :]]
    assert f"{', '.join(skipped)} not tried, as every batch of the run fits" in described
    from heptstudy.measure.summary import describe

    said = describe(report)
    assert "checkpointing auto (budget 65,536 MiB; plans per step in the report)" in said
    assert f"\n  {described}" in said  # the plans tried and why in that order, on the console


def test_auto_budget_follows_the_margin_given():
    from heptstudy.config import load_platform
    from heptstudy.paths import ROOT

    h100 = load_platform(ROOT / "configs" / "training" / "platforms" / "h100.yaml")
    config = load_config(overrides=AUTO)
    # fit --safety-margin-gib 79.9 on an 80 GiB device: auto's budget is what is left
    mib, source = memory_budget_mib(config, CPU, h100, margin_gib=79.9)
    assert mib == pytest.approx(0.1 * 1024) and "79.9 GiB safety margin given" in source
    assert memory_budget_mib(config, CPU, h100)[0] == pytest.approx(80 * 0.9 * 1024)
    # a budget set in the configuration wins over any margin
    given = load_config(overrides=[*AUTO, "model.heptv2.memory_budget_gib=2.5"])
    assert memory_budget_mib(given, CPU, h100, margin_gib=79.9)[0] == 2560.0


def test_calibration_stops_once_every_batch_fits_a_plan():
    from heptstudy.data.layout import BatchGeometry
    from heptstudy.estimate.plans import _covered
    from tests.test_fit import _model

    # per padded hit: off 1 MiB, full 0.25 MiB, budget 15 MiB
    off, full = _model(0.0, 1.0), _model(0.0, 0.25)
    ten, twenty = BatchGeometry(1, 10, 10), BatchGeometry(1, 20, 20)
    assert _covered([ten], [off], 15.0)
    assert not _covered([ten, twenty], [off], 15.0)  # 20 hits need full: calibrate on
    assert _covered([ten, twenty], [off, full], 15.0)
    # full calibrated out of turn (fit's cross-check) is not tried before the plans ahead of it
    from heptstudy.estimate.plans import _tried_in_order
    from heptstudy.model.checkpoint_plan import EVERY_2

    plans = [OFF, EVERY_2, FULL]
    assert _tried_in_order(plans, {"off": off, "full": full}) == [OFF]
    assert _tried_in_order(plans, {"off": off, "every2": off, "full": full}) == plans
