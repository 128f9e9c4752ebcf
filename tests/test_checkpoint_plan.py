"""Checkpoint plans: one value per plan, applied once; count plans; the measured order; the
storage tracker's by-module breakdown."""

import pytest
import torch

from heptstudy.config import FIXED_PLANS, load_config
from heptstudy.errors import HeptstudyError
from heptstudy.measure.parity import build_seeded
from heptstudy.meters.memory import MIB, make_meter, module_owner
from heptstudy.model import example_batch
from heptstudy.model.adaptive_checkpointing import (
    DEFAULT_PLAN_ORDER,
    candidate_plans,
    plan_order,
)
from heptstudy.model.checkpoint_plan import (
    FULL,
    NAMED,
    OFF,
    apply_plan,
    plan_named,
    plan_of,
    report_part,
    unwrapped_name,
)
from heptstudy.model.plan_front import order_by_cost
from heptstudy.train.step import run_step
from tests.conftest import TINY_MODEL

CPU = torch.device("cpu")


def _config(*extra):
    return load_config(overrides=[*TINY_MODEL, "model.heptv2.dropout=0.3", *extra])


def _step(config, batch, plan=None, meter=None):
    model = build_seeded(config, CPU).train()
    torch.manual_seed(5)
    result = run_step(
        model, batch, None, None, config, None, meter=meter, keep_outputs=True, plan=plan
    )
    grads = {
        unwrapped_name(n): p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }
    return result, grads


def test_every_name_is_one_plan():
    assert tuple(NAMED) == (*FIXED_PLANS, "auto")
    assert plan_named(True) is FULL and plan_named(False) is OFF
    for name, plan in NAMED.items():
        assert plan_named(name) is plan
        cfg = _config(f"model.heptv2.activation_checkpointing={name}")
        assert plan_of(cfg.model.heptv2) is plan
    assert plan_named("true") is FULL and plan_named("Every2") is NAMED["every2"]
    with pytest.raises(HeptstudyError, match="not a checkpointing plan.*every2"):
        plan_named("every4")
    layers2 = plan_of(_config("model.heptv2.activation_checkpointing=Layers02").model.heptv2)
    assert (layers2.name, layers2.count, report_part(layers2.name)) == (
        "layers2",
        2,
        "checkpointed_layers2",
    )
    assert [report_part(p.name) for p in (OFF, FULL, NAMED["every2"])] == [
        "baseline",
        "checkpointed",
        "checkpointed_every2",
    ]


def test_plan_is_applied_once_and_keeps_the_state_dict():
    config = _config("model.heptv2.activation_checkpointing=true")
    model = build_seeded(config, CPU)
    plain = build_seeded(_config(), CPU)
    assert model.checkpoint_plan is FULL
    assert list(model.state_dict()) == list(plain.state_dict())
    assert [unwrapped_name(n) for n, _ in model.named_parameters()] == [
        n for n, _ in plain.named_parameters()
    ]
    with pytest.raises(HeptstudyError, match="already applied"):
        apply_plan(model, OFF)


def test_count_plan_checkpoints_the_first_layers_with_exact_results():
    auto = _config("model.heptv2.activation_checkpointing=auto")
    batch = example_batch(auto, 2, [70, 50], seed=3)
    two = plan_named("layers2", auto.model.heptv2.num_convs)
    assert [two.checkpoints(("backbone", i)) for i in range(3)] == [True, True, False]
    assert not two.checkpoints(("decoder", 0))
    base, base_grads = _step(_config(), batch)
    ckpt, ckpt_grads = _step(auto, batch, plan=two)
    for k in base.outputs:
        assert torch.equal(base.outputs[k], ckpt.outputs[k]), k
    assert torch.equal(base.losses["total"], ckpt.losses["total"])
    assert base_grads.keys() == ckpt_grads.keys()
    for n in base_grads:
        assert torch.equal(base_grads[n], ckpt_grads[n]), n
    with pytest.raises(HeptstudyError, match="layers3.*1 to 2"):
        plan_named("layers3", 3)


def test_a_count_plan_is_a_plan_of_its_own_with_the_results_of_off():
    """``layers2`` as the configuration's plan: the model is built with the first two backbone
    layers checkpointed, and its step gives off's results exactly, at a lower peak."""
    batch = example_batch(_config(), 2, [70, 50], seed=3)
    base, base_grads = _step(_config(), batch, meter=make_meter(CPU))
    layers2 = _config("model.heptv2.activation_checkpointing=layers2")
    two, two_grads = _step(layers2, batch, meter=make_meter(CPU))
    assert torch.equal(base.losses["total"], two.losses["total"])
    assert all(torch.equal(base_grads[n], two_grads[n]) for n in base_grads)
    assert two.memory.peak_allocated_bytes < base.memory.peak_allocated_bytes


def test_plan_order_default_configured_or_the_platforms():
    config = _config("model.heptv2.activation_checkpointing=auto")
    order, source = plan_order(config)  # the tiny model: no cost table holds for it
    assert order == list(DEFAULT_PLAN_ORDER) and source.startswith("the default order")
    # three layers: count plans up to two, then full
    assert [p.name for p in candidate_plans(config)] == ["off", "layers1", "layers2", "full"]

    class Platform:
        name, auto_plan_order = "measured", ["every2", "full"]

    assert plan_order(config, Platform())[0] == ["every2", "full"]
    given = _config(
        "model.heptv2.activation_checkpointing=auto", "model.heptv2.auto_plan_order=[layers1,full]"
    )
    assert plan_order(given, Platform()) == (["layers1", "full"], "model.heptv2.auto_plan_order")


def test_order_by_cost_keeps_only_plans_that_save_more_for_more():
    measured = {
        "off": (0.0, 4000.0),
        "selective": (28.0, 3100.0),  # costs more than every2 and saves less: left out
        "every2": (24.0, 2700.0),
        "every3": (16.0, 3160.0),
        "full": (24.5, 600.0),
    }
    assert order_by_cost(measured) == ["every3", "every2", "full"]


def test_breakdown_by_module_adds_up_to_the_peak():
    config = _config("model.heptv2.activation_checkpointing=true")
    batch = example_batch(config, 2, [70, 50], seed=3)
    meter = make_meter(CPU, track_categories=True)
    result, _ = _step(config, batch, meter=meter)
    mem = result.memory
    owners = mem.by_module_at_peak
    total = sum(sum(c.values()) for c in owners.values())
    assert total == mem.peak_allocated_bytes
    for category, nbytes in mem.categories_at_peak.items():
        assert sum(c.get(category, 0) for c in owners.values()) == nbytes
    # the baseline, and storages made by the modules of the backbone (inputs of the next
    # checkpointed layer, or the recomputation at the peak)
    assert {"parameters", "inputs"} <= owners.keys()
    assert owners["parameters"] == {"parameters": mem.categories_at_peak["parameters"]}
    assert any(o.startswith("backbone.") for o in owners)
    assert module_owner("backbone.2._checkpoint_wrapped_module.qkv") == "backbone.2"
    assert module_owner("module.heads.norm") == "heads"
    assert module_owner("") == "model"
    assert mem.peak_allocated_bytes / MIB > 0
