"""Solver plans (``keepNN``): the keep-sets an integer program chooses from the measured op-group
cost table (`heptstudy costs`), for a budget read in the name, with the results of ``off``.

Tolerance: outputs and losses exactly equal; gradients within relative L2 ``GRAD_RTOL`` (the
packed/padded parity tolerance of tests/test_packed.py, as tests/test_op_plans.py)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest
import torch

from heptstudy.config import keep_percent, load_config
from heptstudy.data.layout import geometry_of
from heptstudy.errors import HeptstudyError
from heptstudy.estimate.plans import calibrate
from heptstudy.measure.op_costs import measure_op_costs, write_table
from heptstudy.measure.parity import build_seeded
from heptstudy.measure.report import read_report
from heptstudy.model import example_batch
from heptstudy.model.adaptive_checkpointing import DEFAULT_PLAN_ORDER, candidate_plans, plan_order
from heptstudy.model.checkpoint_plan import (
    apply_plan,
    plan_named,
    plan_of,
    solver_plans,
    unwrapped_name,
)
from heptstudy.model.cost_table import CostTableMismatch, read_cost_table
from heptstudy.model.op_groups import GROUPS
from heptstudy.model.plan_front import order_by_cost, priced_plans
from heptstudy.model.solver import CostModel, GroupCost, choose_keep, front
from heptstudy.train.plan_table import attention_mismatch, check_table_on, plans_held_on
from heptstudy.train.step import run_step
from tests.conftest import TINY_MODEL, run_cli, set_options

GRAD_RTOL = 1e-5
CPU = torch.device("cpu")
LENGTHS = [70, 41, 23]


def _hand_made(layers=None) -> CostModel:
    """bytes, seconds per slot; ``b`` is dear to keep and cheap to redo, ``c`` the opposite."""
    groups = {
        "backbone": {
            "a": GroupCost(4.0, 3.0),
            "b": GroupCost(10.0, 1.0),
            "c": GroupCost(2.0, 5.0),
            "d": GroupCost(0.0, 0.0),
        },
        "decoder": {"e": GroupCost(1.0, 0.5), "f": GroupCost(3.0, 2.2)},
    }
    return CostModel(
        groups, {"backbone": 7.0, "decoder": 1.0}, layers or {"backbone": 2, "decoder": 3}
    )


def _brute_force(model: CostModel, fraction: float) -> float:
    items = model.items()
    best = float("inf")
    for chosen in itertools.product([False, True], repeat=len(items)):
        keep = {k: frozenset() for k in model.groups}
        for (kind, name, _), kept in zip(items, chosen, strict=True):
            if kept:
                keep[kind] |= {name}
        if model.kept_bytes_per_slot(keep) <= fraction * model.total_bytes_per_slot + 1e-12:
            best = min(best, model.recompute_seconds_per_slot(keep))
    return best


def test_solver_chooses_exactly_within_the_budget_and_gains_with_it():
    model = _hand_made()
    total = model.total_bytes_per_slot  # 2*16 + 3*4 = 44
    assert total == 44
    # 30 %: 13.2 bytes; c (2 layers: 4 bytes, spares 10 s) and f (3 layers: 9 bytes, 6.6 s)
    # beat c and a (12 bytes, 16 s); adding a to them would take 21
    choice = choose_keep(model, 0.30)
    assert dict(choice.keep) == {"backbone": frozenset({"c"}), "decoder": frozenset({"f"})}
    assert choice.kept_bytes_per_slot == 13.0
    every = model.recompute_seconds_per_slot({"backbone": frozenset(), "decoder": frozenset()})
    assert choice.recompute_seconds_per_slot == pytest.approx(every - 10.0 - 6.6)
    previous = float("inf")
    for choice in front(model, range(0, 101, 5)):
        assert choice.kept_bytes_per_slot <= choice.fraction * total + 1e-9
        assert choice.recompute_seconds_per_slot == pytest.approx(
            _brute_force(model, choice.fraction)
        )
        assert choice.recompute_seconds_per_slot <= previous
        assert "d" not in choice.keep["backbone"]  # keeping it spares nothing
        previous = choice.recompute_seconds_per_slot
    assert choose_keep(model, 0.0).kept_bytes_per_slot == 0
    assert choose_keep(model, 1.0).keep["backbone"] == {"a", "b", "c"}
    with pytest.raises(HeptstudyError, match="from 0 to 1"):
        choose_keep(model, 1.5)


def test_layer_counts_weigh_the_kinds():
    """With one backbone layer and many decoder layers, the decoder's groups cost more bytes."""
    few = choose_keep(_hand_made({"backbone": 1, "decoder": 10}), 0.25)
    assert few.kept_bytes_per_slot <= 0.25 * few.total_bytes_per_slot
    assert few.total_bytes_per_slot == 16 + 40


def _config(*extra):
    return load_config(overrides=[*TINY_MODEL, "model.heptv2.dropout=0.3", *extra])


@pytest.fixture(scope="module")
def tiny_table(tmp_path_factory):
    """A cost table of the tiny model, measured by the real `costs` code on an example batch."""
    config = _config()
    batch = example_batch(config, len(LENGTHS), LENGTHS, seed=5)
    table = measure_op_costs(config, batch, repeats=1, device=CPU, data={"synthetic": True})
    return write_table(table, tmp_path_factory.mktemp("costs") / "op_costs_tiny.json")


def _step(config, batch, seed=7):
    model = build_seeded(config, CPU).train()
    torch.manual_seed(seed)
    result = run_step(model, batch, None, None, config, None, keep_outputs=True)
    grads = {
        unwrapped_name(n): p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
    }
    return result, grads, torch.get_rng_state()


def _assert_solver_parity(tiny_table, batching, plan_name):
    off = _config(f"model.heptv2.op_costs={tiny_table}")
    solver = _config(
        f"model.heptv2.op_costs={tiny_table}",
        f"model.heptv2.activation_checkpointing={plan_name}",
    )
    plan = plan_of(solver)
    kept = [names for _, names in plan.kind_keep]
    # the budget keeps some groups and recomputes others: not full, not off in disguise
    assert any(kept) and sum(map(len, kept)) < sum(map(len, GROUPS.values())), plan.label
    batch = example_batch(off, len(LENGTHS), LENGTHS, seed=5, batching=batching)
    base, base_grads, base_rng = _step(off, batch)
    ops, ops_grads, ops_rng = _step(solver, batch)
    assert base.outputs.keys() == ops.outputs.keys()
    for k in base.outputs:
        assert torch.equal(base.outputs[k], ops.outputs[k]), k
    assert torch.equal(base.losses["total"], ops.losses["total"])
    assert base_grads.keys() == ops_grads.keys() and len(base_grads) > 50
    for n in base_grads:
        diff = float((base_grads[n] - ops_grads[n]).norm())
        assert diff <= GRAD_RTOL * float(base_grads[n].norm()), n
    assert torch.equal(base_rng, ops_rng)  # dropout replayed: the same draws, no more
    other, _, _ = _step(off, batch, seed=8)
    assert not torch.equal(base.outputs["class_logits"], other.outputs["class_logits"])


def test_solver_plan_parity_padded(tiny_table):
    _assert_solver_parity(tiny_table, "padded", "keep30")


def test_solver_plan_parity_packed(tiny_table):
    _assert_solver_parity(tiny_table, "packed", "keep60")


def test_bench_runs_a_solver_plan_and_its_report_names_the_keep_sets(
    tiny_table, tiny_data_dir, tmp_path
):
    report = tmp_path / "keep30.json"
    overrides = [*TINY_MODEL, "model.heptv2.dropout=0.3", f"model.heptv2.op_costs={tiny_table}"]
    argv = ["bench", "--batch-size", "2", "--checkpointing", "keep30", "--steps", "1"]
    argv += ["--warmup", "0", "--passes", "timing", "--no-progress"]
    argv += ["--data-dir", str(tiny_data_dir), "--output", str(report), *set_options(overrides)]
    code, out, err = run_cli(*argv)
    assert code == 0, err
    written = read_report(report)
    assert written.checkpointing.plan == "keep30"
    expected = plan_named("keep30", config=load_config(overrides=overrides))
    assert written.checkpointing.keep == {k: sorted(v) for k, v in expected.kind_keep}
    assert written.plan.label == "keep 30%"
    assert "keep 30% (backbone: " in expected.label


@pytest.mark.parametrize(
    "value,words",
    [
        ("keep101", "whole number from 0 to 100"),
        ("keep2.5", "whole number from 0 to 100"),
        ("keep", "whole number from 0 to 100"),
    ],
)
def test_bad_solver_plan_names_are_refused(value, words):
    code, _, err = run_cli("bench", "--batch-size", "1", "--checkpointing", value)
    assert code == 2 and words in err and value in err, err
    with pytest.raises(HeptstudyError, match=words):
        plan_named(value)


def test_a_missing_or_foreign_table_is_refused_with_the_command_that_makes_one(
    tiny_table, tmp_path
):
    missing = _config(f"model.heptv2.op_costs={tmp_path / 'none.json'}")
    with pytest.raises(HeptstudyError, match="none.json.*no such cost table.*heptstudy costs"):
        plan_named("keep30", config=missing)
    other = _config(f"model.heptv2.op_costs={tiny_table}", "model.heptv2.embedding_dim=32")
    with pytest.raises(HeptstudyError, match="another model configuration.*embedding_dim 16"):
        read_cost_table(other)
    fused = _config(f"model.heptv2.op_costs={tiny_table}", "model.heptv2.attention_backend=fused")
    with pytest.raises(HeptstudyError, match="timed the plain bucket attention.*is fused"):
        read_cost_table(fused)
    plain = _config(f"model.heptv2.op_costs={tiny_table}", "model.heptv2.attention_backend=plain")
    assert read_cost_table(plain)[0]["attention_backend"] == "plain"
    damaged = tmp_path / "damaged.json"
    table = json.loads(tiny_table.read_text())
    del table["kinds"]["decoder"]["groups"]["ffn"]
    damaged.write_text(json.dumps(table))
    with pytest.raises(
        HeptstudyError, match="kinds.decoder.groups.ffn.bytes_per_slot is missing.*heptstudy costs"
    ):
        plan_named("keep30", config=_config(f"model.heptv2.op_costs={damaged}"))
    # a field edited by hand, its digest left alone: the table holds for the model it names
    edited = tmp_path / "edited.json"
    table = json.loads(tiny_table.read_text())
    table["model_key"]["heptv2"]["width"] += 1
    edited.write_text(json.dumps(table))
    with pytest.raises(HeptstudyError, match="another model configuration.*heptv2.width"):
        read_cost_table(_config(f"model.heptv2.op_costs={edited}"))
    named = plan_named("keep30")  # a report's plan: named, not solved, never applied
    assert named.label == "keep 30%"
    with pytest.raises(HeptstudyError, match="not solved"):
        apply_plan(torch.nn.Module(), named)


def test_costs_command_writes_the_table_a_plan_reads_and_replaces_only_its_own(
    tiny_data_dir, tmp_path
):
    out = tmp_path / "costs.json"
    overrides = set_options([*TINY_MODEL, "model.heptv2.dropout=0.3"])
    # in this process, the allocator as it comes (glibc's settings could not be undone)
    argv = ["costs", "--data-dir", str(tiny_data_dir), "--repeats", "1", "--batch-size", "2"]
    argv += ["--allocator", "default"]
    code, printed, err = run_cli(*argv, "--out", str(out), *overrides)
    assert code == 0, err
    assert all(g.name in printed for groups in GROUPS.values() for g in groups)
    table = json.loads(out.read_text())
    assert table["data"]["synthetic"] and table["geometry"]["events"] == 2
    assert table["torch_version"] == torch.__version__ and table["device_type"] == "cpu"
    slots = table["geometry"]["slots"]
    for entry in table["kinds"].values():
        for cost in entry["groups"].values():
            assert cost["bytes_per_slot"] * slots == pytest.approx(cost["bytes"])
    config = _config(f"model.heptv2.op_costs={out}")
    assert read_cost_table(config)[1].total_bytes_per_slot > 0
    foreign = tmp_path / "notes.json"
    foreign.write_text('{"mine": true}\n')
    code, _, err = run_cli(*argv, "--out", str(foreign), *overrides)
    assert code == 2 and "is not a heptstudy op cost table" in err
    assert foreign.read_text() == '{"mine": true}\n'
    # more events than the data set holds: refused, not filled with repeated events
    big = ["costs", "--data-dir", str(tiny_data_dir), "--batch-size", "25"]
    code, _, err = run_cli(*big, "--out", str(tmp_path / "big.json"), *overrides)
    assert code == 2 and "--batch-size 25 needs 25 events of the train split" in err
    assert "holds 24" in err and not (tmp_path / "big.json").exists()


def test_a_table_of_the_plain_attention_is_not_used_where_auto_runs_the_fused_one(tiny_table):
    """``attention_backend: auto`` runs the fused attention on CUDA, which keeps no attention
    group: a table timed on the plain path (as on a CPU) would price a keep-set it cannot keep."""
    table = f"model.heptv2.op_costs={tiny_table}"
    config = _config(table, "model.heptv2.activation_checkpointing=auto")
    assert read_cost_table(config)[0]["attention_backend"] == "plain"
    assert attention_mismatch(config, "cpu") is None  # auto runs the plain path here
    assert (
        attention_mismatch(_config(table, "model.heptv2.attention_backend=plain"), "cuda") is None
    )
    runs_fused = "timed the plain bucket attention, and on cuda this configuration runs the fused"
    # a solver plan's run on CUDA is refused before anything is built (no GPU is touched)
    solver = _config(table, "model.heptv2.activation_checkpointing=keep30")
    with pytest.raises(CostTableMismatch, match=runs_fused):
        check_table_on(solver, [plan_of(solver)], "cuda")
    check_table_on(solver, [plan_of(solver)], "cpu")
    # auto on CUDA tries the plans of the front but the solver plans, and says why; on a CPU, all
    plans = candidate_plans(config)
    assert any(p.kind_keep for p in plans)
    held, why = plans_held_on(config, plans, "cuda")
    assert held == [p for p in plans if not p.kind_keep] and "runs the fused one" in why
    assert plans_held_on(config, plans, "cpu") == (plans, "")


def test_solver_plans_list_the_front_with_its_estimated_costs(tiny_table):
    config = _config(f"model.heptv2.op_costs={tiny_table}")
    listed = solver_plans(config, [0, 30, 100])
    assert [plan.name for plan, _ in listed] == ["keep0", "keep30", "keep100"]
    seconds = [choice.recompute_seconds_per_slot for _, choice in listed]
    assert seconds == sorted(seconds, reverse=True) and seconds[0] > seconds[-1]
    assert listed[1][0] == plan_named("keep30", config=config)
    assert listed[0][1].kept_bytes_per_slot == 0
    with pytest.raises(HeptstudyError, match="whole number from 0 to 100"):
        solver_plans(config, [120])


def test_auto_runs_the_fastest_plan_of_the_front_that_fits(tiny_table):
    """Without a configured order, ``auto`` tries the plans of the cost table's front, least
    estimated recomputation first, and runs the first whose predicted peak fits the budget."""
    config = _config(
        f"model.heptv2.op_costs={tiny_table}",
        "model.heptv2.activation_checkpointing=auto",
        "model.heptv2.memory_budget_gib=1",
    )
    order, source = plan_order(config)
    assert "front of the cost table" in source
    priced = priced_plans(read_cost_table(config)[1])
    assert any(keep_percent(name) is not None for name in order), order
    # on the front: each plan slower and keeping fewer bytes than the one before, off first
    seconds = [priced[name][0] for name in ["off", *order]]
    kept = [priced[name][1] for name in ["off", *order]]
    assert seconds == sorted(seconds) and all(a > b for a, b in itertools.pairwise(kept))
    dominated = set(priced) - set(order) - {"off"}
    for name in dominated:  # a plan left out keeps as much as a faster plan, or more
        assert any(
            priced[o][0] <= priced[name][0] and priced[o][1] <= priced[name][1]
            for o in ["off", *order]
            if o != name
        ), name
    plans = candidate_plans(config)
    assert [p.name for p in plans] == ["off", *order]
    assert all(p.kind_keep for p in plans if p.solver_plan)  # solved on the table
    batches = [example_batch(config, b, n, seed=i) for i, (b, n) in enumerate([(1, 64), (2, 480)])]
    # four plans along the front, off and the last among them (each calibration is fake steps)
    tried = [plans[i] for i in sorted({round(k * (len(plans) - 1) / 3) for k in range(4)})]
    predictor = calibrate(config, batches, CPU, (1.0, "test"), tried)
    geometry = geometry_of(example_batch(config, 2, [300, 200], seed=3))
    peaks = predictor.predictions(geometry)
    assert len(peaks) == len(tried) == 4
    for budget in sorted(peaks.values()):
        predictor.budget_mib = budget
        chosen = predictor.choose(geometry).plan.name
        fits = [p.name for p in tried if peaks[p.name] <= budget]
        assert chosen == fits[0]  # the least estimated recomputation that fits


def test_auto_without_a_cost_table_for_the_model_says_so_and_tries_layers():
    config = _config("model.heptv2.activation_checkpointing=auto")  # the full model's table
    order, source = plan_order(config)
    assert order == list(DEFAULT_PLAN_ORDER)
    assert source.startswith("the default order, without a cost table")
    assert "another model configuration" in source
    given = _config(
        "model.heptv2.activation_checkpointing=auto", "model.heptv2.auto_plan_order=[keep30,full]"
    )
    assert plan_order(given) == (["keep30", "full"], "model.heptv2.auto_plan_order")


def test_auto_refuses_a_damaged_cost_table_rather_than_passing_it_over(tiny_table, tmp_path):
    """Only a sound table of another model sends auto to the default order; a damaged or
    missing one is an error naming it, as it is for a solver plan."""
    damaged = tmp_path / "damaged.json"
    table = json.loads(tiny_table.read_text())
    table["kinds"]["backbone"]["groups"]["attention"]["seconds_per_slot"] = -1
    damaged.write_text(json.dumps(table))
    missing = tmp_path / "none.json"
    for path, why in ((damaged, "seconds_per_slot is -1, below 0"), (missing, "no such")):
        config = _config(
            "model.heptv2.activation_checkpointing=auto", f"model.heptv2.op_costs={path}"
        )
        with pytest.raises(HeptstudyError, match=f"{path}.*{why}.*heptstudy costs"):
            plan_order(config)


def test_costs_refuses_a_device_or_an_out_it_cannot_use_before_measuring(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    for args, says in (
        (["--device", "gpu"], "'gpu' is not a device to measure on: give cpu, cuda or cuda:N"),
        (["--device", "cuda:"], "'cuda:' is not a device to measure on"),
        (["--device", "cpu:"], "'cpu:' is not a device to measure on"),
        (["--out", ""], "an empty path: give the .json file"),
        (["--out", str(notes / "costs.json")], f"{str(notes)!r} is a file, not a folder"),
    ):
        code, _, err = run_cli("costs", *args)
        assert code == 2 and says in err, err
    if not torch.cuda.is_available():
        code, _, err = run_cli("costs", "--device", "cuda")
        assert code == 2 and "no CUDA device" in err and "--device cpu" in err
    assert notes.read_text() == "mine\n"


def test_order_by_cost_leaves_out_a_plan_that_keeps_as_much_as_off():
    priced = {"off": (0.0, 100.0), "keep100": (1.0, 100.0), "keep50": (2.0, 50.0)}
    assert order_by_cost(priced) == ["keep50"]


def test_costs_times_with_the_allocator_settings_of_the_study_s_runs(tiny_data_dir, tmp_path):
    """On a CPU the forwards are timed with local_cpu's allocator settings, as a study's step is,
    and the table says so; its own process, since glibc's settings cannot be undone."""
    from heptstudy.config import load_platform
    from heptstudy.meters.allocator import allocator_settings
    from heptstudy.paths import PLATFORM_DIR

    out = tmp_path / "costs.json"
    argv = ["costs", "--data-dir", str(tiny_data_dir), "--repeats", "1", "--batch-size", "1"]
    argv += ["--out", str(out), *set_options([*TINY_MODEL])]
    done = subprocess.run(
        [sys.executable, "-m", "heptstudy", *argv], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    wanted = allocator_settings(load_platform(PLATFORM_DIR / "local_cpu.yaml").env)
    assert wanted and json.loads(out.read_text())["allocator"]["settings"] == wanted


def _layer_by_layer_brute_force(model: CostModel, fraction: float) -> float:
    """Every layer on its own: a keep-set, or left uncheckpointed (all kept, nothing redone)."""
    options = []
    for kind, groups in model.groups.items():
        names = list(groups)
        per_layer = [("off", sum(c.bytes_per_slot for c in groups.values()), 0.0)]
        for chosen in itertools.product([False, True], repeat=len(names)):
            kept = [n for n, k in zip(names, chosen, strict=True) if k]
            redone = sum(groups[n].seconds_per_slot for n in names if n not in kept)
            size = sum(groups[n].bytes_per_slot for n in kept)
            per_layer.append((kept, size, model.rest_seconds_per_slot[kind] + redone))
        options += [per_layer] * model.layers[kind]
    budget = fraction * model.total_bytes_per_slot + 1e-12
    return min(
        sum(o[2] for o in choice)
        for choice in itertools.product(*options)
        if sum(o[1] for o in choice) <= budget
    )


def test_the_per_layer_bound_is_the_best_of_every_layer_by_layer_choice():
    """scripts/keep_bound.py: the integer program over layer counts is the exact optimum of the
    choices made layer by layer, never above the solver's per-kind keep-sets."""
    import runpy
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "keep_bound.py"
    least_recompute = runpy.run_path(str(script))["least_recompute"]
    model = _hand_made()
    for percent in range(0, 101, 10):
        bound = least_recompute(model, percent / 100)
        assert bound == pytest.approx(_layer_by_layer_brute_force(model, percent / 100))
        assert bound <= choose_keep(model, percent / 100).recompute_seconds_per_slot + 1e-9
    assert least_recompute(model, 1.0) == pytest.approx(0.0)  # every layer left uncheckpointed
