"""heptstudy.study without kernels: notebook parameters, matrices, tables, failure reports."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from heptstudy import plots, study
from heptstudy.cli import build_parser
from heptstudy.measure.report import read_report
from heptstudy.measure.request import MeasurementRequest, RequestError
from heptstudy.study import StudyError
from tests.conftest import TINY_MODEL

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "value,expected",
    [
        ("true", "full"),
        ("false", "off"),
        ("TRUE", "full"),
        ("False", "off"),
        (" true ", "full"),
        (True, "full"),
        (False, "off"),
        ("Every2", "every2"),
        ("auto", "auto"),
    ],
)
def test_checkpointing_spellings(value, expected):
    assert MeasurementRequest.build(checkpointing=value).checkpointing == expected


@pytest.mark.parametrize("value", ["maybe", "yes", "1", 1, 0, 1.0, None, "", [True]])
def test_checkpointing_refuses_everything_else(value):
    with pytest.raises(RequestError, match=r"parameter checkpointing=.*off, full"):
        MeasurementRequest.build(checkpointing=value)


def test_yaml_booleans_mean_what_they_say():
    values = yaml.safe_load("a: true\nb: False\nc: yes\nd: off")
    got = [MeasurementRequest.build(checkpointing=v).checkpointing for v in values.values()]
    assert got == ["full", "off", "full", "off"]


@pytest.mark.parametrize("value", ["four", 0, -1, 2.5, True, "true", None, "1.5"])
def test_batch_size_refused(value):
    with pytest.raises(RequestError, match=r"parameter batch_size=\S+ is not allowed: \w"):
        _memory(batch_size=value)


def _memory(**parameters) -> MeasurementRequest:
    return MeasurementRequest.build(kind="memory", **parameters)


def _parity(**parameters) -> MeasurementRequest:
    return MeasurementRequest.build(kind="parity", **parameters)


def test_memory_options_from_strings_and_defaults(tiny_data_dir):
    opts = _memory(
        batch_size="4",
        checkpointing="true",
        platform="local_cpu",
        data_dir=str(tiny_data_dir),
        overrides="model.heptv2.num_convs=2 train.lr=0.002",
    )
    assert (opts.batch_size, opts.checkpointing, opts.steps, opts.warmup) == (
        4,
        "full",
        2,
        1,
    )  # CPU: 2/1
    assert opts.platform.endswith("configs/training/platforms/local_cpu.yaml")
    assert opts.overrides == ["model.heptv2.num_convs=2", "train.lr=0.002"]
    assert opts.output is None and opts.name == "checkpointed_b4"
    assert str(opts.resolve().report_path) == "experiments/local/scratch/checkpointed_b4.json"
    gpu = _memory(batch_size=1, platform="h100")
    assert (gpu.steps, gpu.warmup) == (5, 2)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"steps": 0}, "steps"),
        ({"warmup": -1}, "warmup"),
        ({"variant": "mlp"}, "variant"),
        ({"dtype": "float16"}, "dtype"),
        ({"platform": "tpu"}, "local_cpu"),
        ({"overrides": ["noequals"]}, "overrides"),
        ({"seed": "x"}, "seed"),
        ({"seed": True}, "seed=True is not allowed: takes a whole number, not true/false"),
        ({"steps": "2.5"}, "steps"),
        ({"batchsize": 4}, "did you mean 'batch_size'"),
        ({"overrides": ["train.seed=3"]}, "give seed instead"),
        ({"overrides": ["model.heptv2.activation_checkpointing=true"]}, "give checkpointing"),
    ],
)
def test_other_parameters_refused(kwargs, match):
    with pytest.raises(RequestError, match=match):
        _memory(batch_size=1, **kwargs)


def test_parity_options():
    opts = _parity(batch_size=1, deterministic="TRUE")
    assert opts.kind == "parity" and opts.deterministic and opts.name == "parity_deterministic_b1"
    assert (opts.steps, opts.warmup) == (None, None)
    with pytest.raises(RequestError, match="deterministic"):
        _parity(deterministic="sometimes")
    with pytest.raises(RequestError, match="steps does not apply to a parity"):
        _parity(steps=3)


@pytest.mark.parametrize(
    "path", sorted((ROOT / "configs" / "study").glob("*.yaml")), ids=lambda p: p.stem
)
def test_bundled_matrices_load(path):
    matrix = study.load_matrix(path)
    assert matrix.runs and matrix.description


def test_default_matrices_hold_the_original_set():
    original = {
        "baseline_b1",
        "checkpointed_b1",
        "baseline_b4",
        "checkpointed_b4",
        "checkpointed_b16",
        "parity_b1",
        "parity_deterministic_b1",
    }
    policies = {"checkpointed_selective_b4", "checkpointed_every2_b4", "checkpointed_every3_b4"}
    cpu = study.load_matrix(ROOT / "configs" / "study" / "cpu_default.yaml")
    cpu_b16 = study.load_matrix(ROOT / "configs" / "study" / "cpu_b16.yaml")
    gpu = study.load_matrix(ROOT / "configs" / "study" / "gpu.yaml")
    cpu_names = {r.name for r in cpu.runs} | {r.name for r in cpu_b16.runs}
    packed = {"packed_baseline_b4", "packed_checkpointed_b4", "packed_auto_b4"}
    # the front at batch 4: four solver plans, padded and packed
    solver = {
        f"{prefix}checkpointed_keep{n}_b4" for prefix in ("", "packed_") for n in (10, 20, 25, 70)
    }
    # the CPU keeps the deterministic parity only (the GPU both)
    expected = original - {"parity_b1"} | policies | packed | solver | {"auto_b4", "auto_b16"}
    assert cpu_names == expected | {"paired_b1", "paired_b4", "packed_paired_b4"}
    # every plan of the front, and auto, is timed against off paired in one process, padded and
    # packed; the memory runs measure memory alone
    timed = {
        (r.parameters.get("batching", "padded"), plan)
        for r in cpu.runs
        if r.notebook == "paired" and r.parameters["batch_size"] == 4
        for plan in r.parameters["plans"]
    }
    assert {r.parameters.get("passes") for r in cpu.runs if r.notebook == "memory"} == {"memory"}
    front = {
        (r.request().batching, r.request().checkpointing)
        for r in cpu.runs
        if r.notebook == "memory" and r.request().batch_size == 4
    }
    assert front - {("padded", "off"), ("packed", "off")} == timed
    assert original | policies <= {r.name for r in gpu.runs}
    assert {f"packed_{p}_b{b}" for p in ("baseline", "checkpointed") for b in (48, 64)} <= {
        r.name for r in gpu.runs
    }
    mem = [r for r in gpu.runs if r.notebook == "memory"]
    # batch 48 (the recipe's per-device batch): 2 after 1, the data and time a GPU session has
    steps = {r.name: (r.request().steps, r.request().warmup) for r in mem}
    assert all(s == ((2, 1) if n.endswith(("_b48", "_b64")) else (5, 2)) for n, s in steps.items())
    policy_keys = ("model.heptv2.memory_budget_gib=",)  # auto's budget, not the model's size
    assert not any(
        o.startswith("model.") and not o.startswith(policy_keys)
        for r in cpu.runs
        for o in r.parameters.get("overrides", [])
    ), "the CPU default measures the full-size model"


def test_a_paired_run_is_named_by_its_batching_and_batch_size(tmp_path):
    path = tmp_path / "m.yaml"
    paired = {"notebook": "paired", "batch_size": 4, "plans": ["full", "keep70"], "rounds": 3}
    runs = [paired, {**paired, "batching": "packed"}, {"batch_size": 4}]
    path.write_text(yaml.safe_dump({"repeats": 3, "runs": runs}))
    padded, packed, memory = study.load_matrix(path).runs
    assert (padded.name, packed.name) == ("paired_b4", "packed_paired_b4")
    assert padded.repeats == packed.repeats == 1 and memory.repeats == 3
    assert padded.parameters["plans"] == ["full", "keep70"] and padded.parameters["rounds"] == 3
    request = padded.request(progress=False)
    assert (request.checkpointing, request.passes) == ("auto", "timing")


def test_run_overrides_add_to_the_defaults(tmp_path):
    path = tmp_path / "m.yaml"
    matrix = {
        "defaults": {"overrides": ["train.lr=0.002"]},
        "runs": [
            {"batch_size": 2, "checkpointing": True},
            {
                "batch_size": 2,
                "checkpointing": "selective",
                "overrides": ["model.heptv2.dropout=0"],
            },
        ],
    }
    path.write_text(yaml.safe_dump(matrix))
    full, selective = study.load_matrix(path).runs
    assert (full.name, selective.name) == ("checkpointed_b2", "checkpointed_selective_b2")
    assert selective.parameters["overrides"] == ["train.lr=0.002", "model.heptv2.dropout=0"]


@pytest.mark.parametrize(
    "runs,match",
    [
        ([{"batch_size": 1, "colour": "red"}], "unknown keys"),
        ([{"notebook": "parity", "checkpointing": True}], "do not apply"),
        ([{"batch_size": 1}, {"batch_size": 1}], "several runs are named"),
        ([{"batch_size": 1, "checkpointing": "maybe"}], "run 1: parameter checkpointing"),
        ([{"notebook": "train"}], "notebook 'train'"),
        ([], "non-empty"),
        ([{"notebook": "paired", "plans": "full", "rounds": 3}], "plans='full' is not allowed"),
        ([{"notebook": "paired", "plans": ["full"], "rounds": 0}], "rounds=0 is not allowed"),
        # YAML's bare off is false: named as the plan it spells, refused as off is
        ([{"notebook": "paired", "plans": [False], "rounds": 3}], r"plans \['off'\] cannot be"),
        ([{"notebook": "paired", "plans": ["Off"], "rounds": 3}], r"plans \['Off'\] cannot be"),
        ([{"notebook": "paired", "plans": ["full"], "repeats": 3}], "has rounds: give rounds"),
        ([{"notebook": "paired", "plans": ["full"], "checkpointing": "full"}], "do not apply"),
        ([{"notebook": "memory", "plans": ["full"]}], "do not apply to memory.ipynb"),
    ],
)
def test_bad_matrix(tmp_path, runs, match):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"runs": runs}))
    with pytest.raises(StudyError, match=match):
        study.load_matrix(path)


def test_a_paired_run_s_yaml_true_is_full(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("runs: [{notebook: paired, batch_size: 4, plans: [true, keep25], rounds: 3}]\n")
    (run,) = study.load_matrix(path).runs
    assert run.parameters["plans"] == ["full", "keep25"]


def _row(name, b, ckpt, alloc, reserved, t, status="ok", kind="memory", policy="full", every=1):
    label = "auto" if ckpt == "auto" else f"every {every}" if every > 1 else policy
    return {
        "name": name,
        "kind": kind,
        "status": status,
        "batch_size": b,
        "packed_batches": False,
        "batching": "padded",
        "checkpointing": ckpt,
        "policy": policy if ckpt else "none",
        "checkpoint_every": every if ckpt else None,
        "policy_label": label if ckpt else "off",
        "round": 1,
        "allocator_line": "platform",
        "sys_fraction": None,
        "peak_allocated_mib": alloc,
        "peak_reserved_mib": reserved,
        "mean_step_s": t,
    }


def test_comparison_frame():
    df = pd.DataFrame(
        [
            _row("baseline_b1", 1, False, 1000.0, 1200.0, 1.0),
            _row("checkpointed_b1", 1, True, 250.0, 600.0, 1.25),
            _row("checkpointed_b16", 16, True, 4000.0, 5000.0, 10.0),
            _row("baseline_b4", 4, False, None, None, None, status="oom"),
            _row("checkpointed_b4", 4, True, 900.0, 1000.0, 3.0),
        ]
    )
    comp = study.comparison_frame(df)
    assert comp["batch_size"].tolist() == [1]  # b4 baseline failed, b16 has no baseline
    row = comp.iloc[0]
    assert row["allocated_reduction_pct"] == pytest.approx(75.0)
    assert row["reserved_reduction_pct"] == pytest.approx(50.0)
    assert row["step_time_overhead_pct"] == pytest.approx(25.0)
    assert study.comparison_frame(pd.DataFrame(columns=df.columns)).empty


@pytest.mark.parametrize(
    "plan,on,label",
    [
        ("off", False, "off"),
        ("full", True, "full"),
        ("selective", True, "selective"),
        ("every2", True, "every 2"),
        ("auto", "auto", "auto"),
    ],
)
def test_reports_frame_labels_each_plan(plan, on, label):
    row = study.reports_frame([(Path(f"{plan}.json"), _report(plan, 4, plan))]).iloc[0]
    assert row["checkpointing"] == on and row["policy_label"] == label


def _policies_b4():
    return pd.DataFrame(
        [
            _row("baseline_b4", 4, False, 1000.0, 1100.0, 2.0),
            _row("checkpointed_every3_b4", 4, True, 600.0, 700.0, 2.2, every=3),
            _row("checkpointed_selective_b4", 4, True, 350.0, 500.0, 2.1, policy="selective"),
            _row("checkpointed_b4", 4, True, 250.0, 400.0, 2.5),
            _row("checkpointed_every2_b4", 4, True, 500.0, 600.0, 2.3, every=2),
            _row("baseline_b1", 1, False, 300.0, 400.0, 0.5),
            _row("checkpointed_b1", 1, True, 100.0, 200.0, 0.6),
        ]
    )


def test_comparison_uses_the_full_policy_on_every_layer():
    comp = study.comparison_frame(_policies_b4())
    b4 = comp.set_index("batch_size").loc[4]
    assert b4["checkpointed_allocated_mib"] == 250.0
    assert b4["allocated_reduction_pct"] == pytest.approx(75.0)
    assert b4["step_time_overhead_pct"] == pytest.approx(25.0)


def test_comparison_with_an_auto_run_in_the_same_batch():
    # the checkpointing column then holds True, False and "auto" (object dtype): the comparison
    # must still pick off and full by policy, not by negating the column
    df = pd.concat(
        [_policies_b4(), pd.DataFrame([_row("auto_b4", 4, "auto", 700.0, 800.0, 2.2)])],
        ignore_index=True,
    )
    assert df["checkpointing"].dtype == object
    b4 = study.comparison_frame(df).set_index("batch_size").loc[4]
    assert b4["baseline_allocated_mib"] == 1000.0
    assert b4["checkpointed_allocated_mib"] == 250.0


def test_policy_frame_and_table():
    policies = study.policy_frame(_policies_b4())
    assert policies["batch_size"].unique().tolist() == [4]  # batch 1: only one policy
    assert policies["policy"].tolist() == ["off", "full", "selective", "every 2", "every 3"]
    row = policies.set_index("policy").loc["selective"]
    assert row["allocated_cut_pct"] == pytest.approx(65.0)
    assert row["step_time_overhead_pct"] == pytest.approx(5.0)
    off = policies.set_index("policy").loc["off"]
    assert off["allocated_cut_pct"] == 0 and off["step_time_overhead_pct"] == 0
    assert (
        "allocated cut vs off [%]" in study.front_table(study.front_frame(_policies_b4())).columns
    )
    assert study.policy_frame(_policies_b4(), min_policies=1)["batch_size"].nunique() == 2


def _front_rows():
    """Three rounds of batch 4: padded off and five plans, packed off, full and keep 10%. Per
    round ``(MiB, step s)``; off takes 10, 11 and 9 s (padded) and 8 s (packed)."""
    plans = {
        ("padded", "off"): (1000.0, [10.0, 11.0, 9.0]),
        ("padded", "full"): (200.0, [13.0, 14.3, 11.7]),  # +30 %
        ("padded", "every 2"): (500.0, [11.0, 12.1, 9.9]),  # +10 %
        ("padded", "every 3"): (700.0, [11.5, 12.65, 10.35]),  # +15 %: three plans beat it
        ("padded", "keep 10%"): (250.0, [11.2, 12.1, 10.2]),  # +12, +10, +13.3 %
        ("padded", "keep 50%"): (550.0, [10.5, 11.55, 9.45]),  # +5 %
        ("packed", "off"): (850.0, [8.0, 8.0, 8.0]),
        ("packed", "full"): (170.0, [10.4, 10.4, 10.4]),
        ("packed", "keep 10%"): (210.0, [8.8, 8.8, 8.8]),
    }
    rows = []
    for (batching, label), (mib, steps) in plans.items():
        every = int(label[-1]) if label.startswith("every") else 1
        policy = "full" if every > 1 else label
        for rnd, t in enumerate(steps, start=1):
            row = _row(f"{batching}_{label}", 4, label != "off", mib, 2 * mib, t, policy=policy,
                       every=every)  # fmt: skip
            row.update(round=rnd, batching=batching, packed_batches=batching == "packed")
            rows.append(row)
    return pd.DataFrame(rows)


def test_front_names_the_plans_that_dominate_each_padded_and_packed():
    front = study.front_frame(_front_rows()).set_index(["batching", "policy"])
    assert front.loc[("padded", "every 3"), "dominated_by"] == "every 2, keep 10%, keep 50%"
    assert front.loc[("padded", "keep 10%"), "dominated_by"] == ""  # less memory than every 2
    assert front.loc[("padded", "full"), "dominated_by"] == ""
    keep10 = front.loc[("padded", "keep 10%")]
    assert keep10["step_time_overhead_pct"] == pytest.approx(12.0)  # median of three rounds
    assert (keep10["overhead_min_pct"], keep10["overhead_max_pct"]) == pytest.approx(
        (10.0, 13.333), rel=1e-3
    )
    # packed plans are compared with packed off, not padded off
    assert front.loc[("packed", "keep 10%"), "step_time_overhead_pct"] == pytest.approx(10.0)
    assert front.loc[("packed", "full"), "allocated_cut_pct"] == pytest.approx(80.0)
    table = study.front_table(study.front_frame(_front_rows()))
    assert (table["dominated by"] == "none (on the front)").sum() == len(table) - 1
    fig = plots.policy_front(study.front_frame(_front_rows()), tag="test")
    assert [ax.get_xlabel().split(", ")[1] for ax in fig.axes] == [
        "padded batches of 4",
        "packed batches of 4",
    ]
    padded_labels = {t.get_text() for t in fig.axes[0].texts} - {"test"}
    assert padded_labels == {"off", "full", "every 2", "every 3", "keep 10%", "keep 50%"}


def test_packing_frame_pairs_the_same_plan_by_round():
    rows = []
    for rnd, (pad_t, pack_t) in enumerate([(10.0, 8.0), (11.0, 9.9), (9.0, 7.2)], start=1):
        for batching, t, alloc in (("padded", pad_t, 1000.0), ("packed", pack_t, 850.0)):
            row = _row(f"{batching}_b4", 4, False, alloc, alloc * 1.5, t)
            row.update(round=rnd, batching=batching, packed_batches=batching != "padded")
            row.update(peak_batch_hits=800, peak_batch_slots=1000)
            rows.append(row)
    frame = study.packing_frame(pd.DataFrame(rows)).iloc[0]
    assert frame["policy"] == "off" and frame["rounds"] == 3
    assert frame["allocated_ratio"] == pytest.approx(0.85)
    assert frame["real_hit_share"] == pytest.approx(0.8)
    assert frame["step_ratio_median"] == pytest.approx(0.8)  # 0.8, 0.9, 0.8
    assert (frame["step_ratio_min"], frame["step_ratio_max"]) == pytest.approx((0.8, 0.9))
    # checkpointing comparisons stay on padded batches
    assert study.comparison_frame(pd.DataFrame(rows)).empty


def test_packing_frame_takes_memory_only_runs_step_ratios_from_the_paired_rounds_on_one_batch():
    """A study that times in pairs only: each round's ratio is the packed steps' median over the
    padded steps' median in the same round, where both took the same batch."""
    rows = []
    for batching in ("padded", "packed"):
        row = _row(f"{batching}_b4", 4, False, 1000.0 if batching == "padded" else 850.0, 1.0, None)
        rows.append({**row, "batching": batching, "packed_batches": batching == "packed",
                     "peak_batch_hits": 800, "peak_batch_slots": 1000})  # fmt: skip
    padded, packed = _paired_report(), _paired_report("packed")
    for step in packed["steps"]:
        step["time_s"] *= {1: 0.8, 2: 0.9, 3: 0.7}[step["round"]]
        step["batch"] = 2 if step["round"] == 3 else 1  # round 3 took another batch
    paired = [(Path("paired_b4.json"), padded), (Path("packed_paired_b4.json"), packed)]
    off = study.packing_frame(pd.DataFrame(rows), paired).set_index("policy").loc["off"]
    assert off["rounds"] == 2 and off["timing"] == "paired, one process"
    assert (off["step_ratio_min"], off["step_ratio_max"]) == pytest.approx((0.8, 0.9))
    assert (off["padded_step_s"], off["packed_step_s"]) == pytest.approx((10.0, 8.5))
    # without the paired timings there is no step time to compare
    alone = study.packing_frame(pd.DataFrame(rows)).iloc[0]
    assert alone["rounds"] == 0 and alone["timing"] is None


def test_off_takes_its_step_from_a_paired_timing_when_no_fresh_process_timed_it():
    rows = [
        _row("baseline_b4", 4, False, 3000.0, 3500.0, None),
        _row("checkpointed_every2_b4", 4, True, 2000.0, 2500.0, None, every=2),
        _row("checkpointed_b4", 4, True, 600.0, 2000.0, None),
    ]
    paired = [(Path("paired_b4.json"), _paired_report())]
    front = study.front_frame(pd.DataFrame(rows), paired).set_index("policy")
    assert front.loc["off", "mean_step_s"] == pytest.approx(10.0)
    assert front.loc["off", "timing"] == "paired, one process"
    assert front.loc["every 2", "step_time_overhead_pct"] == pytest.approx(20.0)
    assert pd.isna(front.loc["full", "mean_step_s"])  # timed nowhere


@pytest.mark.parametrize("folder", ["cpu_reference", "study_paired_epyc"])
def test_front_labels_do_not_overlap_on_the_reference(folder):
    """The committed studies crowd nine plans within a few per cent of step time (the paired
    one two packed plans 17 pixels apart): in each panel every label, the tag and the legend
    must stay apart and inside the axes, and every label lie nearest its own point."""
    from itertools import combinations

    from matplotlib.text import Annotation, Text

    plots.use_style()
    every = study.reports_frame(study.load_study(ROOT / "experiments" / folder))
    front = study.front_frame(every, study.load_paired(ROOT / "experiments" / folder))
    fig = plots.policy_front(front, tag=study.figure_tag(every))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    assert len(fig.axes) == front.groupby(["batching", "batch_size"]).ngroups == 2
    for ax in fig.axes:
        # the text's own box: a label's tie to its point may cross others
        boxes = {t.get_text(): Text.get_window_extent(t, renderer) for t in ax.texts}
        if ax.get_legend() is not None:
            boxes["legend"] = ax.get_legend().get_window_extent(renderer)
        for (a, box_a), (b, box_b) in combinations(boxes.items(), 2):
            assert not box_a.overlaps(box_b), f"{a!r} overlaps {b!r}"
        frame = ax.get_window_extent(renderer)
        outside = [
            name
            for name, box in boxes.items()
            if not frame.contains(*box.min) or not frame.contains(*box.max)
        ]
        assert outside == []
        labels = [t for t in ax.texts if isinstance(t, Annotation) and t.get_text()]
        points = ax.transData.transform([t.xy for t in labels])
        for label in labels:
            box = Text.get_window_extent(label, renderer)
            gaps = [
                np.hypot(max(box.x0 - x, x - box.x1, 0), max(box.y0 - y, y - box.y1, 0))
                for x, y in points
            ]
            nearest = labels[int(np.argmin(gaps))].get_text()
            assert nearest == label.get_text(), f"{label.get_text()!r} lies nearest {nearest!r}"
    assert {t.get_text() for ax in fig.axes for t in ax.texts} >= set(front["policy"])


def _report(name, b, plan, categories=None):
    from heptstudy.measure import report as rp

    env = rp.environment_info("cpu", "float32", "local_cpu", fresh_process=True)
    return rp.BenchReport(
        kind="memory",
        status="ok",
        name=name,
        environment=env,
        data=rp.DataInfo(dataset="d:1", data_dir=None, synthetic=True, split="train"),
        config={"model": {}},
        batch_size=b,
        checkpointing=rp.Checkpointing(plan=plan),
        summary=rp.Summary(
            counted_steps=1,
            warmup_steps=1,
            mean_step_time_s=1.0,
            max_peak_allocated_mib=1.0,
            max_peak_reserved_mib=None,
        ),
        memory_categories=[
            rp.MemoryCategories(step=i, peak_bytes=sum(c.values()), at_peak_bytes=c, note="")
            for i, c in enumerate(categories or [])
        ]
        or None,
    )


def test_categories_frame():
    mib = 2**20
    reports = [
        (Path(f"{r.name}.json"), r)
        for r in (
            _report(
                "checkpointed_selective_b4",
                4,
                "selective",
                [{"parameters": 10 * mib, "temporaries": 5 * mib}],
            ),
            _report(
                "baseline_b4",
                4,
                "off",
                categories=[
                    {"parameters": 10 * mib, "activations": 50 * mib},
                    {"parameters": 10 * mib, "activations": 90 * mib, "gradients": 2 * mib},
                ],
            ),
            _report("checkpointed_b1", 1, "full", [{"parameters": 10 * mib}]),
            _report("baseline_b16", 16, "off"),  # no categories: not a row
        )
    ]
    cats = study.categories_frame(reports)
    assert cats["name"].tolist() == ["checkpointed_b1", "baseline_b4", "checkpointed_selective_b4"]
    assert cats["policy"].tolist() == ["full", "off", "selective"]
    off = cats.set_index("name").loc["baseline_b4"]  # the step with the larger peak
    assert (off["activations"], off["gradients"], off["peak_mib"]) == (90.0, 2.0, 102.0)
    assert off["optimizer_state"] == 0.0
    assert "peak [MiB]" in study.categories_table(cats).columns
    fig = plots.memory_categories_stacked(cats)
    assert len(fig.axes[0].get_xticklabels()) == 3
    assert study.categories_frame([]).empty


def test_empty_directory_aggregates_to_empty_tables(tmp_path):
    (tmp_path / "junk.json").write_text("{}")
    with pytest.warns(UserWarning, match="junk.json"):
        reports = study.load_reports(tmp_path)
    df = study.reports_frame(reports)
    assert df.empty and study.memory_frame(df).empty and study.comparison_frame(df).empty
    assert study.policy_frame(df).empty and study.categories_frame(reports).empty
    assert study.fit_validation(reports)[0] is None
    assert study.parity_frame(reports).empty
    assert "No reports" in study.study_statement(df)


def test_statement_names_device_data_and_smoke(tiny_data_dir):
    df = pd.DataFrame(
        [
            {
                **_row("baseline_b1", 1, False, 1.0, 2.0, 0.1),
                "device": "AMD EPYC",
                "device_kind": "cpu",
                "dtype": "float32",
                "threads": 2,
                "torch": "2.13.0",
                "dataset": "cld_edm_ttbar_hits:3.2.1",
                "data_dir": str(tiny_data_dir),
                "synthetic": True,
                "counted_steps": 2,
                "warmup_steps": 1,
            }
        ]
    )
    text = study.study_statement(df, "A study.", ["a note"])
    for words in (
        "AMD EPYC",
        "synthetic",
        "smoke measurements",
        "not a throughput or convergence study",
        "2 counted step(s) after 1 warm-up",
        "a note",
    ):
        assert words in text
    stats = study.hits_stats_for(df)
    assert stats["synthetic"] and stats["num_events"] == 24
    assert "not to be trusted" not in text  # nothing flagged (tests/test_reliability_reports.py)
    assert "one fresh process per run (one round)" in text
    memory_only = study.study_statement(df.assign(mean_step_s=None))
    assert "every memory run measured memory alone" in memory_only
    assert "fresh process per run" not in memory_only
    df["untrusted"] = ["busy host: the 1-minute load average was 4.5"]
    busy = study.study_statement(df)
    assert "not to be trusted:** baseline_b1: busy host: the 1-minute load average was 4.5" in busy


def test_cli_has_study_commands(capsys):
    parser = build_parser()
    args = parser.parse_args(["study", "run", "--matrix", "m.yaml", "--out", "x", "--force"])
    assert args.force and (args.command, args.study_command) == ("study", "run")
    args = parser.parse_args(
        ["study", "check", "--matrix", str(ROOT / "configs/study/cpu_default.yaml")]
    )
    assert args.func(args) == 0
    assert "checkpointed_every3_b4" in capsys.readouterr().out


def _pipeline_config(**parameters):
    from heptstudy.study.pipeline import PipelineParameters

    return PipelineParameters.build(**parameters).config()


def test_pipeline_config_and_fresh_dir(tmp_path, tiny_data_dir):
    config = _pipeline_config(
        out_dir=str(tmp_path / "p"),
        batch_size="2",
        num_steps=3,
        checkpointing="false",
        data_dir=str(tiny_data_dir),
        overrides=TINY_MODEL,
    )
    assert config.train.global_batch_size == 2 and config.train.num_steps == 3
    assert config.model.heptv2.activation_checkpointing == "off"
    with pytest.raises(RequestError, match="did you mean 'num_steps'"):
        _pipeline_config(numsteps=3)
    with pytest.raises(RequestError, match="parameter checkpointing=1"):
        _pipeline_config(checkpointing=1)
    from heptstudy.study.pipeline import pipeline_parameters

    injected = "# Parameters\nnumsteps = 3\n"  # papermill's cell for -p numsteps 3
    namespace = {"num_steps": 4, "numsteps": 3, "In": ["", "num_steps = 4", injected, ""]}
    with pytest.raises(RequestError, match=r"pipeline.ipynb has no parameter numsteps"):
        pipeline_parameters(namespace)
    other = tmp_path / "other"
    other.mkdir()
    (other / "precious.txt").write_text("x")
    with pytest.raises(StudyError, match="does not look like a training output"):
        study.fresh_output_dir(other)
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("{}\n")
    assert not any(study.fresh_output_dir(run).iterdir())


def test_at_project_root_from_notebooks_dir(monkeypatch):
    monkeypatch.chdir(ROOT / "notebooks")
    assert study.at_project_root() == ROOT


def test_study_matrices_run_auto_where_the_budget_lies_between_off_and_full():
    def autos(name):
        runs = study.load_matrix(ROOT / "configs" / "study" / name).runs
        requests = [r.request() for r in runs if r.notebook == "memory"]
        return {
            q.batch_size: q
            for q in requests
            if q.checkpointing == "auto" and q.batching == "padded"
        }

    # the committed figures are under test: each matrix's auto budget was chosen between the
    # full-size peaks the reference measured, which a tiny model's peaks cannot stand in for
    def peak_mib(name):
        path = ROOT / "experiments" / "cpu_reference" / f"{name}.json"
        return read_report(path).summary.max_peak_allocated_mib

    cpu = autos("cpu_default.yaml") | autos("cpu_b16.yaml")
    gpu = autos("gpu.yaml")
    assert set(cpu) == {4, 16} and cpu[4].name == "auto_b4"
    # the budgets lie between the committed reference's checkpointed and off peaks; batch 16,
    # which has no committed report (`make reference-b16` measures it), between 4 x batch 4's
    budget_b4 = cpu[4].resolve().config.model.heptv2.memory_budget_gib * 1024
    full_b4, off_b4 = peak_mib("checkpointed_b4"), peak_mib("baseline_b4")
    assert full_b4 < budget_b4 < off_b4
    budget_b16 = cpu[16].resolve().config.model.heptv2.memory_budget_gib * 1024
    assert 4 * full_b4 < budget_b16 < 4 * off_b4
    assert set(gpu) == {48} and gpu[48].resolve().config.model.heptv2.memory_budget_gib is None


def test_overhead_figure_draws_the_spread_of_the_rounds():
    over = pd.DataFrame(
        [
            ("platform", 4, "full", 3, 30.0, 22.0, 41.0),
            ("platform", 4, "auto", 3, 8.0, 2.0, 12.0),
            ("default", 4, "full", 1, -60.0, -60.0, -60.0),
        ],
        columns=[
            "allocator_line",
            "batch_size",
            "policy",
            "rounds",
            "overhead_median_pct",
            "overhead_min_pct",
            "overhead_max_pct",
        ],
    )
    from matplotlib.container import ErrorbarContainer

    ax = plots.overhead_spread_figure(over, tag="synthetic").axes[0]
    spans = sorted(
        tuple(sorted(round(float(y), 6) for y in seg[:, 1]))
        for c in ax.containers
        if isinstance(c, ErrorbarContainer)
        for lines in c.lines[2]
        for seg in lines.get_segments()
    )
    assert spans == [(-60.0, -60.0), (2.0, 12.0), (22.0, 41.0)]


def test_predictions_table_has_no_index_and_no_absolute_paths():
    from heptstudy.paths import ROOT
    from heptstudy.study.tables import predictions_table

    table = pd.DataFrame({"memory model": [f"measured ({ROOT}/configs/fit/a.json)"]})
    html = predictions_table(table).to_html()
    assert "configs/fit/a.json" in html and str(ROOT) not in html
    assert "row_heading" not in html  # the pandas index is hidden


def test_fit_answers_are_paragraphs_under_the_table_not_a_column():
    from heptstudy.study.tables import predictions_table
    from heptstudy.study.text import fit_answers

    predictions = pd.DataFrame(
        {"platform": ["h100", "lumi_mi250x"], "answer": ["48 fit <b>", "48 do not fit"]}
    )
    assert "answer" not in predictions_table(predictions).data.columns
    h100, lumi = fit_answers(predictions).split("\n\n")
    assert h100 == "**h100:** 48 fit &lt;b&gt;" and lumi.startswith("**lumi_mi250x:** 48 do not")


def test_auto_times_said_once_for_the_runs_sharing_them():
    from heptstudy.study.tables import auto_predictions_table
    from heptstudy.study.text import auto_times

    auto = pd.DataFrame(
        {
            "run": ["auto_b4", "packed_auto_b4", "auto_b16"],
            "times": ["none: why", "none: why", "ok"],
        }
    )
    assert "times" not in auto_predictions_table(auto).data.columns
    assert auto_times(auto).split("\n") == [
        "- **Expected step times** (auto_b4, packed_auto_b4): none: why.",
        "- **Expected step times** (auto_b16): ok.",
    ]


def test_every_table_keys_runs_by_batching_batch_size_and_plan():
    rows = [
        _row("baseline_b4", 4, False, 1000.0, 1100.0, 2.0),
        _row("checkpointed_b4", 4, True, 250.0, 400.0, 2.5),
        _row("checkpointed_every2_b4", 4, True, 500.0, 600.0, 2.3, every=2),
    ]
    packed = _row("packed_baseline_b4", 4, False, 900.0, 1000.0, 1.8)
    df = pd.DataFrame([*rows, {**packed, "packed_batches": True, "batching": "packed"}])
    runs = study.runs_table(df).set_index("run")
    assert runs.loc["packed_baseline_b4", ["batch", "batching", "plan"]].tolist() == [
        4,
        "packed",
        "off",
    ]
    assert runs.loc["checkpointed_every2_b4", "plan"] == "every 2"
    # the tables comparing plans with off hold padded batches only, and say so
    for table in (
        study.comparison_table(study.comparison_frame(df)),
        study.overhead_table(study.overhead_frame(df)),
    ):
        columns = list(table.columns)
        assert columns.index("batching") == columns.index("batch") + 1
        assert set(table["batching"]) == {"padded"}
    cats = pd.DataFrame(
        {
            "name": ["baseline_b4", "packed_baseline_b4"],
            "batch_size": [4, 4],
            "policy": ["off", "off"],
            "device_kind": ["cpu", "cpu"],
            "peak_mib": [1000.0, 900.0],
        }
    )
    table = study.categories_table(cats, df)
    assert table[["run", "batch", "batching", "plan"]].values.tolist() == [
        ["baseline_b4", 4, "padded", "off"],
        ["packed_baseline_b4", 4, "packed", "off"],
    ]


def test_parity_table_in_words_with_the_runs_geometry():
    from heptstudy.study.tables import parity_table

    parity = pd.DataFrame(
        {
            "report": ["parity_b1"],
            "comparison": ["checkpointed vs baseline"],
            "grad_rel_l2_max": [0.0],
        }
    )
    runs = pd.DataFrame({"name": ["parity_b1"], "batch_size": [1], "batching": ["padded"]})
    table = parity_table(parity, runs)
    assert table.columns.tolist() == [
        "run",
        "batch",
        "batching",
        "comparison",
        "gradient rel. L2, max",
    ]
    assert table.iloc[0].tolist()[:3] == ["parity_b1", 1, "padded"]


def test_auto_predictions_answer_for_the_references_auto_run(tiny_data_dir, tmp_path):
    """The aggregate's auto section: `heptstudy fit --checkpointing auto` at the committed
    reference's auto run (batch 4, 3.5 GiB), its memory model and step times from the
    reference's reports, on the tiny data set's occupancy (the packed auto run left out: its
    plans would be calibrated too). The auto run is given the one plan
    `full` (each plan auto may take is calibrated on a fake device, half a minute apiece), which
    also shows that the prediction takes the run's own plans."""
    # the committed reports are the aggregate's real input, every kind of run it reads; the
    # assertions are on the table's form and bounds, not on the reference's figures
    for path in (ROOT / "experiments" / "cpu_reference").glob("*.json"):
        if path.name == "packed_auto_b4.json":
            continue
        doc = json.loads(path.read_text())
        if path.name == "auto_b4.json":
            doc["config"]["model"]["heptv2"]["auto_plan_order"] = ["full"]
        (tmp_path / path.name).write_text(json.dumps(doc))
    reports = study.load_reports(tmp_path)
    runs = study.reports_frame(reports).assign(data_dir=str(tiny_data_dir))
    # full is timed in pairs there, its memory alone in a report of its own
    paired = study.load_paired(ROOT / "experiments" / "cpu_reference")
    table, skipped = study.auto_predictions(runs, reports, paired)
    assert skipped == []
    row = table.set_index("run").loc["auto_b4"]
    assert row["batch"] == 4 and row["budget [MiB]"] == 3.0 * 1024
    assert 0.0 <= row["steps checkpointing [%]"] <= 100.0
    assert 0.0 <= row["P(step exceeds budget)"] <= 1.0
    # every plan auto runs was timed in the reference, so both expectations are answered
    assert row["expected step auto [s]"] > 0 and row["expected step full [s]"] > 0
    assert row["measured step auto [s]"] < row["measured step full [s]"]
    assert row["auto timed"] == row["full timed"] == "paired, one process"
    assert {p.rsplit(" ", 1)[0] for p in row["plans [% of steps]"].split(", ")} <= {"off", "full"}


def _paired_report(batching="padded", rounds=3, asked=3):
    """A paired timing at batch 4: every 2 at +20, +30, +10 % and keep 10% at +1, +2, +3 % of
    the off steps around them (10 s each)."""
    steps = []
    for r in range(1, rounds + 1):
        for plan, t in (("off", 10.0), ("every2", 10 + r % 3 + 1), ("off", 10.0),
                        ("keep10", 10 + 0.1 * r), ("off", 10.0)):  # fmt: skip
            steps.append({"round": r, "plan": plan, "batch": 1, "time_s": t})
    from heptstudy.measure.paired import overheads

    over = {
        name: {"per_round": v, "median": 0, "min": 0, "max": 0}
        for name, v in overheads(steps).items()
    }
    # a solver plan's label there names its kept groups, which the memory reports' does not
    plans = {"every2": "every 2", "keep10": "keep 10% (backbone: mlp, order)"}
    return {"kind": "paired_timing", "batch_size": 4, "batching": batching, "plans": plans,
            "rounds": rounds, "rounds_asked": asked, "steps": steps, "overhead": over}  # fmt: skip


def test_paired_rounds_replace_the_fresh_process_rounds_of_their_plans():
    paired = [(Path("paired_b4.json"), _paired_report())]
    front = study.front_frame(_front_rows(), paired).set_index(["batching", "policy"])
    every2, keep10 = front.loc[("padded", "every 2")], front.loc[("padded", "keep 10%")]
    assert every2["step_time_overhead_pct"] == pytest.approx(20.0)
    assert (every2["overhead_min_pct"], every2["overhead_max_pct"]) == pytest.approx((10.0, 30.0))
    assert keep10["step_time_overhead_pct"] == pytest.approx(2.0)
    assert every2["timing"] == keep10["timing"] == "paired, one process"
    # plans the paired timing did not time keep their rounds; packed ones are not touched
    assert front.loc[("padded", "full"), "timing"] == "fresh processes"
    assert front.loc[("padded", "full"), "step_time_overhead_pct"] == pytest.approx(30.0)
    assert front.loc[("packed", "keep 10%"), "step_time_overhead_pct"] == pytest.approx(10.0)
    # keep 10% is now faster than every 2 with less memory: it dominates it
    assert "keep 10%" in front.loc[("padded", "every 2"), "dominated_by"]
    over = study.overhead_frame(_front_rows(), paired=paired)
    assert len(over[(over["policy"] == "every 2") & (over["batch_size"] == 4)]) == 1
    assert "timed in" in study.overhead_table(over).columns


def test_an_interrupted_paired_timing_is_flagged_and_a_failed_one_skipped(tmp_path):
    paired = [(Path("paired_b4.json"), _paired_report(rounds=2, asked=3))]
    row = study.overhead_frame(_front_rows(), paired=paired).set_index("policy").loc["every 2"]
    assert row["rounds"] == 2 and row["flag"] == "2 of 3 rounds (interrupted)"
    folder = tmp_path / "paired"
    folder.mkdir()
    (folder / "paired_b4.json").write_text(json.dumps(_paired_report()))
    (folder / "packed_paired_b4.json").write_text('{"kind": "memory", "status": "error"}')
    with pytest.warns(UserWarning, match="packed_paired_b4.json: .*not a paired-timing report"):
        found = study.load_paired(tmp_path)
    assert [p.name for p, _ in found] == ["paired_b4.json"]


def test_a_paired_report_is_resumed_only_when_stamped_as_this_run(tmp_path):
    from heptstudy.study.resume import report_status, resumable, stamp

    env = {"hostname": "h", "git_commit": "c", "torch_version": "t"}
    report = {**_paired_report(), "environment": env, "config": {"a": 1}}
    identity = {"machine": {"hostname": "h"}, "code": {"git_commit": "c"}, "torch": "t",
                "config": {"a": 1}, "paired": {"plans": ["every2", "keep10"], "rounds": 3}}  # fmt: skip
    path = tmp_path / "paired_b4.json"
    path.write_text(json.dumps(report))
    assert resumable(path, "f1", identity)[0] is False  # not stamped yet
    assert stamp(path, "f1", identity) == "" and report_status(path) == "ok"
    assert json.loads(path.read_text())["fingerprint"] == "f1"
    assert resumable(path, "f1", identity) == (
        True,
        "resumed: report with the same fingerprint (ok)",
    )
    assert resumable(path, "f2", identity)[0] is False  # another machine, code or plans
    # an interrupted timing and one of other plans are never stamped
    path.write_text(json.dumps({**report, "rounds": 2}))
    assert stamp(path, "f1", identity) == "not resumable: 2 of 3 rounds"
    assert report_status(path) == "error" and resumable(path, "f1", identity)[0] is False
    path.write_text(json.dumps(report))
    other = {**identity, "paired": {"plans": ["full"], "rounds": 3}}
    assert stamp(path, "f1", other).startswith(
        "not resumable, the report differs from the run: plans"
    )


def test_a_figure_drawn_again_is_the_same_file(tmp_path):
    """No creation date in the PDF: a committed study aggregated again from the same reports
    leaves its figures unchanged."""
    import time

    import matplotlib.pyplot as plt

    from heptstudy import plots

    drawn = []
    for folder in ("first", "second"):
        fig, ax = plt.subplots()
        ax.plot([1, 2, 3], [3, 1, 2])
        drawn.append([p.read_bytes() for p in plots.save(fig, tmp_path / folder, "f")])
        plt.close(fig)
        time.sleep(1.1)  # the PDF's date has whole seconds
    assert drawn[0] == drawn[1]
